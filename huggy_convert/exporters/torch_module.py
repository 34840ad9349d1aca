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

from typing import List, Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .. import contract as C
from ..converter import Policy
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


def _in_place_ok() -> bool:
    """In place only where autograd cannot need the overwritten value, and never in a traced graph
    (an exported program stays functional: sub/div/clamp/mul)."""
    return not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def draw_noise(spec, batch: int, seed: int):
    """(normal noise [batch, A], uniform [batch, branches]) drawn on the CPU from ``seed``."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    eps = torch.randn(batch, spec.continuous_size, generator=g, dtype=torch.float32)
    u = torch.rand(batch, len(spec.discrete_branches), generator=g, dtype=torch.float32)
    return eps, u


class PolicyModule(nn.Module):
    def __init__(self, policy: Policy, dtype: torch.dtype = torch.float32,
                 normalizer_dtype: torch.dtype = torch.float32):
        super().__init__()
        spec, T = policy.spec, policy.tensors
        self.spec = spec
        self.compute_dtype = dtype
        self.normalizer_dtype = normalizer_dtype
        self._pinned: List[str] = []
        for i in range(len(spec.obs_sizes)):
            if spec.normalize:
                # the mean and the policy's divisor: the same float32 numbers as the ONNX written beside
                # it (IEEE, or adopted from the official ONNX), never torch's CPU sqrt (host-dependent)
                for name, value in ((f"norm{i}_mean", T[C.c_norm(i, C.NORM_MEAN)]), (f"norm{i}_div", policy.divisor(i))):
                    self.register_buffer(name, _t(value, normalizer_dtype).reshape(-1))
                    self._pinned.append(name)
        self.body = nn.ModuleList()
        for layer in range(spec.num_layers):
            self.body.append(Affine(_t(T[C.c_body(layer, "weight")], dtype), _t(T[C.c_body(layer, "bias")], dtype)))
        if spec.memory_size:
            for p in C.LSTM_PARAMS:
                self.register_parameter(f"lstm_{p}", nn.Parameter(_t(T[C.c_lstm(p)], dtype), requires_grad=False))
        if spec.continuous_size:
            self.mu = Affine(_t(T[C.C_MU_W], dtype), _t(T[C.C_MU_B], dtype))
            if spec.conditional_sigma:
                self.log_sigma = Affine(_t(T[C.C_LOG_SIGMA_W], dtype), _t(T[C.C_LOG_SIGMA_B], dtype))
            else:
                self.log_sigma = nn.Parameter(_t(T[C.C_LOG_SIGMA], dtype), requires_grad=False)
        self.branches = nn.ModuleList()
        for b, n in enumerate(spec.discrete_branches):
            self.branches.append(Affine(_t(T[C.c_branch(b, "weight")], dtype), _t(T[C.c_branch(b, "bias")], dtype)))
        # plain-Python facts for a lean forward (at batch 1 every Python step shows in the latency)
        self._n_obs = len(spec.obs_sizes)
        self._norm_keys = tuple((f"norm{i}_mean", f"norm{i}_div") for i in range(self._n_obs)) if spec.normalize else ()
        # plain tuples of the submodules (not registered twice); their parameters are read per call,
        # never cached: torch.export and .to() swap them
        self._layers = tuple(self.body)
        self._mu = (self.mu,) if spec.continuous_size else ()
        self._memory_size = spec.memory_size
        self._n_branches = len(spec.discrete_branches)
        self._clip_actions = bool(spec.continuous_size) and not spec.tanh_squash
        self._one_row_shape = (self._n_obs == 1 and spec.normalize and self._clip_actions and not spec.memory_size
                               and not spec.discrete_branches)

    # keep the normalizer float32 whatever .half()/.to(dtype) does to the rest
    def _apply(self, fn, recurse=True):
        saved = {n: self._buffers[n] for n in self._pinned}
        super()._apply(fn, recurse)
        for n, old in saved.items():
            moved = self._buffers[n]
            self._buffers[n] = old.to(device=moved.device, dtype=self.normalizer_dtype)
        return self

    @property
    def input_names(self) -> List[str]:
        return self.spec.input_names()

    @property
    def output_names(self) -> List[str]:
        return self.spec.deterministic_output_names()

    def _encode(self, inputs, inplace: bool):
        """(body features, new memories or None, vec): features [batch, hidden] in the compute
        dtype, or [hidden] when ``vec`` (one row, run eagerly: see below).

        Written for batch-1 latency, where each torch op costs ~1.5 us of dispatch and the Python
        around them counts too: one pass, locals, in place wherever autograd is off (the same
        arithmetic, fewer allocations), and one row as a vector: ``addmv`` on the contiguous
        [out, in] weight is the fastest GEMV torch has here, ~8 us a forward ahead of ``addmm``
        (benchmarks/latency.py --ops). Under torch.compile / torch.export the graph is the same
        ``addmm`` for every batch size (no shape-dependent branch is traced)."""
        buffers, ndt, cdt = self._buffers, self.normalizer_dtype, self.compute_dtype
        norm_keys = self._norm_keys
        parts = []
        for i in range(self._n_obs):
            x = inputs[i]
            if norm_keys:
                mean_key, div_key = norm_keys[i]
                if x.dtype != ndt:
                    x = x.to(ndt)
                x = x - buffers[mean_key]
                if inplace:
                    x = x.div_(buffers[div_key]).clamp_(-C.NORM_CLIP, C.NORM_CLIP)
                else:
                    x = torch.clamp(x / buffers[div_key], -C.NORM_CLIP, C.NORM_CLIP)
            if x.dtype != cdt:
                x = x.to(cdt)
            parts.append(x)
        h = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        vec = h.shape[0] == 1 and not self._memory_size and not torch.compiler.is_compiling()
        if vec:
            h = h[0]
        for lin in self._layers:
            p = lin._parameters
            z = torch.addmv(p["bias"], p["weight"], h) if vec else torch.addmm(p["bias"], h, p["weight"].t())
            # Swish as ML-Agents exports it (Sigmoid, Mul; F.silu rounds differently): the same products
            # either way, z.mul_ only skips an allocation
            h = z.mul_(torch.sigmoid(z)) if inplace else z * torch.sigmoid(z)
        if not self._memory_size:
            return h, None, vec
        hs = self._memory_size // 2
        m = inputs[-1].to(cdt)[:, 0, :]
        h0, c0 = m[:, :hs], m[:, hs:]
        gates = (h @ self.lstm_weight_ih.t() + self.lstm_bias_ih) + (h0 @ self.lstm_weight_hh.t() + self.lstm_bias_hh)
        i_g, f_g, g_g, o_g = gates.chunk(4, dim=1)
        c1 = torch.sigmoid(f_g) * c0 + torch.sigmoid(i_g) * torch.tanh(g_g)
        h1 = torch.sigmoid(o_g) * torch.tanh(c1)
        return h1, torch.cat([h1, c1], dim=1).unsqueeze(1).to(torch.float32), False

    def _masks(self, inputs):
        return inputs[self._n_obs] if self.spec.discrete_branches else None

    def _probs(self, h, masks):
        probs = []
        start = 0
        for b, lin in enumerate(self.branches):
            n = self.spec.discrete_branches[b]
            mask = masks[:, start:start + n].to(torch.float32)
            start += n
            logits = lin(h).to(torch.float32)
            logits = logits * mask - C.MASK_PENALTY * (1.0 - mask)
            probs.append(torch.softmax(logits, dim=1))
        return probs

    def forward(self, *inputs):
        inplace = _in_place_ok()
        if inplace and self._one_row_shape and inputs[0].shape[0] == 1:
            return self._forward_row(inputs[0])
        h, new_mem, vec = self._encode(inputs, inplace)
        out = []
        for mu_mod in self._mu:
            p = mu_mod._parameters
            mu = torch.addmv(p["bias"], p["weight"], h)[None] if vec else torch.addmm(p["bias"], h, p["weight"].t())
            if mu.dtype != torch.float32:
                mu = mu.float()
            if self._clip_actions:
                if inplace:
                    mu = mu.clamp_(-C.ACTION_CLIP, C.ACTION_CLIP).div_(C.ACTION_CLIP)
                else:
                    mu = torch.clamp(mu, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP
            out.append(mu)
        if self._n_branches:
            h2 = h[None] if vec else h
            out.append(torch.cat([torch.argmax(p, dim=1, keepdim=True) for p in self._probs(h2, self._masks(inputs))],
                                 dim=1))
        if new_mem is not None:
            out.append(new_mem)
        return tuple(out)

    def _forward_row(self, x):
        """``forward`` for one row of the common shape (one normalized observation, a clipped
        continuous head, no memory, no branches), eager with autograd off: the same ops as the
        general path takes for that row (addmv, in place), without its bookkeeping, which is
        ~3 us of a ~100 us batch-1 forward (benchmarks/latency.py)."""
        buffers = self._buffers
        mean_key, div_key = self._norm_keys[0]
        if x.dtype != self.normalizer_dtype:
            x = x.to(self.normalizer_dtype)
        h = (x[0] - buffers[mean_key]).div_(buffers[div_key]).clamp_(-C.NORM_CLIP, C.NORM_CLIP)
        if h.dtype != self.compute_dtype:
            h = h.to(self.compute_dtype)
        for lin in self._layers:
            p = lin._parameters
            z = torch.addmv(p["bias"], p["weight"], h)
            h = z.mul_(torch.sigmoid(z))
        p = self._mu[0]._parameters
        mu = torch.addmv(p["bias"], p["weight"], h)
        if mu.dtype != torch.float32:
            mu = mu.float()
        return (mu.clamp_(-C.ACTION_CLIP, C.ACTION_CLIP).div_(C.ACTION_CLIP)[None],)

    def draw_noise(self, batch: int, seed: int):
        """The noise ``sample`` uses for ``seed``: drawn on the CPU, the same on every device."""
        return draw_noise(self.spec, batch, seed)

    def sample(self, *inputs, seed: Optional[int] = None, noise=None, uniform=None):
        """Stochastic actions: (continuous_actions?, discrete_actions?) in ML-Agents' order."""
        masks = self._masks(inputs)
        batch = inputs[0].shape[0]
        if seed is not None:
            eps, u = self.draw_noise(batch, seed)
            noise = eps if noise is None else noise
            uniform = u if uniform is None else uniform
        if (self.spec.continuous_size and noise is None) or (self.spec.discrete_branches and uniform is None):
            raise ValueError("sample() needs a seed, or injected noise for every head")
        dev = inputs[0].device
        h, _, vec = self._encode(inputs, _in_place_ok())
        if vec:
            h = h[None]
        out = []
        if self.spec.continuous_size:
            mu = self.mu(h).to(torch.float32)
            if self.spec.conditional_sigma:
                log_sigma = torch.clamp(self.log_sigma(h).to(torch.float32), C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX)
            else:
                log_sigma = mu * 0 + self.log_sigma.to(torch.float32)
            s = mu + noise.to(dev) * torch.exp(log_sigma)
            out.append(torch.tanh(s) if self.spec.tanh_squash else torch.clamp(s, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP)
        if self.spec.discrete_branches:
            u = uniform.to(dev)
            picks = []
            for b, p in enumerate(self._probs(h, masks)):
                cdf = torch.cumsum(p, dim=1)
                idx = (cdf < u[:, b:b + 1]).sum(dim=1, keepdim=True)
                picks.append(torch.clamp(idx, max=p.shape[1] - 1))
            out.append(torch.cat(picks, dim=1))
        return tuple(out)


def build_module(policy: Policy, device: str = "cpu", dtype: str = "float32",
                 normalizer_dtype: str = "float32") -> PolicyModule:
    """The module on ``device`` (cpu, cuda, npu, auto) with weights in ``dtype``.

    ``normalizer_dtype`` other than float32 exists only to demonstrate (and test) the failure
    it causes; never use it for deployment."""
    dev = resolve_device(device)
    m = PolicyModule(policy, torch_dtype(dtype), torch_dtype(normalizer_dtype))
    return m.to(dev).eval()


def example_inputs(spec, batch: int = 2, device: str = "cpu"):
    xs = [torch.zeros(batch, n, device=device) for n in spec.obs_sizes]
    if spec.discrete_branches:
        xs.append(torch.ones(batch, sum(spec.discrete_branches), device=device))
    if spec.memory_size:
        xs.append(torch.zeros(batch, 1, spec.memory_size, device=device))
    return tuple(xs)


def export_program(module: PolicyModule):
    """torch.export the module's forward with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    ins = example_inputs(module.spec, 2, next(module.parameters()).device)
    shapes = tuple({0: batch} for _ in ins)
    with torch.no_grad():
        return torch.export.export(module, ins, dynamic_shapes=(shapes,))


def save_program(ep, path) -> None:
    import io

    from ..converter import atomic_write_bytes

    buf = io.BytesIO()
    torch.export.save(ep, buf)
    atomic_write_bytes(path, buf.getvalue())
