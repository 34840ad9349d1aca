"""Every feed of the runners in one place: verify's seeded probes (the normalizer's scale plus
outliers that hit the clips), random observations at the normalizer's scale, the completed masks and
memories, and the noise of the stochastic heads (drawn on the CPU, so a seed means one sample on every
device)."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .. import blocks, contract as C
from ..core.policy import Policy
from ..core.spec import PolicySpec
from ..exporters.torch_module import draw_noise as torch_noise


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


def draw_noise(spec: PolicySpec, rows: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """(normal noise [rows, A], uniform [rows, branches]): what ``PolicyModule.sample`` draws for ``seed``
    (on the CPU), as numpy arrays."""
    eps, u = torch_noise(spec, rows, seed)
    return eps.numpy(), u.numpy()


def random_obs(scales: Sequence[Tuple[np.ndarray, np.ndarray]], rows: int, seed: int,
               shapes: Optional[Sequence[Tuple[int, ...]]] = None) -> Dict[str, np.ndarray]:
    """Observations at the normalizer's scale: ``mean + divisor * z``, z ~ N(0, 1) from
    ``numpy.random.default_rng(seed)``; ``scales``: per observation (running_mean, divisor) as float32
    (zeros and ones without a normalizer); ``shapes``: each observation's shape, where not a vector
    (an entity set: every entity real; a camera (C, H, W): pixels uniform in [0, 1), as Unity sends them)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for i, (mean, div) in enumerate(scales):
        if shapes and len(shapes[i]) == 3:
            feed[C.OBS_INPUT.format(i=i)] = rng.random((rows,) + tuple(shapes[i])).astype(np.float32)
            continue
        z = rng.standard_normal((rows, mean.size))
        x = (mean.astype(np.float64) + div.astype(np.float64) * z).astype(np.float32)
        feed[C.OBS_INPUT.format(i=i)] = x.reshape((rows,) + tuple(shapes[i])) if shapes else x
    return feed


def zeros_obs(spec: PolicySpec, rows: int) -> Dict[str, np.ndarray]:
    return {C.OBS_INPUT.format(i=i): np.zeros((rows,) + spec.obs_shape(i), np.float32) for i in range(spec.obs_count)}


def initial_memory(spec: PolicySpec, rows: int) -> Optional[np.ndarray]:
    """The memory at the start of an episode: zeros [rows, 1, memory_size] (float32), or None without memory."""
    return np.zeros((rows, 1, spec.memory_size), np.float32) if spec.memory_size else None


def complete_feed(spec: PolicySpec, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Add all-ones action masks and zero memories where the feed has none."""
    rows = next(iter(feed.values())).shape[0]
    if spec.discrete_branches and C.ACTION_MASKS not in feed:
        feed[C.ACTION_MASKS] = np.ones((rows, spec.discrete_total), np.float32)
    if spec.memory_size and C.RECURRENT_IN not in feed:
        feed[C.RECURRENT_IN] = initial_memory(spec, rows)
    return feed


class Memory:
    """A closed loop's state from step to step (a fingerprint's sequence, a rollout): each step's feed
    gets masks that allow every action and, for an LSTM, the memory the previous step returned (zeros
    at first): ``memory.step(feed)`` before the run, ``memory.update(outputs)`` after it."""

    def __init__(self, spec: PolicySpec, rows: int):
        self.spec, self.rows = spec, rows
        self.state = initial_memory(spec, rows)
        # every step's masks: one array (the runners read their feeds, never write them)
        self.masks = np.ones((rows, spec.discrete_total), np.float32) if spec.discrete_branches else None

    def step(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        if self.masks is not None:
            feed[C.ACTION_MASKS] = self.masks
        if self.state is not None:
            feed[C.RECURRENT_IN] = self.state
        return feed

    def update(self, outputs: Dict[str, np.ndarray]) -> None:
        if self.state is not None:
            self.state = np.asarray(outputs[C.RECURRENT_OUT], np.float32)
