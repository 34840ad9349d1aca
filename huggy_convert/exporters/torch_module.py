"""An NPU-ready ``nn.Module`` built from spec + tensors.

- ``forward(*inputs)`` returns the deterministic outputs of every head (ML-Agents' order:
  ``deterministic_continuous_actions``, ``deterministic_discrete_actions``, ``recurrent_out``);
  inputs are ``obs_0..obs_k`` then ``action_masks`` / ``recurrent_in`` when the spec has them.
- ``sample(*inputs, seed=...)`` draws its noise on the CPU from ``seed`` and moves it to the
  device, so one seed gives one sample on every device; ``noise=`` injects it directly.
- ``dtype`` casts the weights only. The normalizer statistics and the normalization math stay
  float32 (Huggy's running_variance sums pass fp16's 65504 and overflow); the module keeps
  them float32 even through ``.half()`` / ``.to(dtype)``. The masking and softmax of discrete
  heads run in float32 too (1e8 is inf in fp16).
- No data-dependent Python control flow: it runs under ``torch.compile`` and torch.export. Run
  eagerly, a single row takes a faster GEMV path (``addmv``) and, with autograd off, elementwise
  ops work in place; compiled or exported, the graph is the same functional ``addmm`` form for
  every batch.
"""
from __future__ import annotations

import functools
import io
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .. import blocks
from .. import contract as C
from ..core import torchcompat
from ..core.files import atomic_write_bytes
from ..core.flow import MASK, TorchFlow
from ..core.policy import Policy
from .devices import resolve_device, torch_dtype


def _t(a: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32, copy=True)).to(dtype)


class Affine(nn.Module):
    """``nn.Linear`` without its random initialisation: the weights come from the policy
    (``weight`` [out, in], contiguous, as ML-Agents keeps it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def apply_to(self, h, vec: bool):
        """The layer on ``h``: one row as a vector (``vec``, eager) takes ``addmv`` on the contiguous
        [out, in] weight, the fastest GEMV torch has here (benchmarks/latency.py --ops); a batch, and
        every traced graph, ``addmm``. It reads its own parameter dict: nn.Module's attribute lookup
        costs ~1 us a call, a tenth of Huggy's batch-1 forward over its four layers. Never cached:
        torch.export and ``.to()`` swap the tensors."""
        p = torchcompat.module_params(self)
        if vec:
            return torch.addmv(p["bias"], p["weight"], h)
        return torch.addmm(p["bias"], h, p["weight"].t())


def noise_widths(spec) -> Tuple[int, int]:
    """(the normal noise's columns, the uniform noise's): the sampled outputs' ``Port.noise``, added up."""
    ports = spec.io_signature().noise_outputs()
    return (sum(p.width for p in ports if p.noise == "normal"), sum(p.width for p in ports if p.noise == "uniform"))


def draw_noise(spec, batch: int, seed: int):
    """(normal noise [batch, its columns], uniform [batch, its columns]) drawn on the CPU from ``seed``,
    the normal first (``noise_widths``)."""
    normal, uniform = noise_widths(spec)
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    eps = torch.randn(batch, normal, generator=g, dtype=torch.float32)
    u = torch.rand(batch, uniform, generator=g, dtype=torch.float32)
    return eps, u


