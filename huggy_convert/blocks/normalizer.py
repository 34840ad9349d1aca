"""Vector observations and their normalizers: ``clamp((x - mean) / sqrt(variance / steps), -5, 5)``
per observation, then one Concat. ``running_variance`` is a running sum of squares; the divisor is
the policy's own float32 tensor (IEEE, or adopted from the official ONNX: ``converter.reference``),
and the statistics stay float32 in every dtype (fp16 overflows them).

Stable-Baselines3's VecNormalize (``norm_rule`` ``vecnorm``) is the same graph with its own numbers:
``clip((x - mean) / sqrt(var + eps), -clip_obs, clip_obs)``, which SB3 computes in float64 from float64
statistics; the canonical policy holds them rounded once to float32 (the mean, and the divisor
``sqrt(var + eps)`` as steps = 1 and variance = divisor², which gives it back bit for bit:
``onnx_recover``), and the float64 reference bounds that rounding too (``reference_observe``)."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import Bounded, clip, f64, stored
from ..core.flow import OBSERVATION, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.numerics import U32, one_step_variance
from ..core.spec import OBS_VECTOR, SpecField
from ..errors import InputError, SpecError
from .base import OBSERVE, Block, KeyRules


def mean_std(policy, i: int):
    """Observation ``i``'s normalizer mean and standard deviation, in float64."""
    T = policy.tensors
    mean = T[C.c_norm(i, C.NORM_MEAN)].astype(np.float64)
    steps = float(T[C.c_norm(i, C.NORM_STEPS)].reshape(-1)[0])
    return mean, np.sqrt(T[C.c_norm(i, C.NORM_VAR)].astype(np.float64) / steps)


def _check_rule(spec) -> None:
    rules = (C.NORM_RULE_MLAGENTS, C.NORM_RULE_VECNORM)
    if spec.norm_rule not in rules:
        raise SpecError(f"spec field 'norm_rule' is {str(spec.norm_rule)[:40]!r}, not one of {', '.join(rules)}")
    for name, least, strict in (("norm_clip", 0.0, True), ("norm_eps", 0.0, False)):
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < least or (strict and v == least):
            raise SpecError(f"spec field '{name}' is {str(v)[:40]!r}, not a finite number {'>' if strict else '>='} {least:g}")


