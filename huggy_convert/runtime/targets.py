"""The deploy targets' runtimes (issue 27), each a :class:`Runner` over the files its exporter wrote
(``exporters.targets.TARGET_EXPORTERS``: ``{suffix: bytes}``), on the CPU, in float32, on ``threads`` threads:

- :class:`OpenVinoRunner`: ``openvino.Core().compile_model(model, "CPU", {INFERENCE_PRECISION_HINT: "f32", ...})``
  (the CPU plugin runs bf16 on CPUs with AMX / AVX512-BF16 otherwise; ``dtype`` reports the precision the
  compiled model says it runs in);
- :class:`LiteRtRunner`: ai-edge-litert's ``Interpreter`` (its XNNPACK delegate, float32), a batch-1 model
  run row by row;
- :class:`ExecuTorchRunner`: ``executorch.runtime.Runtime``'s ``forward`` method of the ``.pte``.

``infer(feed)`` returns the outputs by the policy's names (float outputs as float32): OpenVINO every output
of the ONNX it was converted from (the constants and the sampled actions too, like ``OrtRunner``), LiteRT and
ExecuTorch the torch module's (``spec.deterministic_output_names()``); ``sample`` is not offered (the targets are verified on their deterministic outputs, like a
deployed policy's mean action): it raises ``UnsupportedError``."""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np

from .. import contract as C
from ..contract import targets as T
from ..core.policy import Policy
from ..errors import UnsupportedError
from ..exporters.targets import TARGET_EXPORTERS, require
from .base import Feed, RunnerBase
from .threads import VERIFY_THREADS