class PolicyModule(nn.Module):
    """The policy as a module: each block (``huggy_convert.blocks``) registers its parameters here
    (``torch_init``; their names are part of the ``.pt2``) and runs its part of the one forward path
    (``_run``), which ``forward`` and ``sample`` share."""

    def __init__(self, policy: Policy, dtype: torch.dtype = torch.float32,
                 normalizer_dtype: torch.dtype = torch.float32):
        super().__init__()
        spec = policy.spec
        self.spec = spec
        self.compute_dtype = dtype
        self.normalizer_dtype = normalizer_dtype
        self._pinned_names: List[str] = []
        # what each block's forward reads per call, as plain Python (submodules, buffer names): at
        # batch 1 each nn.Module attribute lookup (~1 us) shows in the latency
        self.fast: Dict[str, object] = {}
        for block in blocks.compute_order():  # every block, present or not (see Block.torch_init)
            block.torch_init(self, policy, dtype, normalizer_dtype)
        # plain-Python facts for a lean forward (at batch 1 every Python step shows in the latency):
        # each stage's hooks bound once, in registry order
        self._input_names = tuple(spec.input_names())
        self._observe = tuple(b.torch_observe for b in blocks.in_stage(blocks.OBSERVE, spec) if b.has("torch_observe"))
        own, appending = blocks.encoding_order(spec)
        self._own_obs = own  # the observations whose encodings are concatenated first (observation order)
        self._append = tuple(b.torch_append for b in appending)
        self._encode = tuple(b.torch_encode for b in blocks.in_stage(blocks.ENCODE, spec) if b.has("torch_encode"))
        self._output = tuple(b.torch_output for b in blocks.active(spec) if b.has("torch_output"))  # output order
        self._row_as_vector = all(b.row_as_vector for b in blocks.active(spec))
        # each block's eager form with autograd off (Block.torch_row), and where every block of the forward has
        # one and there is a single vector input, their chain: one row then runs without the flow
        self.rows = {b.name: r for b in blocks.active(spec) if (r := b.torch_row(self)) is not None}
        self._row_plan = self._plan(spec)

    def _plan(self, spec):
        observe = [b for b in blocks.in_stage(blocks.OBSERVE, spec) if b.has("torch_observe")]
        encode = [b for b in blocks.in_stage(blocks.ENCODE, spec) if b.has("torch_encode")]
        output = [b for b in blocks.active(spec) if b.has("torch_output")]
        if (not self._row_as_vector or len(self._input_names) != 1 or self._own_obs != (0,) or self._append
                or len(observe) != 1 or not all(b.name in self.rows for b in observe + encode + output)
                or 0 not in self.rows[observe[0].name]):
            return None
        return self.rows[observe[0].name][0], tuple(self.rows[b.name] for b in encode), \
            tuple(self.rows[b.name] for b in output)

    # --- what the blocks register ---------------------------------------------------------
    def affine(self, weight: np.ndarray, bias: np.ndarray) -> Affine:
        """A Linear with these weights, in the compute dtype."""
        return Affine(_t(weight, self.compute_dtype), _t(bias, self.compute_dtype))

    def frozen(self, value: np.ndarray) -> nn.Parameter:
        """A frozen parameter in the compute dtype."""
        return nn.Parameter(_t(value, self.compute_dtype), requires_grad=False)

    def pin(self, name: str, value: np.ndarray) -> None:
        """A buffer kept in the normalizer dtype (float32) whatever ``.half()`` / ``.to(dtype)`` does."""
        self.register_buffer(name, _t(value, self.normalizer_dtype).reshape(-1))
        self._pinned_names.append(name)

    def pinned(self, name: str) -> torch.Tensor:
        """The pinned buffer ``name`` (read per call: ``.to()`` replaces it)."""
        return torchcompat.module_buffers(self)[name]

    def pinned_dtypes(self) -> Dict[str, str]:
        """The pinned (normalizer) buffers and their dtypes, e.g. ``{'norm0_mean': 'float32'}``."""
        return {n: str(getattr(self, n).dtype).replace("torch.", "") for n in self._pinned_names}

    # keep the normalizer float32 whatever .half()/.to(dtype) does to the rest: every conversion goes
    # through nn.Module._apply (a private hook); where a torch does not route them there
    # (torchcompat.MODULE_APPLY), the public conversions (CONVERSIONS, below the class) do the same
    # around their own call
    def _keeping_pinned(self, convert):
        saved = {n: getattr(self, n) for n in self._pinned_names}
        convert()
        for n, old in saved.items():
            moved = getattr(self, n)
            self.register_buffer(n, old.to(device=moved.device, dtype=self.normalizer_dtype))
        # the compute dtype is the weights' (.half() / .to(float64) cast them): what the normalized input is cast to
        self.compute_dtype = next((p.dtype for p in self.parameters() if p.is_floating_point()), self.compute_dtype)
        return self

    def _apply(self, fn, recurse=True):
        apply = super()._apply
        if not torchcompat.available(torchcompat.MODULE_APPLY):
            return apply(fn, recurse)  # as a torch that never calls this hook: the public conversions pin
        return self._keeping_pinned(lambda: apply(fn, recurse))

    def _public(self, method, *args, **kwargs):
        """``method`` (one of :data:`CONVERSIONS`, unbound) on this module, the normalizer kept float32."""
        if torchcompat.available(torchcompat.MODULE_APPLY):
            return method(self, *args, **kwargs)  # _apply pins
        return self._keeping_pinned(lambda: method(self, *args, **kwargs))

    @property
    def input_names(self) -> List[str]:
        return self.spec.input_names()

    @property
    def output_names(self) -> List[str]:
        return self.spec.deterministic_output_names()

    def _run(self, inputs, sampling: Optional[Dict[str, torch.Tensor]]):
        """The one forward path: the observe blocks encode each observation, their encodings are
        concatenated, the encode blocks take them to the features, then every output block gives
        its outputs in Unity's order (deterministic, or sampled with ``sampling``'s noise).

        Written for batch-1 latency, where each torch op costs ~1.5 us of dispatch and each Python
        call ~0.5 us: the hooks are bound once (``_observe``/``_encode``/``_output``) and read what
        they need from ``fast``; one kernel per step (``F.silu`` for Swish); in place wherever
        autograd is off (the same arithmetic and bits, fewer allocations); one row as a vector
        (``addmv``, ~8 us a forward ahead of ``addmm``: benchmarks/latency.py --ops). Huggy at batch
        1 is then 4 GEMVs and 10 small ops. Under torch.compile / torch.export the graph is the same
        functional ``addmm`` form for every batch size."""
        eager = not torch.compiler.is_compiling()  # a traced graph stays functional: sub/div/clamp/silu, addmm
        vec = eager and self._row_as_vector and inputs[0].size(0) == 1
        inplace = eager and not torch.is_grad_enabled()  # only where autograd cannot need the overwritten value
        f = TorchFlow(self, dict(zip(self._input_names, inputs)), vec, inplace, sampling=sampling)
        for observe in self._observe:
            observe(f)
        enc, own = f.encoded, self._own_obs  # ML-Agents' ObservationEncoder: in observation order, ...
        h = enc[own[0]] if len(own) == 1 else (torch.cat([enc[i] for i in own], dim=1) if own else None)
        if self._append:  # ... then what the appending blocks (attention) make of them
            f.h = h
            h = torch.cat(([h] if h is not None else []) + [a(f) for a in self._append], dim=1)
        f.h = h[0] if vec else h
        for encode in self._encode:
            encode(f)
        out = []
        for output in self._output:
            out += output(f)
        return tuple(out)

    def forward(self, *inputs):
        """The deterministic outputs (``spec.deterministic_output_names()``). One row, eager with autograd
        off, where the spec has a row plan: the blocks' rows chained, the flow skipped (at batch 1 each
        Python step runs on caches the weights just evicted: the plan is the fewest)."""
        plan = self._row_plan
        if plan is not None and not torch.compiler.is_compiling() and not torch.is_grad_enabled() \
                and inputs[0].size(0) == 1:  # eager first: a traced batch is never compared with 1
            observe, encode, output = plan
            h = observe(self, inputs[0])[0]
            for e in encode:
                h = e(self, h)
            out = []
            for o in output:
                out += o(self, h)
            return tuple(out)
        return self._run(inputs, None)

    def draw_noise(self, batch: int, seed: int):
        """The noise ``sample`` uses for ``seed``: drawn on the CPU, the same on every device."""
        return draw_noise(self.spec, batch, seed)

    def sample(self, *inputs, seed: Optional[int] = None, noise=None, uniform=None):
        """Stochastic actions (``spec.sampled_output_names()``): (continuous_actions?, discrete_actions?)."""
        if seed is not None:
            eps, u = self.draw_noise(inputs[0].shape[0], seed)
            noise = eps if noise is None else noise
            uniform = u if uniform is None else uniform
        normal, uniform_width = noise_widths(self.spec)
        if (normal and noise is None) or (uniform_width and uniform is None):
            raise ValueError("sample() needs a seed, or injected noise for every head")
        return self._run(inputs, {"noise": noise, "uniform": uniform})


