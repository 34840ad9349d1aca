"""The Runner protocol: what every backend offers."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Optional, Protocol, runtime_checkable

import numpy as np

from .. import contract as C

STOCHASTIC = (C.OUT_CONT, C.OUT_DISC)  # outputs that are draws, not functions of the feed

Feed = Dict[str, np.ndarray]


@runtime_checkable
class Runner(Protocol):
    """One policy on one backend, device and dtype.

    ``infer``: every output the backend computes for ``feed`` (by output name, numpy, float outputs as
    float32); ``sample``: the stochastic heads for ``seed`` (the noise ``PolicyModule.sample`` draws on
    the CPU) or for the injected ``noise`` [rows, A]. ``runtime``/``device``/``dtype`` say what runs;
    ``build_seconds`` how long making it took; ``note`` a caveat for the user ("" if none)."""

    runtime: str
    device: str
    dtype: str
    build_seconds: float
    note: str

    @property
    def label(self) -> str: ...

    def infer(self, feed: Feed) -> Feed: ...

    def sample(self, feed: Feed, seed: Optional[int] = None, noise: Optional[np.ndarray] = None) -> Feed: ...

    def deterministic(self, feed: Feed) -> Feed: ...


def deterministic(outputs: Feed) -> Feed:
    """``outputs`` without the stochastic ones (their draws are not comparable)."""
    return {k: v for k, v in outputs.items() if k not in STOCHASTIC}


class RunnerBase(ABC):
    """Shared attributes and ``deterministic`` of the runners (each defines ``infer``)."""

    runtime = ""
    device = "cpu"
    dtype = "float32"
    build_seconds = 0.0
    note = ""

    @property
    def label(self) -> str:
        return f"{self.runtime} {self.device} {self.dtype}"

    @abstractmethod
    def infer(self, feed: Feed) -> Feed:
        """Every output the backend computes for ``feed``."""

    def deterministic(self, feed: Feed) -> Feed:
        return deterministic(self.infer(feed))
