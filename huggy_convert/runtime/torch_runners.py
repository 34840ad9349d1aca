"""torch: a ``PolicyModule`` in eager mode (:class:`ModuleRunner`) and a saved ``.pt2`` program loaded
with plain ``torch.export.load`` (:class:`ProgramRunner`)."""
from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError, UnsupportedError
from ..exporters.pt2 import unsafe_reason
from ..exporters.torch_module import build_module
from .base import Feed, RunnerBase


def _numpy(o) -> np.ndarray:
    """A torch output as numpy on the CPU (float outputs as float32)."""
    o = o.detach()
    return o.float().cpu().numpy() if o.dtype.is_floating_point else o.cpu().numpy()


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


class ModuleRunner(RunnerBase):
    """A ``PolicyModule`` (exporters.torch_module) on the device its parameters are on. ``sample``: the
    module's own ``sample`` with the seed's CPU noise, or the injected ``noise``; with ``carry`` (the
    default) also the carried state, which costs a deterministic forward (verification, which runs that
    forward in ``infer``, leaves it out)."""

    runtime = "torch"

    def __init__(self, module, dtype: Optional[str] = None, build_seconds: float = 0.0, carry: bool = True):
        params = list(module.parameters())
        self.module = module
        self.device = str(params[0].device) if params else "cpu"
        self.dtype = dtype or (_dtype_name(params[0]) if params else "float32")
        self.build_seconds = build_seconds
        self.carry = carry
        self._dev = params[0].device if params else "cpu"

    @classmethod
    def build(cls, policy, device: str = "cpu", dtype: str = "float32") -> "ModuleRunner":
        """The module of ``policy`` on ``device`` with weights in ``dtype`` (exporters.build_module)."""
        t0 = time.perf_counter()
        mod = build_module(policy, device=device, dtype=dtype)
        return cls(mod, dtype, time.perf_counter() - t0)

    def pinned(self) -> Dict[str, str]:
        """The dtype of each buffer the module keeps in float32 whatever its weights' dtype."""
        return self.module.pinned_dtypes() if hasattr(self.module, "pinned_dtypes") else {}

    def _inputs(self, feed: Feed):
        import torch

        return [torch.from_numpy(np.ascontiguousarray(feed[n])).to(self._dev) for n in self.module.input_names]

    def infer(self, feed: Feed) -> Feed:
        import torch

        xs = self._inputs(feed)
        with torch.no_grad():
            out = self.module(*xs)
        return {n: _numpy(o) for n, o in zip(self.module.output_names, out)}

    def sample(self, feed: Feed, seed: Optional[int] = None, noise: Optional[np.ndarray] = None) -> Feed:
        """The sampled outputs and, with ``carry``, the carried state (``IOSignature.feedback``: the noise
        does not touch it; ``PolicyModule.sample`` does not return it, so the deterministic forward of
        the same inputs gives it)."""
        import torch

        sig = self.module.spec.io_signature()
        xs = self._inputs(feed)
        with torch.no_grad():
            out = self.module.sample(*xs, seed=seed, noise=None if noise is None else torch.from_numpy(noise))
            res = {n: _numpy(o) for n, o in zip(sig.sampled_output_names(), out)}
            carried = list(sig.feedback()) if self.carry else []
            if carried:
                det = dict(zip(self.module.output_names, self.module(*xs)))
                res.update({n: _numpy(det[n]) for n in carried})
        return res


class ProgramRunner(RunnerBase):
    """A saved ``.pt2`` (the deterministic forward), loaded with ``torch.export.load`` and run on the CPU.
    ``buffers``: the dtype of each normalizer buffer or constant the program holds; ``dtype``: the
    program's (float16 where a normalizer buffer is). ``data``: the file's bytes, already read."""

    runtime = "torch.export"

    def __init__(self, path, input_names: Sequence[str], output_names: Sequence[str], data: Optional[bytes] = None):
        import torch

        t0 = time.perf_counter()
        self.path = path
        if data is None:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise InputError(f"cannot read the program ({exc.strerror or type(exc).__name__})", path) from None
        unsafe = unsafe_reason(data)  # torch.export.load unpickles with weights_only=False: check first
        if unsafe:
            raise InputError(f"not loaded: {unsafe}; torch.export.load would unpickle it, which can run code", path)
        ep = torch.export.load(io.BytesIO(data))
        self.program = ep.module()
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.buffers = {k: _dtype_name(v) for k, v in ep.state_dict.items() if k.startswith("norm")}
        self.buffers.update({k: _dtype_name(v) for k, v in ep.constants.items() if str(k).startswith("norm")})
        self.dtype = "float16" if any(v == "float16" for v in self.buffers.values()) else "float32"
        self.build_seconds = time.perf_counter() - t0

    def pinned(self) -> Dict[str, str]:
        """The dtype of each normalizer buffer or constant the program holds (``buffers``)."""
        return self.buffers

    def infer(self, feed: Feed) -> Feed:
        import torch

        xs = [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self.input_names]
        with torch.no_grad():
            out = self.program(*xs)
        return {n: _numpy(o) for n, o in zip(self.output_names, out)}

    def sample(self, feed: Feed, seed: Optional[int] = None, noise: Optional[np.ndarray] = None) -> Feed:
        raise UnsupportedError("a saved program holds the deterministic forward only: sampling is not available",
                               self.path)


# --- function forms (the modes call these) ------------------------------------------------------
def module_runner(module) -> Callable[[Feed], Feed]:
    """``infer`` of a :class:`ModuleRunner` over ``module``."""
    return ModuleRunner(module).infer


def program_runner(path, input_names, output_names) -> Tuple[Callable[[Feed], Feed], Dict[str, str]]:
    """(``infer``, normalizer buffer dtypes) of a :class:`ProgramRunner` over the ``.pt2`` at ``path``."""
    r = ProgramRunner(path, input_names, output_names)
    return r.infer, r.buffers
