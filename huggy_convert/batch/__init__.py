"""Every checkpoint under a folder, converted in a pool of workers; and ``verify OUT/`` over the same pool.

``rundir`` (the runs under a folder and their checkpoints), ``manifest`` (``OUT/manifest.json``: an
entry per checkpoint, the header, the summary; the previous one read back for a rerun), ``run``
(``run_batch``: ``pipeline.convert_one`` for each checkpoint in the pool; returns a ``BatchResult`` and
reports its progress as events: it prints nothing), ``alias`` (``checkpoint.pt`` recognised by content),
``deployed`` (which checkpoint a run-root ``<Behavior>.onnx`` is the export of), ``reverify`` (``verify
OUT/``: every set re-verified, in this process or over the pool), ``workers`` (the pool). The names below are imported from their modules when first asked for, so that ``batch.rundir`` alone
stays light."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "run_batch": "run", "batch_profiles": "run", "check_tolerances": "run", "MANIFEST_JSON": "manifest",
    "MANIFEST_CSV": "manifest", "verify_out": "reverify", "verify_dir": "reverify", "raise_error_record": "reverify",
    "recorded_profiles": "manifest", "BatchResult": "run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
