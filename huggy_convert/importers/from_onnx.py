"""An ML-Agents ONNX read back into the actor it was exported from: its ``Policy`` state dict under
ML-Agents' keys, which the usual key rules (``converter.mapping``) turn into the PolicySpec and the
canonical tensors, so that an ONNX-only policy goes through the one pipeline as a checkpoint does.

How the tensors are found: by synthesis, not by a second description of ML-Agents' graph.

1. The spec is read from the graph's inputs and outputs (Unity's names and dims) and a count of its
   Sigmoids (:func:`infer_spec`), each block reading its own fields (``Block.onnx_detect``); a field only
   the graph decides (``blocks.base.Choices``: a camera's encoder) is the value whose template graph
   matches (the likeliest first).
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
import itertools
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import blocks
from .. import contract as C
from ..blocks.base import Choices
from ..converter import policy_from_checkpoint
from ..converter.checkpoint import Checkpoint
from ..converter.reference import NOT_ML_AGENTS, OnnxView, not_ml_agents, onnx_attrs, onnx_dims, read_onnx
from ..core.files import clip
from ..core.numerics import same_bits
from ..core.spec import PolicySpec
from ..errors import HuggyError, InputError, UnsupportedError
from ..exporters.onnx_export import build_onnx

NOT_RECOVERED = ("the training step", "the normalizer's running sums", "the critic and optimizer state")


def _opset(model) -> int:
    return {o.domain or "": o.version for o in model.opset_import}.get("", 0)


# --- 1. the spec from the I/O ------------------------------------------------------------------
def _observations(g: OnnxView) -> List[Tuple[int, ...]]:
    """Each observation input's shape without the batch axis, of a rank an observe block encodes; the
    inputs must be ``obs_0..`` and the other blocks' (``InputError`` naming the first that is not)."""
    obs_prefix, known, kinds = C.OBS_INPUT.format(i=""), blocks.onnx_inputs(), blocks.observe_kinds()
    for name in g.inputs:
        if name not in known and not (name.startswith(obs_prefix) and name[len(obs_prefix):].isdigit()):
            raise g.error(f"unexpected input {clip(repr(name), 60)} (an ML-Agents policy takes "
                          f"{C.OBS_INPUT.format(i=0)}, {C.OBS_INPUT.format(i=1)}..., {', '.join(known)})")
    obs: List[Tuple[int, ...]] = []
    while C.OBS_INPUT.format(i=len(obs)) in g.inputs:
        dims = g.inputs[C.OBS_INPUT.format(i=len(obs))]
        if len(dims) - 1 not in [b.obs_rank for b in kinds] or not all(dims[1:]):
            words = [b.obs_dims for b in kinds]
            raise g.error(f"input {C.OBS_INPUT.format(i=len(obs))!r} has the dims {dims}, not "
                          f"{', '.join(words[:-1])} or {words[-1]}")
        obs.append(tuple(int(d) for d in dims[1:]))
    n_obs = sum(1 for n in g.inputs if n.startswith(obs_prefix))
    if n_obs != len(obs):
        raise g.error(f"observation inputs are not {C.OBS_INPUT.format(i=0)}..{C.OBS_INPUT.format(i=n_obs - 1)}")
    for name in g.outputs:
        if name not in C.OUTPUTS:
            raise g.error(f"unexpected output {clip(repr(name), 60)} (an ML-Agents policy's outputs are {', '.join(C.OUTPUTS)})")
    return obs


