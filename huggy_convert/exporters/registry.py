"""The artifact kinds built from a canonical policy, one exporter each (one file per kind).

``EXPORTERS[kind](policy, opset, writer) -> bytes``; the deploy targets (issue 27, written when asked:
``--targets``), ``TARGETS[target](policy, opset, writer) -> {kind: bytes}`` (OpenVINO writes two files, two
kinds: ``core.artifacts.TARGET_KINDS``), each target's modules imported only when it is built.

Adding an artifact kind: its exporter module, one entry here, its suffix in ``core.artifacts.SUFFIXES``, and what check 6 (``verify.engine.check_files``)
regenerates to compare it with.
"""
from __future__ import annotations

import contextlib
import io
from typing import Callable, Dict, Sequence

from ..converter.policy_file import dumps
from ..errors import InputError
from ..core.artifacts import ONNX, PT2, SAFETENSORS, TARGET_KINDS
from .onnx_export import build_onnx, model_bytes
from .pt2 import program_bytes
from .targets import TARGET_EXPORTERS, require


def _safetensors(policy, opset, writer) -> bytes:
    return dumps(policy)


def _onnx(policy, opset, writer) -> bytes:
    return model_bytes(build_onnx(policy, opset=opset))


def _pt2(policy, opset, writer) -> bytes:
    return program_bytes(policy, writer)


EXPORTERS: Dict[str, Callable] = {SAFETENSORS: _safetensors, ONNX: _onnx, PT2: _pt2}


def _target(target: str) -> Callable:
    kinds = {suffix: kind for kind, suffix in TARGET_KINDS[target].items()}

    def files(policy, opset, writer) -> Dict[str, bytes]:
        require(target)
        with contextlib.redirect_stdout(io.StringIO()):  # a converter's progress lines (litert-torch's) are not
            made = TARGET_EXPORTERS[target](policy, opset, writer)  # ours: stdout is the command's (--json)
        return {kinds[suffix]: data for suffix, data in made.items()}

    files.__name__ = f"_{target}"
    return files


TARGETS: Dict[str, Callable] = {t: _target(t) for t in TARGET_KINDS}


def require_targets(targets: Sequence[str]) -> None:
    """Every deploy target asked for is one we know and its extra is installed, else one line (an
    ``InputError``; ``exporters.targets.MissingExtra``: what to install), before anything is built."""
    for t in targets:
        if t not in TARGETS:
            raise InputError(f"unknown deploy target {t!r} (known: {', '.join(TARGETS)})")
        require(t)
