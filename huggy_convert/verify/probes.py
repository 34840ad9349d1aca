"""Seeded probe inputs: rows at the normalizer's own scale plus outliers that hit the clips."""
from __future__ import annotations

from typing import Dict

import numpy as np

from .. import blocks
from ..converter import Policy


def make_probes(policy: Policy, rows: int = 64, seed: int = 0) -> Dict[str, np.ndarray]:
    """Input feed for every ONNX input of ``policy``: each block's probes (``Block.probe``), drawn in
    Unity's input order from one seeded generator.

    Observations: half the rows at the normalizer's scale, a quarter far outside its +-5 clip, the
    rest N(0, 3) and zeros (``blocks.normalizer``); pushing the body with clipped inputs drives some
    actions into the +-3 clip as well. Masks allow at least one action per branch; memories are N(0, 1).
    """
    rng = np.random.default_rng(seed)
    feed: Dict[str, np.ndarray] = {}
    for block in blocks.active(policy.spec):
        feed.update(block.probe(policy, rng, rows))
    return feed


def make_noise(policy: Policy, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 7919)
    return rng.standard_normal((rows, policy.spec.continuous_size)).astype(np.float32)
