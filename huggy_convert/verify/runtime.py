"""onnxruntime sessions, the reference runtime (CPU execution provider, fixed thread counts)."""
from __future__ import annotations

from typing import Dict, Optional, Union

import numpy as np

INTRA_OP_THREADS = 1


def ort_session(model: Union[bytes, str, "object"], threads: int = INTRA_OP_THREADS, profile_prefix=None,
                provider: str = "CPUExecutionProvider", provider_options: Optional[Dict] = None):
    """The one place sessions are made. CPU: ``threads`` intra-op threads, one inter-op (the verifier's
    setting); another ``provider`` (CUDA, CANN) gets ``provider_options`` and the CPU as fallback.
    ``profile_prefix``: turn on onnxruntime's own per-node profiler, writing under that prefix."""
    import onnxruntime as ort

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    providers = ["CPUExecutionProvider"]
    if provider == "CPUExecutionProvider":
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    else:
        providers = [(provider, provider_options or {}), "CPUExecutionProvider"]
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(model, sess_options=so, providers=providers)


def ort_run(session, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    outs = session.run(None, {k: feed[k] for k in names})
    return dict(zip([o.name for o in session.get_outputs()], outs))