# nn.Module's public methods that go through _apply: PolicyModule overrides each this torch has, so that
# where a torch does not call the private hook (torchcompat.MODULE_APPLY) they still keep the normalizer float32
CONVERSIONS = ("to", "to_empty", "cpu", "cuda", "ipu", "xpu", "mtia", "type", "float", "double", "half", "bfloat16",
               "share_memory")


def _pinning(name: str):
    convert = getattr(nn.Module, name)

    @functools.wraps(convert)
    def method(self, *args, **kwargs):
        return self._public(convert, *args, **kwargs)
    return method


for _name in CONVERSIONS:
    if hasattr(nn.Module, _name):
        setattr(PolicyModule, _name, _pinning(_name))


def build_module(policy: Policy, device: str = "cpu", dtype: str = "float32",
                 normalizer_dtype: str = "float32") -> PolicyModule:
    """The module on ``device`` (cpu, cuda, npu, auto) with weights in ``dtype``.

    ``normalizer_dtype`` other than float32 exists only to demonstrate (and test) the failure
    it causes; never use it for deployment."""
    dev = resolve_device(device)
    m = PolicyModule(policy, torch_dtype(dtype), torch_dtype(normalizer_dtype))
    return m.to(dev).eval()


def example_inputs(spec, batch: int = 2, device: str = "cpu"):
    """One tensor per input port: zeros, and every action allowed."""
    def one(port):
        shape = [batch if d == C.BATCH_DIM else d for d in port.dims]
        return (torch.ones if port.kind == MASK else torch.zeros)(*shape, device=device)

    return tuple(one(p) for p in spec.io_signature().inputs)


def export_program(module: PolicyModule):
    """torch.export the module's forward with a dynamic batch dimension.

    The nodes' ``stack_trace`` metadata (this package's absolute path and line numbers) is dropped:
    with it the saved bytes would depend on where the package is installed and on edits that change
    no computation; without it the same policy gives the same ``.pt2`` everywhere."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    ins = example_inputs(module.spec, 2, next(module.parameters()).device)
    shapes = tuple({0: batch} for _ in ins)
    with torch.no_grad():
        ep = torch.export.export(module, ins, dynamic_shapes=(shapes,))
    for node in ep.graph.nodes:
        node.meta.pop("stack_trace", None)
    return ep


def save_program(ep, path) -> None:
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    atomic_write_bytes(path, buf.getvalue())
