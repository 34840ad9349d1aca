"""The goal-conditioned body (``goal_conditioning_type: hyper``): ML-Agents' ConditionalEncoder.

An observation with ``ObservationType.GOAL_SIGNAL`` conditions the body: the last layer
(``num_conditional_layers`` = 1) is a HyperNetwork whose weight is generated per row from the goal's
encoding (the goal observations' processor outputs, concatenated in observation order: their
normalized vectors). The regular layers before it are ``linear_layer``s + Swish, as in the MLP body,
and the body's input still holds the goal's encoding among the other observations'.

``hypernet`` = Linear(goal, H) Swish Linear(H, H) Swish LayerNorm Linear(H, in * H), LayerNorm
parameter-free (``(x - mean) / sqrt(mean((x - mean)^2) + 1e-5)``); the generated weight is viewed
``[-1, in, H]`` and the layer is ``bmm(h[:, None, :], W).squeeze(1) + bias``, then Swish.

Which observations are the goal: the checkpoint does not record ObservationType; the hypernetwork's
first layer takes the goal encoding's width, so the goal is the set of vector observations whose
widths add up to it. The official ONNX, where there is one, decides (the inputs that feed its
hypernetwork through the goal Concat, ``/network_body/Concat``: :meth:`Goal.onnx_stated`),
cross-checked with that width; without one, a width that several sets fit is an error naming them.
The choice is recorded in the spec (``goal_obs``)."""
from __future__ import annotations

from itertools import combinations
from typing import Dict

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import Bounded, Linear, affine, concat, f64, layer_norm, matmul, swish
from ..core.flow import OnnxFlow, ReferenceFlow, TorchFlow
from ..core.spec import SpecField, as_tuple, check_counts
from ..errors import SpecError
from .base import ENCODE, Block, KeyRules
from .body import observation_shapes, record_body
from .normalizer import Normalizer

GOAL_NONE, GOAL_HYPER = C.GOAL_NONE, C.GOAL_HYPER  # goal_conditioning_type (a "none" goal is a vector like any other)


def _check_conditioning(spec) -> None:
    if spec.goal_conditioning not in (GOAL_NONE, GOAL_HYPER):
        raise SpecError(f"spec field 'goal_conditioning' is {str(spec.goal_conditioning)[:40]!r}, not "
                        f"{GOAL_NONE!r} or {GOAL_HYPER!r}")


def _check_goal_obs(spec) -> None:
    goal = spec.goal_obs
    check_counts("goal_obs", goal, 0, len(spec.obs_sizes) - 1, 1 if spec.goal_conditioning == GOAL_HYPER else 0)
    if spec.goal_conditioning == GOAL_NONE and goal:
        raise SpecError("spec field 'goal_obs' names goal observations, but 'goal_conditioning' is 'none'")
    if list(goal) != sorted(set(goal)) or any(len(spec.obs_shape(i)) != 1 for i in goal):
        raise SpecError(f"spec field 'goal_obs' {list(goal)} is not increasing indices of vector observations")


def _widths(spec):
    """(input width of the generated layer, goal encoding width)."""
    prev = spec.encoded_width if spec.num_layers == 1 else spec.hidden_units
    return prev, sum(spec.obs_sizes[i] for i in spec.goal_obs)


def goal_candidates(shapes, width: int):
    """Every set of vector observations (increasing indices) whose widths add up to ``width``."""
    vec = [(i, s[0]) for i, s in enumerate(shapes) if len(s) == 1]
    if len(vec) > 16:
        return None  # too many to enumerate: the goal must be named
    return [tuple(i for i, _ in c) for k in range(1, len(vec) + 1) for c in combinations(vec, k)
            if sum(n for _, n in c) == width]


