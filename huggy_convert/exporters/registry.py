"""The artifact kinds built from a canonical policy, one exporter each (one file per kind).

``EXPORTERS[kind](policy, opset, writer) -> bytes``. Adding an artifact kind: its exporter module,
one entry here, its suffix in ``core.artifacts.SUFFIXES``, and what check 6 (``verify.engine.check_files``)
regenerates to compare it with.
"""
from __future__ import annotations

from typing import Callable, Dict

from ..converter.policy_file import dumps
from ..core.artifacts import ONNX, PT2, SAFETENSORS
from .onnx_export import build_onnx, model_bytes
from .pt2 import program_bytes


def _safetensors(policy, opset, writer) -> bytes:
    return dumps(policy)


def _onnx(policy, opset, writer) -> bytes:
    return model_bytes(build_onnx(policy, opset=opset))


def _pt2(policy, opset, writer) -> bytes:
    return program_bytes(policy, writer)


EXPORTERS: Dict[str, Callable] = {SAFETENSORS: _safetensors, ONNX: _onnx, PT2: _pt2}
