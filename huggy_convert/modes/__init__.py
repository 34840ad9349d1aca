"""Run modes (info, act, sample, batch-sizes, precision, onnx-compare, fingerprint, stats, benchmark,
export) and the numbered test matrix, on a checkpoint, a canonical policy or an ONNX, on any device.

Modes use every stage (converter, exporters, verify); no stage imports modes.
"""
from __future__ import annotations

