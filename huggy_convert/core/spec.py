"""PolicySpec: what an ML-Agents actor is, inferred from its state dict's keys and shapes.

The spec is data, checked on construction. The fields every actor has (its observations, the normalizer
switch, the body's width, depth and activation, notes) are declared here; each block declares its own
(:class:`SpecField`: name, default, check, when its JSON writes it) with the rules across them, its part
of the :attr:`PolicySpec.family` sentence and of :meth:`PolicySpec.input_hints`, the values that follow
from its fields (``derived``) and the kind of observation it encodes, by rank. What follows from the spec
part by part — its ports (``io_signature``), its parameter count, the width of its observations'
encodings — each block owns too (``huggy_convert.blocks``). The block registry hands all of it here when
it is imported (:func:`bind_architecture`): the layer below the blocks is handed their answers, it never
imports them.
"""
from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import InternalError, SpecError
from .flow import InputHint, IOSignature

ACTIVATIONS = ("swish", "tanh", "relu")  # ML-Agents' Swish; Tanh and ReLU: other trainers' MLPs
MAX_WIDTH = 1 << 20  # any width (an observation, the hidden layer, an action head, the memory): far past any actor
MAX_LAYERS = 64
OBS_VECTOR = "vector"  # the kind of a rank-1 observation; the other kinds, by rank, are their observe blocks'
SUMMARY_PARAMETERS = 90  # where summary() puts the parameter count among the fields (by SpecField.order)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # a SpecField without a default: every spec states it


def as_tuple(v):
    """A JSON list as the tuple a spec field holds (anything else as it is: the field's check judges it)."""
    return tuple(v) if isinstance(v, list) else v


def _shapes(v):
    return tuple(tuple(s) if isinstance(s, list) else s for s in v) if isinstance(v, list) else v


class SpecField(NamedTuple):
    """One field of :class:`PolicySpec`. ``order``: its place among the fields (positional arguments,
    :meth:`PolicySpec.summary`); ``check(spec)`` raises a ``SpecError`` naming the field; ``used(value)``:
    whether :meth:`PolicySpec.to_json` and ``summary`` write it (None: always); ``decode``: its JSON
    value as the field holds it; ``summary``: whether ``summary`` lists it at all; ``compare``: whether
    it takes part in ``==`` and the hash; ``stated``: what an official ONNX states and no checkpoint
    tensor does, handed back to the key rules when a canonical file is re-read (:meth:`PolicySpec.stated`)."""

    name: str
    order: int
    default: Any = REQUIRED
    check: Optional[Callable[["PolicySpec"], None]] = None
    used: Optional[Callable[[Any], bool]] = None
    decode: Optional[Callable[[Any], Any]] = None
    summary: bool = True
    compare: bool = True
    stated: bool = False


class Architecture(NamedTuple):
    """What the block registry answers for a spec (``blocks.io_signature``, ``blocks.parameter_count``,
    ``blocks.encoded_width``) and what the blocks declare of it: their fields (``fields``), the rules
    across them (``check``), their parts of the family sentence (``describe``: slot -> texts, slots
    ``trainer``, ``obs``, ``body``, ``heads``), of the input hints (``hints``), the values that follow
    from their fields (``derived``: name -> function of the spec) and the observation kinds by rank
    (``kinds``)."""

    io_signature: Callable[["PolicySpec"], IOSignature]
    parameter_count: Callable[["PolicySpec", bool], int]
    encoded_width: Callable[["PolicySpec"], int]
    fields: Tuple[SpecField, ...] = ()
    check: Callable[["PolicySpec"], None] = lambda spec: None
    describe: Callable[["PolicySpec"], Dict[str, List[str]]] = lambda spec: {}
    hints: Callable[["PolicySpec", Dict[int, InputHint]], None] = lambda spec, hints: None
    derived: Mapping[str, Callable[["PolicySpec"], Any]] = {}
    kinds: Mapping[int, str] = {1: OBS_VECTOR}


_ARCHITECTURE: Optional[Architecture] = None
_FIELDS: Tuple[SpecField, ...] = ()


def check_count(name: str, v, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:39] + "…"
        raise SpecError(f"spec field '{name}' is {shown}, not an integer in {lo}..{hi}")


