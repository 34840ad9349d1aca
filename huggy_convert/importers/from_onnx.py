"""An ML-Agents ONNX read back into the actor it was exported from: its ``Policy`` state dict under
ML-Agents' keys, which the usual key rules (``converter.mapping``) turn into the PolicySpec and the
canonical tensors, so that an ONNX-only policy goes through the one pipeline as a checkpoint does.

How the tensors are found: by synthesis, not by a second description of ML-Agents' graph.

1. The spec is read from the graph's inputs and outputs (Unity's names and dims) and two counts
   (:func:`infer_spec`); a camera's ``vis_encode_type`` is the one of ML-Agents' five whose template
   graph matches (the likeliest first, from the node that reads the camera).
2. The blocks' ``state_template`` give that spec's state dict with placeholder values; its graph, built
   by ``exporters.onnx_export.build_onnx`` (the one description of ML-Agents' export), is matched with
   the input node by node: op types, attributes, Constant values and wiring must agree, and each of the
   input's initializers is read where the template has one (the template's name for it says which
   tensor it is).
3. The blocks' ``onnx_recover`` undo what the export transformed (the folded normalizer divisor, the
   LSTM's gate order, the renamed version number); the other initializers are the checkpoint's tensors
   as they are. The constant vectors an ONNX does not keep come from the spec.
4. The graph rebuilt from the recovered policy must equal the input: every node, attribute, constant,
   wire and initializer bit for bit. So its outputs are the input's, bitwise, in any runtime.

Any difference is an ``InputError`` naming it (exit 2). The comparison ignores what differs between
torch's exporters without changing the computation: node and tensor names (torch 1.x names nodes
``Gemm_12``, torch 2.x by module scope; folded initializers get numbered names), torch 2.x's
initializer-dedup Identity nodes, and whether a constant is a Constant node or an initializer. Unity's
I/O names must be ML-Agents'.

The normalizer: an ONNX holds ``D = sqrt(running_variance / normalization_steps)`` folded into one
initializer, not the running sums. The recovered policy holds steps = 1, variance = D² (float32), so
that the IEEE divisor every exporter computes is D again, bit for bit (``blocks.normalizer``), and the
canonical file's ``recovered_from`` metadata says so.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import blocks
from .. import contract as C
from ..converter import policy_from_checkpoint
from ..converter.checkpoint import Checkpoint
from ..converter.reference import goal_obs_from_reference, input_hints, read_onnx
from ..core.files import clip
from ..core.numerics import same_bits
from ..core.spec import PolicySpec
from ..errors import HuggyError, InputError, UnsupportedError
from ..exporters.onnx_export import build_onnx

NOT_RECOVERED = ("the training step", "the normalizer's running sums", "the critic and optimizer state")


def _opset(model) -> int:
    return {o.domain or "": o.version for o in model.opset_import}.get("", 0)


def _dims(vi) -> List[Optional[int]]:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def _not_ml_agents(what: str, path) -> InputError:
    return InputError(f"not an ML-Agents policy graph: {what}", path)


# --- 1. the spec from the I/O ------------------------------------------------------------------
def infer_spec(model, path=None) -> PolicySpec:
    """The PolicySpec an ML-Agents graph's I/O and layer count say: observations from ``obs_i``'s widths,
    the continuous head from its outputs, the discrete branches from the constant behind
    ``discrete_action_output_shape``, the memory from ``recurrent_in``, the normalizer from a Sub on
    ``obs_0`` (its mean), SAC from the Tanh of the sampled action, the body from its Sigmoids (one per
    Swish) and the first Gemm's width. ``InputError`` naming what is not an ML-Agents policy's; the
    rest of the graph is checked by :func:`match_graph`."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    for name in inits:  # torch keeps a parameter's key as its initializer's name: say which family it is
        for pat, what in C.UNSUPPORTED_PATTERNS:
            if pat.search(name):
                raise UnsupportedError(f"not supported yet: {what} (initializer {clip(repr(name), 80)})", path)
    inputs = {i.name: _dims(i) for i in g.input if i.name not in inits}
    obs_prefix = C.OBS_INPUT.format(i="")
    known = (C.ACTION_MASKS, C.RECURRENT_IN)
    for name in inputs:
        if name not in known and not (name.startswith(obs_prefix) and name[len(obs_prefix):].isdigit()):
            raise _not_ml_agents(f"unexpected input {clip(repr(name), 60)} (an ML-Agents policy takes "
                                 f"{C.OBS_INPUT.format(i=0)}, {C.OBS_INPUT.format(i=1)}..., {', '.join(known)})", path)
    obs = []  # each observation's shape: (n,) a vector, (max_entities, entity_size) a variable-length one
    while C.OBS_INPUT.format(i=len(obs)) in inputs:
        dims = inputs[C.OBS_INPUT.format(i=len(obs))]
        if len(dims) not in (2, 3, 4) or not all(dims[1:]):
            raise _not_ml_agents(f"input {C.OBS_INPUT.format(i=len(obs))!r} has the dims {dims}, not [batch, width], "
                                 "[batch, entities, features] or [batch, C, H, W] (a camera)", path)
        obs.append(tuple(int(d) for d in dims[1:]))
    n_obs = sum(1 for n in inputs if n.startswith(obs_prefix))
    if n_obs != len(obs):
        raise _not_ml_agents(f"observation inputs are not {C.OBS_INPUT.format(i=0)}..{C.OBS_INPUT.format(i=n_obs - 1)}", path)
    outputs = {o.name: o for o in g.output}
    for name in outputs:
        if name not in C.OUTPUTS:
            raise _not_ml_agents(f"unexpected output {clip(repr(name), 60)} (an ML-Agents policy's outputs are "
                                 f"{', '.join(C.OUTPUTS)})", path)
    producer = {o: n for n in g.node for o in n.output}
    alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and len(n.input) == 1}

    def constant_behind(out: str) -> Optional[np.ndarray]:
        name = out
        for _ in range(4):  # the output's Identity, then torch 2.x's dedup Identity
            if name in inits:
                return numpy_helper.to_array(inits[name])
            n = producer.get(name)
            if n is not None and n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                return numpy_helper.to_array(n.attribute[0].t)
            name = alias.get(name)
            if name is None:
                return None
        return None

    cont = 0
    for name in (C.OUT_CONT_DET, C.OUT_CONT):
        if name in outputs:
            d = _dims(outputs[name])
            if len(d) != 2 or not d[1]:
                raise _not_ml_agents(f"output {name!r} has the dims {d}, not [batch, actions]", path)
            cont = cont or int(d[1])
    branches: Tuple[int, ...] = ()
    if C.OUT_DISC_SHAPE in outputs or C.OUT_DISC_DET in outputs:
        v = constant_behind(C.OUT_DISC_SHAPE) if C.OUT_DISC_SHAPE in outputs else None
        if v is None or v.ndim != 2 or v.shape[0] != 1 or not np.all(np.isfinite(v)) or np.any(v != np.round(v)):
            raise _not_ml_agents(f"no constant branch sizes behind the output {C.OUT_DISC_SHAPE!r}", path)
        branches = tuple(int(x) for x in v.reshape(-1))
    memory = 0
    if C.RECURRENT_IN in inputs:
        d = inputs[C.RECURRENT_IN]
        if len(d) != 3 or d[1] != 1 or not d[2]:
            raise _not_ml_agents(f"input {C.RECURRENT_IN!r} has the dims {d}, not [batch, 1, memory]", path)
        memory = int(d[2])
    hidden = _features_width(g, producer, constant_behind, memory, path)
    sac = bool(cont) and C.OUT_CONT in producer and producer[C.OUT_CONT].op_type == "Tanh"
    vectors = [C.OBS_INPUT.format(i=i) for i, s in enumerate(obs) if len(s) == 1]
    normalize = any(n.op_type == "Sub" and n.input[:1] == vectors[:1] for n in g.node) if vectors else False
    goal = goal_obs_from_reference(model)
    legacy = any(h.transposed for h in input_hints(model).values())
    fields = dict(algorithm=C.TRAINER_SAC if sac else C.TRAINER_PPO, obs_sizes=tuple(int(np.prod(s)) for s in obs),
                  obs_shapes=tuple(obs) if any(len(s) != 1 for s in obs) else (), normalize=normalize,
                  hidden_units=hidden, continuous_size=cont, discrete_branches=branches, memory_size=memory,
                  attention_export=C.ATTENTION_EXPORT_030 if legacy else C.ATTENTION_EXPORT_110,
                  **({"goal_conditioning": C.GOAL_HYPER, "goal_obs": tuple(goal)} if goal else {}))
    sigmoids = sum(n.op_type == "Sigmoid" for n in g.node)
    cameras = [i for i, sh in enumerate(obs) if len(sh) == 3]
    tried = []
    for vtype in (_camera_encoders(g, cameras[0]) if cameras else [""]):
        try:  # every body layer (the MLP's, the conditional body's) is one Swish: the rest is the other blocks'
            one = PolicySpec(num_layers=1, vis_encode_type=vtype, **fields)
            spec = PolicySpec(num_layers=1 + sigmoids - _count_ops(_template_graph(one, _opset(model), model), "Sigmoid"),
                              vis_encode_type=vtype, **fields)
            if vtype:  # which visual encoder: the one whose graph this is
                match_graph(model, _template_graph(spec, _opset(model), model), path, collect=True)
        except HuggyError as exc:
            tried.append((vtype, exc.message))
            continue
        _check_io(model, spec, path)
        return spec
    if len(tried) == 1 and not tried[0][0]:
        raise _not_ml_agents(tried[0][1], path)
    raise _not_ml_agents(f"no visual encoder of ML-Agents ({', '.join(t for t, _ in tried)}) gives this graph for the "
                         f"camera {C.OBS_INPUT.format(i=cameras[0])}; as a {tried[0][0]}: "
                         f"{tried[0][1].replace('not an ML-Agents policy graph: ', '')}", path)