class Goal(Block):
    name = "goal"
    stage = ENCODE
    row_as_vector = False  # the generated weight is per row: a batched matmul
    # ``goal_conditioning``: ``hyper`` for the ConditionalEncoder, else ``none`` (``goal_obs`` empty); ``goal_obs``:
    # the goal observations, whose encodings the hypernetwork reads (an official ONNX states them)
    spec_fields = (SpecField("goal_conditioning", 130, GOAL_NONE, check=_check_conditioning,
                             used=lambda v: v != GOAL_NONE),
                   SpecField("goal_obs", 131, (), check=_check_goal_obs, used=bool, decode=as_tuple, stated=True))

    def active(self, spec) -> bool:
        return spec.goal_conditioning == GOAL_HYPER

    def describe(self, spec):
        if spec.goal_conditioning != GOAL_HYPER:
            return []
        return [("body", f" (last layer hypernetwork-generated from goal obs {','.join(map(str, spec.goal_obs))})")]

    def onnx_stated(self, g):
        """The goal observations: the inputs that feed the hypernetwork's first Gemm (through the goal Concat
        and their normalizers), in order. The checkpoint cannot say (ObservationType is the environment's);
        :meth:`claim` cross-checks them with the goal's width."""
        gemm = next((n for n in g.nodes if n.op_type == "Gemm" and len(n.input) > 1
                     and C.HYPER_GOAL_WEIGHT_RE.match(n.input[1])), None)
        if gemm is None:
            return {}
        obs = {C.OBS_INPUT.format(i=i): i for i in range(len(g.graph.input))}
        found = []
        stack, seen = [gemm.input[0]], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in obs:
                found.append(obs[name])
            elif name in g.producer:
                stack.extend(reversed(g.producer[name].input))
        return {"goal_obs": tuple(found)} if found else {}

    def onnx_detect(self, g, found):
        stated = self.onnx_stated(g)
        return {"goal_conditioning": GOAL_HYPER, **stated} if stated else {}

    def claim(self, r: KeyRules) -> None:
        found = r.matching(C.HYPER_RE)
        if not found:
            return
        idx = sorted({int(m.group(1)) for m in found})
        if any(j % 2 for j in idx) or idx != list(range(0, max(idx) + 1, 2)):
            raise r.error(f"unexpected conditional body layer indices {idx}: expected 0, 2, 4... (Swish between)")
        num_layers = len(idx)
        jh = 2 * (num_layers - 1)  # ML-Agents' num_conditional_layers = 1: the last layer is generated
        net = lambda k, p: C.HYPER_NET.format(j=jh, k=k, p=p)  # noqa: E731
        hidden, goal_width = r.shape(r.matrix(net(0, "weight")))
        flat = r.shape(r.matrix(net(5, "weight")))
        if num_layers > 1:
            in_width = r.shape(r.matrix(C.HYPER_LAYER.format(j=0, p="weight")))[1]
        else:
            in_width = flat[0] // max(hidden, 1)
        if flat[0] != (in_width if num_layers == 1 else hidden) * hidden:
            raise r.error(f"wrong shape for '{net(5, 'weight')}': {list(flat)}, expected "
                          f"[{(in_width if num_layers == 1 else hidden) * hidden}, {hidden}] (the generated layer's "
                          f"inputs x {hidden} outputs)")
        shapes = observation_shapes(r, in_width)
        goal = self._goal_obs(r, shapes, goal_width)
        prev = in_width
        for layer in range(num_layers - 1):
            r.linear(C.HYPER_LAYER.format(j=2 * layer, p="{p}"), C.c_body(layer, "weight"), C.c_body(layer, "bias"),
                     hidden, prev)
            prev = hidden
        r.take(C.HYPER_LAYER.format(j=jh, p="bias"), C.C_HYPER_BIAS, (hidden,))
        for k, (out, width) in zip(C.HYPER_NET_LINEARS, ((hidden, goal_width), (hidden, hidden), (prev * hidden, hidden))):
            r.linear(net(k, "{p}"), C.c_hyper(k, "weight"), C.c_hyper(k, "bias"), out, width)
        record_body(r, shapes, hidden, num_layers)
        r.fields.update(goal_conditioning=GOAL_HYPER, goal_obs=goal)

    @staticmethod
    def _goal_obs(r: KeyRules, shapes, goal_width: int):
        given = r.stated.get("goal_obs")
        fits = goal_candidates(shapes, goal_width)
        if given is not None:
            given = tuple(int(i) for i in given)
            if given not in (fits or [given]) or any(i >= len(shapes) or len(shapes[i]) != 1 for i in given):
                raise r.error(f"goal observations {list(given)} do not give the hypernetwork's goal width {goal_width} "
                              f"(observation shapes {[list(s) for s in shapes]})")
            return given
        if not fits:
            raise r.error(f"no set of vector observations is {goal_width} wide, the hypernetwork's goal input "
                          f"(observation shapes {[list(s) for s in shapes]})" if fits is not None else
                          "too many vector observations to tell which are the goal: give the official ONNX (--reference)")
        if len(fits) > 1:
            raise r.error(f"the hypernetwork's goal input is {goal_width} wide and observations "
                          f"{' or '.join(str(list(c)) for c in fits)} could be the goal: the checkpoint does not say "
                          "which (give the official ONNX beside it, or --reference)")
        return fits[0]

    def state_template(self, spec):
        h, L = spec.hidden_units, spec.num_layers
        prev, goal_width = _widths(spec)
        z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        out, width = {}, spec.encoded_width
        for layer in range(L - 1):
            out[C.HYPER_LAYER.format(j=2 * layer, p="weight")] = z(h, width)
            out[C.HYPER_LAYER.format(j=2 * layer, p="bias")] = z(h)
            width = h
        jh = 2 * (L - 1)
        out[C.HYPER_LAYER.format(j=jh, p="bias")] = z(h)
        for k, shape in zip(C.HYPER_NET_LINEARS, ((h, goal_width), (h, h), (prev * h, h))):
            out[C.HYPER_NET.format(j=jh, k=k, p="weight")] = z(*shape)
            out[C.HYPER_NET.format(j=jh, k=k, p="bias")] = z(shape[0])
        return out

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        h = spec.hidden_units
        prev, g = _widths(spec)
        n, width = 0, spec.encoded_width
        for _ in range(spec.num_layers - 1):
            n += width * h + h
            width = h
        return n + h + (g * h + h) + (h * h + h) + (h * prev * h + prev * h)

    # --- ONNX: ML-Agents' opset-9 node sequence ------------------------------------------------
    def onnx_encode(self, f: OnnxFlow) -> None:
        g, spec = f.g, f.spec
        parts = [f.encoded[i] for i in spec.goal_obs]
        goal = g.node("Concat", parts, C.SCOPE_NETWORK_BODY, axis=1)  # get_goal_encoding's torch.cat
        L = spec.num_layers
        for layer in range(L - 1):
            z = f.gemm(f.h, C.c_body(layer, "weight"), C.c_body(layer, "bias"), C.SCOPE_HYPER_LAYER.format(j=2 * layer))
            f.h = self._swish(g, z, C.SCOPE_HYPER_LAYER.format(j=2 * layer + 1))
        jh = 2 * (L - 1)
        net = lambda k: C.SCOPE_HYPER_NET.format(j=jh, k=k)  # noqa: E731
        x = self._swish(g, f.gemm(goal, C.c_hyper(0, "weight"), C.c_hyper(0, "bias"), net(0)), net(1))
        x = self._swish(g, f.gemm(x, C.c_hyper(2, "weight"), C.c_hyper(2, "bias"), net(2)), net(3))
        s = net(4)  # LayerNorm: mean, x - mean (once: torch.onnx shares it), ^2, mean, + eps, sqrt, /
        mean = g.node("ReduceMean", [x], s, axes=[-1], keepdims=1)
        c = g.node("Sub", [x, mean], s)
        var = g.node("ReduceMean", [g.node("Pow", [c, g.const(2.0, s)], s)], s, axes=[-1], keepdims=1)
        y = g.node("Div", [c, g.node("Sqrt", [g.node("Add", [var, g.const(C.LAYER_NORM_EPS, s)], s)], s)], s)
        w = f.gemm(y, C.c_hyper(5, "weight"), C.c_hyper(5, "bias"), net(5))
        lay = C.SCOPE_HYPER_LAYER.format(j=jh)
        prev, _ = _widths(spec)
        w = g.node("Reshape", [w, g.const([-1, prev, spec.hidden_units], lay, np.int64)], lay)
        z = g.squeeze(g.node("MatMul", [g.unsqueeze(f.h, 1, lay), w], lay), 1, lay)
        z = g.node("Add", [z, f.init(C.C_HYPER_BIAS)], lay)
        f.h = self._swish(g, z, C.SCOPE_HYPER_LAYER.format(j=jh + 1))

    @staticmethod
    def _swish(g, z: str, scope: str) -> str:
        return g.node("Mul", [z, g.node("Sigmoid", [z], scope)], scope)

    # --- torch ---------------------------------------------------------------------------------
    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        spec = policy.spec
        if not self.active(spec):
            return
        import torch
        from torch import nn
        from torch.nn.functional import silu

        T = policy.tensors
        module.goal_layers = nn.ModuleList(module.affine(T[C.c_body(k, "weight")], T[C.c_body(k, "bias")])
                                           for k in range(spec.num_layers - 1))
        module.hypernet = nn.ModuleList(module.affine(T[C.c_hyper(k, "weight")], T[C.c_hyper(k, "bias")])
                                        for k in C.HYPER_NET_LINEARS)
        module.hyper_bias = module.frozen(T[C.C_HYPER_BIAS])
        prev, _ = _widths(spec)
        module.fast[self.name] = (tuple(module.goal_layers), tuple(module.hypernet), tuple(spec.goal_obs),
                                  (-1, prev, spec.hidden_units), torch.addmm, torch.bmm, torch.cat, silu)

    def torch_encode(self, f: TorchFlow) -> None:
        """The regular layers as the MLP body runs them (``addmm`` + ``F.silu``); the hypernetwork the
        same, its LayerNorm in ML-Agents' form (mean, ``x - mean``, its square's mean, ``+ eps``,
        sqrt, division: the rounding steps ``core.bounds.layer_norm`` bounds), the generated layer
        one ``bmm`` of each row with its own weight, plus the bias."""
        layers, net, goal_obs, view, addmm, bmm, cat, silu = f.module.fast[self.name]
        h = f.h
        for lin in layers:
            p = torchcompat.module_params(lin)
            h = silu(addmm(p["bias"], h, p["weight"].t()))
        goal = [f.encoded[i] for i in goal_obs]
        x = goal[0] if len(goal) == 1 else cat(goal, dim=1)
        if x.dtype != h.dtype:
            x = x.to(h.dtype)
        for lin in net[:2]:
            p = torchcompat.module_params(lin)
            x = silu(addmm(p["bias"], x, p["weight"].t()))
        c = x - x.mean(dim=-1, keepdim=True)
        x = c / ((c * c).mean(dim=-1, keepdim=True) + C.LAYER_NORM_EPS).sqrt()
        p = torchcompat.module_params(net[2])
        w = addmm(p["bias"], x, p["weight"].t()).view(view)
        f.h = silu(bmm(h.unsqueeze(1), w).squeeze(1) + f.module.hyper_bias)

    # --- the float64 reference -----------------------------------------------------------------
    def reference_init(self, policy):
        spec, T = policy.spec, policy.tensors
        if not self.active(spec):
            return None
        regular = [Linear(T[C.c_body(k, "weight")], T[C.c_body(k, "bias")]) for k in range(spec.num_layers - 1)]
        net = [Linear(T[C.c_hyper(k, "weight")], T[C.c_hyper(k, "bias")]) for k in C.HYPER_NET_LINEARS]
        return regular, net, f64(T[C.C_HYPER_BIAS]), (-1, _widths(spec)[0], spec.hidden_units), spec.goal_obs

    def reference_encode(self, r: ReferenceFlow, w) -> None:
        """The generated layer: ``hypernet`` as Linear/Swish/LayerNorm bounds (the Linear after the
        LayerNorm takes its errors as correlated: they share the LayerNorm's divisor), the reshape
        exact, ``bounds.matmul`` for the row times its generated weight (both inexact), the bias add
        (``u |z|``), Swish."""
        regular, net, bias, view, goal_obs = w
        p = r.precision
        for lin in regular:
            r.h = swish(affine(r.h, lin, r.bounds, p=p), p)
        parts = [r.encoded[i] for i in goal_obs]
        x = parts[0] if len(parts) == 1 else concat(parts)
        x = swish(affine(x, net[0], r.bounds, p=p), p)
        x = swish(affine(x, net[1], r.bounds, p=p), p)
        x = layer_norm(x, float(np.float32(C.LAYER_NORM_EPS)), p)  # errors are zero without bounds: they stay 0
        gw = affine(x, net[2], r.bounds, correlated=True, p=p)
        gw = Bounded(gw.v.reshape(view), gw.err.reshape(view))
        z = matmul(Bounded(r.h.v[:, None, :], r.h.err[:, None, :]), gw, p)
        if r.bounds:  # the generated bias: a parameter, in the weights' format
            z = Bounded(z.v, z.err + (p.rnd(bias) if p.stored else 0.0))
        v = z.v[:, 0, :] + bias
        err = z.err[:, 0, :] + p.rnd(v) if r.bounds else np.zeros_like(v)
        r.h = swish(Bounded(v, err), p)

    # --- probes ----------------------------------------------------------------------------------
    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Goals as tasks give them: a quarter of the rows one-hot (a goal index), a quarter one
        goal shared by every such row (the other observations vary), the rest the normalizer's probes
        (at its scale and beyond its clip) left as they are."""
        spec = policy.spec
        base = Normalizer().probe(policy, rng, rows)
        feed: Dict[str, np.ndarray] = {}
        q = max(rows // 4, 1)
        for i in spec.goal_obs:
            name = C.OBS_INPUT.format(i=i)
            x = base[name].copy()
            n = x.shape[1]
            x[:q] = 0
            x[np.arange(q), rng.integers(0, n, q)] = 1
            if rows > q:
                x[q:2 * q] = x[rng.integers(q, rows)]
            feed[name] = x.astype(np.float32)
        return feed
