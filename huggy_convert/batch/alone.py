"""A folder that holds no checkpoint but one ONNX: a Hugging Face Hub download of a repo with only its
``<Behavior>.onnx``. ``convert`` takes that file alone (``importers.from_onnx``) where a batch would find
no checkpoint."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..core.artifacts import ONNX, SUFFIXES
from ..errors import InputError
from .rundir import discover


def onnx_alone(source, out=None) -> Optional[Path]:
    """A folder without any checkpoint that holds one ONNX (a Hub download of a repo that has only its
    ``<Behavior>.onnx``): that ONNX, which converts alone (``importers.from_onnx``). None where a checkpoint
    is there (a batch) or no ONNX is; several ONNX and no checkpoint: an ``InputError`` naming them."""
    source = Path(source)
    try:
        exclude = Path(out).resolve() if out is not None else None
    except (OSError, RuntimeError):  # an OUT that cannot be resolved (a symlink loop): the batch names it
        return None
    found = discover(source, out)
    if any(not it.missing for it in found.items):
        return None
    onnx = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and (exclude is None or Path(dirpath, d).resolve() != exclude))
        onnx += [Path(dirpath, f) for f in sorted(filenames) if f.endswith(SUFFIXES[ONNX]) and not f.startswith(".")]
    if len(onnx) > 1:
        names = ", ".join(p.relative_to(source).as_posix() for p in onnx[:3]) + (", ..." if len(onnx) > 3 else "")
        raise InputError(f"no ML-Agents checkpoints (.pt files) or SB3 model zips here, and {len(onnx)} ONNX files ({names}): "
                         "convert each alone (huggy-convert FILE.onnx OUT/)", source)
    return onnx[0] if onnx else None