class Normalizer(Block):
    name = "normalizer"
    stage = OBSERVE
    obs_rank, obs_kind, obs_dims = 1, OBS_VECTOR, "[batch, width]"
    # the rule (ML-Agents' or SB3's VecNormalize), its clip and its epsilon: stated by the importer
    spec_fields = (SpecField("norm_rule", 502, C.NORM_RULE_MLAGENTS, check=_check_rule,
                             used=lambda v: v != C.NORM_RULE_MLAGENTS, stated=True),
                   SpecField("norm_clip", 503, C.NORM_CLIP, used=lambda v: v != C.NORM_CLIP, decode=float, stated=True),
                   SpecField("norm_eps", 504, 0.0, used=bool, decode=float, stated=True))

    def onnx_detect(self, g, found):
        """Normalized: a Sub (its mean) reads the first vector observation."""
        vectors = [C.OBS_INPUT.format(i=i) for i, s in enumerate(g.obs) if len(s) == 1]
        return {"normalize": any(n.op_type == "Sub" and n.input[:1] == vectors[:1] for n in g.nodes) if vectors else False}

    def claim(self, r: KeyRules) -> None:
        sd = r.sd
        norm_idx = r.indices(C.NORM_RE)
        for m in r.matching(C.NORM_RE):
            if m.group(2) not in C.NORM_FIELDS:
                raise r.error(f"unexpected key '{m.group(0)}'")
        # gaps are other kinds' observations (an entity set between two vectors): the body checks the indices
        sizes = []
        for i in norm_idx:
            pre = C.NORM_PREFIX.format(i=i)
            for f in C.NORM_FIELDS:
                r.require(pre + f)
            mean_t = sd[pre + C.NORM_MEAN]
            if len(r.shape(mean_t)) != 1:
                raise r.error(f"wrong shape for '{pre + C.NORM_MEAN}': {list(r.shape(mean_t))}, expected [n]")
            n = r.shape(mean_t)[0]
            sizes.append(n)
            # taken in ML-Agents' registration order (steps, mean, variance): converter.state_dict
            # writes a state dict back in the order the keys were claimed
            steps_t = sd[pre + C.NORM_STEPS]
            if steps_t.numel() != 1:
                raise r.error(f"wrong shape for '{pre + C.NORM_STEPS}': {list(r.shape(steps_t))}, expected a scalar")
            steps_exact = steps_t.reshape(-1)[0].item()
            r.take(pre + C.NORM_STEPS, C.c_norm(i, C.NORM_STEPS), r.shape(steps_t), integer=True)
            if not steps_exact > 0:
                raise r.error(f"'{pre + C.NORM_STEPS}' is {steps_exact}: must be > 0 (it divides the variance)")
            r.take(pre + C.NORM_MEAN, C.c_norm(i, C.NORM_MEAN), (n,))
            var = r.take(pre + C.NORM_VAR, C.c_norm(i, C.NORM_VAR), (n,))
            if np.any(var <= 0):
                j = int(np.argmax(var <= 0))
                raise r.error(f"'{pre + C.NORM_VAR}' must be > 0 (a running sum of squares), index {j} is {var[j]!r}")
            if isinstance(steps_exact, int) and steps_exact >= C.FLOAT32_EXACT_INT_LIMIT:
                # float32 is what torch divides by anyway (int64 / float32 promotes to float32);
                # the exact count is kept in the metadata.
                r.exact_steps[C.c_norm(i, C.NORM_STEPS)] = int(steps_exact)
            # the alias (same module under a second name) must be the same tensors, bit for bit
            for f in C.NORM_FIELDS:
                r.twin(C.NORM_ALIAS_PREFIX.format(i=i) + f, pre + f)
        for m in r.matching(C.NORM_ALIAS_RE):
            if m.group(0) in r.remaining:
                raise r.error(f"unexpected key '{m.group(0)}' (alias without its twin)")
        r.fields["normalize"] = bool(sizes)
        for f in self.spec_fields:
            if f.name in r.stated:
                r.fields[f.name] = r.stated[f.name]
        r.state["obs_sizes"] = sizes  # the body decides the split when there are none (normalize: false)
        # every observation block records what it found: index -> (shape, encoded width)
        r.state.setdefault("observations", {}).update({i: ((n,), n) for i, n in zip(norm_idx, sizes)})

    def restore(self, policy, sd) -> None:
        """Each normalizer's step count as ML-Agents keeps it (a 0-d int64, its exact value), and the
        alias keys: the same tensors again under ``network_body.processors.{i}`` (one module, two names;
        the same tensor objects, so torch.save stores them once, as ML-Agents' files do)."""
        import torch

        if not policy.spec.normalize:
            return
        exact = policy.exact_steps
        for i, _ in policy.spec.vector_obs:
            pre, alias, name = C.NORM_PREFIX.format(i=i), C.NORM_ALIAS_PREFIX.format(i=i), C.c_norm(i, C.NORM_STEPS)
            steps = float(policy.tensors[name].reshape(-1)[0])
            count = exact.get(name, steps)
            if not (float(count).is_integer() and count >= 1):
                raise SpecError(f"normalizer {i}: {count!r} steps is not a whole count, which ML-Agents keeps "
                                f"('{pre + C.NORM_STEPS}' is an integer)")
            sd[pre + C.NORM_STEPS] = torch.tensor(int(count), dtype=getattr(torch, C.NORM_STEPS_DTYPE))
            for f in C.NORM_FIELDS:
                sd[alias + f] = sd[pre + f]

    def inputs(self, spec) -> List[Port]:
        return [Port(C.OBS_INPUT.format(i=i), (C.BATCH_DIM, n), kind=OBSERVATION) for i, n in spec.vector_obs]

    def encoded_width(self, spec) -> int:
        return spec.obs_total

    def encoders(self, spec) -> List[Dict[str, object]]:
        how = _how(spec) if spec.normalize else "as is (no normalizer)"
        return [{"inputs": [C.OBS_INPUT.format(i=i)], "kind": "vector", "shape": [n], "encoder": how, "width": n,
                 "parameters": 0} for i, n in spec.vector_obs]

    def onnx_float32_nodes(self, spec):
        return [(C.SCOPE_NORMALIZER.format(i=i) + "/", C.KEEP_DTYPE_OPS) for i, _ in spec.vector_obs] if spec.normalize else []

    def onnx_observe(self, f: OnnxFlow) -> None:
        g, spec = f.g, f.spec
        for i, _ in f.observing(spec.vector_obs):
            x = C.OBS_INPUT.format(i=i)
            if spec.normalize:
                scope = C.SCOPE_NORMALIZER.format(i=i)
                mean = f.init(C.c_norm(i, C.NORM_MEAN))
                div = g.init(C.NORM_DIVISOR_INIT.format(i=i), f.policy.divisor(i))
                x = g.node("Sub", [x, mean], scope)
                x = g.node("Div", [x, div], scope)
                x = g.clip(x, -spec.norm_clip, spec.norm_clip, scope)
            f.encoded[i] = x

    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        spec = policy.spec
        keys = []
        if spec.normalize:
            for i, _ in spec.vector_obs:
                # the mean and the policy's divisor: the same float32 numbers as the ONNX written beside
                # it, never torch's CPU sqrt (host-dependent)
                mean_key, div_key = f"norm{i}_mean", f"norm{i}_div"
                module.pin(mean_key, policy.tensors[C.c_norm(i, C.NORM_MEAN)])
                module.pin(div_key, policy.divisor(i))
                keys.append((mean_key, div_key))
        module.fast[self.name] = (tuple((i, C.OBS_INPUT.format(i=i)) for i, _ in spec.vector_obs), tuple(keys),
                                  float(spec.norm_clip))

    def torch_row(self, module):
        names, norm_keys, clip = module.fast[self.name]
        return {i: _normalize_inplace(norm_keys[j] if norm_keys else None, clip) for j, (i, _) in enumerate(names)}

    def torch_observe(self, f: TorchFlow) -> None:
        mod = f.module
        names, norm_keys, clip = mod.fast[self.name]
        feed, encoded = f.feed, f.encoded
        if f.inplace:  # the in-place form (torch_row), for any batch
            rows = mod.rows[self.name]
            for i, name in names:
                encoded[i] = rows[i](mod, feed[name])
            return
        ndt, cdt, bufs = mod.normalizer_dtype, mod.compute_dtype, torchcompat.module_buffers(mod)  # the pinned buffers (.to() swaps them)
        for j, (i, name) in enumerate(names):
            x = feed[name]
            if norm_keys:
                mean_key, div_key = norm_keys[j]
                if x.dtype != ndt:
                    x = x.to(ndt)
                x = ((x - bufs[mean_key]) / bufs[div_key]).clamp(-clip, clip)
            if x.dtype != cdt:
                x = x.to(cdt)
            encoded[i] = x

    def reference_init(self, policy):
        spec = policy.spec
        if not spec.normalize:
            return [i for i, _ in spec.vector_obs], None
        stats = {i: (f64(policy.tensors[C.c_norm(i, C.NORM_MEAN)]), f64(policy.divisor(i))) for i, _ in spec.vector_obs}
        return [i for i, _ in spec.vector_obs], stats, float(spec.norm_clip), spec.norm_rule == C.NORM_RULE_VECNORM

    def reference_observe(self, r: ReferenceFlow, w) -> None:
        """The subtraction and division add ``2 u |q|``; inputs are float32 and exact. The normalizer runs
        in float32 in every dtype (``torch_observe``: the pinned float32 buffers), so ``u`` is float32's
        whatever the runtime's format; a half runtime then casts its output (or the raw observation,
        without a normalizer) to its format: one rounding of that format (``bounds.stored``)."""
        indices, norm = w[:2]
        for i in indices:
            x = f64(r.feed[C.OBS_INPUT.format(i=i)])
            if norm is not None:
                mean, div = norm[i]
                lim, rounded = w[2:]
                q = (x - mean) / div
                err = 2 * U32 * np.abs(q) * (1 + U32)
                if rounded:  # VecNormalize's float64 mean and sqrt(var + eps), each rounded once to float32:
                    # |q64 - q| <= u (|mean| / div (1 + 2u) + |q|), and SB3's own rounding of q64 is within err
                    err = err + U32 * (np.abs(mean) / div * (1 + 2 * U32) + np.abs(q))
                b = clip(Bounded(q, err if r.bounds else np.zeros_like(q)), -lim, lim)
            else:
                b = Bounded.exact(x)
            r.encoded[i] = stored(b, r.precision) if r.bounds else b

    def state_template(self, spec):
        out = {}
        if spec.normalize:
            for i, n in spec.vector_obs:
                pre = C.NORM_PREFIX.format(i=i)
                out[pre + C.NORM_STEPS] = np.array(1, np.int64)
                out[pre + C.NORM_MEAN] = np.zeros(n, np.float32)
                out[pre + C.NORM_VAR] = np.ones(n, np.float32)
        return out

    def onnx_recover(self, spec, found, sd) -> None:
        """An ONNX folds ``sqrt(variance / steps)`` into one divisor D: the running sums are gone. What
        the canonical policy holds instead: steps = 1 and variance = D² (float32, correctly rounded), so
        that the IEEE divisor every exporter computes, ``sqrt(D² / 1)``, is D again bit for bit: in
        binary floating point ``fl(sqrt(fl(D * D))) == D`` for every D whose square is a normal float32
        (``core.numerics.one_step_variance``). A D outside that range, not positive or not finite is refused."""
        if not spec.normalize:
            return
        for i, _ in spec.vector_obs:
            d = found.pop(C.NORM_DIVISOR_INIT.format(i=i))
            var, bad = one_step_variance(d)
            if bad.any():
                j = int(np.argmax(bad))
                raise InputError(f"the {C.OBS_INPUT.format(i=i)} normalizer divisor [{j}] is {float(d[j])!r}: not "
                                 "a positive float32 whose square is a normal float32, so no float32 variance gives it back")
            pre = C.NORM_PREFIX.format(i=i)
            sd[pre + C.NORM_STEPS] = np.array(1, np.int64)
            sd[pre + C.NORM_VAR] = var

    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Half the rows at the normalizer's scale (mean + k*std, k ~ N(0,1)); a quarter far outside the
        +-5 clip (mean +- 20..1e3 std, and +-1e4); the rest N(0, 3) and zeros. Without a normalizer
        (std taken as 3) the outliers stay at 2..10 std and +-100: unnormalized inputs of 1e4 make
        float32 sums whose rounding differs between runtimes by more than any useful bound."""
        spec = policy.spec
        feed: Dict[str, np.ndarray] = {}
        q = max(rows // 4, 1)
        for i, n in spec.vector_obs:
            if spec.normalize:
                mean, std = mean_std(policy, i)
            else:
                mean, std = np.zeros(n), np.full(n, 3.0)
            x = np.empty((rows, n), dtype=np.float64)
            half = rows // 2
            x[:half] = mean + rng.standard_normal((half, n)) * std
            if spec.normalize:  # far outside the normalizer's +-5 clip
                far = rng.choice([-1.0, 1.0], size=(q, n)) * rng.uniform(20, 1e3, size=(q, n))
                hard = 1e4
            else:  # no clip to reach: large but plausible magnitudes that still saturate the +-3 action clip
                far = rng.choice([-1.0, 1.0], size=(q, n)) * rng.uniform(2, 10, size=(q, n))
                hard = 100.0
            x[half:half + q] = mean + far * std
            x[half + q - 1] = np.where(rng.random(n) < 0.5, -hard, hard)  # hard outliers
            rest = rows - half - q
            if rest > 0:
                x[half + q:] = rng.standard_normal((rest, n)) * 3.0
                x[-1] = 0.0
            feed[C.OBS_INPUT.format(i=i)] = x.astype(np.float32)
        return feed


def _how(spec) -> str:
    """What the normalizer computes, in words (``info``'s encoders)."""
    c = f"{spec.norm_clip:g}"
    if spec.norm_rule == C.NORM_RULE_VECNORM:
        return (f"VecNormalize: clip((x - mean) / sqrt(var + {spec.norm_eps:g}), -{c}, {c}), its float64 statistics "
                "rounded to float32")
    return f"normalizer: clamp((x - mean) / sqrt(variance / steps), -{c}, {c})"


def _normalize_inplace(keys, clip: float):
    """One observation's normalizer with autograd off: ``x - mean`` then in place ``/ divisor`` and the
    clip (the same arithmetic and bits as the functional form, fewer allocations), in the pinned
    (float32) dtype, then cast to the compute dtype; ``keys``: its (mean, divisor) buffer names, or
    None without normalization; ``clip``: the spec's ``norm_clip``."""

    def row(mod, x):
        if keys is not None:
            if x.dtype != mod.normalizer_dtype:
                x = x.to(mod.normalizer_dtype)
            bufs = torchcompat.module_buffers(mod)
            x = (x - bufs[keys[0]]).div_(bufs[keys[1]]).clamp_(-clip, clip)
        if x.dtype != mod.compute_dtype:
            x = x.to(mod.compute_dtype)
        return x
    return row
