"""``stats``: a closed-loop rollout through a documented surrogate dynamics.

The policy's actions feed back into its next observation. In normalized units
``u = (obs - mean) / D`` (``mean`` the running mean, ``D`` the folded divisor
``sqrt(running_variance / steps)``; 0 and 1 without a normalizer):

    u_0     ~ N(0, I)
    obs_t   = mean + D * u_t                                  (each observation input)
    a_t     = policy(obs_t)                                   (deterministic; --stochastic: sample, seed s+1+t)
    v_t[j]  = b_t[j mod K]                                    (pad: tile the K action values over the width)
    b_t     = each action output in output order: clip(a, -1, 1) for a real-valued one,
              2 k / (n - 1) - 1 for an integer one (k of n levels per column)
    u_{t+1} = clip(ALPHA * u_t + BETA * v_t + SIGMA * xi_t, -U_MAX, U_MAX),   xi_t ~ N(0, I)

with ALPHA = 0.9, BETA = 0.5, SIGMA = 0.1, U_MAX = 10 and every random draw from
``numpy.random.default_rng(seed)``. Carried state is fed back (``IOSignature.feedback``); masks
allow every choice (``IOSignature.defaults``).
Bounded: every action finite and |u| < U_MAX throughout (the guard clip never engaged):
with |v| <= 1 the contraction keeps |u| near BETA / (1 - ALPHA) = 5, so a NaN, an inf or a
runaway state is what fails it.
"""
from __future__ import annotations

import hashlib
import warnings
from typing import Dict, List, Tuple

import numpy as np

from .. import contract as C
from ..core.flow import Port
from .common import ModeResult, g
from ..runtime.feeds import Stepper
from .ports import action_pairs
from .sources import Source, make_runner

ALPHA, BETA, SIGMA, U_MAX = 0.9, 0.5, 0.1, 10.0
FORMULA = ("u=(obs-mean)/D; u0~N(0,I); u[t+1]=clip(0.9*u[t] + 0.5*pad(clip(a[t],-1,1)) + 0.1*xi[t], -10, 10); "
           "obs=mean+D*u; pad tiles the action values over the observation width; an integer k of n levels -> 2k/(n-1)-1")


def _feedback(taken: List[Tuple[Port, np.ndarray]], rows: int) -> np.ndarray:
    """b_t: every action output's values in [-1, 1], concatenated in output order."""
    parts: List[np.ndarray] = []
    for port, a in taken:
        if port.levels:
            n = np.asarray(port.levels, np.float64)
            parts.append(2.0 * a.astype(np.float64) / np.maximum(n - 1.0, 1.0) - 1.0)
        else:
            parts.append(np.clip(a.astype(np.float64), -1.0, 1.0))
    return np.concatenate(parts, axis=1) if parts else np.zeros((rows, 1))


def _real_figures(a: np.ndarray) -> List[Dict[str, float]]:
    """Per column of a real-valued action output over the rollout: mean, std, min, max, fraction at +-1."""
    at_clip = np.abs(a) >= 1.0
    out = []
    for j in range(a.shape[1]):
        col = a[:, j]
        with warnings.catch_warnings():  # a dimension that is NaN throughout: NaN figures, and finite=False
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append({"dim": j, "mean": float(np.nanmean(col)), "std": float(np.nanstd(col)),
                        "min": float(np.nanmin(col)), "max": float(np.nanmax(col)),
                        "frac_at_clip": float(at_clip[:, j].mean())})
    return out


def _histograms(d: np.ndarray, levels) -> List[Dict[str, object]]:
    """Per column of an integer action output: how often each of its levels was chosen."""
    out = []
    for bi, n in enumerate(levels):
        counts = np.bincount(d[:, bi], minlength=n)[:n]
        out.append({"branch": bi, "choices": n, "frequency": [float(c) / d.shape[0] for c in counts]})
    return out