def _camera_encoders(g, i: int) -> List[str]:
    """ML-Agents' visual encoders, the likeliest first for the node that reads camera ``i``: a Reshape
    (fully_connected), a Conv 8x8 (simple, nature_cnn), 3x3 padded (resnet) or not (match3)."""
    name = C.OBS_INPUT.format(i=i)
    first = next((n for n in g.node if name in n.input), None)
    order = []
    if first is not None and first.op_type == "Reshape":
        order = [C.VIS_FULLY_CONNECTED]
    elif first is not None and first.op_type == "Conv":
        a = _attrs(first)
        k, pads = list(a.get("kernel_shape", [])), list(a.get("pads", [0]))
        order = [t for t in (C.VIS_SIMPLE, C.VIS_NATURE, C.VIS_MATCH3) if [C.VIS_CONVS[t][0][1]] * 2 == k and not any(pads)]
        order += [C.VIS_RESNET] if k == [3, 3] and any(pads) else []
    return order + [t for t in C.VIS_ENCODE_TYPES if t not in order]


def _features_width(g, producer, constant_behind, memory: int, path) -> int:
    """The body's width: what an LSTM takes (its W is [1, 4h, width]), else what the first head's Gemm
    reads, found by walking back from its deterministic output (first inputs) to a Gemm."""
    if memory:
        lstm = next((n for n in g.node if n.op_type == "LSTM"), None)
        w = constant_behind(lstm.input[1]) if lstm is not None and len(lstm.input) > 1 else None
        if w is None or w.ndim != 3:
            raise _not_ml_agents(f"{C.RECURRENT_IN!r} is an input but no LSTM reads a weight initializer", path)
        return int(w.shape[2])
    for out in (C.OUT_CONT_DET, C.OUT_DISC_DET):
        name = out
        for _ in range(16):
            n = producer.get(name)
            if n is None or not n.input:
                break
            if n.op_type == "Gemm":
                w = constant_behind(n.input[1])
                if w is None or w.ndim != 2:
                    break
                return int(w.shape[1] if _attrs(n).get("transB", 0) == 1 else w.shape[0])
            name = n.input[0]
    raise _not_ml_agents("no Gemm (a head's Linear) computes the deterministic actions", path)


