"""What the consumers' rules read of an ONNX file, read once: its opset, domains, operators, inputs and
outputs, external data, the constants behind its outputs, which outputs no input reaches, and what it
computes when run once on zero-filled inputs, as ML-Agents' Unity package runs it at load.

Reading is more lenient than the converter's (``converter.reference.read_onnx``): a file ``onnx.checker``
refuses is still judged as its consumers would judge it (Unity's importer drops a declared output that
nothing computes; onnxruntime refuses the file), so a checker failure is a fact, not an error."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..contract import consumers as K
from ..core.files import read_input_file
from ..errors import InputError
from ..runtime.ort import ort_run, ort_session

FLOAT, INT64 = 1, 7  # onnx.TensorProto element types


@dataclass
class Tensor:
    """One input or output: its name, element type (onnx.TensorProto) and dims (ints, or None where not fixed)."""

    name: str
    elem_type: int
    dims: Tuple[object, ...]

    @property
    def fixed(self) -> bool:
        return all(isinstance(d, int) for d in self.dims)


@dataclass
class ModelFacts:
    path: Path
    opset: int
    ir_version: int
    custom_domains: List[str]
    ops: List[str]
    inputs: List[Tensor]
    outputs: List[Tensor]
    external: List[str] = field(default_factory=list)  # the side files its tensors name
    missing_external: List[str] = field(default_factory=list)
    constants: Dict[str, np.ndarray] = field(default_factory=dict)  # output -> the value an initializer/Constant gives it
    bare_constants: List[str] = field(default_factory=list)  # outputs that are initializers themselves (no node)
    unconnected: List[str] = field(default_factory=list)  # outputs no input reaches (ML-Agents' Identity form aside)
    not_computed: List[str] = field(default_factory=list)  # declared outputs nothing produces
    checker: Optional[str] = None  # onnx.checker's complaint, if any
    zero_run: Dict[str, np.ndarray] = field(default_factory=dict)
    zero_run_error: Optional[str] = None
    model: Optional[object] = field(default=None, repr=False)  # the onnx.ModelProto read (what atc_plan reads too)

    def output(self, name: str) -> Optional[Tensor]:
        return next((t for t in self.outputs if t.name == name), None)

    def input(self, name: str) -> Optional[Tensor]:
        return next((t for t in self.inputs if t.name == name), None)

    def outputs_containing(self, name: str) -> List[str]:
        """Output names that contain ``name``, as ML-Agents matches them (``OutputsContainName``)."""
        return [t.name for t in self.outputs if name in t.name]

    def constant(self, name: str) -> Optional[np.ndarray]:
        """The value of output ``name``: its constant, else what the zero run gave (None: neither)."""
        if name in self.constants:
            return self.constants[name]
        return self.zero_run.get(name)


def _dims(vi) -> Tuple[object, ...]:
    """Each dimension: its size, its name where it is a named one (the batch), or None (neither)."""
    shape = vi.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim)


def _external_locations(model) -> List[str]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    locations = []
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if loc and loc not in locations:
                locations.append(loc)
    return locations


def _beside(path: Path, location: str) -> bool:
    """Whether the side file ``location`` is a regular file in ``path``'s folder (a location that is
    absolute or climbs out of the folder is never read)."""
    loc = Path(location)
    if loc.is_absolute() or ".." in loc.parts:
        return False
    return (path.parent / loc).is_file()


def _constants(model) -> Tuple[Dict[str, np.ndarray], List[str]]:
    """Outputs an initializer or a Constant node gives, directly or behind Identity nodes."""
    from onnx import numpy_helper

    values = {t.name: t for t in model.graph.initializer}
    bare = [o.name for o in model.graph.output if o.name in values]
    producer = {out: n for n in model.graph.node for out in n.output}
    found = {}
    for o in model.graph.output:
        name = o.name
        while name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        n = producer.get(name)
        try:
            if name in values and values[name].data_location != 1:  # not external: its bytes are here
                found[o.name] = numpy_helper.to_array(values[name])
            elif n is not None and n.op_type == "Constant":
                found[o.name] = numpy_helper.to_array(next(a.t for a in n.attribute if a.name == "value"))
        except Exception:  # an odd tensor: the zero run reads it instead
            continue
    return found, bare


def _unconnected(model) -> List[str]:
    """Outputs that depend on no graph input, except ML-Agents' own constant form (an initializer behind one
    or more ``Identity`` nodes, which every ML-Agents 3.x/4.x loads: it is what ML-Agents' exporter writes)."""
    producer = {out: n for n in model.graph.node for out in n.output}
    inputs = {i.name for i in model.graph.input}
    inits = {t.name for t in model.graph.initializer}
    memo: Dict[str, bool] = {}

    def reaches(name: str, depth=0) -> bool:
        if name in memo:
            return memo[name]
        if name in inputs and name not in inits:
            memo[name] = True
            return True
        memo[name] = False  # cycles (none in a valid graph) stop here
        n = producer.get(name)
        memo[name] = n is not None and depth < 10000 and any(reaches(i, depth + 1) for i in n.input if i)
        return memo[name]

    def identity_of_initializer(name: str) -> bool:
        n, hops = producer.get(name), 0
        if n is None or n.op_type != "Identity":
            return False
        while n is not None and n.op_type == "Identity" and hops < 64:  # torch's dedup adds Identity hops
            name, n, hops = n.input[0], producer.get(n.input[0]), hops + 1
        return name in inits

    return [o.name for o in model.graph.output if not identity_of_initializer(o.name) and not reaches(o.name)]


