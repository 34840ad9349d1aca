"""``Policy``: a policy in canonical form, its spec and its float32 tensors under their canonical names
(``contract.canonical``); the canonical file's verbs (``dumps``/``loads``/``save``/``load``) are
``converter.policy_file``'s."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict

import numpy as np

from .. import contract as C
from .spec import PolicySpec


@dataclass
class Policy:
    """A policy in canonical form: spec + float32 tensors (+ metadata once written/read)."""

    spec: PolicySpec
    tensors: Dict[str, np.ndarray]
    sources: Dict[str, str] = field(default_factory=dict)
    metadata: Dict[str, str] = field(default_factory=dict)

    def divisor(self, i: int) -> np.ndarray:
        """The float32 divisor of observation ``i``'s normalizer, the one every artifact uses."""
        return self.tensors[C.c_divisor(i)]

    @property
    def exact_steps(self) -> Dict[str, int]:
        return {k: int(v) for k, v in json.loads(self.metadata.get("normalizer_exact_steps", "{}")).items()}