def _count_ops(model, op: str) -> int:
    return sum(n.op_type == op for n in model.graph.node)


def _template_graph(spec: PolicySpec, opset: int, model):
    """The graph ML-Agents' export has for ``spec`` (placeholder values; no dedup Identity nodes)."""
    return build_onnx(_placeholder_policy(spec, model)[1], opset if opset in C.ONNX_OPSETS else C.ONNX_OPSET_DEFAULT,
                      dedup=False)


def _vector_sizes(spec: PolicySpec) -> Tuple[int, ...]:
    """The vector observations' widths: what the key rules take as the split no tensor gives."""
    return tuple(n for _, n in spec.vector_obs)


def _policy_of(ckpt: Checkpoint, spec: PolicySpec, model):
    """``ckpt``'s canonical policy by the usual key rules, told what the ONNX's inputs say (the vector
    split, an entity observation's count, the goal observations)."""
    return policy_from_checkpoint(ckpt, obs_sizes=_vector_sizes(spec), goal_obs=spec.goal_obs or None,
                                  hints_from=model).policy


def _check_io(model, spec: PolicySpec, path) -> None:
    """The graph's inputs and outputs are the spec's, in Unity's order."""
    inits = {t.name for t in model.graph.initializer}
    for which, got, want in (("input", [i.name for i in model.graph.input if i.name not in inits], spec.input_names()),
                             ("output", [o.name for o in model.graph.output], spec.output_names())):
        if got == want:
            continue
        extra = [n for n in got if n not in want]
        missing = [n for n in want if n not in got]
        if extra:
            msg = f"unexpected {which} {clip(repr(extra[0]), 60)}"
        elif missing:
            msg = f"no {which} {missing[0]!r}"
        else:
            msg = f"{which}s in the order {got}"
        raise _not_ml_agents(f"{msg} (ML-Agents' export of a {spec.family} has the {which}s {', '.join(want)})", path)


