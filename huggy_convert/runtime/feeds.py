"""Every feed of the runners in one place: verify's seeded probes (the normalizer's scale plus
outliers that hit the clips), random observations at the normalizer's scale, the completed masks and
memories, and the noise of the stochastic heads (drawn on the CPU, so a seed means one sample on every
device)."""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..converter import Policy, PolicySpec


def make_probes(policy: Policy, rows: int = 64, seed: int = 0) -> Dict[str, np.ndarray]:
    """Input feed for every ONNX input of ``policy``.

    Half the rows sit at the normalizer's scale (mean + k*std, k ~ N(0,1)); a quarter are far
    outside the +-5 clip (mean +- 20..1e3 std, and +-1e4); the rest are N(0, 3) and zeros. Pushing
    the body with clipped inputs drives some actions into the +-3 clip as well. Without a
    normalizer (std taken as 3) the outliers stay at 2..10 std and +-100: unnormalized inputs of
    1e4 make float32 sums whose rounding differs between runtimes by more than any useful bound.
    """
    spec, T = policy.spec, policy.tensors
    rng = np.random.default_rng(seed)
    feed: Dict[str, np.ndarray] = {}
    q = max(rows // 4, 1)
    for i, n in enumerate(spec.obs_sizes):
        if spec.normalize:
            mean = T[C.c_norm(i, C.NORM_MEAN)].astype(np.float64)
            std = np.sqrt(T[C.c_norm(i, C.NORM_VAR)].astype(np.float64) / float(T[C.c_norm(i, C.NORM_STEPS)].reshape(-1)[0]))
        else:
            mean, std = np.zeros(n), np.full(n, 3.0)
        x = np.empty((rows, n), dtype=np.float64)
        half = rows // 2
        x[:half] = mean + rng.standard_normal((half, n)) * std
        if spec.normalize:  # far outside the normalizer's +-5 clip
            far = rng.choice([-1.0, 1.0], size=(q, n)) * rng.uniform(20, 1e3, size=(q, n))
            hard = 1e4
        else:  # no clip to reach: large but plausible magnitudes that still saturate the +-3 action clip
            far = rng.choice([-1.0, 1.0], size=(q, n)) * rng.uniform(2, 10, size=(q, n))
            hard = 100.0
        x[half:half + q] = mean + far * std
        x[half + q - 1] = np.where(rng.random(n) < 0.5, -hard, hard)  # hard outliers
        rest = rows - half - q
        if rest > 0:
            x[half + q:] = rng.standard_normal((rest, n)) * 3.0
            x[-1] = 0.0
        feed[C.OBS_INPUT.format(i=i)] = x.astype(np.float32)
    if spec.discrete_branches:
        m = (rng.random((rows, spec.discrete_total)) < 0.7).astype(np.float32)
        start = 0
        for n in spec.discrete_branches:
            pick = rng.integers(0, n, size=rows)
            m[np.arange(rows), start + pick] = 1.0  # at least one action allowed per branch
            start += n
        feed[C.ACTION_MASKS] = m
    if spec.memory_size:
        feed[C.RECURRENT_IN] = rng.standard_normal((rows, 1, spec.memory_size)).astype(np.float32)
    return feed


def make_noise(policy: Policy, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 7919)
    return rng.standard_normal((rows, policy.spec.continuous_size)).astype(np.float32)


def draw_noise(spec: PolicySpec, rows: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """(normal noise [rows, A], uniform [rows, branches]): what ``PolicyModule.sample`` draws for ``seed``
    (on the CPU), as numpy arrays."""
    from ..exporters.torch_module import draw_noise as torch_noise

    eps, u = torch_noise(spec, rows, seed)
    return eps.numpy(), u.numpy()


def random_obs(scales: Sequence[Tuple[np.ndarray, np.ndarray]], rows: int, seed: int) -> Dict[str, np.ndarray]:
    """Observations at the normalizer's scale: ``mean + divisor * z``, z ~ N(0, 1) from
    ``numpy.random.default_rng(seed)``; ``scales``: per observation (running_mean, divisor) as float32
    (zeros and ones without a normalizer)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for i, (mean, div) in enumerate(scales):
        z = rng.standard_normal((rows, mean.size))
        feed[C.OBS_INPUT.format(i=i)] = (mean.astype(np.float64) + div.astype(np.float64) * z).astype(np.float32)
    return feed


def zeros_obs(spec: PolicySpec, rows: int) -> Dict[str, np.ndarray]:
    return {C.OBS_INPUT.format(i=i): np.zeros((rows, n), np.float32) for i, n in enumerate(spec.obs_sizes)}


def complete_feed(spec: PolicySpec, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Add all-ones action masks and zero memories where the feed has none."""
    rows = next(iter(feed.values())).shape[0]
    if spec.discrete_branches and C.ACTION_MASKS not in feed:
        feed[C.ACTION_MASKS] = np.ones((rows, spec.discrete_total), np.float32)
    if spec.memory_size and C.RECURRENT_IN not in feed:
        feed[C.RECURRENT_IN] = np.zeros((rows, 1, spec.memory_size), np.float32)
    return feed

