"""PolicySpec: what an ML-Agents actor is, inferred from its state dict's keys and shapes."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import List, Tuple

from .. import blocks
from .. import contract as C
from ..errors import SpecError

PPO = C.TRAINER_PPO
SAC = C.TRAINER_SAC
ACTIVATIONS = ("swish",)
MAX_WIDTH = 1 << 20  # any width (an observation, the hidden layer, an action head, the memory): far past any actor
MAX_LAYERS = 64


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
    log_sigma + tanh squash). ``obs_sizes`` has one entry per vector observation, in
    ML-Agents' order (``obs_0``, ``obs_1``...). ``memory_size`` is 0 without an LSTM.
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
    notes: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        """A spec describes a policy that can exist: every field of its type and in its range (a
        ``SpecError`` naming the field otherwise; a file's metadata is never trusted unchecked)."""
        if self.algorithm not in (PPO, SAC):
            raise SpecError(f"spec field 'algorithm' is {str(self.algorithm)[:40]!r}, not {PPO!r} or {SAC!r}")
        _counts("obs_sizes", self.obs_sizes, 1, MAX_WIDTH, 1)
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
        if not isinstance(self.notes, (tuple, list)) or not all(isinstance(n, str) for n in self.notes):
            raise SpecError("spec field 'notes' is not a list of strings")

    @property
    def obs_total(self) -> int:
        return sum(self.obs_sizes)

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
        obs = "+".join(map(str, self.obs_sizes))
        norm = "normalized " if self.normalize else ""
        return (f"{self.algorithm.upper()} actor: {norm}obs {obs} -> {self.num_layers}x{self.hidden_units} "
                f"{self.activation}{mem} -> {' + '.join(heads)}")

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
        return cls(**d)