# --- 2. matching two graphs ------------------------------------------------------------------------
class _Flat:
    """A graph as compute nodes over values: torch 2.x's dedup Identity nodes (an initializer copied
    under another name) and Constant nodes are folded into values, so that each node input is a graph
    input, a value (an initializer, ``init``, or a Constant node's, ``const``), or a node's output."""

    def __init__(self, model):
        from onnx import helper, numpy_helper

        g = model.graph
        self.outputs = [o.name for o in g.output]
        self.inputs = {i.name for i in g.input}
        keep = set(self.outputs)
        self.values: Dict[str, np.ndarray] = {}
        self.kind: Dict[str, str] = {}
        self.origin: Dict[str, str] = {}  # value name -> the initializer it is (dedup aliases resolved)
        for t in g.initializer:
            self.values[t.name], self.kind[t.name], self.origin[t.name] = numpy_helper.to_array(t), "init", t.name
        self.inputs -= set(self.values)
        self.nodes = []  # (index in the file, NodeProto)
        self.made: Dict[str, Tuple[int, int]] = {}
        for k, n in enumerate(g.node):
            attrs = {a.name: a for a in n.attribute}
            if (n.op_type == "Constant" and not n.domain and not n.input and len(n.output) == 1
                    and set(attrs) == {"value"} and n.output[0] not in keep):
                self.values[n.output[0]] = numpy_helper.to_array(helper.get_attribute_value(attrs["value"]))
                self.kind[n.output[0]] = "const"
                continue
            if (n.op_type == "Identity" and not n.domain and len(n.input) == 1 and n.input[0] in self.values
                    and self.kind[n.input[0]] == "init" and n.output[0] not in keep):
                src = n.input[0]
                self.values[n.output[0]], self.kind[n.output[0]] = self.values[src], "init"
                self.origin[n.output[0]] = self.origin[src]
                continue
            for s, o in enumerate(n.output):
                self.made[o] = (len(self.nodes), s)
            self.nodes.append((k, n))

    def token(self, name: str):
        if name == "":
            return ("none",)
        if name in self.values:
            return (self.kind[name],)
        if name in self.inputs:
            return ("input", name)
        if name in self.made:
            return ("node",) + self.made[name]
        return ("undefined", name)

    def describe(self, token) -> str:
        if token[0] == "node":
            k, n = self.nodes[token[1]]
            return f"output {token[2]} of {describe_node(k, n)}"
        if token[0] == "input":
            return f"the input {token[1]!r}"
        return {"none": "no input", "init": "an initializer", "const": "a constant"}.get(token[0], f"{token[1]!r}")


def describe_node(k: int, n) -> str:
    return f"node {k} ({n.op_type}{' ' + clip(repr(n.name), 70) if n.name else ''})"


def _attrs(n) -> Dict[str, object]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _value_text(a: np.ndarray) -> str:
    return f"{a.dtype}{list(a.shape)}" + (f" {clip(a.reshape(-1)[:4].tolist(), 40)}" if a.size else "")


def _io_text(elem_type: int, dims) -> str:
    from onnx import TensorProto

    kind = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    return f"{kind.lower()}{['batch' if d is None else d for d in dims]}"


