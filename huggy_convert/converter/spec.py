"""PolicySpec: what an ML-Agents actor is, inferred from its state dict's keys and shapes."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Tuple

from .. import blocks
from .. import contract as C

PPO = C.TRAINER_PPO
SAC = C.TRAINER_SAC


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
        d: Dict = json.loads(text)
        d["obs_sizes"] = tuple(d["obs_sizes"])
        d["discrete_branches"] = tuple(d.get("discrete_branches", ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)
