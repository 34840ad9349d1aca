"""The official ONNX as a reference: its folded normalizer divisors, and the divisor decision.

ML-Agents folds ``sqrt(running_variance / normalization_steps)`` into one initializer with torch on
the exporting machine's CPU, where MKL's float32 sqrt is exact (AVX2 path) or 1 ulp off on some
elements (AVX-512, generic paths). So an official divisor equal to the IEEE value or 1 ulp from it
on some elements is expected (folded by a sqrt that is not correctly rounded); anything further away is not the same
normalizer (``sqrt(var + eps)``, another checkpoint's file) and fails verification.

``reconcile_divisors`` decides what the artifacts divide by:
- ``auto`` (default): with an official ONNX whose divisor is within 1 ulp of IEEE everywhere, adopt
  the official's divisor, so the rebuilt ONNX's outputs are bitwise equal to the official's;
- ``ieee``: always the IEEE value (the same bytes on every machine, with or without a reference).
The decision is recorded in the policy's metadata (``divisor``), and from there in the ONNX's
``metadata_props``, the report, ``verify.json`` and the batch manifest.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import blocks
from .. import contract as C
from ..core.files import clip, read_input_file
from ..core.flow import InputHint
from ..core.numerics import ieee_divisor, ulp_distance
from ..core.spec import MAX_WIDTH
from ..errors import InputError


def divisor_initializers(model) -> Dict[int, str]:
    """{observation index: initializer name} of the folded divisor in an ML-Agents graph: the Div fed
    by ``Sub(obs_i, running_mean)``, second input (through torch 2.x's dedup Identity, if any)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input and n.input[0] in inits}
    consumers: Dict[str, list] = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    out: Dict[int, str] = {}
    for vi in g.input:
        name = vi.name
        if not name.startswith(C.OBS_INPUT.format(i="")) or not name[len(C.OBS_INPUT.format(i="")):].isdigit():
            continue
        i = int(name[len(C.OBS_INPUT.format(i="")):])
        for sub in consumers.get(name, []):
            if sub.op_type != "Sub":
                continue
            for div in consumers.get(sub.output[0], []):
                if div.op_type == "Div" and len(div.input) == 2 and div.input[0] == sub.output[0]:
                    d = alias.get(div.input[1], div.input[1])
                    if d in inits:
                        out[i] = d
    return out


def official_divisors(model) -> Dict[int, np.ndarray]:
    """{observation index: float32 divisor [n]} folded into an ML-Agents ONNX."""
    from onnx import numpy_helper

    names = divisor_initializers(model)
    by_name = {t.name: t for t in model.graph.initializer if t.name in set(names.values())}
    return {i: numpy_helper.to_array(by_name[n]).astype(np.float32).reshape(-1) for i, n in names.items()}


def _hex(x: np.float32) -> str:
    return "0x%08x" % int(np.float32(x).view(np.uint32))


def compare_divisor(got: np.ndarray, want: np.ndarray) -> Dict[str, object]:
    """Element-wise comparison of two divisors (an official or stored one against IEEE, a rebuilt one
    against the official's): counts, indices, max ulp, and the worst element with both values."""
    if got.shape != want.shape:
        return {"shape_mismatch": [list(want.shape), list(got.shape)], "max_ulp": None}
    ulp = ulp_distance(got, want)
    idx = np.nonzero(ulp)[0]
    d: Dict[str, object] = {"count": int(want.size), "differs": int(idx.size), "indices": [int(k) for k in idx],
                            "max_ulp": int(ulp.max()) if ulp.size else 0}
    if idx.size:
        k = int(np.argmax(ulp))
        d["worst"] = {"index": k, "got": float(got[k]), "got_bits": _hex(got[k]),
                      "want": float(want[k]), "want_bits": _hex(want[k]), "ulp": int(ulp[k])}
    return d


def ulp_problem(cmp: Dict[str, object], got: str, want: str, limit: int = 1, why: str = "") -> Optional[str]:
    """The failure sentence for a :func:`compare_divisor` result beyond ``limit`` ulp (None within it):
    the worst element, both values with their bits, the ulp distance."""
    if "shape_mismatch" in cmp:
        w, g = cmp["shape_mismatch"]
        return f"{got} has shape {g}, {want} has {w}"
    if cmp["max_ulp"] <= limit:
        return None
    w = cmp["worst"]
    return (f"{got}[{w['index']}] is {w['got']!r} ({w['got_bits']}), {want} is {w['want']!r} ({w['want_bits']}): "
            f"{w['ulp']} ulp apart ({cmp['differs']}/{cmp['count']} elements differ" + (f"; {why})" if why else ")"))


def divisor_problem(obs: int, cmp: Dict[str, object]) -> Optional[str]:
    """An official divisor against IEEE: None when equal or 1 ulp off (another CPU's sqrt)."""
    return ulp_problem(cmp, f"the official {C.OBS_INPUT.format(i=obs)} divisor", "IEEE sqrt(variance/steps)", 1,
                       "another CPU's sqrt explains at most 1 ulp: not this checkpoint's normalizer")


def policy_ieee_divisors(policy) -> Dict[int, np.ndarray]:
    T = policy.tensors
    return {i: ieee_divisor(T[C.c_norm(i, C.NORM_VAR)], T[C.c_norm(i, C.NORM_STEPS)])
            for i, _ in policy.spec.vector_obs} if policy.spec.normalize else {}


def _fixed_dims(dims) -> Tuple:
    return tuple(d if isinstance(d, int) else None for d in dims)[1:]


def input_hints(official) -> Dict[int, "InputHint"]:
    """Observation index -> what the official ONNX says of its input ``obs_<index>``
    (``core.flow.InputHint``): the dims without the batch axis (None where not fixed), and whether a
    Transpose swapping its last two axes reads it (ML-Agents 0.30's entity inputs); empty without an
    official file."""
    if official is None:
        return {}
    swapped = {n.input[0] for n in official.graph.node if n.op_type == "Transpose" and n.input
               and [list(a.ints) for a in n.attribute if a.name == "perm"] == [[0, 2, 1]]}
    out = {}
    for i in official.graph.input:
        m = re.fullmatch(C.OBS_INPUT.format(i=r"(\d+)"), i.name)
        if m:
            dims = _fixed_dims([d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim])
            out[int(m.group(1))] = InputHint(dims, i.name in swapped)
    return out


def check_same_policy(spec, official, reference_name: Optional[str] = None) -> None:
    """The official ONNX is this policy's: each of its inputs is one of the spec's, with the same
    fixed dims, and it takes every observation the spec has (``InputError`` naming the mismatch)."""
    ours = {p.name: _fixed_dims(p.dims) for p in spec.io_signature().inputs}
    inits = {t.name for t in official.graph.initializer}
    theirs = {}
    for i in official.graph.input:
        if i.name in inits:
            continue
        theirs[i.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                               for d in i.type.tensor_type.shape.dim)[1:]
    shown = ", ".join(f"{n} {list(d)}" for n, d in ours.items())
    for name, dims in theirs.items():
        if name not in ours:
            raise InputError(f"another policy: its input {name[:40]!r} is not one of this checkpoint's ({shown})",
                             reference_name)
        if len(dims) != len(ours[name]) or any(a is not None and b is not None and a != b
                                               for a, b in zip(dims, ours[name])):
            raise InputError(f"another policy: its input {name!r} is {list(dims)[:8]}, this checkpoint's is "
                             f"{list(ours[name])}", reference_name)
    for i in range(len(spec.obs_sizes)):
        name = C.OBS_INPUT.format(i=i)
        if name not in theirs:
            raise InputError(f"another policy: it has no input {name!r} (this checkpoint's: {shown})", reference_name)


def reconcile_divisors(policy, official=None, mode: str = "auto", reference_name: Optional[str] = None,
                       reference_sha256: Optional[str] = None) -> Tuple[object, Dict[str, object]]:
    """(policy whose ``obs.{i}.normalizer.divisor`` tensors are the ones to export, the decision).

    The decision (also stored as the policy's ``divisor`` metadata): ``mode``, ``source`` (``ieee``,
    ``official`` or ``none`` without a normalizer), the reference's name and sha256, and per
    observation the comparison with IEEE; ``problem`` names an official divisor more than 1 ulp
    from IEEE (then IEEE is used, and verification fails on it)."""
    if mode not in C.DIVISOR_MODES:
        raise InputError(f"--divisor {mode!r}: choose one of {', '.join(C.DIVISOR_MODES)}")
    spec = policy.spec
    if official is not None:
        check_same_policy(spec, official, reference_name)
    decision: Dict[str, object] = {"mode": mode, "source": "ieee" if spec.normalize else "none"}
    ieee = policy_ieee_divisors(policy)
    tensors = dict(policy.tensors)
    for i, d in ieee.items():
        tensors[C.c_divisor(i)] = d
    if official is not None and spec.normalize:
        decision["reference"] = reference_name
        decision["reference_sha256"] = reference_sha256
        found = official_divisors(official)
        per_obs, problems = {}, []
        for i, d in ieee.items():
            if i not in found:
                per_obs[str(i)] = {"found": False}
                problems.append(f"the official ONNX has no folded divisor for {C.OBS_INPUT.format(i=i)}")
                continue
            cmp = compare_divisor(found[i], d)
            per_obs[str(i)] = cmp
            p = divisor_problem(i, cmp)
            if p:
                problems.append(p)
        decision["observations"] = per_obs
        if problems:
            decision["problem"] = problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        elif mode == "auto" and any(v.get("differs") for v in per_obs.values()):
            decision["source"] = "official"
            for i in ieee:
                tensors[C.c_divisor(i)] = found[i].copy()
    md = dict(policy.metadata)
    md[C.MD_DIVISOR] = json.dumps(decision, sort_keys=True, separators=(",", ":"))
    return replace(policy, tensors=tensors, metadata=md), decision


def keep_divisors(policy, stated):
    """``policy`` with the divisors ``stated`` holds and its divisor record: a canonical file converted
    with no ONNX beside it keeps its own (adopted from its official ONNX, or IEEE: as its record says)."""
    tensors = dict(policy.tensors)
    for i in policy_ieee_divisors(policy):
        tensors[C.c_divisor(i)] = np.array(stated.tensors[C.c_divisor(i)], np.float32)
    md = dict(policy.metadata)
    if C.MD_DIVISOR in stated.metadata:
        md[C.MD_DIVISOR] = stated.metadata[C.MD_DIVISOR]
    return replace(policy, tensors=tensors, metadata=md)


def divisor_record(policy) -> Dict[str, object]:
    """The divisor decision recorded in a policy's metadata ({} for a version-1 file)."""
    try:
        return json.loads(policy.metadata.get(C.MD_DIVISOR, "{}"))
    except ValueError:
        return {}


def describe(decision: Dict[str, object]) -> str:
    """One line for the CLI, the report and the manifest."""
    src = decision.get("source")
    if src == "none":
        return "no normalizer"
    obs = decision.get("observations") or {}
    diff = sum(v.get("differs", 0) for v in obs.values())
    total = sum(v.get("count", 0) for v in obs.values())
    if decision.get("problem"):
        return f"IEEE (the official's is not this normalizer: {decision['problem']})"
    if src == "official":
        idx = {k: v["indices"] for k, v in obs.items() if v.get("differs")}
        where = "; ".join(f"{C.OBS_INPUT.format(i=k)} {v}" for k, v in idx.items())
        return (f"adopted from the official ONNX: {diff}/{total} elements 1 ulp from IEEE "
                f"(folded by a sqrt that is not correctly rounded: MKL's generic or AVX-512 path) at {where}")
    if obs:
        if diff:
            return (f"IEEE (--divisor ieee): the official's differs by 1 ulp on {diff}/{total} elements "
                    "(folded by a sqrt that is not correctly rounded: MKL's generic or AVX-512 path)")
        return f"IEEE, equal to the official's on all {total} elements"
    return "IEEE (correctly rounded float32 division, then sqrt)"


ONNX_MIN_OPSET = 7  # the oldest opset a Unity runtime imports (Sentis 7-15, Barracuda 9)


def read_onnx(path, what: str = "ONNX model", data: Optional[bytes] = None):
    """An ONNX model file read and validated: a regular file within the size bound
    (``core.files.read_input_file``), a protobuf ``onnx`` parses, ``onnx.checker.check_model``
    with ``full_check=True`` (a cycle, a missing initializer, an IR version or opset it does not
    know, a type error: all refused), a default-domain opset Unity imports, and an ML-Agents policy's
    ``obs_0`` float input of a width in 1..``core.spec.MAX_WIDTH``. ``data``: the file's bytes, already
    read (``read_input_file``): checked the same. Returns (model, the file's bytes)."""
    import onnx

    if data is None:
        data = read_input_file(path, what)
    if not data:
        raise InputError(f"empty file, not an {what}", path)
    try:
        m = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file
        raise InputError(f"not a readable ONNX model ({type(exc).__name__})", path) from None
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception as exc:  # onnx.checker.ValidationError, onnx.shape_inference.InferenceError
        first = " ".join(str(exc).split())
        raise InputError(f"not a valid ONNX model (onnx.checker: {clip(first, 160)})", path) from None
    opset = {o.domain or "": o.version for o in m.opset_import}.get("", 0)
    if opset < ONNX_MIN_OPSET:
        raise InputError(f"ONNX opset {opset}: an ML-Agents policy is opset {ONNX_MIN_OPSET} or newer", path)
    obs = C.OBS_INPUT.format(i=0)
    inputs = {i.name: i for i in m.graph.input}
    if not m.graph.node or obs not in inputs:
        raise InputError(f"not an ML-Agents policy ONNX (no '{obs}' input)", path)
    init_names = {t.name for t in m.graph.initializer}
    for name, i in inputs.items():
        if name in init_names:
            continue
        t = i.type.tensor_type
        if t.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            raise InputError(f"input {clip(repr(name), 40)} is of type "
                             f"{onnx.TensorProto.DataType.Name(t.elem_type) if t.elem_type in onnx.TensorProto.DataType.values() else t.elem_type}, "
                             "not float: not an ML-Agents policy ONNX", path)
        dims = [d.dim_value for d in t.shape.dim[1:] if d.HasField("dim_value")]
        if any(not 1 <= d <= MAX_WIDTH for d in dims):
            raise InputError(f"input {clip(repr(name), 40)} has the dims {clip(str(dims), 60)}: an observation "
                             f"width is 1..{MAX_WIDTH}", path)
    return m, data


def onnx_dims(vi) -> List[Optional[int]]:
    """A graph input's or output's dims (None where not fixed)."""
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def onnx_attrs(n) -> Dict[str, object]:
    """A node's attributes as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


NOT_ML_AGENTS = "not an ML-Agents policy graph: "


def not_ml_agents(what: str, path=None) -> InputError:
    return InputError(NOT_ML_AGENTS + what, path)


class OnnxView:
    """An ML-Agents ONNX as the blocks' ``onnx_detect`` and ``onnx_stated`` hooks read it: its ``inputs``
    (graph inputs that are no initializer) and ``outputs`` (name -> dims), ``nodes``, ``producer`` (value
    -> node), ``obs`` (each observation input's shape without the batch axis, where the importer read
    them), ``hints`` (:func:`input_hints`); :meth:`constant`, :meth:`gemm_width`, :meth:`first_reader`,
    :meth:`error` (``InputError``: not an ML-Agents policy graph)."""

    def __init__(self, model, path=None, obs: Tuple[Tuple[int, ...], ...] = ()):
        self.model, self.graph, self.path, self.obs = model, model.graph, path, tuple(obs)
        self.nodes = list(model.graph.node)

    @cached_property
    def inits(self) -> Dict[str, Any]:
        return {t.name: t for t in self.graph.initializer}

    @cached_property
    def inputs(self) -> Dict[str, List[Optional[int]]]:
        return {i.name: onnx_dims(i) for i in self.graph.input if i.name not in self.inits}

    @cached_property
    def outputs(self) -> Dict[str, List[Optional[int]]]:
        return {o.name: onnx_dims(o) for o in self.graph.output}

    @cached_property
    def producer(self) -> Dict[str, Any]:
        return {o: n for n in self.nodes for o in n.output}

    @cached_property
    def alias(self) -> Dict[str, str]:
        return {n.output[0]: n.input[0] for n in self.nodes if n.op_type == "Identity" and len(n.input) == 1}

    @cached_property
    def hints(self) -> Dict[int, InputHint]:
        return input_hints(self.model)

    def error(self, what: str) -> InputError:
        return not_ml_agents(what, self.path)

    @staticmethod
    def attrs(n) -> Dict[str, object]:
        return onnx_attrs(n)

    def first_reader(self, name: str):
        """The first node that reads ``name`` (None if none does)."""
        return next((n for n in self.nodes if name in n.input), None)

    def constant(self, out: str) -> Optional[np.ndarray]:
        """The constant behind ``out``: an initializer or a Constant node, through up to 4 Identity nodes
        (an output's, then torch 2.x's dedup Identity); None if it is computed."""
        from onnx import numpy_helper

        alias = self.alias
        name = out
        for _ in range(4):
            if name in self.inits:
                return numpy_helper.to_array(self.inits[name])
            n = self.producer.get(name)
            if n is not None and n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                return numpy_helper.to_array(n.attribute[0].t)
            name = alias.get(name)
            if name is None:
                return None
        return None

    def gemm_width(self, out: str) -> Optional[int]:
        """The width the Gemm nearest behind ``out`` reads (walking back along first inputs; a head's
        Linear), or None."""
        name = out
        for _ in range(16):
            n = self.producer.get(name)
            if n is None or not n.input:
                return None
            if n.op_type == "Gemm":
                w = self.constant(n.input[1])
                if w is None or w.ndim != 2:
                    return None
                return int(w.shape[1] if self.attrs(n).get("transB", 0) == 1 else w.shape[0])
            name = n.input[0]
        return None


def stated_fields(official) -> Dict[str, Any]:
    """What the official ONNX states that no checkpoint tensor does (``SpecField.stated``: e.g. which
    observations a block reads in a way no tensor records), each block reading its own
    (``Block.onnx_stated``); empty without one. The key rules cross-check it with the tensors."""
    if official is None:
        return {}
    view, out = OnnxView(official), {}
    for b in blocks.REGISTRY:
        out.update(b.onnx_stated(view))
    return out
