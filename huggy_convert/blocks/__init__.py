"""The block registry: one file per part of an ML-Agents actor, each owning everything about it.

A block (:class:`base.Block`) owns, for its part of the actor:

- its checkpoint key rules (``claim``: the ML-Agents keys it takes, the canonical tensors they
  become, the spec fields it infers, the shapes it cross-checks; ``constant_checks``: what the
  actor's constant vectors must say about it) — ``converter.mapping`` loops over them; ``restore``
  (what writing its keys back needs beyond ``policy.sources``: ML-Agents' dtypes, alias keys) —
  ``converter.state_dict`` loops over them;
- its slice of the spec: its fields (``spec_fields``: ``core.spec.SpecField``, each with its check and
  JSON rule; ``check_spec`` for the rules across them), the values that follow from them
  (``spec_derived``), its part of the family sentence (``describe``) and of the input hints
  (``spec_hints``), the kind of observation it encodes (``obs_rank``/``obs_kind``) — bound to
  ``core.spec`` below (``bind_architecture``);
- its parameter count (``parameter_count``) — ``PolicySpec.parameter_count`` sums them;
- its input/output ports (``inputs``/``outputs``) — ``PolicySpec.io_signature`` concatenates them;
- its ONNX nodes (``onnx_observe`` for an observation's processor, ``onnx_encode`` for a features
  block, ``onnx_head`` + ``onnx_output`` for a head; ``onnx_dims``) —
  ``exporters.onnx_export.build_onnx`` loops over them;
- its torch parameters and forward (``torch_init``, ``torch_observe`` / ``torch_encode`` / ``torch_output``) —
  ``exporters.torch_module.PolicyModule`` loops over them, one forward path for ``forward`` and ``sample``;
  and its eager in-place form (``torch_row``), which its hooks call with autograd off and which the module
  chains without the flow for one row where every block of the spec has one (``PolicyModule._row_plan``);
- its float64 reference with error bounds (``reference_init``, ``reference_observe`` /
  ``reference_encode`` / ``reference_output``) — ``verify.bounds.Float64Policy`` loops over them;
- its probe inputs (``probe``) — ``runtime.feeds.make_probes`` merges them;
- the way back from an ONNX alone (``onnx_detect``: its spec fields from the graph's I/O;
  ``state_template``: its keys for a spec as placeholders; ``onnx_recover``: the inverse of what its ONNX
  nodes transform) — ``importers.from_onnx`` loops over them; and ``onnx_stated``: what an official ONNX
  states that no checkpoint tensor does (``converter.reference.stated_fields``, read by its ``claim``).

:data:`REGISTRY` is the explicit list, in Unity's I/O order (inputs: observations, action masks,
memory; outputs: the actor's header, continuous, discrete, memory). The computation runs stage by
stage — ``frame`` (the actor's constants), ``observe`` (each observation -> its encoding, written to
``f.encoded[i]``; the orchestrators concatenate them in observation order, as ML-Agents'
ObservationEncoder does), ``encode`` (features -> features: body, memory), ``head`` (features ->
actions) — in registry order within a stage: :func:`in_stage`.

How to add a family (e.g. a visual encoder: an ``observe`` block for the observations of its kind,
beside the vector normalizer; attention: an ``observe`` block for the entity observations; a
hypernetwork body: an ``encode`` block claiming its keys, with the MLP body's rule made to step
aside when they are there):

1. Write ``blocks/<family>.py`` with one ``Block`` subclass. Put every ML-Agents key, Unity name and
   node scope it needs in ``contract/`` (``mlagents.py``, ``unity.py``) and its canonical tensor
   names in ``contract/canonical.py``; a block file holds no such literal (``tests/test_architecture.py``).
2. ``claim``: take every key the family owns with ``r.take`` / ``r.linear`` (or ``r.ignore`` with a
   reason), fail with ``r.error`` naming the key, record spec fields in ``r.fields`` (declared in its
   ``spec_fields``: core and the other stages are not edited) and the feature width the next block reads
   in ``r.state["width"]``. Remove the family's pattern from ``C.UNSUPPORTED_PATTERNS``.
3. Implement the spec, ONNX, torch and probe hooks the family has (``onnx_detect`` for reading it from an
   ONNX alone); ``active(spec)`` says when it is there.
4. Add an instance to :data:`REGISTRY` at its place in Unity's I/O order, and its tests (a fixture
   from ML-Agents' own code, the keys it claims, its ONNX against the official file, its module).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Tuple

from .. import contract as C
from ..core import spec as _spec
from ..core.flow import OBSERVATION, IOSignature
from ..errors import SpecError
from . import actor
from .actor import Actor
from .attention import Attention
from .base import ENCODE, FRAME, HEAD, OBSERVE, STAGES, Block, KeyRules  # noqa: F401  (the stages: blocks.OBSERVE...)
from .body import Body
from .continuous import Continuous
from .discrete import Discrete
from .goal import Goal
from .memory import Memory
from .normalizer import Normalizer
from .visual import Visual

REGISTRY: Tuple[Block, ...] = (Actor(), Normalizer(), Visual(), Attention(), Body(), Goal(), Continuous(), Discrete(), Memory())


def in_stage(stage: str, spec=None) -> List[Block]:
    """The blocks of ``stage`` in registry order (only those ``spec`` has, when given)."""
    return [b for b in REGISTRY if b.stage == stage and (spec is None or b.active(spec))]


def compute_order(spec=None) -> List[Block]:
    """Every block in the order the computation runs them (stage by stage)."""
    return [b for stage in STAGES for b in in_stage(stage, spec)]


def active(spec) -> List[Block]:
    """The blocks ``spec`` has, in registry (I/O) order."""
    return [b for b in REGISTRY if b.active(spec)]


@lru_cache(maxsize=256)
def io_signature(spec) -> IOSignature:
    """Every block's ports in registry order, except that the observations (each kind owned by its
    observe block) come first and in observation order, as Unity binds them: ``obs_0``, ``obs_1``..."""
    blocks = active(spec)
    ports = [p for b in blocks for p in b.inputs(spec)]
    order = {C.OBS_INPUT.format(i=i): i for i in range(spec.obs_count)}
    obs = sorted((p for p in ports if p.kind == OBSERVATION), key=lambda p: order[p.name])
    if [p.name for p in obs] != list(order):
        raise SpecError(f"the observation blocks give the inputs {[p.name for p in obs]}, not one per observation")
    return IOSignature(tuple(obs) + tuple(p for p in ports if p.kind != OBSERVATION),
                       tuple(p for b in blocks for p in b.outputs(spec)))


@lru_cache(maxsize=256)
def encoding_order(spec) -> Tuple[Tuple[int, ...], Tuple[Block, ...]]:
    """How ML-Agents' ObservationEncoder joins the encodings: the observations whose encodings are
    concatenated first, in observation order (those of the observe blocks without an ``*_append``
    hook), and the blocks whose encodings are appended after them, in registry order (attention: it
    embeds the others' concatenation as its self)."""
    order = {C.OBS_INPUT.format(i=i): i for i in range(spec.obs_count)}
    blocks = in_stage(OBSERVE, spec)
    appended = tuple(b for b in blocks if b.has("onnx_append"))
    own = sorted(order[p.name] for b in blocks if b not in appended for p in b.inputs(spec) if p.kind == OBSERVATION)
    return tuple(own), appended


def encoded_width(spec) -> int:
    """The width of every observation's encoding together (what the body's first layer takes)."""
    return sum(b.encoded_width(spec) for b in in_stage(OBSERVE, spec))


def encoders(spec) -> List[dict]:
    """Every observation's encoder (``Block.encoders``), in observation order of their first input."""
    order = {C.OBS_INPUT.format(i=i): i for i in range(spec.obs_count)}
    found = [e for b in in_stage(OBSERVE, spec) for e in b.encoders(spec)]
    return sorted(found, key=lambda e: order[e["inputs"][0]])


def parameter_count(spec, include_log_sigma: bool = True) -> int:
    return sum(b.parameter_count(spec, include_log_sigma) for b in active(spec))


def check_constants(r: KeyRules) -> None:
    """Every block's constant-vector checks: the blocks' own first, then the frame's (they span the heads)."""
    order = [b for b in REGISTRY if b.stage != FRAME] + in_stage(FRAME)
    actor.check_constants(r, [c for b in order for c in b.constant_checks(r)])


def check_spec(spec) -> None:
    """Every block's rules across the spec's fields (after each field's own check)."""
    for b in REGISTRY:
        b.check_spec(spec)


def describe(spec) -> Dict[str, List[str]]:
    """The blocks' parts of ``PolicySpec.family``, by slot, in registry order."""
    out: Dict[str, List[str]] = {}
    for b in REGISTRY:
        for slot, text in b.describe(spec):
            out.setdefault(slot, []).append(text)
    return out


def spec_hints(spec, hints) -> None:
    for b in REGISTRY:
        b.spec_hints(spec, hints)


def observe_kinds() -> List[Block]:
    """The observe blocks that own a kind of observation, by rank."""
    return sorted((b for b in REGISTRY if b.obs_rank), key=lambda b: b.obs_rank)


def onnx_inputs() -> Tuple[str, ...]:
    """Every input other than the observations a policy's blocks can have, in registry order."""
    return tuple(n for b in REGISTRY for n in b.onnx_inputs)


def onnx_detect(g) -> Dict[str, Any]:
    """The spec fields an ML-Agents ONNX's I/O says (``g``: ``converter.reference.OnnxView``), each block in
    registry order reading its own (``Block.onnx_detect``): values, or ``Choices`` only its graph decides."""
    found: Dict[str, Any] = {}
    for b in REGISTRY:
        found.update(b.onnx_detect(g, found))
    return found


_spec.bind_architecture(_spec.Architecture(
    io_signature, parameter_count, encoded_width, fields=tuple(f for b in REGISTRY for f in b.spec_fields),
    check=check_spec, describe=describe, hints=spec_hints,
    derived={k: fn for b in REGISTRY for k, fn in b.spec_derived.items()},
    kinds={b.obs_rank: b.obs_kind for b in observe_kinds()}))


# --- what the run modes ask of the blocks (modes/ reads these; a block never imports modes/) ---------
def traits(spec) -> Tuple[str, ...]:
    """The traits of ``spec`` that its ports do not tell, from every block (``Block.traits``)."""
    return tuple(t for b in REGISTRY for t in b.traits(spec))


def described_traits() -> Dict[str, str]:
    """Every block's ``traits_described``: a trait's name -> what it is, in the words the modes print."""
    return {k: v for b in REGISTRY for k, v in b.traits_described.items()}


def variants() -> Dict[str, str]:
    """Every block's fixture variants: a variant's name -> the trait a policy needs to stand in for it."""
    return {k: v for b in REGISTRY for k, v in b.variants.items()}


def onnx_weight_ops() -> Tuple[str, ...]:
    """The ONNX op types whose initializers hold parameters (``Block.onnx_weight_ops``), sorted."""
    return tuple(sorted({op for b in REGISTRY for op in b.onnx_weight_ops}))


def describe_input(spec, i: int, given=None) -> str:
    """What observation ``i`` is, said by the block that takes it (``Block.describe_input``; "" for a vector)."""
    name = C.OBS_INPUT.format(i=i)
    for b in active(spec):
        if any(p.name == name for p in b.inputs(spec)):
            return b.describe_input(spec, i, given)
    return ""

def action_heads() -> Tuple[Tuple[str, Tuple[str, str]], ...]:
    """(name, (deterministic output, sampled output)) of each block that makes actions, in registry order:
    what the Python API calls each head's actions (``api.Actions``)."""
    return tuple((b.action, b.action_outputs) for b in REGISTRY if getattr(b, "action", None))
