"""Reading an ML-Agents ``.pt`` checkpoint safely (``weights_only=True``: a pickle never runs code)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import pickletools
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .. import contract as C
from ..errors import CheckpointError, InputError


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


@dataclass
class Checkpoint:
    path: Path
    sha256: str
    policy: Dict[str, "object"]  # ML-Agents key -> torch.Tensor (CPU)
    global_step: Optional[int]
    top_keys: List[str]


_PICKLE_OPCODES = {ord(op.code): op.name for op in pickletools.opcodes}


def _describe_load_failure(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    bad_op = re.search(r"Unsupported operand (\d+)", text)
    if bad_op:
        code = int(bad_op.group(1))
        if code not in _PICKLE_OPCODES:  # not an opcode at all: damaged bytes, not a pickle asking for code
            return f"not a readable torch checkpoint (not a valid pickle: byte 0x{code:02x} is no pickle opcode)"
        return (f"refused to load: the pickle uses opcode {_PICKLE_OPCODES[code]}, which loading with "
                "weights_only=True does not allow")
    if isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" in text:
        # torch's message names the global the pickle asked for; keep just that part.
        detail = text
        for marker in ("Unsupported global:", "Unsupported operand", "GLOBAL"):
            i = text.find(marker)
            if i >= 0:
                detail = text[i:].split(" Check the documentation")[0].split(". ")[0][:120]
                break
        return f"refused to load: the pickle asks for more than tensors ({detail}); a checkpoint must load with weights_only=True"
    if isinstance(exc, zipfile.BadZipFile) or "zip" in text.lower() or "central directory" in text.lower():
        return f"not a readable torch checkpoint (damaged or truncated zip: {text[:160]})"
    if isinstance(exc, EOFError):
        return "not a readable torch checkpoint (file ends too early: truncated?)"
    return f"not a readable torch checkpoint ({type(exc).__name__}: {text[:160]})"


def torch_load_weights_only(data: bytes):
    """``torch.load`` of ``data`` on the CPU with ``weights_only=True``: the package's one call of
    ``torch.load`` (a pickle is only ever read this way, so it never runs code)."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_checkpoint(path, data: Optional[bytes] = None, sha256: Optional[str] = None,
                    quiet_warnings: bool = True) -> Checkpoint:
    """Load ``path`` on the CPU with ``weights_only=True`` and return its ``Policy`` state dict.

    ``data`` (and its ``sha256``) let a caller that already read the file load it from memory, so
    a checkpoint is read once. ``quiet_warnings=False`` leaves torch's warnings alone (a threaded
    caller silences them once: ``warnings.catch_warnings`` is not thread-safe)."""
    import torch  # deferred: only checkpoint reading needs torch here

    p = Path(path)
    if data is None:
        if not p.exists():
            raise InputError("no such file", p)
        if p.is_dir():
            raise InputError("is a directory, not a checkpoint file", p)
        with open(p, "rb") as f:
            data = f.read()
    if not data:
        raise CheckpointError("empty file, not a torch checkpoint", p)
    if data[:4] != b"PK\x03\x04" and data[:1] != b"\x80":
        raise CheckpointError(f"not a readable torch checkpoint (neither a zip archive nor a pickle; "
                              f"starts with bytes {data[:4].hex(' ')})", p)
    digest = sha256 or hashlib.sha256(data).hexdigest()
    try:
        with warnings.catch_warnings() if quiet_warnings else contextlib.nullcontext():
            if quiet_warnings:  # torch's own warnings would break the one-line error
                warnings.simplefilter("ignore")
            obj = torch_load_weights_only(data)
    except Exception as exc:  # torch raises many types for bad files; all mean "not loadable"
        raise CheckpointError(_describe_load_failure(exc), p) from None
    del data
    if isinstance(obj, torch.Tensor):
        raise CheckpointError("holds a bare tensor, not an ML-Agents checkpoint (a dict with a 'Policy' state dict)", p)
    if not isinstance(obj, dict):
        raise CheckpointError(f"holds a {type(obj).__name__}, not an ML-Agents checkpoint dict", p)
    top = [str(k) for k in obj.keys()]
    if C.CKPT_POLICY not in obj:
        shown = ", ".join(top[:6]) + (" ..." if len(top) > 6 else "")
        raise CheckpointError(f"no '{C.CKPT_POLICY}' state dict: not an ML-Agents checkpoint (top-level keys: {shown or 'none'})", p)
    policy = obj[C.CKPT_POLICY]
    if not isinstance(policy, dict) or not all(isinstance(v, torch.Tensor) for v in policy.values()):
        raise CheckpointError(f"'{C.CKPT_POLICY}' is not a state dict of tensors", p)
    step = None
    gs = obj.get(C.CKPT_GLOBAL_STEP)
    if isinstance(gs, dict) and isinstance(gs.get(C.GLOBAL_STEP_KEY), torch.Tensor):
        t = gs[C.GLOBAL_STEP_KEY]
        if t.numel() == 1:
            step = int(t.reshape(-1)[0].item())
    return Checkpoint(path=p, sha256=digest, policy=dict(policy), global_step=step, top_keys=top)
