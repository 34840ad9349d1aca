"""Rebuild ML-Agents' Unity ONNX graph from a canonical policy, with onnx.helper (not torch.onnx).

At opset 9 the node sequence mirrors what ML-Agents' ``ModelSerializer`` gets from torch's
legacy exporter (constant folding on): per observation Sub/Div/Clip with the divisor folded
into one initializer ``sqrt(running_variance / normalization_steps)`` — the policy's own divisor
tensor (IEEE-exact, or adopted from the official ONNX: ``converter.reference``), never torch's CPU
sqrt, whose result depends on the CPU — Concat, Gemm/Sigmoid/Mul per layer, the LSTM path, the
continuous head (RandomNormalLike for the sample, Clip/Div or Tanh), the discrete head (mask,
Softmax, Log/Multinomial, ArgMax) and Identity nodes for the constant outputs. Each part's nodes
are its block's (``huggy_convert.blocks``); this module holds the opset-aware builder and the loop.

torch 2.x merges initializers of equal value into one and re-creates the others with
Identity nodes at the top of the graph (e.g. two zero biases). ``dedup=True`` (the default)
does the same, so the op sequence matches a torch 2.x export node for node; verification
also compares with those Identity nodes removed, so a torch 1.x file (no merging) compares too.

Opsets 10-15 use each opset's own forms (Clip/Slice/Squeeze bounds, ReduceSum axes as inputs).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import blocks
from .. import contract as C
from ..core.flow import OnnxFlow
from ..core.policy import Policy
from ..core.version import __version__
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
        self.inits.append(numpy_helper.from_array(np.asarray(array, order="C"), name))  # a 0-d array stays 0-d
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

    def reduce_sum(self, x: str, axis: int, keepdims: int, scope: str) -> str:
        if self.opset < 13:
            return self.node("ReduceSum", [x], scope, axes=[axis], keepdims=keepdims)
        return self.node("ReduceSum", [x, self.const([axis], scope, np.int64)], scope, keepdims=keepdims)

    def unsqueeze(self, x: str, axis: int, scope: str) -> str:
        if self.opset < 13:
            return self.node("Unsqueeze", [x], scope, axes=[axis])
        return self.node("Unsqueeze", [x, self.const([axis], scope, np.int64)], scope)

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


_ONNX_DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}


def build_onnx(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, dedup: bool = True) -> onnx.ModelProto:
    """Build the Unity-contract ONNX model for ``policy``; checked with ``full_check``.

    A loop over the blocks (``huggy_convert.blocks``): the constant outputs' initializers first,
    then each block's nodes stage by stage (observe, then one Concat of the encodings; encode;
    heads' distributions, then their outputs), the I/O from ``spec.io_signature()`` and an
    Identity per constant output."""
    if opset not in C.ONNX_OPSETS:
        raise ExportError(f"opset {opset} is not supported: choose one of {C.ONNX_OPSETS[0]}-{C.ONNX_OPSETS[-1]} "
                          f"({C.opset_story()})")
    spec = policy.spec
    sig = spec.io_signature()
    g = _Graph(opset)
    f = OnnxFlow(g, policy)
    # constants first, in the order torch lists them (SimpleActor registers them in C.CONSTANT_KEYS' order)
    consts = sig.constant_outputs()
    rank = {C.c_const(k): n for n, k in enumerate(C.CONSTANT_KEYS)}
    for port in sorted(consts, key=lambda p: rank[p.tensor]):
        g.init(port.init, policy.tensors[port.tensor])
    observers = [b for b in blocks.in_stage(blocks.OBSERVE, spec) if b.has("onnx_observe")]
    for i in range(spec.obs_count):  # ML-Agents' processors run in observation order
        f.current = i
        for b in observers:
            b.onnx_observe(f)
    f.current = None
    # ML-Agents' ObservationEncoder: the encodings concatenated in observation order, then what the
    # appending blocks (attention) make of them appended after them
    own, appending = blocks.encoding_order(spec)
    if sorted(f.encoded) != list(own):
        raise ExportError(f"observations {sorted(set(own) - set(f.encoded))} have no encoder block")
    f.h = g.node("Concat", [f.encoded[i] for i in own], C.SCOPE_OBS_ENCODER, axis=1) if own else None
    appended = [b.onnx_append(f) for b in appending]
    if appended:
        f.h = g.node("Concat", ([f.h] if f.h else []) + appended, C.SCOPE_OBS_ENCODER, axis=1)
    for b in blocks.in_stage(blocks.ENCODE, spec):
        b.onnx_encode(f)
    heads = blocks.in_stage(blocks.HEAD, spec)
    for b in heads:  # trace order: every distribution, then every output
        b.onnx_head(f)
    for b in heads:
        b.onnx_output(f)
    dims = {k: v for b in blocks.active(spec) for k, v in b.onnx_dims(spec).items()}

    def info(port, batch_name=C.BATCH_DIM):
        shape = [batch_name if d == C.BATCH_DIM else d for d in port.dims]
        return helper.make_tensor_value_info(port.name, _ONNX_DTYPES[port.dtype], shape)

    inputs = [info(p) for p in sig.inputs]
    outputs = [info(p, dims.get(p.name, C.BATCH_DIM)) for p in sig.outputs]
    for port in consts:
        g.node("Identity", [port.init], "", out=port.name)
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
