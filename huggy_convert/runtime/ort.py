"""onnxruntime: the one session factory (the reference CPU setting and every accelerator provider) and
:class:`OrtRunner`. No other module of the package constructs an onnxruntime session."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from .. import contract as C
from ..errors import DeviceError, UnsupportedError
from ..exporters.onnx_export import with_noise_input
from .base import Feed, RunnerBase
from .feeds import draw_noise, injected, unseeded

INTRA_OP_THREADS = 1
CPU_EP, CUDA_EP, CANN_EP = "CPUExecutionProvider", "CUDAExecutionProvider", C.CANN_EP


def ort_session(model: Union[bytes, str, "object"], threads: int = INTRA_OP_THREADS, profile_prefix=None,
                provider: str = CPU_EP, provider_options: Optional[Dict] = None):
    """The one place sessions are made. CPU: ``threads`` intra-op threads, one inter-op (the verifier's
    setting); another ``provider`` (CUDA, CANN) gets ``provider_options`` and the CPU as fallback.
    ``profile_prefix``: turn on onnxruntime's own per-node profiler, writing under that prefix."""
    import onnxruntime as ort

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    providers = [CPU_EP]
    if provider == CPU_EP:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    else:
        providers = [(provider, provider_options or {}), CPU_EP]
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(model, sess_options=so, providers=providers)


def ort_run(session, feed: Feed) -> Feed:
    """Every output of ``session`` for the inputs it takes from ``feed``."""
    names = [i.name for i in session.get_inputs()]
    outs = session.run(None, {k: feed[k] for k in names})
    return dict(zip([o.name for o in session.get_outputs()], outs))


def ort_providers() -> List[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def cann_available() -> bool:
    """Whether this onnxruntime has the CANN execution provider (onnxruntime-cann: Ascend NPUs)."""
    return CANN_EP in ort_providers()


def ort_provider_for(device: str) -> Tuple[str, str]:
    """(execution provider, device label) for an ONNX run on ``device``."""
    base = device.split(":")[0]
    have = ort_providers()
    if device == "auto":
        if CANN_EP in have:
            return CANN_EP, "npu"
        if CUDA_EP in have:
            return CUDA_EP, "cuda"
        return CPU_EP, "cpu"
    if base == "cpu":
        return CPU_EP, "cpu"
    if base == "cuda":
        if CUDA_EP not in have:
            raise DeviceError("device 'cuda' for onnxruntime needs its CUDA execution provider (onnxruntime-gpu); "
                              f"this onnxruntime has {', '.join(have)}")
        return CUDA_EP, device
    if base == "npu":
        if CANN_EP not in have:
            raise DeviceError("device 'npu' is not available for onnxruntime here (no CANN execution provider); "
                              "give the .pt or .safetensors to run the torch module on the NPU")
        return CANN_EP, device
    raise DeviceError(f"unknown device '{device}': choose cpu, cuda, npu or auto")


def provider_options(provider: str, device: str, precision_mode: Optional[str] = None) -> Dict[str, str]:
    """The options of ``provider`` for ``device``: ``device_id`` (from ``cuda:i`` / ``npu:i``, else 0);
    CANN also ``precision_mode`` (default ``must_keep_origin_dtype``: the graph's float32, so the normalizer
    is never cast to fp16 the way ATC's ``force_fp16`` default casts it)."""
    index = device.split(":")[1] if ":" in device else "0"
    try:
        opts = {C.EP_OPT_DEVICE_ID: str(int(index))}
    except ValueError:
        raise DeviceError(f"device '{device[:40]}': the index after ':' is not a number") from None
    if provider == CANN_EP:
        mode = precision_mode or C.CANN_EP_PRECISION_DEFAULT
        if mode not in C.PRECISION_MODES:
            raise DeviceError(f"precision mode '{mode[:40]}' is not one of {', '.join(C.PRECISION_MODES)}")
        opts[C.CANN_OPT_PRECISION] = mode
    elif precision_mode is not None:
        raise DeviceError(f"a precision mode is an option of the CANN execution provider (npu), not of {provider}")
    return opts


def ort_session_on(model, device: str = "cpu", precision_mode: Optional[str] = None):
    """(session, device label) on ``device``: the CPU (one intra-op thread, as the verifier) or an
    accelerator provider (``provider_options``), which must really start (no silent CPU fallback)."""
    provider, label = ort_provider_for(device)
    if provider == CPU_EP:
        if precision_mode is not None:
            raise DeviceError("a precision mode is an option of the CANN execution provider (npu), not of the CPU")
        return ort_session(model), label
    sess = ort_session(model, provider=provider, provider_options=provider_options(provider, device, precision_mode))
    if provider not in sess.get_providers():
        raise DeviceError(f"onnxruntime could not start {provider} on {device}")
    return sess, label


class OrtRunner(RunnerBase):
    """An ONNX model (``ModelProto`` or bytes) in onnxruntime on ``device`` (an NPU through the CANN
    execution provider where onnxruntime-cann is installed, with ``precision_mode``). ``sample`` runs the same
    graph with its ``RandomNormalLike`` replaced by the input ``epsilon`` (exporters.with_noise_input),
    fed the CPU noise of ``seed`` or ``noise``; ``spec`` gives the noise's width (``feeds.injected``: the
    sampled outputs whose noise is normal; a graph's own uniform draw has no seed). ``path``: the file the
    model came from, named in errors; ``graph``: the ``ModelProto`` of a ``model`` given as bytes (what
    the noise graph is made from, without parsing the bytes again)."""

    runtime = "onnxruntime"

    def __init__(self, model, device: str = "cpu", spec=None, path=None, precision_mode: Optional[str] = None,
                 graph=None):
        t0 = time.perf_counter()
        self.model, self.spec, self.path = model, spec, path
        self.graph = graph if graph is not None else model
        self.precision_mode = precision_mode
        self.session, self.device = ort_session_on(model, device, precision_mode)
        self._asked = device
        self._noise_session = None
        self.build_seconds = time.perf_counter() - t0
        given, own = (injected(spec), unseeded(spec)) if spec is not None else ([], [])
        if given and own:
            self.note = (f"{', '.join(p.name for p in own)} not sampled for an ONNX (its Multinomial has no seed): "
                         f"{', '.join(p.name for p in given)} only")

    def infer(self, feed: Feed) -> Feed:
        return ort_run(self.session, feed)

    def noise_session(self):
        """The session of the graph with the noise as an input (made on the first call)."""
        if self._noise_session is None:
            self._noise_session = ort_session_on(with_noise_input(self.graph), self._asked, self.precision_mode)[0]
        return self._noise_session

    def sample(self, feed: Feed, seed: Optional[int] = None, noise: Optional[np.ndarray] = None) -> Feed:
        """The sampled outputs whose noise the graph takes, and the carried state (``IOSignature.feedback``)."""
        given = injected(self.spec) if self.spec is not None else []
        if not given:
            own = ", ".join(p.name for p in unseeded(self.spec)) if self.spec is not None else "its sampled outputs"
            raise UnsupportedError(f"seeded sampling of this ONNX is not available: {own or 'nothing'} is drawn by "
                                   "its Multinomial node, which has no seed (give the .pt or .safetensors)", self.path)
        if noise is None:
            noise = draw_noise(self.spec, next(iter(feed.values())).shape[0], seed)[0]
        out = ort_run(self.noise_session(), dict(feed, **{C.NOISE_INPUT: noise}))
        keep = [p.name for p in given] + list(self.spec.io_signature().feedback())
        return {k: out[k] for k in keep if k in out}