def match_graph(model, reference, path=None, collect: bool = True) -> Dict[str, np.ndarray]:
    """``model`` computes what ``reference`` computes, node for node: the same op types, attributes,
    Constant values and wires, and (``collect=False``) the same initializers, bit for bit. With
    ``collect``, the reference's initializers are placeholders: returns {reference initializer name:
    the value ``model`` has in its place}. The first difference is an ``InputError``."""
    ours, ref = _Flat(model), _Flat(reference)
    for which in ("input", "output"):  # names, element types and fixed dims (a batch dim's name aside)
        mine = {v.name: v for v in getattr(model.graph, which) if v.name not in ours.origin}
        for v in getattr(reference.graph, which):
            if v.name in ref.origin:
                continue
            got = mine.get(v.name)
            a = None if got is None else (got.type.tensor_type.elem_type, _dims(got))
            b = (v.type.tensor_type.elem_type, _dims(v))
            if a != b:
                raise _not_ml_agents(f"the {which} {v.name!r} is " + ("missing" if a is None else _io_text(*a))
                                     + f", ML-Agents' is {_io_text(*b)}", path)
    found: Dict[str, np.ndarray] = {}
    for pos, ((k, n), (rk, r)) in enumerate(zip(ours.nodes, ref.nodes)):
        where = describe_node(k, n)
        if (n.op_type, n.domain) != (r.op_type, r.domain):
            raise _not_ml_agents(f"{where} where ML-Agents' graph has {r.op_type}"
                                 + (f" ({clip(repr(r.name), 70)})" if r.name else ""), path)
        if len(n.input) != len(r.input) or len(n.output) != len(r.output):
            raise _not_ml_agents(f"{where} has {len(n.input)} inputs and {len(n.output)} outputs, ML-Agents' "
                                 f"{r.op_type} there {len(r.input)} and {len(r.output)}", path)
        if _attrs(n) != _attrs(r):
            raise _not_ml_agents(f"{where} has the attributes {clip(_attrs(n), 80)}, ML-Agents' {clip(_attrs(r), 80)}", path)
        for s, (a, b) in enumerate(zip(n.input, r.input)):
            ta, tb = ours.token(a), ref.token(b)
            if tb[0] in ("init", "const"):
                if ta[0] not in ("init", "const"):
                    raise _not_ml_agents(f"input {s} of {where} is {ours.describe(ta)}, where ML-Agents' graph "
                                         "reads a constant", path)
                va, vb = ours.values[a], ref.values[b]
                if collect and tb[0] == "init":
                    name = ref.origin[b]
                    if name in found and not same_bits(found[name], va):
                        raise _not_ml_agents(f"input {s} of {where} differs from the same tensor read earlier", path)
                    found[name] = va
                elif not same_bits(va, vb):
                    raise _not_ml_agents(f"input {s} of {where} is {_value_text(va)}, ML-Agents' graph has "
                                         f"{_value_text(vb)}", path)
            elif ta != tb:
                raise _not_ml_agents(f"input {s} of {where} is {ours.describe(ta)}, ML-Agents' graph has "
                                     f"{ref.describe(tb)} there", path)
    if len(ours.nodes) != len(ref.nodes):
        if len(ours.nodes) > len(ref.nodes):
            k, n = ours.nodes[len(ref.nodes)]
            raise _not_ml_agents(f"unexpected {describe_node(k, n)} after the {len(ref.nodes)} nodes of "
                                 "ML-Agents' graph", path)
        rk, r = ref.nodes[len(ours.nodes)]
        raise _not_ml_agents(f"the graph ends after {len(ours.nodes)} nodes, ML-Agents' has {len(ref.nodes)} "
                             f"(next: {r.op_type})", path)
    for name in ref.outputs:
        ta, tb = ours.token(name), ref.token(name)
        if ta != tb:
            raise _not_ml_agents(f"the output {name!r} is {ours.describe(ta)}, ML-Agents' is {ref.describe(tb)}", path)
    read = {ours.origin[x] for _, n in ours.nodes for x in n.input if x in ours.origin}
    unused = [t for t in ours.origin.values() if t not in read]
    if unused:
        raise _not_ml_agents(f"unexpected initializer {clip(repr(unused[0]), 70)} (no node reads it)", path)
    return found


