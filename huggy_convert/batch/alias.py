"""``checkpoint.pt``: ML-Agents saves the newest step twice. Recognised by content (its ``Policy``
tensors bitwise equal to those of the step file with its global step, else of the behavior's newest
step) and recorded as ``same_as`` that entry; one that matches none is converted as its own entry.
Another trainer's file (an SB3 model zip beside it: ``Item.foreign``) is never a candidate, and never
loaded here."""
from __future__ import annotations

import time
from typing import Callable, List, Optional, Tuple

from ..core.version import __version__
from .. import contract as C
from ..converter import load_checkpoint
from ..core.artifacts import sha256_bytes
from ..core.files import read_input_file
from ..errors import HuggyError, one_line
from .manifest import CHECKED, ERROR, FAILED, OK, PROFILE_BATCH, SAME_AS, SKIPPED, VERIFY_FAILED, base_entry
from .rundir import Item


def _policy_state(item: Item):
    """The ``Policy`` state dict of an ML-Agents checkpoint through the one loader (``None`` if it does not
    load, or is another trainer's file)."""
    if item.foreign:
        return None
    try:
        return load_checkpoint(item.path, quiet_warnings=False).policy  # run_batch silences torch's warnings
    except (HuggyError, OSError):
        return None


def check_alias(item: Item, ctx, candidates: List[Tuple[Item, dict]], convert: Callable) -> dict:
    """checkpoint.pt: recorded as ``same_as`` the step entry whose Policy it equals, else converted
    (``convert(item, ctx, ckpt=...)``: the batch's one-checkpoint task)."""
    t0 = time.perf_counter()
    entry = base_entry(item)
    try:
        data = read_input_file(item.path)
        sha = sha256_bytes(data)
        entry.update(source_sha256=sha, source_bytes=len(data))
        prev = ctx.previous.get(item.rel)
        if (not ctx.force and prev and prev.get("status") == SAME_AS and prev.get("source_sha256") == sha
                and prev.get("tool_version") == __version__):
            for cand, cand_entry in candidates:
                if (cand.out_stem == prev.get("same_as") and cand_entry.get("status") == OK
                        and cand_entry.get("source_sha256") == prev.get("same_as_sha256")):
                    entry.update(status=SAME_AS, run=SKIPPED, stem=None, same_as=cand.out_stem, same_as_source=cand.rel,
                                 same_as_sha256=cand_entry["source_sha256"], step=cand.step, reward=cand.reward,
                                 seconds=round(time.perf_counter() - t0, 3))
                    return entry
        ckpt = load_checkpoint(item.path, data=data, sha256=sha, quiet_warnings=False)
        data = None
        entry[C.CKPT_GLOBAL_STEP] = ckpt.global_step
        # the step file of its own global step first, then the newest of the folder (candidates[0])
        candidates = [ce for ce in candidates if not ce[0].foreign]
        order = [ce for ce in candidates if ckpt.global_step is not None and ce[0].step == ckpt.global_step]
        order += [ce for ce in candidates[:1] if ce not in order]
        for cand, cand_entry in order:
            if cand_entry.get("status") not in (OK, VERIFY_FAILED):
                continue
            if _same_policy(ckpt.policy, _policy_state(cand)):
                entry.update(status=SAME_AS, run=CHECKED, stem=None, same_as=cand.out_stem, same_as_source=cand.rel,
                             same_as_sha256=cand_entry.get("source_sha256"), step=cand.step,
                             reward=cand.reward if item.reward is None else item.reward,
                             seconds=round(time.perf_counter() - t0, 3))
                if cand_entry.get("status") != OK:
                    entry["error"] = f"same as {cand.out_stem}, which failed verification"
                return entry
        entry["profile"] = PROFILE_BATCH
        res = convert(item, ctx, ckpt=ckpt)
        res["note"] = f"{C.CHECKPOINT_FILE} matches no step checkpoint: converted as its own entry"
        res["seconds"] = round(time.perf_counter() - t0, 3)
        return res
    except Exception as exc:
        entry.update(status=ERROR, run=FAILED, error=one_line(exc, item.path),
                     seconds=round(time.perf_counter() - t0, 3))
        return entry


def _same_policy(a: Optional[dict], b: Optional[dict]) -> bool:
    """Bitwise equality of two Policy state dicts (same keys, dtypes, shapes and bytes)."""
    import torch

    if a is None or b is None or sorted(a) != sorted(b):
        return False
    for k, x in a.items():
        y = b[k]
        if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
            return False
        bx = x.detach().contiguous().reshape(-1).view(torch.uint8)
        by = y.detach().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(bx, by):
            return False
    return True
