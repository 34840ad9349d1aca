"""The MLP body: ``[Linear, Swish] x num_layers``, Swish = ``x * sigmoid(x)`` exported as Sigmoid +
Mul (ML-Agents' own form); the torch module runs it as one ``F.silu`` kernel, which rounds
differently but inside the same derived bound. No residuals. The first layer's input
width fixes the observation split where no normalizer does. Another trainer's MLP (``activation``
``tanh`` or ``relu``, stated by its importer: ``importers.sb3``) is the same loop with a Tanh or Relu."""
from __future__ import annotations

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import Linear, affine, relu, swish, tanh
from ..core.flow import OnnxFlow, ReferenceFlow, TorchFlow
from ..core.spec import MAX_WIDTH, SpecField, as_tuple, check_counts
from ..errors import SpecError
from .base import ENCODE, Block, KeyRules


def _check_sizes(spec) -> None:
    sizes = spec.hidden_sizes
    if sizes == ():
        return
    check_counts("hidden_sizes", sizes, 1, MAX_WIDTH, 2)
    if len(sizes) != spec.num_layers or sizes[-1] != spec.hidden_units:
        raise SpecError("spec field 'hidden_sizes' is not one width per layer ending with hidden_units")


def widths(spec):
    """Each hidden layer's width: ``hidden_sizes`` where another trainer's net has layers of different widths
    (SB3's TD3 default ``[400, 300]``), else ``num_layers`` x ``hidden_units``."""
    return tuple(spec.hidden_sizes) or (spec.hidden_units,) * spec.num_layers


class Body(Block):
    name = "body"
    stage = ENCODE
    # layers of different widths (stated by another trainer's importer: ML-Agents' body has one width)
    spec_fields = (SpecField("hidden_sizes", 508, (), check=_check_sizes, used=bool, decode=as_tuple, stated=True),)

    def describe(self, spec):
        return [("body", f" (widths {'-'.join(map(str, spec.hidden_sizes))})")] if spec.hidden_sizes else []

    def active(self, spec) -> bool:
        return spec.goal_conditioning != C.GOAL_HYPER  # the goal-conditioned body is blocks/goal.py's

    def claim(self, r: KeyRules) -> None:
        if r.matching(C.HYPER_RE):
            return  # a ConditionalEncoder: blocks/goal.py claims it
        body_idx = r.indices(C.BODY_RE)
        first = C.BODY_LAYER.format(j=0, p="weight")
        if not body_idx:
            raise r.error(f"missing key '{first}' (no body layers)")
        num_layers = max(body_idx) // 2 + 1
        if any(j % 2 for j in body_idx):
            raise r.error(f"unexpected body layer indices {body_idx}: expected Linear at 0, 2, 4... (Swish between)")
        hidden, in_width = r.shape(r.matrix(first))
        shapes = observation_shapes(r, in_width)
        prev, sizes = in_width, tuple(r.stated.get("hidden_sizes") or ())
        if sizes and len(sizes) != num_layers:
            raise r.error(f"{num_layers} body layers, but the stated widths are {list(sizes)}")
        for layer in range(num_layers):
            key = C.BODY_LAYER.format(j=2 * layer, p="{p}")
            width = sizes[layer] if sizes else hidden
            r.linear(key, C.c_body(layer, "weight"), C.c_body(layer, "bias"), width, prev)
            prev = width
        record_body(r, shapes, prev, num_layers)
        if sizes:
            r.fields["hidden_sizes"] = sizes
        if "activation" in r.stated:
            r.fields["activation"] = r.stated["activation"]

    def state_template(self, spec):
        out, prev = {}, spec.encoded_width
        for layer, w in enumerate(widths(spec)):
            out[C.BODY_LAYER.format(j=2 * layer, p="weight")] = np.zeros((w, prev), np.float32)
            out[C.BODY_LAYER.format(j=2 * layer, p="bias")] = np.zeros(w, np.float32)
            prev = w
        return out

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        n, prev = 0, spec.encoded_width
        for w in widths(spec):
            n += prev * w + w
            prev = w
        return n

    def onnx_encode(self, f: OnnxFlow) -> None:
        g = f.g
        op = _ONNX_ACT.get(f.spec.activation)
        for layer in range(f.spec.num_layers):
            z = f.gemm(f.h, C.c_body(layer, "weight"), C.c_body(layer, "bias"), C.SCOPE_BODY_LAYER.format(j=2 * layer))
            act = C.SCOPE_BODY_LAYER.format(j=2 * layer + 1)
            if op is not None:  # another trainer's activation: one node
                f.h = g.node(op, [z], act)
                continue
            s = g.node("Sigmoid", [z], act)
            f.h = g.node("Mul", [z, s], act)

    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        import torch
        from torch import nn
        from torch.nn.functional import silu

        T = policy.tensors
        module.body = nn.ModuleList(module.affine(T[C.c_body(layer, "weight")], T[C.c_body(layer, "bias")])
                                    for layer in range(policy.spec.num_layers if self.active(policy.spec) else 0))
        # what the forward reads per call: the layers (never their tensors or parameter dicts: torch.export
        # and .to() swap those) and the kernels (an import inside the hook costs ~1 us a call)
        act = policy.spec.activation
        module.fast[self.name] = (tuple(module.body), torch.addmv, torch.addmm,
                                  silu if act == "swish" else _torch_act(act))

    def torch_row(self, module):
        import torch

        addmv, silu_, name = torch.addmv, torchcompat.inplace_silu(), self.name  # silu_: F.silu(.., True)'s own kernel
        if module.spec.activation != "swish":
            silu_ = _torch_act(module.spec.activation, True)

        def row(mod, h):
            for lin in mod.fast[name][0]:
                p = torchcompat.module_params(lin)
                h = silu_(addmv(p["bias"], p["weight"], h))
            return h
        return row

    def torch_encode(self, f: TorchFlow) -> None:
        """Each layer is one GEMM (``addmv`` for one row, eager; ``addmm`` otherwise, the
        ``Affine.apply_to`` forms) and one Swish kernel, ``F.silu`` (in place with autograd off: the
        same kernel, the same bits). ``silu`` computes ``z / (1 + exp(-z))``: three float32 roundings
        (exp, add, div), ~3 u relative, inside the Sigmoid + Mul bound the float64 reference derives
        (``core.bounds.swish``: ``8 u |z| + u |v|`` on top of the inherited error), which the tests
        check element-wise."""
        mod = f.module
        if f.vec and f.inplace:  # the eager one-row form (torch_row)
            f.h = mod.rows[self.name](mod, f.h)
            return
        layers, addmv, addmm, silu = mod.fast[self.name]
        h, inplace = f.h, f.inplace
        if f.vec:
            for lin in layers:
                p = torchcompat.module_params(lin)
                h = silu(addmv(p["bias"], p["weight"], h))
        else:
            for lin in layers:
                p = torchcompat.module_params(lin)
                h = silu(addmm(p["bias"], h, p["weight"].t()), inplace)
        f.h = h

    def reference_init(self, policy):
        T = policy.tensors
        return [Linear(T[C.c_body(k, "weight")], T[C.c_body(k, "bias")]) for k in range(policy.spec.num_layers)], \
            policy.spec.activation

    def reference_encode(self, r: ReferenceFlow, w) -> None:
        """Swish, Tanh (one rounding of torch's and onnxruntime's tanh: ``bounds.tanh``) or ReLU (exact)."""
        p, (layers, act) = r.precision, w
        for lin in layers:
            z = affine(r.h, lin, r.bounds, p=p)
            r.h = swish(z, p) if act == "swish" else tanh(z, p) if act == "tanh" else relu(z)

    # --- the run modes ----------------------------------------------------------------------
    onnx_weight_ops = ("Gemm", "MatMul")  # the heads' Gemms too: every Gemm's initializers are parameters


