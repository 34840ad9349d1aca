"""The continuous head: ``mu = Linear(features, A)`` and a log standard deviation.

- PPO (and POCA): ``log_sigma`` is a [1, A] parameter; deterministic = ``clamp(mu, -3, 3) / 3``,
  sampled = ``clamp(mu + eps * exp(log_sigma), -3, 3) / 3``.
- SAC: ``log_sigma`` is a Linear, clamped to [-20, 2]; sampled = ``tanh(mu + eps * exp(log_sigma))``
  and the deterministic output is raw ``mu``.

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


def _check_algorithm(spec) -> None:
    if spec.algorithm not in (PPO, SAC):
        raise SpecError(f"spec field 'algorithm' is {str(spec.algorithm)[:40]!r}, not {PPO!r} or {SAC!r}")


class Continuous(Block):
    name = "continuous"
    stage = HEAD
    # ``algorithm``: ``ppo`` (also POCA's actor: same layout) or ``sac`` (conditional log_sigma + tanh squash)
    spec_fields = (SpecField("algorithm", 10, check=_check_algorithm),
                   SpecField("continuous_size", 60,
                             check=lambda s: check_count("continuous_size", s.continuous_size, 0, MAX_WIDTH)))
    spec_derived = {"tanh_squash": lambda s: s.algorithm == SAC, "conditional_sigma": lambda s: s.algorithm == SAC}

    def active(self, spec) -> bool:
        return bool(spec.continuous_size)

    def describe(self, spec):
        return [("trainer", spec.algorithm.upper())] + ([("heads", f"continuous {spec.continuous_size}")]
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
            else:
                raise r.error(f"missing key '{C.LOG_SIGMA}'")
        r.fields["continuous_size"] = cont

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
        else:
            out[C.LOG_SIGMA] = np.zeros((1, a), np.float32)
        return out

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        a, prev = spec.continuous_size, spec.encoding_size
        n = prev * a + a
        if include_log_sigma:
            n += (prev * a + a) if spec.conditional_sigma else a
        return n

    def outputs(self, spec) -> List[Port]:
        a = spec.continuous_size
        return [Port(C.OUT_CONT, (C.BATCH_DIM, a), kind=SAMPLED, noise="normal"),
                Port(C.OUT_CONT_SHAPE, (1,), kind=CONSTANT, tensor=C.c_const(C.K_CONT_SIZE), init=C.K_CONT_SIZE),
                Port(C.OUT_CONT_DET, (C.BATCH_DIM, a), kind=DETERMINISTIC)]

    def onnx_dims(self, spec) -> Dict[str, str]:
        return {} if spec.tanh_squash else {C.OUT_CONT_DET: f"Div{C.OUT_CONT_DET}_dim_0"}

    def onnx_head(self, f: OnnxFlow) -> None:
        g, sc = f.g, C.SCOPE_CONTINUOUS
        if f.spec.tanh_squash:  # SAC: deterministic output is raw mu
            mu = f.gemm(f.h, C.C_MU_W, C.C_MU_B, C.SCOPE_MU, out=C.OUT_CONT_DET)
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
        else:
            module.log_sigma = module.frozen(T[C.C_LOG_SIGMA])
        # what the forward reads per call: the mu and log-sigma layers (never their tensors or parameter
        # dicts: torch.export and .to() swap those), whether the output is clipped, and the clip as a
        # 0-d float32 tensor for the eager in-place division: the same IEEE division as by the Python
        # number (the same bits) without wrapping a number into a tensor on every call (~3 us)
        import torch

        module.fast[self.name] = (module.mu, module.log_sigma if policy.spec.conditional_sigma else None,
                                  not policy.spec.tanh_squash, torch.tensor(C.ACTION_CLIP, dtype=torch.float32))

    def torch_row(self, module):
        import torch

        addmv, name = torch.addmv, self.name

        def row(mod, h):
            fast = mod.fast[name]
            p = torchcompat.module_params(fast[0])
            return [_deterministic(fast, addmv(p["bias"], p["weight"], h)[None], True)]
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
        if f.sampling is None:
            return [_deterministic(fast, mu, f.inplace)]
        if mu.dtype != torch.float32:
            mu = mu.float()
        spec = mod.spec
        if spec.conditional_sigma:
            log_sigma = sigma_layer.apply_to(f.h, f.vec)
            log_sigma = torch.clamp(log_sigma.to(torch.float32), C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX)
        else:
            log_sigma = mu * 0 + mod.log_sigma.to(torch.float32)
        s = mu + f.sampling["noise"].to(mu.device) * torch.exp(log_sigma)
        return [torch.tanh(s) if spec.tanh_squash else torch.clamp(s, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP]

    def reference_init(self, policy):
        T = policy.tensors
        sigma = (Linear(T[C.C_LOG_SIGMA_W], T[C.C_LOG_SIGMA_B]) if policy.spec.conditional_sigma
                 else f64(T[C.C_LOG_SIGMA]))
        return Linear(T[C.C_MU_W], T[C.C_MU_B]), sigma, policy.spec

    def reference_output(self, r: ReferenceFlow, w) -> None:
        mu_lin, sigma, spec = w
        p = r.precision
        mu = affine(r.h, mu_lin, r.bounds, p=p)
        det = mu if spec.tanh_squash else scale(clip(mu, -C.ACTION_CLIP, C.ACTION_CLIP), 1.0 / C.ACTION_CLIP, p)
        r.values[C.OUT_CONT_DET], r.errs[C.OUT_CONT_DET] = det.v, det.err
        if r.noise is None:
            return
        if spec.conditional_sigma:
            ls = clip(affine(r.h, sigma, r.bounds, p=p), C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX)
        else:
            ls = stored(Bounded.exact(np.broadcast_to(sigma, mu.v.shape)), p)  # a parameter: in the weights' format
        s = add(mu, mul(exp(ls, p), Bounded.exact(f64(r.noise)), p), p)
        out = tanh(s, p) if spec.tanh_squash else scale(clip(s, -C.ACTION_CLIP, C.ACTION_CLIP), 1.0 / C.ACTION_CLIP, p)
        r.values[C.OUT_CONT], r.errs[C.OUT_CONT] = out.v, out.err

    # --- the run modes ----------------------------------------------------------------------
    traits_described = {"normal_sample": "continuous actions", "fixed_sigma": "a PPO continuous head",
                        "tanh_sample": "a SAC policy"}
    variants = {"sac": "tanh_sample"}

    def traits(self, spec) -> tuple:
        """``fixed_sigma``: PPO's head, whose sample is clip(mu + eps * exp(log_sigma), -3, 3) / 3;
        ``tanh_sample``: a SAC policy (its sample tanh-squashed)."""
        return (("fixed_sigma",) if spec.continuous_size and spec.algorithm == C.TRAINER_PPO else ()) + \
            (("tanh_sample",) if spec.algorithm == C.TRAINER_SAC else ())

    # the Python API's name of this head's actions (api.Actions) and its (deterministic, sampled) outputs
    action = "continuous"
    action_outputs = (C.OUT_CONT_DET, C.OUT_CONT)


def _deterministic(fast, mu, inplace: bool):
    """The deterministic action from ``mu`` (float32): clipped to +-ACTION_CLIP and scaled to [-1, 1]
    unless the head squashes with tanh; in place with autograd off (dividing by the 0-d float32 clip
    on the CPU: the same IEEE division as by the number, without wrapping it on every call). The clip
    tensor is never moved or cast (it is no buffer), so its dtype is float32."""
    _, _, clip, clip_t = fast
    if mu.dtype != clip_t.dtype:
        mu = mu.float()
    if not clip:
        return mu
    if inplace:
        return mu.clamp_(-C.ACTION_CLIP, C.ACTION_CLIP).div_(clip_t if mu.is_cpu else C.ACTION_CLIP)
    import torch  # the functional form (traced, or with autograd): torch.clamp, as the .pt2's graph records it

    return torch.clamp(mu, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP
