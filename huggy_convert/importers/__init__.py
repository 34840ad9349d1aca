"""Importers: sources other than an ML-Agents ``.pt`` checkpoint, read back into the ``Policy`` state dict
a checkpoint holds so that they enter the one pipeline (the converter's key rules, then the exporters).
They sit above the exporters they reuse: :mod:`.from_onnx` rebuilds a template graph with
``exporters.onnx_export.build_onnx`` to find each tensor in an ML-Agents ONNX; :mod:`.own` reads this
tool's own outputs (a canonical ``.safetensors``, the set a file of OUT/ belongs to).
"""
from __future__ import annotations

from pathlib import Path

from ..converter.checkpoint import Checkpoint, load_checkpoint
from ..core.artifacts import ONNX, SUFFIXES
from .from_onnx import checkpoint_from_onnx
from .own import checkpoint_from_policy_file, is_policy_file
from .sb3 import checkpoint_from_sb3
from .sb3_files import is_sb3_zip


def is_onnx_source(path) -> bool:
    """Whether ``path`` names an ONNX model (read back into a checkpoint by ``from_onnx``)."""
    return Path(path).suffix.lower() == SUFFIXES[ONNX]


def read_source(path) -> Checkpoint:
    """The actor of a ``.pt`` checkpoint, of an ML-Agents ``.onnx`` read back into one
    (``from_onnx.checkpoint_from_onnx``: its ``recovered`` record says what an ONNX does not hold), or of
    a canonical ``.safetensors`` this tool wrote (``own.checkpoint_from_policy_file``), or of a Stable-Baselines3
    model zip (``sb3.checkpoint_from_sb3``)."""
    if is_onnx_source(path):
        return checkpoint_from_onnx(path)
    if is_policy_file(path):
        return checkpoint_from_policy_file(path)
    if is_sb3_zip(path):
        return checkpoint_from_sb3(path)
    return load_checkpoint(path)


def foreign_format(path) -> bool:
    """Whether ``path`` is another trainer's file (an SB3 model zip): no ML-Agents ONNX is its reference."""
    return is_sb3_zip(path)
