"""This tool's own outputs as inputs.

A canonical ``.safetensors`` (``<stem>.safetensors`` in OUT/) is read by ``converter.policy_file``, the
canonical reader (no pickle), and written back, in memory, into the ``Policy`` state dict a checkpoint
holds (``converter.state_dict``: each tensor under the key its block claimed it from), so that it
enters the one pipeline as a checkpoint does; its spec goes with it for what no tensor says (the
vector split, the goal observations, the inputs' shapes). As for a checkpoint, the ``<stem>.onnx``
beside it is the reference its divisors and checks 2-3 are decided against (in OUT/: the ONNX written
with it from the same tensors); without one, ``--divisor auto`` keeps the divisors the file holds.

A file of an artifact set (``OUT/<stem>.onnx``, ``.pt2``, ``.verify.json``...) names its set:
``artifact_set``; ``artifact_sets``: the sets below OUT/; ``export_target``: where ``export`` writes (OUT/, as convert, or says why not).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Tuple

from .. import contract as C
from ..converter.checkpoint import Checkpoint
from ..converter.policy_file import loads
from ..converter.state_dict import policy_state_dict
from ..core.artifacts import ONNX, REPORT, SAFETENSORS, SUFFIXES, ArtifactSet, sha256_bytes
from ..core.files import read_input_file
from ..errors import InputError


def is_policy_file(path) -> bool:
    """Whether ``path`` names a canonical policy (``<stem>.safetensors``)."""
    return Path(path).name.lower().endswith(SUFFIXES[SAFETENSORS])


def checkpoint_from_policy_file(path, data: Optional[bytes] = None) -> Checkpoint:
    """The ``Policy`` state dict of the canonical policy at ``path``, as a checkpoint holds it, with the
    training step its metadata records and the policy itself (``Checkpoint.stated``: its spec and, where
    no ONNX is beside it, its divisors). ``data``: the file's bytes, already read."""
    p = Path(path)
    data = read_input_file(p, "policy file") if data is None else data
    policy = loads(data, p)
    step = str(policy.metadata.get("training_step", ""))
    return Checkpoint(p, sha256_bytes(data), policy_state_dict(policy), int(step) if step.isdigit() else None,
                      [C.CKPT_POLICY, C.CKPT_GLOBAL_STEP], obs_sizes=tuple(n for _, n in policy.spec.vector_obs),
                      stated=policy)


def artifact_set(path) -> Optional[Tuple[Path, str]]:
    """(folder, stem) of the artifact set a file named ``<stem><suffix>`` belongs to (any suffix of
    ``core.artifacts.SUFFIXES``) where that set's ``.safetensors`` or report is beside it; else None."""
    p = Path(path)
    for suffix in sorted(SUFFIXES.values(), key=len, reverse=True):  # .verify.json before .json...
        if p.name.lower().endswith(suffix) and len(p.name) > len(suffix):
            stem = p.name[:-len(suffix)]
            folder = p.parent
            if any((folder / (stem + SUFFIXES[k])).is_file() for k in (SAFETENSORS, REPORT)):
                return folder, stem
            return None
    return None


def export_target(source, out_dir, opset: int) -> Path:
    """Where ``export`` writes without ``--out``: ``OUT/<stem>.opset<N>.onnx``, OUT the folder given (as
    ``convert SOURCE OUT/`` takes it) or, for a file of an artifact set, the set's own folder (where
    convert wrote it). Otherwise an ``InputError`` that says why and what to give."""
    p = Path(source)
    name = f"{p.stem}.opset{opset}{SUFFIXES[ONNX]}"
    if out_dir is not None:
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise InputError("exists and is not a directory (export SOURCE OUT/ writes OUT/"
                             f"{name}; --out names a file)", out)
        return out / name
    named = artifact_set(p)
    if named is not None:
        return named[0] / name
    raise InputError(f"where to write {name}? give OUT/ (export SOURCE OUT/, as convert takes it) or --out FILE; "
                     "without either, export writes only beside a set convert wrote (OUT/<stem>.safetensors)", p)


def artifact_sets(out) -> List[Tuple[Path, str]]:
    """The artifact sets in ``out`` and the folders below it (hidden ones aside: a batch over several
    runs writes ``OUT/<run>/``): ``(folder, stem)`` of each ``<stem>.safetensors``, in order."""
    found: List[Tuple[Path, str]] = []
    for dirpath, dirnames, _ in os.walk(out):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [(Path(dirpath), s) for s in ArtifactSet.stems(Path(dirpath))]
    return found