def check_counts(name: str, v, lo: int, hi: int, min_len: int) -> None:
    if not isinstance(v, (tuple, list)) or not min_len <= len(v) <= 64:
        raise SpecError(f"spec field '{name}' is not a list of {min_len}..64 integers")
    for x in v:
        check_count(name, x, lo, hi)


def _check_obs(spec: "PolicySpec") -> None:
    check_counts("obs_sizes", spec.obs_sizes, 1, MAX_WIDTH, 1)
    shapes, ranks = spec.obs_shapes, sorted(_architecture().kinds)
    if not isinstance(shapes, (tuple, list)) or (shapes and len(shapes) != len(spec.obs_sizes)):
        raise SpecError("spec field 'obs_shapes' is not one shape per observation (or empty)")
    for i, shape in enumerate(shapes):
        if not isinstance(shape, (tuple, list)) or len(shape) not in ranks:
            raise SpecError(f"spec field 'obs_shapes' entry {i} is not a shape of {ranks[0]} to {ranks[-1]} dimensions")
        check_counts("obs_shapes", shape, 1, MAX_WIDTH, 1)
        if int(np.prod(shape, dtype=np.int64)) != spec.obs_sizes[i]:
            raise SpecError(f"spec field 'obs_shapes' entry {i} {list(shape)} does not hold obs_sizes[{i}] = "
                            f"{spec.obs_sizes[i]} elements")


def _check_normalize(spec: "PolicySpec") -> None:
    if not isinstance(spec.normalize, bool):
        raise SpecError("spec field 'normalize' is not true or false")


def _check_activation(spec: "PolicySpec") -> None:
    if spec.activation not in ACTIVATIONS:
        raise SpecError(f"spec field 'activation' is {str(spec.activation)[:40]!r}, not one of {', '.join(ACTIVATIONS)}")


def _check_notes(spec: "PolicySpec") -> None:
    if not isinstance(spec.notes, (tuple, list)) or not all(isinstance(n, str) for n in spec.notes):
        raise SpecError("spec field 'notes' is not a list of strings")


# the fields every actor has (the blocks' come between them, by order: core/README "SpecField")
CORE_FIELDS = (
    SpecField("obs_sizes", 20, check=_check_obs, decode=as_tuple),
    SpecField("normalize", 30, check=_check_normalize),
    SpecField("hidden_units", 40, check=lambda s: check_count("hidden_units", s.hidden_units, 1, MAX_WIDTH)),
    SpecField("num_layers", 50, check=lambda s: check_count("num_layers", s.num_layers, 1, MAX_LAYERS)),
    SpecField("activation", 85, "swish", check=_check_activation, summary=False, stated=True),
    SpecField("obs_shapes", 100, (), used=bool, decode=_shapes),
    SpecField("notes", 1000, (), check=_check_notes, decode=as_tuple, summary=False, compare=False),
)


def bind_architecture(arch: Architecture) -> None:
    """Called by ``huggy_convert.blocks`` when it is imported: ``huggy_convert/__init__`` imports the
    blocks, so any import of the package has them bound."""
    global _ARCHITECTURE, _FIELDS
    fields = sorted(CORE_FIELDS + tuple(arch.fields), key=lambda f: f.order)
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise InternalError(f"spec fields declared twice: {sorted({n for n in names if names.count(n) > 1})}")
    _ARCHITECTURE, _FIELDS = arch, tuple(fields)


def _architecture() -> Architecture:
    if _ARCHITECTURE is None:
        raise InternalError("PolicySpec has no block registry bound (huggy_convert.blocks was not imported)")
    return _ARCHITECTURE


def _plain(v):
    """A field's value as JSON writes it (tuples as lists)."""
    return [_plain(x) for x in v] if isinstance(v, (tuple, list)) else v


def _make(values: Dict[str, Any]) -> "PolicySpec":
    return PolicySpec(**values)


