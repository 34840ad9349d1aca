"""The continuous head: ``mu = Linear(features, A)`` and a log standard deviation.

- PPO (and POCA): ``log_sigma`` is a [1, A] parameter; deterministic = ``clamp(mu, -3, 3) / 3``,
  sampled = ``clamp(mu + eps * exp(log_sigma), -3, 3) / 3``.
- SAC: ``log_sigma`` is a Linear, clamped to [-20, 2]; sampled = ``tanh(mu + eps * exp(log_sigma))``
  and the deterministic output is raw ``mu``.

Another trainer's head maps its actions onto the action space it was trained on (``action_rule``, with
``action_low``/``action_high``, stated by its importer: ``importers.sb3``), as its own ``predict`` does:

- ``clip`` (SB3 PPO/A2C): deterministic = ``clip(mu, low, high)``, sampled = ``clip(mu + eps * exp(log_std), low, high)``;
- ``squash`` (SB3 SAC, TD3): deterministic = ``low + 0.5 * (tanh(mu) + 1) * (high - low)``, sampled the same of
  ``tanh(mu + eps * exp(log_std))``; TD3's actor has no standard deviation (``no_sigma``): its sampled action is
  the deterministic one (the noise scaled by 0), as SB3's ``predict`` gives it.

The ONNX draws ``eps`` with RandomNormalLike (no seed); ``with_noise_input`` makes it an input."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import Bounded, Linear, add, affine, clip, exp, f64, mul, scale, stored, tanh
from ..core.flow import CONSTANT, DETERMINISTIC, SAMPLED, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.spec import MAX_WIDTH, SpecField, check_count
from ..errors import SpecError
from .base import HEAD, Block, KeyRules

PPO, SAC = C.TRAINER_PPO, C.TRAINER_SAC
ALGORITHMS = (PPO, SAC, C.SB3_A2C, C.SB3_TD3)
MLAGENTS, CLIP, SQUASH = C.ACTION_RULE_MLAGENTS, C.ACTION_RULE_CLIP, C.ACTION_RULE_SQUASH


def _check_algorithm(spec) -> None:
    if spec.algorithm not in ALGORITHMS:
        raise SpecError(f"spec field 'algorithm' is {str(spec.algorithm)[:40]!r}, not one of {', '.join(ALGORITHMS)}")


def _check_actions(spec) -> None:
    """The action rule and, for another trainer's, the action space's finite bounds, one per action."""
    rule, lo, hi = spec.action_rule, spec.action_low, spec.action_high
    if rule not in C.ACTION_RULES:
        raise SpecError(f"spec field 'action_rule' is {str(rule)[:40]!r}, not one of {', '.join(C.ACTION_RULES)}")
    if not isinstance(lo, tuple) or not isinstance(hi, tuple):
        raise SpecError("spec fields 'action_low' and 'action_high' are not lists of numbers")
    if rule == MLAGENTS or not spec.continuous_size:
        if lo or hi:
            raise SpecError(f"spec fields 'action_low'/'action_high' belong to the action rules {CLIP} and {SQUASH}")
        if spec.algorithm == C.SB3_TD3:
            raise SpecError(f"spec field 'algorithm' {C.SB3_TD3!r} needs the action rule {SQUASH!r}")
        return
    n = spec.continuous_size
    for name, v in (("action_low", lo), ("action_high", hi)):
        if len(v) != n or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) for x in v):
            raise SpecError(f"spec field '{name}' is not {n} finite number(s), one per continuous action")
    if any(a > b for a, b in zip(lo, hi)):
        raise SpecError("spec field 'action_low' is above 'action_high'")


def _floats(v):
    return tuple(float(x) for x in v) if isinstance(v, list) else v


class Continuous(Block):
    name = "continuous"
    stage = HEAD
    # ``algorithm``: ``ppo`` (also POCA's actor: same layout) or ``sac`` (conditional log_sigma + tanh squash)
    spec_fields = (SpecField("algorithm", 10, check=_check_algorithm, stated=True),
                   SpecField("continuous_size", 60,
                             check=lambda s: check_count("continuous_size", s.continuous_size, 0, MAX_WIDTH)),
                   SpecField("action_rule", 505, MLAGENTS, check=_check_actions, used=lambda v: v != MLAGENTS, stated=True),
                   SpecField("action_low", 506, (), used=bool, decode=_floats, stated=True),
                   SpecField("action_high", 507, (), used=bool, decode=_floats, stated=True))
    spec_derived = {"tanh_squash": lambda s: s.algorithm == SAC, "conditional_sigma": lambda s: s.algorithm == SAC,
                    "no_sigma": lambda s: s.algorithm == C.SB3_TD3}

    def active(self, spec) -> bool:
        return bool(spec.continuous_size)

    def describe(self, spec):
        return [("trainer", spec.algorithm.upper())] + ([("heads", f"continuous {spec.continuous_size}{_mapped(spec)}")]
                                                        if spec.continuous_size else [])

    def onnx_detect(self, g, found):
        """Its width from its outputs' dims, SAC from the Tanh of the sampled action, and the features'
        width from what its Gemm reads."""
        cont = 0
        for name in (C.OUT_CONT_DET, C.OUT_CONT):
            if name in g.outputs:
                d = g.outputs[name]
                if len(d) != 2 or not d[1]:
                    raise g.error(f"output {name!r} has the dims {d}, not [batch, actions]")
                cont = cont or int(d[1])
        sac = bool(cont) and C.OUT_CONT in g.producer and g.producer[C.OUT_CONT].op_type == "Tanh"
        out = {"algorithm": SAC if sac else PPO, "continuous_size": cont}
        width = g.gemm_width(C.OUT_CONT_DET)
        if width is not None and "hidden_units" not in found:
            out["hidden_units"] = width
        return out

    def claim(self, r: KeyRules) -> None:
        cont = 0
        r.fields["algorithm"] = PPO
        mu_w = C.MU.format(p="weight")
        if mu_w in r.sd:
            shape = r.shape(r.sd[mu_w])
            cont = shape[0] if len(shape) == 2 else -1
            if cont <= 0:
                raise r.error(f"wrong shape for '{mu_w}': {list(shape)}")
            width = r.state["width"]
            r.linear(C.MU, C.C_MU_W, C.C_MU_B, cont, width)
            if C.LOG_SIGMA in r.sd:
                r.take(C.LOG_SIGMA, C.C_LOG_SIGMA, (1, cont))
            elif C.LOG_SIGMA_LINEAR.format(p="weight") in r.sd:
                r.fields["algorithm"] = SAC
                r.linear(C.LOG_SIGMA_LINEAR, C.C_LOG_SIGMA_W, C.C_LOG_SIGMA_B, cont, width)
            elif r.stated.get("algorithm") != C.SB3_TD3:  # TD3's actor alone has no standard deviation
                raise r.error(f"missing key '{C.LOG_SIGMA}'")
        r.fields["continuous_size"] = cont
        stated = r.stated.get("algorithm")
        if stated in (C.SB3_A2C, C.SB3_TD3):  # another trainer's name for a layout the keys tell apart only so far
            if cont and (stated == C.SB3_TD3) != (C.LOG_SIGMA not in r.sd and r.fields["algorithm"] == PPO):
                raise r.error(f"the keys are not a {stated.upper()} actor's (a log standard deviation "
                              f"{'is there' if stated == C.SB3_TD3 else 'is missing'})")
            r.fields["algorithm"] = stated
        for f in self.spec_fields[2:]:
            if f.name in r.stated:
                r.fields[f.name] = r.stated[f.name]

    def constant_checks(self, r: KeyRules):
        return [(C.K_CONT_SIZE, [r.fields["continuous_size"]], "mu layer")]

    def state_template(self, spec):
        a, w = spec.continuous_size, spec.encoding_size
        if not a:
            return {}
        out = {C.MU.format(p="weight"): np.zeros((a, w), np.float32), C.MU.format(p="bias"): np.zeros(a, np.float32)}
        if spec.conditional_sigma:
            out[C.LOG_SIGMA_LINEAR.format(p="weight")] = np.zeros((a, w), np.float32)
            out[C.LOG_SIGMA_LINEAR.format(p="bias")] = np.zeros(a, np.float32)
        elif not spec.no_sigma:
            out[C.LOG_SIGMA] = np.zeros((1, a), np.float32)
        return out

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        a, prev = spec.continuous_size, spec.encoding_size
        n = prev * a + a
        if include_log_sigma and not spec.no_sigma:
            n += (prev * a + a) if spec.conditional_sigma else a
        return n

    def outputs(self, spec) -> List[Port]:
        a = spec.continuous_size
        return [Port(C.OUT_CONT, (C.BATCH_DIM, a), kind=SAMPLED, noise="normal"),
                Port(C.OUT_CONT_SHAPE, (1,), kind=CONSTANT, tensor=C.c_const(C.K_CONT_SIZE), init=C.K_CONT_SIZE),
                Port(C.OUT_CONT_DET, (C.BATCH_DIM, a), kind=DETERMINISTIC)]

    def onnx_dims(self, spec) -> Dict[str, str]:
        return {} if spec.tanh_squash or spec.action_rule != MLAGENTS else {C.OUT_CONT_DET: f"Div{C.OUT_CONT_DET}_dim_0"}

    def onnx_head(self, f: OnnxFlow) -> None:
        g, sc = f.g, C.SCOPE_CONTINUOUS
        own = f.spec.action_rule == MLAGENTS
        if f.spec.no_sigma:  # TD3: no standard deviation, the noise scaled by 0
            f.state["mu"], f.state["std"] = f.gemm(f.h, C.C_MU_W, C.C_MU_B, C.SCOPE_MU), g.const(0.0, sc)
            return
        if f.spec.tanh_squash:  # SAC: deterministic output is raw mu (ML-Agents'; another trainer's maps it)
            mu = f.gemm(f.h, C.C_MU_W, C.C_MU_B, C.SCOPE_MU, out=C.OUT_CONT_DET if own else None)
            ls = f.gemm(f.h, C.C_LOG_SIGMA_W, C.C_LOG_SIGMA_B, C.SCOPE_LOG_SIGMA)
            ls = g.clip(ls, C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX, sc)
        else:
            mu = f.gemm(f.h, C.C_MU_W, C.C_MU_B, C.SCOPE_MU)
            zero = g.node("Mul", [mu, g.const(0.0, sc)], sc)
            ls = g.node("Add", [zero, f.init(C.C_LOG_SIGMA)], sc)
        f.state["mu"], f.state["std"] = mu, g.node("Exp", [ls], sc)

    def onnx_output(self, f: OnnxFlow) -> None:
        from onnx import TensorProto

        g, mu = f.g, f.state["mu"]
        noise = g.node("RandomNormalLike", [mu], "", dtype=TensorProto.FLOAT)
        scaled = g.node("Mul", [noise, f.state["std"]], "")
        sample = g.node("Add", [mu, scaled], "")
        rule = f.spec.action_rule
        if rule != MLAGENTS:  # the action space's bounds: SB3's predict
            lo = g.init(C.ACTION_LOW_INIT, np.array(f.spec.action_low, np.float32))
            if rule == CLIP:
                hi = g.init(C.ACTION_HIGH_INIT, np.array(f.spec.action_high, np.float32))
                for x, out in ((sample, C.OUT_CONT), (mu, C.OUT_CONT_DET)):
                    g.node("Min", [g.node("Max", [x, lo], ""), hi], "", out=out)
                return
            span = g.init(C.ACTION_RANGE_INIT, _span(f.spec))
            for x, out in ((sample, C.OUT_CONT), (mu, C.OUT_CONT_DET)):  # low + 0.5 * (tanh(x) + 1) * (high - low)
                t = g.node("Add", [g.node("Tanh", [x], ""), g.const(1.0, "")], "")
                t = g.node("Mul", [g.node("Mul", [t, g.const(0.5, "")], ""), span], "")
                g.node("Add", [lo, t], "", out=out)
            return
        if f.spec.tanh_squash:
            g.node("Tanh", [sample], "", out=C.OUT_CONT)
        else:
            c = g.clip(sample, -C.ACTION_CLIP, C.ACTION_CLIP, "")
            g.node("Div", [c, g.const(C.ACTION_CLIP, "")], "", out=C.OUT_CONT)
            c = g.clip(mu, -C.ACTION_CLIP, C.ACTION_CLIP, "")
            g.node("Div", [c, g.const(C.ACTION_CLIP, "")], "", out=C.OUT_CONT_DET)

    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        if not self.active(policy.spec):
            return
        T = policy.tensors
        module.mu = module.affine(T[C.C_MU_W], T[C.C_MU_B])
        if policy.spec.conditional_sigma:
            module.log_sigma = module.affine(T[C.C_LOG_SIGMA_W], T[C.C_LOG_SIGMA_B])
        elif not policy.spec.no_sigma:
            module.log_sigma = module.frozen(T[C.C_LOG_SIGMA])
        # what the forward reads per call: the mu and log-sigma layers (never their tensors or parameter
        # dicts: torch.export and .to() swap those), whether the output is clipped, and the clip as a
        # 0-d float32 tensor for the eager in-place division: the same IEEE division as by the Python
        # number (the same bits) without wrapping a number into a tensor on every call (~3 us)
        import torch

        spec = policy.spec
        if spec.action_rule != MLAGENTS:  # the action space's bounds, float32 in every dtype
            module.pin("act_low", np.array(spec.action_low, np.float32))
            module.pin("act_high", np.array(spec.action_high, np.float32))
            module.pin("act_span", _span(spec))
        module.fast[self.name] = (module.mu, module.log_sigma if spec.conditional_sigma else None,
                                  not spec.tanh_squash, torch.tensor(C.ACTION_CLIP, dtype=torch.float32), spec.action_rule)

    def torch_row(self, module):
        import torch

        addmv, name = torch.addmv, self.name

        def row(mod, h):
            fast = mod.fast[name]
            p = torchcompat.module_params(fast[0])
            mu = addmv(p["bias"], p["weight"], h)[None]
            return [_deterministic(fast, mu, True) if fast[4] == MLAGENTS else _mapped_action(mod, fast[4], mu)]
        return row

    def torch_output(self, f: TorchFlow) -> list:
        mod = f.module
        if f.sampling is None and f.vec and f.inplace:  # the eager one-row form (torch_row)
            return mod.rows[self.name](mod, f.h)
        import torch

        fast = mod.fast[self.name]
        mu_layer, sigma_layer = fast[:2]
        mu_p = torchcompat.module_params(mu_layer)
        if f.vec:  # Affine.apply_to's two forms, inline (a call costs ~1 us at batch 1)
            mu = torch.addmv(mu_p["bias"], mu_p["weight"], f.h)[None]
        else:
            mu = torch.addmm(mu_p["bias"], f.h, mu_p["weight"].t())
        rule = fast[4]
        if f.sampling is None:
            return [_deterministic(fast, mu, f.inplace) if rule == MLAGENTS else _mapped_action(mod, rule, mu)]
        if mu.dtype != torch.float32:
            mu = mu.float()
        spec = mod.spec
        if spec.no_sigma:
            return [_mapped_action(mod, rule, mu + f.sampling["noise"].to(mu.device) * 0.0)]
        if spec.conditional_sigma:
            log_sigma = sigma_layer.apply_to(f.h, f.vec)
            log_sigma = torch.clamp(log_sigma.to(torch.float32), C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX)
        else:
            log_sigma = mu * 0 + mod.log_sigma.to(torch.float32)
        s = mu + f.sampling["noise"].to(mu.device) * torch.exp(log_sigma)
        if rule != MLAGENTS:
            return [_mapped_action(mod, rule, s)]
        return [torch.tanh(s) if spec.tanh_squash else torch.clamp(s, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP]

    def reference_init(self, policy):
        T = policy.tensors
        sigma = (Linear(T[C.C_LOG_SIGMA_W], T[C.C_LOG_SIGMA_B]) if policy.spec.conditional_sigma
                 else None if policy.spec.no_sigma else f64(T[C.C_LOG_SIGMA]))
        return Linear(T[C.C_MU_W], T[C.C_MU_B]), sigma, policy.spec

    def reference_output(self, r: ReferenceFlow, w) -> None:
        mu_lin, sigma, spec = w
        p = r.precision
        mu = affine(r.h, mu_lin, r.bounds, p=p)
        rule = spec.action_rule
        if rule != MLAGENTS:
            det = _reference_mapped(spec, mu, p)
        else:
            det = mu if spec.tanh_squash else scale(clip(mu, -C.ACTION_CLIP, C.ACTION_CLIP), 1.0 / C.ACTION_CLIP, p)
        r.values[C.OUT_CONT_DET], r.errs[C.OUT_CONT_DET] = det.v, det.err
        if r.noise is None:
            return
        if spec.no_sigma:  # mu + noise * 0: mu exactly
            r.values[C.OUT_CONT], r.errs[C.OUT_CONT] = det.v, det.err
            return
        if spec.conditional_sigma:
            ls = clip(affine(r.h, sigma, r.bounds, p=p), C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX)
        else:
            ls = stored(Bounded.exact(np.broadcast_to(sigma, mu.v.shape)), p)  # a parameter: in the weights' format
        s = add(mu, mul(exp(ls, p), Bounded.exact(f64(r.noise)), p), p)
        if rule != MLAGENTS:
            out = _reference_mapped(spec, s, p)
            r.values[C.OUT_CONT], r.errs[C.OUT_CONT] = out.v, out.err
            return
        out = tanh(s, p) if spec.tanh_squash else scale(clip(s, -C.ACTION_CLIP, C.ACTION_CLIP), 1.0 / C.ACTION_CLIP, p)
        r.values[C.OUT_CONT], r.errs[C.OUT_CONT] = out.v, out.err

    # --- the run modes ----------------------------------------------------------------------
    traits_described = {"normal_sample": "continuous actions", "fixed_sigma": "a PPO continuous head",
                        "tanh_sample": "a SAC policy"}
    variants = {"sac": "tanh_sample"}

    def traits(self, spec) -> tuple:
        """``fixed_sigma``: PPO's head, whose sample is clip(mu + eps * exp(log_sigma), -3, 3) / 3;
        ``tanh_sample``: a SAC policy (its sample tanh-squashed)."""
        if spec.action_rule != MLAGENTS:  # another trainer's head: neither of ML-Agents' samples
            return ()
        return (("fixed_sigma",) if spec.continuous_size and spec.algorithm == C.TRAINER_PPO else ()) + \
            (("tanh_sample",) if spec.algorithm == C.TRAINER_SAC else ())

    # the Python API's name of this head's actions (api.Actions) and its (deterministic, sampled) outputs
    action = "continuous"
    action_outputs = (C.OUT_CONT_DET, C.OUT_CONT)


def _span(spec) -> np.ndarray:
    """``high - low`` in float32, as SB3's ``unscale_action`` computes it from the float32 space."""
    return np.array(spec.action_high, np.float32) - np.array(spec.action_low, np.float32)