_ONNX_ACT = {"tanh": "Tanh", "relu": "Relu"}  # the other activations' ONNX op (Swish: Sigmoid + Mul)


def _torch_act(name: str, always_inplace: bool = False):
    """``fn(z, inplace=False)`` for the body's ``tanh`` or ``relu`` (the in-place kernel with autograd off)."""
    import torch

    fn, fn_ = (torch.tanh, torch.tanh_) if name == "tanh" else (torch.relu, torch.relu_)
    if always_inplace:
        return fn_
    return lambda z, inplace=False: fn_(z) if inplace else fn(z)


def record_body(r: KeyRules, shapes, hidden: int, num_layers: int) -> None:
    """The spec fields a body fixes (every observation's size and shape, its width and depth) and the
    width the next block reads."""
    sizes = tuple(int(np.prod(s, dtype=np.int64)) for s in shapes)
    r.fields.update(obs_sizes=sizes, hidden_units=hidden, num_layers=num_layers,
                    obs_shapes=tuple(shapes) if any(len(s) != 1 for s in shapes) else ())
    r.state["width"] = hidden


def observation_shapes(r: KeyRules, in_width: int):
    """Every observation's shape, in observation order, from what the observation blocks claimed
    (``r.state["observations"]``: index -> (shape, encoded width)) and the first body layer's width.

    With normalizers every vector observation is claimed and the indices must be 0..n-1. Without
    them (``normalize: false``) the vector observations are the indices no block claimed and share
    the width left over: split by the sizes given (``r.obs_sizes``: the vector observations', from
    the official ONNX or ``--obs-sizes``), else one vector."""
    found = dict(r.state.get("observations", {}))
    claimed = sum(w for _, w in found.values())
    left = in_width - claimed
    given = r.obs_sizes
    if r.state.get("obs_sizes"):  # normalized: the vector observations are all claimed
        if left:
            raise r.error(f"first body layer takes {in_width} inputs but the observations' encodings give {claimed}")
        if given is not None and list(given) != [s[0] for _, (s, _) in sorted(found.items()) if len(s) == 1]:
            raise r.error(f"observation sizes {list(given)} disagree with the normalizers' "
                          f"{[s[0] for _, (s, _) in sorted(found.items()) if len(s) == 1]}")
    elif left < 0:
        raise r.error(f"first body layer takes {in_width} inputs but the observations' encodings give {claimed}")
    elif left:
        vec = [int(s) for s in given] if given is not None else [left]
        if sum(vec) != left:
            what = "observation sizes" if not found else "vector observation sizes"
            raise r.error(f"{what} {vec} sum to {sum(vec)}, the first body layer takes {left}"
                          + (f" beside the other observations' {claimed}" if found else ""))
        free = [i for i in range(len(found) + len(vec)) if i not in found]
        if len(free) != len(vec):
            raise r.error(f"observation indices {sorted(found)} leave no place for {len(vec)} vector observation(s)")
        found.update({i: ((n,), n) for i, n in zip(free, vec)})
    elif given:
        raise r.error(f"observation sizes {list(given)} given, but the first body layer has no room for a vector")
    idx = sorted(found)
    if idx != list(range(len(idx))) or not idx:
        raise r.error(f"observation indices {idx} are not 0..{max(len(idx) - 1, 0)}")
    return [tuple(found[i][0]) for i in idx]
