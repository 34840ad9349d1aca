"""Rebuild ML-Agents' Unity ONNX graph from a canonical policy, with onnx.helper (not torch.onnx).

At opset 9 the node sequence mirrors what ML-Agents' ``ModelSerializer`` gets from torch's
legacy exporter (constant folding on): per observation Sub/Div/Clip with the divisor folded
into one initializer ``sqrt(running_variance / normalization_steps)`` — the policy's own divisor
tensor (IEEE-exact, or adopted from the official ONNX: ``converter.reference``), never torch's CPU
sqrt, whose result depends on the CPU — Concat, Gemm/Sigmoid/Mul per layer, the LSTM path, the
continuous head (RandomNormalLike for the sample, Clip/Div or Tanh), the discrete head (mask,
Softmax, Log/Multinomial, ArgMax) and Identity nodes for the constant outputs.

torch 2.x merges initializers of equal value into one and re-creates the others with
Identity nodes at the top of the graph (e.g. two zero biases). ``dedup=True`` (the default)
does the same, so the op sequence matches a torch 2.x export node for node; verification
also compares with those Identity nodes removed, so a torch 1.x file (no merging) compares too.

Opsets 10-15 use each opset's own forms (Clip/Slice/Squeeze bounds as inputs).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import __version__
from .. import contract as C
from ..converter import Policy
from ..errors import ExportError

PRODUCER = "huggy-convert"


class _Graph:
    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self.counts: Dict[str, int] = {}

    def _name(self, scope: str, op: str) -> str:
        key = f"{scope}/{op}"
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return f"{scope}/{op}" + (f"_{n}" if n else "")

    def node(self, op: str, inputs, scope: str = "", out: Optional[str] = None, n_out: int = 1, **attrs):
        name = self._name(scope, op)
        outs = [out] if out else [f"{name}_output_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, scope: str, dtype=np.float32) -> str:
        t = numpy_helper.from_array(np.array(value, dtype=dtype))
        return self.node("Constant", [], scope, value=t)

    def clip(self, x: str, lo: float, hi: float, scope: str, out: Optional[str] = None) -> str:
        if self.opset < 11:
            return self.node("Clip", [x], scope, out=out, min=float(lo), max=float(hi))
        lo_t, hi_t = self.const(lo, scope), self.const(hi, scope)
        return self.node("Clip", [x, lo_t, hi_t], scope, out=out)

    def slice(self, x: str, start: int, end: int, axis: int, scope: str) -> str:
        if self.opset < 10:
            return self.node("Slice", [x], scope, axes=[axis], starts=[start], ends=[end])
        s, e, a = (self.const([v], scope, np.int64) for v in (start, end, axis))
        return self.node("Slice", [x, s, e, a], scope)

    def squeeze(self, x: str, axis: int, scope: str) -> str:
        if self.opset < 13:
            return self.node("Squeeze", [x], scope, axes=[axis])
        return self.node("Squeeze", [x, self.const([axis], scope, np.int64)], scope)


def _dedup(g: _Graph) -> None:
    """Mimic torch 2.x: an initializer equal (dtype, shape, bytes) to an earlier one is dropped
    and re-created by an Identity node placed at the top of the graph."""
    kept: List[onnx.TensorProto] = []
    seen: Dict[tuple, str] = {}
    idents = []
    for t in g.inits:
        key = (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
        if key in seen:
            idents.append(helper.make_node("Identity", [seen[key]], [t.name], name=f"Identity_{len(idents)}"))
        else:
            seen[key] = t.name
            kept.append(t)
    g.inits = kept
    g.nodes = idents + g.nodes


def build_onnx(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, dedup: bool = True) -> onnx.ModelProto:
    """Build the Unity-contract ONNX model for ``policy``; checked with ``full_check``."""
    if opset not in C.ONNX_OPSETS:
        raise ExportError(f"opset {opset} is not supported: choose one of {C.ONNX_OPSETS[0]}-{C.ONNX_OPSETS[-1]} "
                          "(Barracuda: 9, Sentis: 7-15, Ascend ATC: 9-13 on CANN 5/6, 9-18 on CANN 7)")
    spec, T = policy.spec, policy.tensors
    src = lambda canonical: policy.sources.get(canonical, canonical)  # noqa: E731 - ML-Agents' name
    g = _Graph(opset)
    batch = C.BATCH_DIM
    inputs = []
    # constants first, in the order torch lists them (params before buffers, module order)
    ver = g.init(C.K_VERSION + ".1", T[C.c_const(C.K_VERSION)])
    cont_shape = g.init(C.K_CONT_SIZE, T[C.c_const(C.K_CONT_SIZE)]) if spec.continuous_size else None
    disc_shape = g.init(C.K_DISC_SIZES, T[C.c_const(C.K_DISC_SIZES)]) if spec.discrete_branches else None
    mem = g.init(C.K_MEMORY_SIZE, T[C.c_const(C.K_MEMORY_SIZE)])

    # --- observations and normalizers -----------------------------------------------------
    encoded = []
    for i, n in enumerate(spec.obs_sizes):
        name = C.OBS_INPUT.format(i=i)
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, n]))
        if spec.normalize:
            scope = f"/network_body/observation_encoder/processors.{i}/normalizer"
            mean = g.init(src(C.c_norm(i, C.NORM_MEAN)), T[C.c_norm(i, C.NORM_MEAN)])
            div = g.init(f"{C.NORM_PREFIX.format(i=i)}divisor", policy.divisor(i))
            x = g.node("Sub", [name, mean], scope)
            x = g.node("Div", [x, div], scope)
            x = g.clip(x, -C.NORM_CLIP, C.NORM_CLIP, scope)
            encoded.append(x)
        else:
            encoded.append(name)
    if spec.discrete_branches:
        inputs.append(helper.make_tensor_value_info(C.ACTION_MASKS, TensorProto.FLOAT, [batch, spec.discrete_total]))
    if spec.memory_size:
        inputs.append(helper.make_tensor_value_info(C.RECURRENT_IN, TensorProto.FLOAT, [batch, 1, spec.memory_size]))
    h = g.node("Concat", encoded, "/network_body/observation_encoder", axis=1)

    # --- body ------------------------------------------------------------------------------
    for layer in range(spec.num_layers):
        w = g.init(src(C.c_body(layer, "weight")), T[C.c_body(layer, "weight")])
        b = g.init(src(C.c_body(layer, "bias")), T[C.c_body(layer, "bias")])
        z = g.node("Gemm", [h, w, b], f"/network_body/_body_endoder/seq_layers/seq_layers.{2 * layer}",
                   alpha=1.0, beta=1.0, transB=1)
        s = g.node("Sigmoid", [z], f"/network_body/_body_endoder/seq_layers/seq_layers.{2 * layer + 1}")
        h = g.node("Mul", [z, s], f"/network_body/_body_endoder/seq_layers/seq_layers.{2 * layer + 1}")

    # --- memory ----------------------------------------------------------------------------
    rec_out = None
    if spec.memory_size:
        hs = spec.memory_size // 2
        sc = "/network_body"
        x = g.node("Reshape", [h, g.const([-1, 1, spec.hidden_units], sc, np.int64)], sc)
        mem_t = g.node("Transpose", [C.RECURRENT_IN], sc + "/lstm", perm=[1, 0, 2])
        h0 = g.slice(mem_t, 0, hs, 2, sc + "/lstm")
        c0 = g.slice(mem_t, hs, np.iinfo(np.int64).max, 2, sc + "/lstm")
        x = g.node("Transpose", [x], sc + "/lstm/lstm", perm=[1, 0, 2])
        reorder = lambda a: np.concatenate([a[0:hs], a[3 * hs:4 * hs], a[hs:2 * hs], a[2 * hs:3 * hs]])  # noqa: E731 ifgo->iofc
        W = g.init("network_body.lstm.lstm.W", reorder(T[C.c_lstm("weight_ih")])[None])
        R = g.init("network_body.lstm.lstm.R", reorder(T[C.c_lstm("weight_hh")])[None])
        B = g.init("network_body.lstm.lstm.B", np.concatenate([reorder(T[C.c_lstm("bias_ih")]),
                                                               reorder(T[C.c_lstm("bias_hh")])])[None])
        y, yh, yc = g.node("LSTM", [x, W, R, B, "", h0, c0], sc + "/lstm/lstm", n_out=3, hidden_size=hs)
        y = g.squeeze(y, 1, sc + "/lstm/lstm")
        y = g.node("Transpose", [y], sc + "/lstm/lstm", perm=[1, 0, 2])
        cat = g.node("Concat", [yh, yc], sc + "/lstm", axis=-1)
        rec_out = g.node("Transpose", [cat], sc + "/lstm", out=C.RECURRENT_OUT, perm=[1, 0, 2])
        h = g.node("Reshape", [y, g.const([-1, hs], sc, np.int64)], sc)

    # --- heads: distributions (trace order: continuous, then discrete) ---------------------
    outputs = [helper.make_tensor_value_info(C.OUT_VERSION, TensorProto.FLOAT, [1]),
               helper.make_tensor_value_info(C.OUT_MEMORY, TensorProto.FLOAT, [1])]
    A = spec.continuous_size
    mu = std = None
    if A:
        sc = "/_continuous_distribution"
        w = g.init(src(C.C_MU_W), T[C.C_MU_W])
        b = g.init(src(C.C_MU_B), T[C.C_MU_B])
        if spec.tanh_squash:  # SAC: deterministic output is raw mu
            mu = g.node("Gemm", [h, w, b], sc + "/mu", out=C.OUT_CONT_DET, alpha=1.0, beta=1.0, transB=1)
            lw = g.init(src(C.C_LOG_SIGMA_W), T[C.C_LOG_SIGMA_W])
            lb = g.init(src(C.C_LOG_SIGMA_B), T[C.C_LOG_SIGMA_B])
            ls = g.node("Gemm", [h, lw, lb], sc + "/log_sigma", alpha=1.0, beta=1.0, transB=1)
            ls = g.clip(ls, C.SAC_LOG_SIGMA_MIN, C.SAC_LOG_SIGMA_MAX, sc)
        else:
            mu = g.node("Gemm", [h, w, b], sc + "/mu", alpha=1.0, beta=1.0, transB=1)
            zero = g.node("Mul", [mu, g.const(0.0, sc)], sc)
            ls = g.node("Add", [zero, g.init(src(C.C_LOG_SIGMA), T[C.C_LOG_SIGMA])], sc)
        std = g.node("Exp", [ls], sc)
    probs = []
    if spec.discrete_branches:
        sc = "/_discrete_distribution"
        ends = np.cumsum(spec.discrete_branches)
        masks = [g.slice(C.ACTION_MASKS, int(e - n), int(e), 1, sc) for n, e in zip(spec.discrete_branches, ends)]
        for bi, n in enumerate(spec.discrete_branches):
            w = g.init(src(C.c_branch(bi, "weight")), T[C.c_branch(bi, "weight")])
            b = g.init(src(C.c_branch(bi, "bias")), T[C.c_branch(bi, "bias")])
            logits = g.node("Gemm", [h, w, b], f"{sc}/branches.{bi}", alpha=1.0, beta=1.0, transB=1)
            block = g.node("Mul", [masks[bi], g.const(-1.0, sc)], sc)
            block = g.node("Add", [block, g.const(1.0, sc)], sc)
            kept = g.node("Mul", [logits, masks[bi]], sc)
            pen = g.node("Mul", [block, g.const(C.MASK_PENALTY, sc)], sc)
            masked = g.node("Sub", [kept, pen], sc)
            probs.append(g.node("Softmax", [masked], sc, axis=1))

    # --- heads: outputs --------------------------------------------------------------------
    if A:
        noise = g.node("RandomNormalLike", [mu], "", dtype=TensorProto.FLOAT)
        scaled = g.node("Mul", [noise, std], "")
        sample = g.node("Add", [mu, scaled], "")
        if spec.tanh_squash:
            g.node("Tanh", [sample], "", out=C.OUT_CONT)
        else:
            c = g.clip(sample, -C.ACTION_CLIP, C.ACTION_CLIP, "")
            g.node("Div", [c, g.const(C.ACTION_CLIP, "")], "", out=C.OUT_CONT)
            c = g.clip(mu, -C.ACTION_CLIP, C.ACTION_CLIP, "")
            g.node("Div", [c, g.const(C.ACTION_CLIP, "")], "", out=C.OUT_CONT_DET)
        det_dim = "batch" if spec.tanh_squash else f"Div{C.OUT_CONT_DET}_dim_0"
        outputs += [helper.make_tensor_value_info(C.OUT_CONT, TensorProto.FLOAT, [batch, A]),
                    helper.make_tensor_value_info(C.OUT_CONT_SHAPE, TensorProto.FLOAT, [1]),
                    helper.make_tensor_value_info(C.OUT_CONT_DET, TensorProto.FLOAT, [det_dim, A])]
    if spec.discrete_branches:
        nb = len(spec.discrete_branches)
        samples = []
        for p in probs:
            lp = g.node("Log", [p], "")
            samples.append(g.node("Multinomial", [lp], "", dtype=TensorProto.INT64, sample_size=1))
        g.node("Concat", samples, "", out=C.OUT_DISC, axis=1)
        g.node("Concat", [g.node("ArgMax", [p], "", axis=1, keepdims=1) for p in probs], "", out=C.OUT_DISC_DET, axis=1)
        outputs += [helper.make_tensor_value_info(C.OUT_DISC, TensorProto.INT64, [batch, nb]),
                    helper.make_tensor_value_info(C.OUT_DISC_SHAPE, TensorProto.FLOAT, [1, nb]),
                    helper.make_tensor_value_info(C.OUT_DISC_DET, TensorProto.INT64, [f"Concat{C.OUT_DISC_DET}_dim_0", nb])]
    if rec_out:
        outputs.append(helper.make_tensor_value_info(C.RECURRENT_OUT, TensorProto.FLOAT,
                                                     [f"Transpose{C.RECURRENT_OUT}_dim_0", 1, spec.memory_size]))
    g.node("Identity", [ver], "", out=C.OUT_VERSION)
    g.node("Identity", [mem], "", out=C.OUT_MEMORY)
    if cont_shape:
        g.node("Identity", [cont_shape], "", out=C.OUT_CONT_SHAPE)
    if disc_shape:
        g.node("Identity", [disc_shape], "", out=C.OUT_DISC_SHAPE)
    if dedup:
        _dedup(g)
    graph = helper.make_graph(g.nodes, "huggy_convert_policy", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name=PRODUCER, producer_version=__version__)
    model.ir_version = 6 if opset <= 11 else 7
    if spec.normalize and C.MD_DIVISOR in policy.metadata:
        helper.set_model_props(model, {C.ONNX_META_DIVISOR: policy.metadata[C.MD_DIVISOR]})
    onnx.checker.check_model(model, full_check=True)
    return model


def with_noise_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose RandomNormalLike draw is the graph input ``epsilon`` [batch, A].

    Works on any ML-Agents-shaped graph, the official file included, so the stochastic head
    can be compared bit for bit with the same injected noise."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    rnl = [n for n in m.graph.node if n.op_type == "RandomNormalLike"]
    if len(rnl) != 1:
        raise ExportError(f"expected one RandomNormalLike node, found {len(rnl)}")
    node = rnl[0]
    width = None
    for o in m.graph.output:
        if o.name == C.OUT_CONT:
            width = o.type.tensor_type.shape.dim[1].dim_value
    noise_name = node.output[0]
    m.graph.node.remove(node)
    for n in m.graph.node:
        for k, name in enumerate(n.input):
            if name == noise_name:
                n.input[k] = C.NOISE_INPUT
    m.graph.input.append(helper.make_tensor_value_info(C.NOISE_INPUT, TensorProto.FLOAT, [C.BATCH_DIM, width]))
    return m


def model_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)
