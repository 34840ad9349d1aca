"""PolicySpec: what an ML-Agents actor is, inferred from its state dict's keys and shapes."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import List, Tuple

import numpy as np

from .. import blocks
from .. import contract as C
from ..errors import SpecError

PPO = C.TRAINER_PPO
SAC = C.TRAINER_SAC
ACTIVATIONS = ("swish",)
MAX_WIDTH = 1 << 20  # any width (an observation, the hidden layer, an action head, the memory): far past any actor
MAX_LAYERS = 64
# the kinds of observation, by the rank of ML-Agents' observation shape (ModelUtils.get_encoder_for_obs)
OBS_VECTOR, OBS_ENTITY, OBS_VISUAL = "vector", "entity", "visual"
OBS_KINDS = {1: OBS_VECTOR, 2: OBS_ENTITY, 3: OBS_VISUAL}


def _count(name: str, v, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:39] + "…"
        raise SpecError(f"spec field '{name}' is {shown}, not an integer in {lo}..{hi}")


def _counts(name: str, v, lo: int, hi: int, min_len: int) -> None:
    if not isinstance(v, (tuple, list)) or not min_len <= len(v) <= 64:
        raise SpecError(f"spec field '{name}' is not a list of {min_len}..64 integers")
    for x in v:
        _count(name, x, lo, hi)


@dataclass(frozen=True)
class PolicySpec:
    """The architecture of one ML-Agents actor (SimpleActor).

    ``algorithm`` is ``ppo`` (also POCA's actor: same layout) or ``sac`` (conditional
    log_sigma + tanh squash). ``obs_sizes`` has one entry per observation, in ML-Agents' order
    (``obs_0``, ``obs_1``...): its element count. ``obs_shapes`` is empty when every observation is a
    vector (``(obs_sizes[i],)``); otherwise it holds one shape per observation as ML-Agents' observation
    spec states it: ``(n,)`` a vector, ``(max_entities, entity_size)`` a variable-length observation,
    ``(C, H, W)`` a visual one (ML-Agents 1.x specs and ONNX inputs are channels first). The
    observation blocks (``blocks/``) own each kind. ``memory_size`` is 0 without an LSTM.
    ``attention_export``: which ML-Agents export of the attention over entity observations the ONNX
    mirrors and the modules compute (``1.1``; ``0.30`` transposes and reshapes each entity input first).
    """

    algorithm: str
    obs_sizes: Tuple[int, ...]
    normalize: bool
    hidden_units: int
    num_layers: int
    continuous_size: int
    discrete_branches: Tuple[int, ...] = ()
    memory_size: int = 0
    activation: str = "swish"
    obs_shapes: Tuple[Tuple[int, ...], ...] = ()
    attention_export: str = C.ATTENTION_EXPORT_110
    notes: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        """A spec describes a policy that can exist: every field of its type and in its range (a
        ``SpecError`` naming the field otherwise; a file's metadata is never trusted unchecked)."""
        if self.algorithm not in (PPO, SAC):
            raise SpecError(f"spec field 'algorithm' is {str(self.algorithm)[:40]!r}, not {PPO!r} or {SAC!r}")
        _counts("obs_sizes", self.obs_sizes, 1, MAX_WIDTH, 1)
        if not isinstance(self.obs_shapes, (tuple, list)) or (self.obs_shapes and len(self.obs_shapes) != len(self.obs_sizes)):
            raise SpecError("spec field 'obs_shapes' is not one shape per observation (or empty)")
        for i, shape in enumerate(self.obs_shapes):
            if not isinstance(shape, (tuple, list)) or len(shape) not in OBS_KINDS:
                raise SpecError(f"spec field 'obs_shapes' entry {i} is not a shape of 1 to 3 dimensions")
            _counts("obs_shapes", shape, 1, MAX_WIDTH, 1)
            if int(np.prod(shape, dtype=np.int64)) != self.obs_sizes[i]:
                raise SpecError(f"spec field 'obs_shapes' entry {i} {list(shape)} does not hold obs_sizes[{i}] = "
                                f"{self.obs_sizes[i]} elements")
        if not isinstance(self.normalize, bool):
            raise SpecError("spec field 'normalize' is not true or false")
        _count("hidden_units", self.hidden_units, 1, MAX_WIDTH)
        _count("num_layers", self.num_layers, 1, MAX_LAYERS)
        _count("continuous_size", self.continuous_size, 0, MAX_WIDTH)
        _counts("discrete_branches", self.discrete_branches, 1, MAX_WIDTH, 0)
        _count("memory_size", self.memory_size, 0, MAX_WIDTH)
        if self.memory_size % 2:
            raise SpecError(f"spec field 'memory_size' is {self.memory_size}: an LSTM memory is even (cell + hidden)")
        if not self.continuous_size and not self.discrete_branches:
            raise SpecError("spec has no action head (continuous_size 0, no discrete branches)")
        if self.activation not in ACTIVATIONS:
            raise SpecError(f"spec field 'activation' is {str(self.activation)[:40]!r}, not one of {', '.join(ACTIVATIONS)}")
        if self.attention_export not in C.ATTENTION_EXPORTS:
            raise SpecError(f"spec field 'attention_export' is {str(self.attention_export)[:40]!r}, not one of "
                            f"{', '.join(C.ATTENTION_EXPORTS)}")
        if self.attention_export != C.ATTENTION_EXPORT_110 and not self.observations(OBS_ENTITY):
            raise SpecError(f"spec field 'attention_export' is {self.attention_export!r} without an entity observation")
        if not isinstance(self.notes, (tuple, list)) or not all(isinstance(n, str) for n in self.notes):
            raise SpecError("spec field 'notes' is not a list of strings")

    @property
    def obs_count(self) -> int:
        return len(self.obs_sizes)

    def obs_shape(self, i: int) -> Tuple[int, ...]:
        """Observation ``i``'s shape as ML-Agents states it (without the batch axis)."""
        return tuple(self.obs_shapes[i]) if self.obs_shapes else (self.obs_sizes[i],)

    def obs_kind(self, i: int) -> str:
        """``vector``, ``entity`` (variable length) or ``visual``."""
        return OBS_KINDS[len(self.obs_shape(i))]

    def observations(self, kind: str) -> List[Tuple[int, Tuple[int, ...]]]:
        """``(index, shape)`` of every observation of ``kind``, in observation order."""
        return [(i, self.obs_shape(i)) for i in range(self.obs_count) if self.obs_kind(i) == kind]

    @property
    def vector_obs(self) -> List[Tuple[int, int]]:
        """``(index, size)`` of every vector observation (the ones a normalizer can have)."""
        return [(i, shape[0]) for i, shape in self.observations(OBS_VECTOR)]

    @property
    def obs_total(self) -> int:
        """The width of the vector observations together."""
        return sum(n for _, n in self.vector_obs)

    @property
    def encoded_width(self) -> int:
        """The width the body's first layer takes: every observation block's encoding together."""
        return blocks.encoded_width(self)

    @property
    def encoding_size(self) -> int:
        return self.memory_size // 2 if self.memory_size else self.hidden_units

    @property
    def discrete_total(self) -> int:
        return sum(self.discrete_branches)

    @property
    def tanh_squash(self) -> bool:
        return self.algorithm == SAC

    @property
    def conditional_sigma(self) -> bool:
        return self.algorithm == SAC

    @property
    def family(self) -> str:
        heads = []
        if self.continuous_size:
            heads.append(f"continuous {self.continuous_size}")
        if self.discrete_branches:
            heads.append("discrete " + "x".join(map(str, self.discrete_branches)))
        mem = f", LSTM memory {self.memory_size}" if self.memory_size else ""
        obs = "+".join("x".join(map(str, self.obs_shape(i))) for i in range(self.obs_count))
        norm = "normalized " if self.normalize else ""
        if self.attention_export != C.ATTENTION_EXPORT_110:
            obs += f" (attention as ML-Agents {self.attention_export} exports it)"
        return (f"{self.algorithm.upper()} actor: {norm}obs {obs} -> {self.num_layers}x{self.hidden_units} "
                f"{self.activation}{mem} -> {' + '.join(heads)}")

    def input_hints(self):
        """What this spec says of each observation input (``blocks.InputHint``), as an official ONNX
        would: re-reading a canonical file maps its tensors with these (``converter.policy_file``)."""
        transposed = self.attention_export == C.ATTENTION_EXPORT_030
        return {i: blocks.InputHint(self.obs_shape(i), transposed and self.obs_kind(i) == OBS_ENTITY)
                for i in range(self.obs_count)}

    def io_signature(self):
        """The policy's inputs and outputs as Unity binds them (names, dims, dtypes, kinds), in
        Unity's order: the one source every name list below derives from (``blocks.IOSignature``)."""
        return blocks.io_signature(self)

    def input_names(self) -> List[str]:
        """The policy's inputs as Unity names them: ``obs_0..``, ``action_masks``, ``recurrent_in``."""
        return self.io_signature().input_names()

    def output_names(self) -> List[str]:
        """Every ONNX output, in ML-Agents' order."""
        return self.io_signature().output_names()

    def deterministic_output_names(self) -> List[str]:
        """The deterministic outputs of every head, in ML-Agents' order (then the memory)."""
        return self.io_signature().deterministic_output_names()

    def sampled_output_names(self) -> List[str]:
        """The stochastic outputs of every head, in ML-Agents' order."""
        return self.io_signature().sampled_output_names()

    def parameter_count(self, include_log_sigma: bool = True) -> int:
        """Trainable parameters of the actor (linear layers, LSTM, heads; normalizer excluded): the
        sum of its blocks' counts."""
        return blocks.parameter_count(self, include_log_sigma)

    def to_json(self) -> str:
        d = asdict(self)
        d["obs_sizes"] = list(self.obs_sizes)
        if self.obs_shapes:
            d["obs_shapes"] = [list(s) for s in self.obs_shapes]
        else:  # an all-vector spec reads (and hashes) as before the field existed
            del d["obs_shapes"]
        if self.attention_export == C.ATTENTION_EXPORT_110:  # likewise: a policy without 0.30's attention
            del d["attention_export"]
        d["discrete_branches"] = list(self.discrete_branches)
        d["notes"] = list(self.notes)
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
        names = {f.name for f in fields(cls)}
        extra = sorted(set(d) - names)
        if extra:
            raise SpecError(f"spec has the unknown field {extra[0][:40]!r}")
        missing = [n for n in ("algorithm", "obs_sizes", "normalize", "hidden_units", "num_layers", "continuous_size")
                   if n not in d]
        if missing:
            raise SpecError(f"spec has no field '{missing[0]}'")
        for k in ("obs_sizes", "discrete_branches", "notes"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        if isinstance(d.get("obs_shapes"), list):
            d["obs_shapes"] = tuple(tuple(s) if isinstance(s, list) else s for s in d["obs_shapes"])
        return cls(**d)
