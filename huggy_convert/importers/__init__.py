"""Importers: sources other than an ML-Agents ``.pt`` checkpoint, read back into the ``Policy`` state dict
a checkpoint holds so that they enter the one pipeline (the converter's key rules, then the exporters).
They sit above the exporters they reuse: :mod:`.from_onnx` rebuilds a template graph with
``exporters.onnx_export.build_onnx`` to find each tensor in an ML-Agents ONNX.
"""
from __future__ import annotations

from pathlib import Path

from ..converter.checkpoint import Checkpoint, load_checkpoint
from ..core.artifacts import ONNX, SUFFIXES
from .from_onnx import checkpoint_from_onnx


def is_onnx_source(path) -> bool:
    """Whether ``path`` names an ONNX model (read back into a checkpoint by ``from_onnx``)."""
    return Path(path).suffix.lower() == SUFFIXES[ONNX]


def read_source(path) -> Checkpoint:
    """The actor of a ``.pt`` checkpoint, or of an ML-Agents ``.onnx`` read back into one
    (``from_onnx.checkpoint_from_onnx``: its ``recovered`` record says what an ONNX does not hold)."""
    if is_onnx_source(path):
        return checkpoint_from_onnx(path)
    return load_checkpoint(path)
