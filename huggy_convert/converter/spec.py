"""PolicySpec: what an ML-Agents actor is, inferred from its state dict's keys and shapes."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Tuple

PPO = "ppo"
SAC = "sac"


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

    def input_names(self) -> List[str]:
        """The policy's inputs as Unity names them: ``obs_0..``, ``action_masks``, ``recurrent_in``."""
        from .. import contract as C

        names = [C.OBS_INPUT.format(i=i) for i in range(len(self.obs_sizes))]
        if self.discrete_branches:
            names.append(C.ACTION_MASKS)
        if self.memory_size:
            names.append(C.RECURRENT_IN)
        return names

    def deterministic_output_names(self) -> List[str]:
        """The deterministic outputs of every head, in ML-Agents' order."""
        from .. import contract as C

        names = []
        if self.continuous_size:
            names.append(C.OUT_CONT_DET)
        if self.discrete_branches:
            names.append(C.OUT_DISC_DET)
        if self.memory_size:
            names.append(C.RECURRENT_OUT)
        return names

    def parameter_count(self, include_log_sigma: bool = True) -> int:
        """Trainable parameters of the actor (linear layers, LSTM, heads; normalizer excluded)."""
        n, prev = 0, self.obs_total
        for _ in range(self.num_layers):
            n += prev * self.hidden_units + self.hidden_units
            prev = self.hidden_units
        if self.memory_size:
            hs = self.memory_size // 2
            n += 4 * hs * (self.hidden_units + hs) + 8 * hs
            prev = hs
        a = self.continuous_size
        if a:
            n += prev * a + a
            if include_log_sigma:
                n += (prev * a + a) if self.conditional_sigma else a
        for b in self.discrete_branches:
            n += prev * b + b
        return n

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
