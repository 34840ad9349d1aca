"""The discrete head: one Linear per branch, its logits masked by ``action_masks``
(``logits * mask - 1e8 * (1 - mask)``, in float32: 1e8 is inf in fp16) and a softmax;
deterministic = argmax, sampled = multinomial (the torch module inverts the CDF at a uniform
draw); both int64, one column per branch."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .. import contract as C
from ..core.bounds import Bounded, Linear, affine, f64
from ..core.flow import CONSTANT, DETERMINISTIC, MASK, SAMPLED, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.spec import MAX_WIDTH, SpecField, as_tuple, check_counts
from .base import HEAD, Block, KeyRules


class Discrete(Block):
    name = "discrete"
    stage = HEAD
    spec_fields = (SpecField("discrete_branches", 70, (), decode=as_tuple,
                             check=lambda s: check_counts("discrete_branches", s.discrete_branches, 1, MAX_WIDTH, 0)),)
    spec_derived = {"discrete_total": lambda s: sum(s.discrete_branches)}
    onnx_inputs = (C.ACTION_MASKS,)

    def active(self, spec) -> bool:
        return bool(spec.discrete_branches)

    def describe(self, spec):
        return [("heads", "discrete " + "x".join(map(str, spec.discrete_branches)))] if spec.discrete_branches else []

    def onnx_detect(self, g, found):
        """The branches from the constant behind its shape output; the features' width from what its Gemm
        reads (where no head before it said)."""
        if C.OUT_DISC_SHAPE not in g.outputs and C.OUT_DISC_DET not in g.outputs:
            return {}
        v = g.constant(C.OUT_DISC_SHAPE) if C.OUT_DISC_SHAPE in g.outputs else None
        if v is None or v.ndim != 2 or v.shape[0] != 1 or not np.all(np.isfinite(v)) or np.any(v != np.round(v)):
            raise g.error(f"no constant branch sizes behind the output {C.OUT_DISC_SHAPE!r}")
        out = {"discrete_branches": tuple(int(x) for x in v.reshape(-1))}
        width = g.gemm_width(C.OUT_DISC_DET) if "hidden_units" not in found else None
        if width is not None:
            out["hidden_units"] = width
        return out

    def claim(self, r: KeyRules) -> None:
        branch_idx = r.indices(C.BRANCH_RE)
        r.contiguous(branch_idx, "discrete branch")
        branches = []
        for b in branch_idx:
            n = r.shape(r.matrix(C.DISC_BRANCH.format(b=b, p="weight")))[0]
            branches.append(n)
            r.linear(C.DISC_BRANCH.format(b=b, p="{p}"), C.c_branch(b, "weight"), C.c_branch(b, "bias"), n,
                     r.state["width"])
        r.fields["discrete_branches"] = tuple(branches)

    def constant_checks(self, r: KeyRules):
        return [(C.K_DISC_SIZES, list(r.fields["discrete_branches"]), "discrete branch layers")]

    def state_template(self, spec):
        out = {}
        for b, n in enumerate(spec.discrete_branches):
            out[C.DISC_BRANCH.format(b=b, p="weight")] = np.zeros((n, spec.encoding_size), np.float32)
            out[C.DISC_BRANCH.format(b=b, p="bias")] = np.zeros(n, np.float32)
        return out

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        return sum(spec.encoding_size * b + b for b in spec.discrete_branches)

    def inputs(self, spec) -> List[Port]:
        return [Port(C.ACTION_MASKS, (C.BATCH_DIM, spec.discrete_total), kind=MASK, fill=1.0)]

    def outputs(self, spec) -> List[Port]:
        nb = len(spec.discrete_branches)
        return [Port(C.OUT_DISC, (C.BATCH_DIM, nb), "int64", kind=SAMPLED, levels=tuple(spec.discrete_branches), noise="uniform"),
                Port(C.OUT_DISC_SHAPE, (1, nb), kind=CONSTANT, tensor=C.c_const(C.K_DISC_SIZES), init=C.K_DISC_SIZES),
                Port(C.OUT_DISC_DET, (C.BATCH_DIM, nb), "int64", kind=DETERMINISTIC, levels=tuple(spec.discrete_branches))]

    def onnx_dims(self, spec) -> Dict[str, str]:
        return {C.OUT_DISC_DET: f"Concat{C.OUT_DISC_DET}_dim_0"}

    def onnx_head(self, f: OnnxFlow) -> None:
        g, sc, sizes = f.g, C.SCOPE_DISCRETE, f.spec.discrete_branches
        ends = np.cumsum(sizes)
        masks = [g.slice(C.ACTION_MASKS, int(e - n), int(e), 1, sc) for n, e in zip(sizes, ends)]
        probs = []
        for bi in range(len(sizes)):
            logits = f.gemm(f.h, C.c_branch(bi, "weight"), C.c_branch(bi, "bias"), C.SCOPE_BRANCH.format(b=bi))
            block = g.node("Mul", [masks[bi], g.const(-1.0, sc)], sc)
            block = g.node("Add", [block, g.const(1.0, sc)], sc)
            kept = g.node("Mul", [logits, masks[bi]], sc)
            pen = g.node("Mul", [block, g.const(C.MASK_PENALTY, sc)], sc)
            masked = g.node("Sub", [kept, pen], sc)
            probs.append(g.node("Softmax", [masked], sc, axis=1))
        f.state["probs"] = probs

    def onnx_output(self, f: OnnxFlow) -> None:
        from onnx import TensorProto

        g, probs = f.g, f.state["probs"]
        samples = []
        for p in probs:
            lp = g.node("Log", [p], "")
            samples.append(g.node("Multinomial", [lp], "", dtype=TensorProto.INT64, sample_size=1))
        g.node("Concat", samples, "", out=C.OUT_DISC, axis=1)
        g.node("Concat", [g.node("ArgMax", [p], "", axis=1, keepdims=1) for p in probs], "", out=C.OUT_DISC_DET, axis=1)

    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        from torch import nn

        # registered empty without a discrete head too (the .pt2's module call graph lists it)
        T = policy.tensors
        module.branches = nn.ModuleList(module.affine(T[C.c_branch(b, "weight")], T[C.c_branch(b, "bias")])
                                        for b in range(len(policy.spec.discrete_branches)))
        module.fast[self.name] = tuple(module.branches)

    def torch_output(self, f: TorchFlow) -> list:
        import torch

        mod = f.module
        h = f.h[None] if f.vec else f.h
        masks = f.feed[C.ACTION_MASKS]
        probs = []
        start = 0
        for lin, n in zip(mod.fast[self.name], mod.spec.discrete_branches):
            mask = masks[:, start:start + n].to(torch.float32)
            start += n
            logits = lin(h).to(torch.float32)
            logits = logits * mask - C.MASK_PENALTY * (1.0 - mask)
            probs.append(torch.softmax(logits, dim=1))
        if f.sampling is None:
            return [torch.cat([torch.argmax(p, dim=1, keepdim=True) for p in probs], dim=1)]
        u = f.sampling["uniform"].to(h.device)
        picks = []
        for b, p in enumerate(probs):
            cdf = torch.cumsum(p, dim=1)
            idx = (cdf < u[:, b:b + 1]).sum(dim=1, keepdim=True)
            picks.append(torch.clamp(idx, max=p.shape[1] - 1))
        return [torch.cat(picks, dim=1)]

    def reference_init(self, policy):
        T, sizes = policy.tensors, policy.spec.discrete_branches
        return [(Linear(T[C.c_branch(b, "weight")], T[C.c_branch(b, "bias")]), n) for b, n in enumerate(sizes)]

    def reference_output(self, r: ReferenceFlow, w) -> None:
        masks = f64(r.feed[C.ACTION_MASKS])
        start, picks = 0, []
        for b, (lin, n) in enumerate(w):
            lg = affine(r.h, lin, r.bounds, p=r.precision)
            m = masks[:, start:start + n]
            start += n
            # masked: logits * mask - 1e8 * (1 - mask): a kept logit is exact, a masked one is -1e8
            lg = Bounded(np.where(m > 0, lg.v, -C.MASK_PENALTY), np.where(m > 0, lg.err, 0.0))
            r.logits[b] = lg
            picks.append(np.argmax(lg.v, axis=1))
        r.values[C.OUT_DISC_DET] = np.stack(picks, axis=1).astype(np.int64)
        r.errs[C.OUT_DISC_DET] = np.zeros(r.values[C.OUT_DISC_DET].shape)

    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Random masks (70 % allowed), at least one action allowed per branch."""
        spec = policy.spec
        m = (rng.random((rows, spec.discrete_total)) < 0.7).astype(np.float32)
        start = 0
        for n in spec.discrete_branches:
            pick = rng.integers(0, n, size=rows)
            m[np.arange(rows), start + pick] = 1.0
            start += n
        return {C.ACTION_MASKS: m}

    # --- the run modes ----------------------------------------------------------------------
    traits_described = {"integer_output": "a policy with discrete actions",
                        "integer_and_real": "a hybrid (continuous + discrete) policy"}
    variants = {"discrete": "integer_output", "hybrid": "integer_and_real"}

    # the Python API's name of this head's actions (api.Actions) and its (deterministic, sampled) outputs
    action = "discrete"
    action_outputs = (C.OUT_DISC_DET, C.OUT_DISC)
