"""Every checkpoint under a folder, converted in a pool of workers; and ``verify OUT/`` over the same pool.

``rundir`` (the runs under a folder and their checkpoints), ``manifest`` (``OUT/manifest.json``: an
entry per checkpoint, the header, the summary; the previous one read back for a rerun), ``run``
(``run_batch``: ``pipeline.convert_one`` for each checkpoint in the pool; returns a ``BatchResult`` and
reports its progress as events: it prints nothing), ``alias`` (``checkpoint.pt`` recognised by content),
``deployed`` (which checkpoint a run-root ``<Behavior>.onnx`` is the export of), ``reverify`` (``verify
OUT/``: every set re-verified, in this process or over the pool), ``workers`` (the pool).
Import the names from their modules (``batch.rundir`` alone stays light)."""
