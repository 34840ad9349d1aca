"""Every feed of the runners in one place: verify's seeded probes (the normalizer's scale plus
outliers that hit the clips), random observations at the normalizer's scale, the inputs a feed may
leave out (``IOSignature.fills``), and the noise of the stochastic heads (drawn on the CPU, so a seed means one sample on every
device)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import blocks, contract as C
from ..core.flow import Port
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


NORMAL, UNIFORM = "normal", "uniform"  # Port.noise: how a sampled output's noise is drawn


def injected(spec: PolicySpec) -> List[Port]:
    """The sampled outputs whose noise a graph can take as an input (``C.NOISE_INPUT``: one standard normal
    per column, ``exporters.with_noise_input``), in output order; the others' draws (``"uniform"``) a graph
    makes itself, without a seed."""
    return [p for p in spec.io_signature().noise_outputs() if p.noise == NORMAL]


def unseeded(spec: PolicySpec) -> List[Port]:
    """The sampled outputs an ONNX cannot be given the noise of (its own draw has no seed)."""
    return [p for p in spec.io_signature().noise_outputs() if p.noise != NORMAL]


def noise_width(spec: PolicySpec, kind: str = NORMAL) -> int:
    """The columns of the noise of kind ``kind`` the sampled outputs take (0: none)."""
    return sum(p.width for p in spec.io_signature().noise_outputs() if p.noise == kind)


def make_noise(policy: Policy, rows: int, seed: int = 0) -> np.ndarray:
    """The injected standard normal noise [rows, width] of ``policy``'s sampled outputs (``injected``)."""
    rng = np.random.default_rng(seed + 7919)
    return rng.standard_normal((rows, noise_width(policy.spec))).astype(np.float32)


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


def complete_feed(spec: PolicySpec, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Add every input the feed may leave out (``IOSignature.fills``: masks allowing every choice, the
    carried state of a first step) where the feed has none."""
    rows = next(iter(feed.values())).shape[0]
    for port in spec.io_signature().fills():
        if port.name not in feed:
            feed[port.name] = port.filled(rows)
    return feed


class Stepper:
    """A closed loop's inputs from step to step (a fingerprint's sequence, a rollout): each step's feed
    gets every input a feed may leave out (``IOSignature.fills``: masks that allow every choice, made
    once) and the carried state the previous step returned (``IOSignature.feedback``; the fill at
    first): ``stepper.step(feed)`` before the run, ``stepper.update(outputs)`` after it."""

    def __init__(self, spec: PolicySpec, rows: int):
        sig = spec.io_signature()
        self.feedback = sig.feedback()  # output -> the input it becomes
        carried = set(self.feedback.values())
        # every step's fixed inputs: one array each (the runners read their feeds, never write them)
        self.fixed = {p.name: p.filled(rows) for p in sig.fills() if p.name not in carried}
        self.state = {p.name: p.filled(rows) for p in sig.fills() if p.name in carried}

    def step(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        feed.update(self.fixed)
        feed.update(self.state)
        return feed

    def update(self, outputs: Dict[str, np.ndarray]) -> None:
        for out, name in self.feedback.items():
            self.state[name] = np.asarray(outputs[out], np.float32)