def _float32(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.kind == "f" and a.dtype != np.float32 else a


class _TargetRunner(RunnerBase):
    device = "cpu"
    dtype = "float32"

    def __init__(self, spec):
        self.spec = spec
        sig = spec.io_signature()
        self.input_names: List[str] = sig.input_names()
        self.output_names: List[str] = list(spec.deterministic_output_names())  # the torch module's outputs
        self._batched = {p.name: bool(p.dims) and p.dims[0] == C.BATCH_DIM for p in sig.outputs}
        self._dtypes = {p.name: p.dtype for p in sig.outputs}

    def _named(self, outs: List[np.ndarray]) -> Feed:
        """Positional outputs (the module's order) by name, each in its port's dtype."""
        return {n: _float32(o).astype(self._dtypes[n], copy=False) for n, o in zip(self.output_names, outs)}

    def sample(self, feed: Feed, seed: Optional[int] = None, noise: Optional[np.ndarray] = None) -> Feed:
        raise UnsupportedError(f"the {self.runtime} target is verified on its deterministic outputs: sampling "
                               "is not offered (sample with the .pt2 or the ONNX)")


def _position(name: str) -> int:
    """``args_3`` / ``output_3`` -> 3 (litert-torch's positional names)."""
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _port_name(port, names) -> str:
    """The one of ``port``'s tensor names that is a policy input (OpenVINO merges names onto a tensor)."""
    ours = sorted(port.get_names() & names)
    return ours[0] if ours else port.get_any_name()


class OpenVinoRunner(_TargetRunner):
    """An OpenVINO IR (``{".xml": graph, ".bin": weights}``) compiled for the CPU in f32."""

    runtime = T.OPENVINO

    def __init__(self, files: Dict[str, bytes], spec, threads: int = VERIFY_THREADS):
        require(T.OPENVINO)
        import openvino as ov

        super().__init__(spec)
        t0 = time.perf_counter()
        core = ov.Core()
        weights = ov.Tensor(np.frombuffer(files[T.OPENVINO_BIN], np.uint8).copy())
        model = core.read_model(model=files[T.OPENVINO_XML].decode("utf-8"), weights=weights)
        config = {T.OV_PRECISION_HINT: T.OV_PRECISION_F32, T.OV_THREADS: int(threads), T.OV_NUM_STREAMS: 1}
        self.compiled = core.compile_model(model, T.OV_DEVICE_CPU, config)
        self.precision = str(self.compiled.get_property(T.OV_PRECISION_HINT))
        self.dtype = "float32" if ("f32" in self.precision.lower() or "float32" in self.precision.lower()) \
            else self.precision
        self._request = self.compiled.create_infer_request()
        ins, outs = set(spec.input_names()), set(spec.io_signature().output_names())
        self._inputs = [_port_name(i, ins) for i in self.compiled.inputs]
        # an output tensor may carry several names (the ONNX's deduplicated outputs): each of the policy's
        self._outputs = [(n, o) for o in self.compiled.outputs for n in sorted(o.get_names() & outs)
                         or [o.get_any_name()]]
        self.build_seconds = time.perf_counter() - t0

    def infer(self, feed: Feed) -> Feed:
        res = self._request.infer({n: np.ascontiguousarray(feed[n]) for n in self._inputs})
        return {n: _float32(res[o]).astype(self._dtypes.get(n, res[o].dtype), copy=False) for n, o in self._outputs}


class LiteRtRunner(_TargetRunner):
    """A ``.tflite`` in ai-edge-litert's interpreter, through its signature (litert-torch names the module's
    inputs ``args_<i>`` and outputs ``output_<i>``, in the module's order); a model of batch 1 runs a feed row
    by row."""

    runtime = T.LITERT

    def __init__(self, data: bytes, spec, threads: int = VERIFY_THREADS):
        require(T.LITERT)
        from ai_edge_litert.interpreter import Interpreter

        super().__init__(spec)
        t0 = time.perf_counter()
        self.data = bytes(data)
        self.interpreter = Interpreter(model_content=self.data, num_threads=int(threads))
        sig = self.interpreter.get_signature_list()[T.LITERT_SIGNATURE]
        self._runner = self.interpreter.get_signature_runner(T.LITERT_SIGNATURE)
        self._in = sorted(sig["inputs"], key=_position)
        self._out = sorted(sig["outputs"], key=_position)
        details = self._runner.get_input_details()
        self._in_dtypes = [details[k]["dtype"] for k in self._in]
        shape = details[self._in[0]]["shape"]
        self.rows = int(shape[0]) if len(shape) else 1
        self.build_seconds = time.perf_counter() - t0

    def _run(self, xs: List[np.ndarray]) -> List[np.ndarray]:
        out = self._runner(**{k: np.ascontiguousarray(x, dtype=d) for k, x, d in zip(self._in, xs, self._in_dtypes)})
        return [np.array(out[k]) for k in self._out]

    def infer(self, feed: Feed) -> Feed:
        xs = [np.asarray(feed[n]) for n in self.input_names]
        n = xs[0].shape[0]
        if n == self.rows:
            return self._named(self._run(xs))
        if self.rows != 1:
            raise UnsupportedError(f"this .tflite takes {self.rows} rows at a time, not {n}")
        outs = [self._run([x[i:i + 1] for x in xs]) for i in range(n)]
        cols = []
        for k, name in enumerate(self.output_names[:len(outs[0])]):
            cols.append(np.concatenate([o[k] for o in outs]) if self._batched[name] else outs[0][k])
        return self._named(cols)


_EXECUTORCH_LOADED: List[bool] = []  # a program was loaded: the threadpool may no longer be reset


def _executorch_threads(n: int) -> int:
    """ExecuTorch's (XNNPACK's) threadpool at ``n`` threads, where no program was loaded yet in this process
    (resetting it under a loaded method crashes the process); the count it runs."""
    from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count, _unsafe_reset_threadpool

    if _threadpool_get_thread_count() != n and not _EXECUTORCH_LOADED:
        _unsafe_reset_threadpool(n)
    return int(_threadpool_get_thread_count())


class ExecuTorchRunner(_TargetRunner):
    """A ``.pte`` program's ``forward`` in ExecuTorch's runtime (XNNPACK delegate, float32)."""

    runtime = T.EXECUTORCH

    def __init__(self, data: bytes, spec, threads: int = VERIFY_THREADS):
        require(T.EXECUTORCH)
        from executorch.runtime import Runtime

        super().__init__(spec)
        t0 = time.perf_counter()
        self.data = bytes(data)
        self.threads = _executorch_threads(int(threads))
        if self.threads != int(threads):
            self.note = f"ExecuTorch's threadpool already runs {self.threads} threads in this process"
        self.program = Runtime.get().load_program(self.data)
        self.method = self.program.load_method(T.EXECUTORCH_METHOD)
        _EXECUTORCH_LOADED.append(True)
        # the planned input sizes are the batch's upper bound (1 for the exporter's batch-1 fallback): a larger
        # feed runs in slices of at most that many rows
        meta = self.method.metadata
        self.max_rows = min(int(meta.input_tensor_meta(i).sizes()[0]) for i in range(meta.num_inputs()))
        self.build_seconds = time.perf_counter() - t0

    def infer(self, feed: Feed) -> Feed:
        import torch

        xs = [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self.input_names]
        n, step = int(xs[0].shape[0]), self.max_rows
        if n <= step:
            return self._named(self._run(xs))
        outs = [self._run([x[i:i + step] for x in xs]) for i in range(0, n, step)]
        return self._named([np.concatenate([o[k] for o in outs]) if self._batched[name] else outs[0][k]
                            for k, name in enumerate(self.output_names[:len(outs[0])])])

    def _run(self, xs) -> List[np.ndarray]:
        return [o.detach().numpy() if hasattr(o, "detach") else np.asarray(o) for o in self.method.execute(xs)]


RUNNERS = {T.OPENVINO: OpenVinoRunner, T.LITERT: LiteRtRunner, T.EXECUTORCH: ExecuTorchRunner}


def target_runner(target: str, files: Dict[str, bytes], spec, threads: int = VERIFY_THREADS):
    """The runner of ``target`` over the files its exporter wrote (``{suffix: bytes}``)."""
    if target == T.OPENVINO:
        return OpenVinoRunner(files, spec, threads)
    (data,) = files.values()
    return RUNNERS[target](data, spec, threads)


def build_target(target: str, policy: Policy, threads: int = VERIFY_THREADS):
    """Export ``policy`` for ``target`` and its runner: (files, runner)."""
    files = TARGET_EXPORTERS[target](policy)
    return files, target_runner(target, files, policy.spec, threads)