# --- 3. the state dict ---------------------------------------------------------------------------
def _placeholder_policy(spec: PolicySpec, model):
    """The policy of the blocks' ``state_template`` for ``spec`` (the usual key rules; IEEE divisors;
    ``model``: the ONNX whose inputs say what no tensor does, e.g. an entity observation's count)."""
    import torch

    sd = {}
    for b in blocks.active(spec):
        sd.update(b.state_template(spec))
    ckpt = Checkpoint(Path("template"), "", {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                      None, [])
    policy = _policy_of(ckpt, spec, model)
    if policy.spec != spec:  # the templates and the key rules disagree: a bug, not the input's fault
        raise RuntimeError(f"the blocks' state templates make a {policy.spec.family}, not a {spec.family}")
    return sd, policy


def recover_state_dict(model, path=None) -> Tuple[Dict[str, np.ndarray], PolicySpec]:
    """(the ``Policy`` state dict an ML-Agents ``model`` was exported from, as far as the graph holds it;
    the spec its I/O says). ``InputError`` naming what is not ML-Agents'."""
    opset = _opset(model)
    if opset not in C.ONNX_OPSETS:
        raise InputError(f"ONNX opset {opset}: this tool reads ML-Agents' opset {C.ONNX_OPSET_DEFAULT} export and its "
                         f"own rebuilds ({C.ONNX_OPSETS[0]}-{C.ONNX_OPSETS[-1]})", path)
    spec = infer_spec(model, path)
    template, placeholder = _placeholder_policy(spec, model)
    reference = build_onnx(placeholder, opset, dedup=False)
    found = match_graph(model, reference, path, collect=True)
    shapes = {t.name: tuple(t.dims) for t in reference.graph.initializer}
    for name, a in found.items():
        if a.dtype != np.float32 or a.shape != shapes[name]:
            raise _not_ml_agents(f"the initializer in the place of {clip(repr(name), 90)} is {_value_text(a)}, "
                                 f"ML-Agents' is float32{list(shapes[name])}", path)
    sd = dict(template)
    try:
        for b in blocks.active(spec):
            b.onnx_recover(spec, found, sd)
    except HuggyError as exc:
        raise _not_ml_agents(exc.message, path) from None
    for name, a in found.items():
        if name not in sd:
            raise RuntimeError(f"initializer {name!r} of the template is no key and no block recovers it")
        sd[name] = a
    return {k: np.array(v, order="C") for k, v in sd.items()}, spec


def recovery_record(model, path: Path, sha256: str, spec: PolicySpec) -> Dict[str, object]:
    """What the canonical file's ``recovered_from`` metadata says about an ONNX-only policy."""
    norm = (f"{C.NORM_STEPS} = 1, {C.NORM_VAR} = divisor^2 (float32): the ONNX keeps only the folded divisor "
            f"sqrt({C.NORM_VAR} / {C.NORM_STEPS}), which these give back bit for bit") if spec.normalize else None
    return {"kind": "onnx", "file": Path(path).name, "sha256": sha256, "opset": _opset(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(), "normalizer": norm,
            "not_recovered": list(NOT_RECOVERED)}


def checkpoint_from_onnx(path, model=None, data: Optional[bytes] = None) -> Checkpoint:
    """An ML-Agents ONNX read (``reference.read_onnx``: validated) and recovered into a :class:`Checkpoint`
    whose ``policy`` is the state dict the graph was exported from (``global_step`` unknown); the graph
    rebuilt from it is checked to be the input's, node for node and bit for bit. ``model``/``data``: the
    file already read."""
    import torch

    p = Path(path)
    if model is None or data is None:
        model, data = read_onnx(p, "ONNX model")
    sd, spec = recover_state_dict(model, p)
    digest = hashlib.sha256(data).hexdigest()
    ckpt = Checkpoint(p, digest, {k: torch.from_numpy(v) for k, v in sd.items()}, None, [],
                      recovered=recovery_record(model, p, digest, spec), obs_sizes=_vector_sizes(spec))
    try:
        policy = _policy_of(ckpt, spec, model)
    except HuggyError as exc:  # the key rules on the recovered tensors (a constant that contradicts a layer...)
        raise _not_ml_agents(exc.message, p) from None
    match_graph(model, build_onnx(policy, _opset(model)), p, collect=False)
    return ckpt


def recovered_record(policy) -> Dict[str, object]:
    """The ``recovered_from`` record of a canonical policy ({} for one converted from a checkpoint)."""
    try:
        d = json.loads(policy.metadata.get(C.MD_RECOVERED, "{}"))
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def describe_recovered(record: Dict[str, object]) -> str:
    """One line for the CLI and ``info``."""
    if not record:
        return ""
    norm = f"; normalizer: {record['normalizer']}" if record.get("normalizer") else ""
    return (f"recovered from the ONNX {record.get('file')} (opset {record.get('opset')}, "
            f"{record.get('producer') or 'unknown producer'}){norm}; not in an ONNX: "
            + ", ".join(record.get("not_recovered") or ()))
