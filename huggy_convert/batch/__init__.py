"""Every checkpoint under a folder, converted in a pool of workers; and ``verify OUT/`` over the same pool.

``rundir`` (the runs under a folder and their checkpoints), ``deployed`` (which checkpoint a run-root
``<Behavior>.onnx`` is the export of), ``workers`` (the pool), ``run`` (the batch: ``run_batch``).
The names below are imported from their modules when first asked for, so that ``batch.rundir`` alone
stays light."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "run_batch": "run", "batch_profiles": "run", "check_tolerances": "run", "MANIFEST_JSON": "run",
    "MANIFEST_CSV": "run", "verify_out": "run", "raise_error_record": "run", "recorded_profiles": "run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