def _zero_feed(inputs: List[Tensor], unnamed: int) -> Dict[str, np.ndarray]:
    """Every input zero-filled as Unity fills its inputs at load: one row for a named dimension (the
    batch), ``unnamed`` for a dimension with neither size nor name (torch's dynamo export gives an unused
    ``recurrent_in`` such a width, which it takes as 0). Each of its declared type (the float rule says
    what Unity would make of another type)."""
    dtype = {FLOAT: np.float32, INT64: np.int64}
    shape = lambda t: tuple(d if isinstance(d, int) else (1 if d else unnamed) for d in t.dims)  # noqa: E731
    return {t.name: np.zeros(shape(t), dtype.get(t.elem_type, np.float32)) for t in inputs}


def _run_on_zeros(model, facts: ModelFacts) -> None:
    """The model run once on zero inputs (onnxruntime, CPU, one thread). A declared output that nothing
    computes is dropped first, as Unity's importer drops it (onnxruntime refuses such a file)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if facts.not_computed:
        keep = [o for o in m.graph.output if o.name not in facts.not_computed]
        del m.graph.output[:]
        m.graph.output.extend(keep)
    try:
        session = ort_session(m.SerializeToString())
    except Exception as exc:  # onnxruntime's own errors: the fact is that it does not load
        facts.zero_run_error = " ".join(str(exc).split())[:300]
        return
    for unnamed in (1, 0):
        try:
            facts.zero_run, facts.zero_run_error = ort_run(session, _zero_feed(facts.inputs, unnamed)), None
            return
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors: it does not compute
            facts.zero_run_error = " ".join(str(exc).split())[:300]


def read_facts(path, run: bool = True) -> ModelFacts:
    """The facts of the ONNX file ``path`` (its external data read from beside it where present)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    p = Path(path)
    data = read_input_file(p, "ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:
        raise InputError(f"not a readable ONNX model ({type(exc).__name__})", p) from None
    if not model.graph.node and not model.graph.output:
        raise InputError("not an ONNX model (no graph)", p)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    external = _external_locations(model)
    missing = [loc for loc in external if not _beside(p, loc)]
    if external and not missing:
        try:
            load_external_data_for_model(model, str(p.parent))
        except Exception:
            missing = list(external)
    domains = sorted({n.domain for n in model.graph.node if n.domain not in K.ONNX_DOMAINS}
                     | {f.domain for f in model.functions} | {d for d in opsets if d not in K.ONNX_DOMAINS})
    produced = {out for n in model.graph.node for out in n.output}
    known = produced | {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    facts = ModelFacts(
        path=p, opset=opsets.get("", opsets.get("ai.onnx", 0)), ir_version=model.ir_version, custom_domains=domains,
        ops=sorted({n.op_type for n in model.graph.node}),
        inputs=[Tensor(i.name, i.type.tensor_type.elem_type, _dims(i)) for i in model.graph.input
                if i.name not in {t.name for t in model.graph.initializer}],
        outputs=[Tensor(o.name, o.type.tensor_type.elem_type, _dims(o)) for o in model.graph.output],
        external=external, missing_external=missing,
        not_computed=[o.name for o in model.graph.output if o.name not in known])
    facts.constants, facts.bare_constants = _constants(model)
    facts.model = model
    facts.unconnected = [n for n in _unconnected(model) if n not in facts.not_computed]
    try:
        onnx.checker.check_model(model, full_check=False)
    except Exception as exc:
        facts.checker = " ".join(str(exc).split())[:200]
    if run and not missing:
        _run_on_zeros(model, facts)
    return facts