class PolicySpec:
    """The architecture of one ML-Agents actor (SimpleActor): frozen, hashable, checked on construction.

    Generic fields: ``obs_sizes`` has one entry per observation, in ML-Agents' order (``obs_0``,
    ``obs_1``...): its element count. ``obs_shapes`` is empty when every observation is a vector
    (``(obs_sizes[i],)``); otherwise it holds one shape per observation as ML-Agents' observation spec
    states it, channels first; each rank is the kind of one observe block (``obs_kind``). ``normalize``,
    ``hidden_units``, ``num_layers``, ``activation`` are the body's; ``notes`` take no part in ``==``.
    The other fields (the heads, the memory, the encoders' options) are the blocks' (``SpecField``),
    read as attributes like these (``spec.<field>``), as are the values that follow from them.
    ``PolicySpec(*fields in order, **fields)``: a ``TypeError`` for an unknown or missing field, a
    ``SpecError`` naming a field whose value is not one a policy can have.
    """

    def __init__(self, *args, **kwargs):
        _architecture()
        if len(args) > len(_FIELDS):
            raise TypeError(f"PolicySpec takes at most {len(_FIELDS)} fields, {len(args)} given")
        values = {f.name: v for f, v in zip(_FIELDS, args)}
        for k, v in kwargs.items():
            if k in values:
                raise TypeError(f"PolicySpec got multiple values for the field '{k}'")
            values[k] = v
        names = [f.name for f in _FIELDS]
        extra = [k for k in values if k not in names]
        if extra:
            raise TypeError(f"PolicySpec got an unexpected keyword argument '{extra[0]}'")
        missing = [f.name for f in _FIELDS if f.name not in values and f.default is REQUIRED]
        if missing:
            raise TypeError(f"PolicySpec is missing the field(s) {', '.join(repr(n) for n in missing)}")
        values = {f.name: values.get(f.name, f.default) for f in _FIELDS}
        self.__dict__.update(values)
        self.__dict__["_values"] = values
        self.__dict__["_key"] = tuple(values[f.name] for f in _FIELDS if f.compare)
        for f in _FIELDS:
            if f.check is not None:
                f.check(self)
        _ARCHITECTURE.check(self)

    def __getattr__(self, name: str):
        """The values that follow from the blocks' fields (``encoding_size``...), computed once."""
        fn = _architecture().derived.get(name) if not name.startswith("_") else None
        if fn is None:
            raise AttributeError(f"'PolicySpec' object has no attribute '{name}'")
        v = self.__dict__[name] = fn(self)
        return v

    def __setattr__(self, name: str, value) -> None:
        raise FrozenInstanceError(f"cannot assign to field '{name}'")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field '{name}'")

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(self._key)
        return h

    def __repr__(self) -> str:
        return "PolicySpec(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def __reduce__(self):
        return _make, (dict(self._values),)

    def values(self) -> Dict[str, Any]:
        """Every field's value, in field order (``PolicySpec(**spec.values()) == spec``)."""
        return dict(self._values)

    @property
    def obs_count(self) -> int:
        return len(self.obs_sizes)

    def obs_shape(self, i: int) -> Tuple[int, ...]:
        """Observation ``i``'s shape as ML-Agents states it (without the batch axis)."""
        return tuple(self.obs_shapes[i]) if self.obs_shapes else (self.obs_sizes[i],)

    def obs_kind(self, i: int) -> str:
        """The kind of observation ``i``, by its rank: ``vector`` (rank 1) or its observe block's kind."""
        return _architecture().kinds[len(self.obs_shape(i))]

    def observations(self, kind: str) -> List[Tuple[int, Tuple[int, ...]]]:
        """``(index, shape)`` of every observation of ``kind``, in observation order."""
        return [(i, self.obs_shape(i)) for i in range(self.obs_count) if self.obs_kind(i) == kind]

    @property
    def vector_obs(self) -> List[Tuple[int, int]]:
        """``(index, size)`` of every vector observation (the ones a normalizer can have)."""
        return [(i, shape[0]) for i in range(self.obs_count) if len(shape := self.obs_shape(i)) == 1]

    @property
    def obs_total(self) -> int:
        """The width of the vector observations together."""
        return sum(n for _, n in self.vector_obs)

    @property
    def encoded_width(self) -> int:
        """The width the body's first layer takes: every observation block's encoding together."""
        return _architecture().encoded_width(self)

    @property
    def family(self) -> str:
        """One sentence: the trainer, the observations, the body, the heads (each block its part)."""
        d = _architecture().describe(self)
        obs = "+".join("x".join(map(str, self.obs_shape(i))) for i in range(self.obs_count)) + "".join(d.get("obs", ()))
        norm = "normalized " if self.normalize else ""
        return (f"{''.join(d.get('trainer', ()))} actor: {norm}obs {obs} -> {self.num_layers}x{self.hidden_units} "
                f"{self.activation}{''.join(d.get('body', ()))} -> {' + '.join(d.get('heads', ()))}")

    def input_hints(self):
        """What this spec says of each observation input (``core.flow.InputHint``), as an official ONNX
        would: re-reading a canonical file maps its tensors with these (``converter.policy_file``)."""
        hints = {i: InputHint(self.obs_shape(i)) for i in range(self.obs_count)}
        _architecture().hints(self, hints)
        return hints

    def stated(self) -> Dict[str, Any]:
        """The fields an official ONNX states and no checkpoint tensor does (``SpecField.stated``) that this
        spec uses: what the key rules are told when its tensors are mapped again (``converter.mapping``)."""
        return {f.name: self._values[f.name] for f in _FIELDS if f.stated and self._written(f)}

    def io_signature(self) -> IOSignature:
        """The policy's inputs and outputs as Unity binds them (names, dims, dtypes, kinds), in
        Unity's order: the one source every name list below derives from (``core.flow.IOSignature``, the blocks' ports)."""
        return _architecture().io_signature(self)

    def input_names(self) -> List[str]:
        """The policy's inputs as Unity names them (the observations first)."""
        return self.io_signature().input_names()

    def output_names(self) -> List[str]:
        """Every ONNX output, in ML-Agents' order."""
        return self.io_signature().output_names()

    def deterministic_output_names(self) -> List[str]:
        """The deterministic outputs of every head, in ML-Agents' order (then the carried state)."""
        return self.io_signature().deterministic_output_names()

    def sampled_output_names(self) -> List[str]:
        """The stochastic outputs of every head, in ML-Agents' order."""
        return self.io_signature().sampled_output_names()

    def parameter_count(self, include_log_sigma: bool = True) -> int:
        """Trainable parameters of the actor (normalizer excluded): the sum of its blocks' counts."""
        return _architecture().parameter_count(self, include_log_sigma)

    def _written(self, f: SpecField) -> bool:
        return f.used is None or bool(f.used(self._values[f.name]))

    def summary(self) -> dict:
        """The spec as people and scripts read it (``info``, ``convert --json``, the batch manifest): the
        family, the fields in their order with the parameter count among them; a field a policy of this
        kind does not use is left out, as in :meth:`to_json` (which is the canonical form, not this)."""
        d = {"family": self.family}
        listed = [f for f in _FIELDS if f.summary and self._written(f)]
        for f in listed:
            if f.order > SUMMARY_PARAMETERS and "parameters" not in d:
                d["parameters"] = self.parameter_count()
            d[f.name] = _plain(self._values[f.name])
        d.setdefault("parameters", self.parameter_count())
        return d

    def to_json(self) -> str:
        """The canonical form (every file's ``spec`` metadata): each field the policy uses, keys sorted."""
        d = {f.name: _plain(self._values[f.name]) for f in _FIELDS if self._written(f)}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "PolicySpec":
        """The spec a file's metadata states, checked field by field (``SpecError`` otherwise)."""
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"spec is not JSON ({type(exc).__name__})") from None
        if not isinstance(d, dict):
            raise SpecError(f"spec is a JSON {type(d).__name__}, not an object")
        _architecture()
        by_name = {f.name: f for f in _FIELDS}
        extra = sorted(set(d) - set(by_name))
        if extra:
            raise SpecError(f"spec has the unknown field {extra[0][:40]!r}")
        missing = [f.name for f in _FIELDS if f.default is REQUIRED and f.name not in d]
        if missing:
            raise SpecError(f"spec has no field '{missing[0]}'")
        return cls(**{k: (by_name[k].decode(v) if by_name[k].decode else v) for k, v in d.items()})