def infer_spec(model, path=None) -> PolicySpec:
    """The PolicySpec an ML-Agents graph's I/O and layer count say: the observations from ``obs_i``'s dims,
    each block's fields from what it reads in the graph (``Block.onnx_detect``), the body's depth from its
    Sigmoids (one per Swish) beyond the other blocks'; a field only the graph decides (``blocks.base.Choices``)
    is the first value whose graph matches. ``InputError`` naming what is not an ML-Agents policy's; the
    rest of the graph is checked by :func:`match_graph`."""
    for t in model.graph.initializer:  # torch keeps a parameter's key as its initializer's name: say which family it is
        for pat, what in C.UNSUPPORTED_PATTERNS:
            if pat.search(t.name):
                raise UnsupportedError(f"not supported yet: {what} (initializer {clip(repr(t.name), 80)})", path)
    g = OnnxView(model, path)
    g.obs = obs = tuple(_observations(g))
    fields = dict(obs_sizes=tuple(int(np.prod(s)) for s in obs), obs_shapes=obs if any(len(s) != 1 for s in obs) else ())
    fields.update(blocks.onnx_detect(g))
    if "hidden_units" not in fields:
        raise g.error("no Gemm (a head's Linear) computes the deterministic actions")
    choices = {k: v for k, v in fields.items() if isinstance(v, Choices)}
    sigmoids, opset, tried = _count_ops(model, "Sigmoid"), _opset(model), []
    for values in itertools.product(*(c.values for c in choices.values())):
        option = {**fields, **dict(zip(choices, values))}
        try:  # every body layer (the MLP's, the conditional body's) is one Swish: the rest is the other blocks'
            one = PolicySpec(num_layers=1, **option)
            spec = PolicySpec(num_layers=1 + sigmoids - _count_ops(_template_graph(one, opset, model), "Sigmoid"), **option)
            if choices:  # which value: the one whose graph this is
                match_graph(model, _template_graph(spec, opset, model), path, collect=True)
        except HuggyError as exc:
            tried.append((values, exc.message))
            continue
        _check_io(model, spec, path)
        return spec
    if not choices:
        raise g.error(tried[0][1])
    c = next(iter(choices.values()))
    raise g.error(f"no {c.what} ({', '.join(str(v[0]) for v, _ in tried)}) gives this graph {c.where}; as a "
                  f"{tried[0][0][0]}: {tried[0][1].replace(NOT_ML_AGENTS, '')}")


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
    split, the observations' shapes) and what the spec's fields state (``PolicySpec.stated``)."""
    return policy_from_checkpoint(ckpt, obs_sizes=_vector_sizes(spec), stated=spec.stated(), hints_from=model).policy


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
        raise not_ml_agents(f"{msg} (ML-Agents' export of a {spec.family} has the {which}s {', '.join(want)})", path)


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


def _value_text(a: np.ndarray) -> str:
    return f"{a.dtype}{list(a.shape)}" + (f" {clip(a.reshape(-1)[:4].tolist(), 40)}" if a.size else "")


def _io_text(elem_type: int, dims) -> str:
    from onnx import TensorProto

    kind = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    return f"{kind.lower()}{['batch' if d is None else d for d in dims]}"


def _match_io(model, ours: _Flat, reference, ref: _Flat, path) -> None:
    """The graph inputs and outputs: names, element types and fixed dims (a batch dim's name aside)."""
    for which in ("input", "output"):
        mine = {v.name: v for v in getattr(model.graph, which) if v.name not in ours.origin}
        for v in getattr(reference.graph, which):
            if v.name in ref.origin:
                continue
            got = mine.get(v.name)
            a = None if got is None else (got.type.tensor_type.elem_type, onnx_dims(got))
            b = (v.type.tensor_type.elem_type, onnx_dims(v))
            if a != b:
                raise not_ml_agents(f"the {which} {v.name!r} is " + ("missing" if a is None else _io_text(*a))
                                    + f", ML-Agents' is {_io_text(*b)}", path)


def match_graph(model, reference, path=None, collect: bool = True) -> Dict[str, np.ndarray]:
    """``model`` computes what ``reference`` computes, node for node: the same op types, attributes,
    Constant values and wires, and (``collect=False``) the same initializers, bit for bit. With
    ``collect``, the reference's initializers are placeholders: returns {reference initializer name:
    the value ``model`` has in its place}. The first difference is an ``InputError``."""
    ours, ref = _Flat(model), _Flat(reference)
    _match_io(model, ours, reference, ref, path)
    found: Dict[str, np.ndarray] = {}
    for pos, ((k, n), (rk, r)) in enumerate(zip(ours.nodes, ref.nodes)):
        where = describe_node(k, n)
        if (n.op_type, n.domain) != (r.op_type, r.domain):
            raise not_ml_agents(f"{where} where ML-Agents' graph has {r.op_type}"
                                + (f" ({clip(repr(r.name), 70)})" if r.name else ""), path)
        if len(n.input) != len(r.input) or len(n.output) != len(r.output):
            raise not_ml_agents(f"{where} has {len(n.input)} inputs and {len(n.output)} outputs, ML-Agents' "
                                f"{r.op_type} there {len(r.input)} and {len(r.output)}", path)
        if onnx_attrs(n) != onnx_attrs(r):
            raise not_ml_agents(f"{where} has the attributes {clip(onnx_attrs(n), 80)}, ML-Agents' {clip(onnx_attrs(r), 80)}", path)
        for s, (a, b) in enumerate(zip(n.input, r.input)):
            ta, tb = ours.token(a), ref.token(b)
            if tb[0] in ("init", "const"):
                if ta[0] not in ("init", "const"):
                    raise not_ml_agents(f"input {s} of {where} is {ours.describe(ta)}, where ML-Agents' graph "
                                        "reads a constant", path)
                va, vb = ours.values[a], ref.values[b]
                if collect and tb[0] == "init":
                    name = ref.origin[b]
                    if name in found and not same_bits(found[name], va):
                        raise not_ml_agents(f"input {s} of {where} differs from the same tensor read earlier", path)
                    found[name] = va
                elif not same_bits(va, vb):
                    raise not_ml_agents(f"input {s} of {where} is {_value_text(va)}, ML-Agents' graph has "
                                        f"{_value_text(vb)}", path)
            elif ta != tb:
                raise not_ml_agents(f"input {s} of {where} is {ours.describe(ta)}, ML-Agents' graph has "
                                    f"{ref.describe(tb)} there", path)
    if len(ours.nodes) != len(ref.nodes):
        if len(ours.nodes) > len(ref.nodes):
            k, n = ours.nodes[len(ref.nodes)]
            raise not_ml_agents(f"unexpected {describe_node(k, n)} after the {len(ref.nodes)} nodes of "
                                "ML-Agents' graph", path)
        rk, r = ref.nodes[len(ours.nodes)]
        raise not_ml_agents(f"the graph ends after {len(ours.nodes)} nodes, ML-Agents' has {len(ref.nodes)} "
                            f"(next: {r.op_type})", path)
    for name in ref.outputs:
        ta, tb = ours.token(name), ref.token(name)
        if ta != tb:
            raise not_ml_agents(f"the output {name!r} is {ours.describe(ta)}, ML-Agents' is {ref.describe(tb)}", path)
    read = {ours.origin[x] for _, n in ours.nodes for x in n.input if x in ours.origin}
    unused = [t for t in ours.origin.values() if t not in read]
    if unused:
        raise not_ml_agents(f"unexpected initializer {clip(repr(unused[0]), 70)} (no node reads it)", path)
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
            raise not_ml_agents(f"the initializer in the place of {clip(repr(name), 90)} is {_value_text(a)}, "
                                f"ML-Agents' is float32{list(shapes[name])}", path)
    sd = dict(template)
    try:
        for b in blocks.active(spec):
            b.onnx_recover(spec, found, sd)
    except HuggyError as exc:
        raise not_ml_agents(exc.message, path) from None
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
        raise not_ml_agents(exc.message, p) from None
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