class _Loop:
    """The rollout's state: u, the carried inputs, the action logs, the trajectory hash, the figures."""

    def __init__(self, src: Source, rows: int, seed: int, stochastic: bool):
        spec = src.spec
        self.spec, self.rows, self.stochastic = spec, rows, stochastic
        self.rng = np.random.default_rng(seed)
        scale = src.obs_scale()
        self.width = sum(spec.obs_sizes)  # every observation's elements (an entity set's too)
        self.mean = np.concatenate([m for m, _ in scale]).astype(np.float64)
        self.div = np.concatenate([d for _, d in scale]).astype(np.float64)
        self.u = self.rng.standard_normal((rows, self.width))
        self.stepper = Stepper(spec, rows)
        self.pairs = action_pairs(spec)
        self.logs: Dict[str, List[np.ndarray]] = {}
        self.h = hashlib.sha256()
        self.max_u, self.guard_hits, self.beyond_clip, self.finite = float(np.abs(self.u).max()), 0, 0, True

    def feed(self) -> Dict[str, np.ndarray]:
        obs = (self.mean + self.div * self.u).astype(np.float32)
        feed, start = {}, 0
        for i, n in enumerate(self.spec.obs_sizes):  # an entity set's random features: every entity real
            feed[C.OBS_INPUT.format(i=i)] = np.ascontiguousarray(obs[:, start:start + n]).reshape(
                (self.rows,) + self.spec.obs_shape(i))
            start += n
        return feed

    def take(self, out: Dict[str, np.ndarray]) -> List[Tuple[Port, np.ndarray]]:
        """Each action output's values this step (a sampled one where drawn), logged and hashed."""
        taken = []
        for sampled, det in self.pairs:
            port = sampled if self.stochastic and sampled.name in out else det
            a = out.get(port.name)
            if a is None:
                continue
            if port.levels:
                a = a.astype(np.int64)
            else:
                self.finite = self.finite and bool(np.all(np.isfinite(a)))
                a = a.astype(np.float32)
            self.logs.setdefault(port.name, []).append(a)
            self.h.update(np.ascontiguousarray(a).tobytes())
            taken.append((port, a))
        return taken

    def advance(self, taken: List[Tuple[Port, np.ndarray]]) -> None:
        b = _feedback(taken, self.rows)
        v = b[:, np.arange(self.width) % b.shape[1]]
        nxt = ALPHA * self.u + BETA * np.nan_to_num(v, nan=0.0) + SIGMA * self.rng.standard_normal((self.rows, self.width))
        if not np.all(np.isfinite(nxt)):
            self.finite = False
            nxt = np.nan_to_num(nxt, nan=0.0, posinf=U_MAX, neginf=-U_MAX)
        self.guard_hits += int(np.count_nonzero(np.abs(nxt) >= U_MAX))
        self.u = np.clip(nxt, -U_MAX, U_MAX)
        self.max_u = max(self.max_u, float(np.abs(self.u).max()))
        self.beyond_clip += int(np.count_nonzero(np.abs(self.u) > C.NORM_CLIP))

    def figures(self) -> Tuple[Dict[str, list], Dict[str, list]]:
        """(per real-valued action output: its columns' figures, per integer one: its histograms), by name."""
        ports = {p.name: p for pair in self.pairs for p in pair}
        real, integer = {}, {}
        for name, log in self.logs.items():
            a = np.concatenate(log, axis=0)
            if ports[name].levels:
                integer[name] = _histograms(a, ports[name].levels)
            else:
                real[name] = _real_figures(a.astype(np.float64))
        return real, integer


def rollout(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto", steps: int = 256,
            rows: int = 8, seed: int = 0, stochastic: bool = False) -> ModeResult:
    runner = make_runner(src, device, dtype, runtime)
    loop = _Loop(src, rows, seed, stochastic)
    for t in range(steps):
        feed = loop.feed()
        det = runner.infer(loop.stepper.step(feed))
        out = dict(det)
        if stochastic:
            out.update(runner.sample(feed, seed + 1 + t))
        loop.stepper.update(det)
        loop.advance(loop.take(out))
    real, integer = loop.figures()
    bounded = loop.finite and loop.guard_hits == 0
    r = ModeResult("stats", ok=bounded)
    r.data = {"source": src.label, "runtime": runner.runtime, "device": runner.device, "dtype": runner.dtype,
              "steps": steps, "rows": rows, "seed": seed, "policy": "stochastic" if stochastic else "deterministic",
              "dynamics": FORMULA, "constants": {"alpha": ALPHA, "beta": BETA, "sigma": SIGMA, "u_max": U_MAX},
              "bounded": bounded, "finite": loop.finite, "max_abs_u": loop.max_u, "guard_hits": loop.guard_hits,
              "frac_beyond_normalizer_clip": loop.beyond_clip / float(steps * rows * loop.width),
              "trajectory_sha256": loop.h.hexdigest(), "real": real, "levels": integer}
    per_dim = [x for cols in real.values() for x in cols]
    if per_dim:
        r.data["summary"] = {"mean_abs_mean": float(np.mean([abs(x["mean"]) for x in per_dim])),
                             "mean_std": float(np.mean([x["std"] for x in per_dim])),
                             "frac_at_clip": float(np.mean([x["frac_at_clip"] for x in per_dim]))}
    _render(r, src, runner)
    return r


def _render(r: ModeResult, src: Source, runner) -> None:
    d, L = r.data, r.lines
    L.append(f"stats {src.label}: {runner.label}, {d['policy']} closed loop, {d['steps']} steps x {d['rows']} rows, "
             f"seed {d['seed']}")
    L.append(f"  dynamics: {FORMULA}")
    L.append(f"  {'✓ bounded' if d['bounded'] else '✗ NOT bounded'}: finite={d['finite']}, max |u|={g(d['max_abs_u'], 4)} "
             f"(guard {U_MAX:g}, hits {d['guard_hits']}), beyond the ±5 normalizer clip "
             f"{g(d['frac_beyond_normalizer_clip'], 3)}")
    for name, cols in d["real"].items():
        L.append(f"  {name}:")
        L.append("  dim      mean       std       min       max  at ±1")
        for x in cols:
            L.append(f"  {x['dim']:>3} {x['mean']:+9.4f} {x['std']:9.4f} {x['min']:+9.4f} {x['max']:+9.4f}  {x['frac_at_clip']:.3f}")
    for name, hist in d["levels"].items():
        for b in hist:
            L.append(f"  {name} column {b['branch']} ({b['choices']} choices): " + " ".join(f"{f:.3f}" for f in b["frequency"]))
    L.append(f"  trajectory sha256 {d['trajectory_sha256']}")