def _mapped(spec) -> str:
    """The family sentence's words for an action rule of another trainer (nothing for ML-Agents')."""
    if spec.action_rule == MLAGENTS or not spec.action_low:
        return ""
    lo, hi = set(spec.action_low), set(spec.action_high)
    where = f"[{min(lo):g}, {max(hi):g}]" if len(lo) == len(hi) == 1 else "the action space's bounds"
    return f" {'clipped' if spec.action_rule == CLIP else 'squashed'} to {where}"


def _mapped_action(mod, rule: str, x):
    """``x`` (float32) onto the action space: ``clip`` or ``squash`` (``low + 0.5 * (tanh(x) + 1) * span``, in
    SB3's order), with the pinned float32 bounds."""
    import torch

    if x.dtype != torch.float32:
        x = x.float()
    bufs = torchcompat.module_buffers(mod)
    if rule == CLIP:
        return torch.minimum(torch.maximum(x, bufs["act_low"]), bufs["act_high"])
    return bufs["act_low"] + (torch.tanh(x) + 1.0) * 0.5 * bufs["act_span"]


def _reference_mapped(spec, x: Bounded, p) -> Bounded:
    """The float64 reference of ``_mapped_action``: the clip is exact; the squash's tanh, add and two
    products each round once (``core.bounds``)."""
    lo = f64(np.array(spec.action_low, np.float32))
    if spec.action_rule == CLIP:
        return clip(x, lo, f64(np.array(spec.action_high, np.float32)))
    t = scale(add(tanh(x, p), Bounded.exact(np.ones_like(x.v)), p), 0.5, p)
    return add(Bounded.exact(np.broadcast_to(lo, x.v.shape)), mul(t, Bounded.exact(np.broadcast_to(f64(_span(spec)), x.v.shape)), p), p)


def _deterministic(fast, mu, inplace: bool):
    """The deterministic action from ``mu`` (float32): clipped to +-ACTION_CLIP and scaled to [-1, 1]
    unless the head squashes with tanh; in place with autograd off (dividing by the 0-d float32 clip
    on the CPU: the same IEEE division as by the number, without wrapping it on every call). The clip
    tensor is never moved or cast (it is no buffer), so its dtype is float32."""
    _, _, clip, clip_t, _ = fast
    if mu.dtype != clip_t.dtype:
        mu = mu.float()
    if not clip:
        return mu
    if inplace:
        return mu.clamp_(-C.ACTION_CLIP, C.ACTION_CLIP).div_(clip_t if mu.is_cpu else C.ACTION_CLIP)
    import torch  # the functional form (traced, or with autograd): torch.clamp, as the .pt2's graph records it

    return torch.clamp(mu, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP
