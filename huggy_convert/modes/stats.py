"""``stats``: a closed-loop rollout through a documented surrogate dynamics.

The policy's actions feed back into its next observation. In normalized units
``u = (obs - mean) / D`` (``mean`` the running mean, ``D`` the folded divisor
``sqrt(running_variance / steps)``; 0 and 1 without a normalizer):

    u_0     ~ N(0, I)
    obs_t   = mean + D * u_t                                  (each observation input)
    a_t     = policy(obs_t)                                   (deterministic; --stochastic: sample, seed s+1+t)
    v_t[j]  = b_t[j mod K]                                    (pad: tile the K action values over the width)
    b_t     = clip(continuous, -1, 1) ++ (2 k / (n - 1) - 1 per discrete branch of n choices)
    u_{t+1} = clip(ALPHA * u_t + BETA * v_t + SIGMA * xi_t, -U_MAX, U_MAX),   xi_t ~ N(0, I)

with ALPHA = 0.9, BETA = 0.5, SIGMA = 0.1, U_MAX = 10 and every random draw from
``numpy.random.default_rng(seed)``. An LSTM's memory is fed back; discrete masks allow all.
Bounded: every action finite and |u| < U_MAX throughout (the guard clip never engaged):
with |v| <= 1 the contraction keeps |u| near BETA / (1 - ALPHA) = 5, so a NaN, an inf or a
runaway state is what fails it.
"""
from __future__ import annotations

import hashlib
import warnings
from typing import Dict, List

import numpy as np

from .. import contract as C
from ..runtime.feeds import Stepper
from .common import ModeResult, g
from .sources import Source, make_runner

ALPHA, BETA, SIGMA, U_MAX = 0.9, 0.5, 0.1, 10.0
FORMULA = ("u=(obs-mean)/D; u0~N(0,I); u[t+1]=clip(0.9*u[t] + 0.5*pad(clip(a[t],-1,1)) + 0.1*xi[t], -10, 10); "
           "obs=mean+D*u; pad tiles the action values over the observation width; discrete k -> 2k/(n-1)-1")


def _feedback(spec, out: Dict[str, np.ndarray], rows: int) -> np.ndarray:
    parts: List[np.ndarray] = []
    cont = out.get(C.OUT_CONT) if C.OUT_CONT in out else out.get(C.OUT_CONT_DET)
    if spec.continuous_size and cont is not None:
        parts.append(np.clip(cont.astype(np.float64), -1.0, 1.0))
    disc = out.get(C.OUT_DISC) if C.OUT_DISC in out else out.get(C.OUT_DISC_DET)
    if spec.discrete_branches and disc is not None:
        n = np.asarray(spec.discrete_branches, np.float64)
        parts.append(2.0 * disc.astype(np.float64) / np.maximum(n - 1.0, 1.0) - 1.0)
    return np.concatenate(parts, axis=1) if parts else np.zeros((rows, 1))


def rollout(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto", steps: int = 256,
            rows: int = 8, seed: int = 0, stochastic: bool = False) -> ModeResult:
    runner = make_runner(src, device, dtype, runtime)
    spec = src.spec
    rng = np.random.default_rng(seed)
    scale = src.obs_scale()
    width = sum(spec.obs_sizes)  # every observation's elements (an entity set's too)
    mean = np.concatenate([m for m, _ in scale]).astype(np.float64)
    div = np.concatenate([d for _, d in scale]).astype(np.float64)
    u = rng.standard_normal((rows, width))
    memory = Stepper(spec, rows)
    cont_log, disc_log = [], []
    h = hashlib.sha256()
    max_u, guard_hits, beyond_clip, finite = float(np.abs(u).max()), 0, 0, True
    for t in range(steps):
        obs = (mean + div * u).astype(np.float32)
        feed, start = {}, 0
        for i, n in enumerate(spec.obs_sizes):  # an entity set's random features: every entity real
            feed[C.OBS_INPUT.format(i=i)] = np.ascontiguousarray(obs[:, start:start + n]).reshape((rows,) + spec.obs_shape(i))
            start += n
        det = runner.infer(memory.step(feed))
        out = dict(det)
        if stochastic:
            out.update(runner.sample(feed, seed + 1 + t))
        memory.update(det)
        cont = out.get(C.OUT_CONT) if stochastic and C.OUT_CONT in out else out.get(C.OUT_CONT_DET)
        disc = out.get(C.OUT_DISC) if stochastic and C.OUT_DISC in out else out.get(C.OUT_DISC_DET)
        if cont is not None and spec.continuous_size:
            finite = finite and bool(np.all(np.isfinite(cont)))
            cont_log.append(cont.astype(np.float32))
            h.update(np.ascontiguousarray(cont, np.float32).tobytes())
        if disc is not None and spec.discrete_branches:
            disc_log.append(disc.astype(np.int64))
            h.update(np.ascontiguousarray(disc, np.int64).tobytes())
        fb_src = {C.OUT_CONT: cont, C.OUT_DISC: disc}
        b = _feedback(spec, {k: v for k, v in fb_src.items() if v is not None}, rows)
        v = b[:, np.arange(width) % b.shape[1]]
        nxt = ALPHA * u + BETA * np.nan_to_num(v, nan=0.0) + SIGMA * rng.standard_normal((rows, width))
        if not np.all(np.isfinite(nxt)):
            finite = False
            nxt = np.nan_to_num(nxt, nan=0.0, posinf=U_MAX, neginf=-U_MAX)
        guard_hits += int(np.count_nonzero(np.abs(nxt) >= U_MAX))
        u = np.clip(nxt, -U_MAX, U_MAX)
        max_u = max(max_u, float(np.abs(u).max()))
        beyond_clip += int(np.count_nonzero(np.abs(u) > C.NORM_CLIP))
    per_dim = []
    if cont_log:
        a = np.concatenate(cont_log, axis=0).astype(np.float64)
        at_clip = np.abs(a) >= 1.0
        for j in range(a.shape[1]):
            col = a[:, j]
            with warnings.catch_warnings():  # a dimension that is NaN throughout: NaN figures, and finite=False above
                warnings.simplefilter("ignore", RuntimeWarning)
                per_dim.append({"dim": j, "mean": float(np.nanmean(col)), "std": float(np.nanstd(col)),
                                "min": float(np.nanmin(col)), "max": float(np.nanmax(col)),
                                "frac_at_clip": float(at_clip[:, j].mean())})
    branches = []
    if disc_log:
        d = np.concatenate(disc_log, axis=0)
        for bi, n in enumerate(spec.discrete_branches):
            counts = np.bincount(d[:, bi], minlength=n)[:n]
            branches.append({"branch": bi, "choices": n, "frequency": [float(c) / d.shape[0] for c in counts]})
    bounded = finite and guard_hits == 0
    r = ModeResult("stats", ok=bounded)
    r.data = {"source": src.label, "runtime": runner.runtime, "device": runner.device, "dtype": runner.dtype,
              "steps": steps, "rows": rows, "seed": seed, "policy": "stochastic" if stochastic else "deterministic",
              "dynamics": FORMULA, "constants": {"alpha": ALPHA, "beta": BETA, "sigma": SIGMA, "u_max": U_MAX},
              "bounded": bounded, "finite": finite, "max_abs_u": max_u, "guard_hits": guard_hits,
              "frac_beyond_normalizer_clip": beyond_clip / float(steps * rows * width),
              "trajectory_sha256": h.hexdigest(), "continuous": per_dim, "discrete": branches}
    if per_dim:
        r.data["summary"] = {"mean_abs_mean": float(np.mean([abs(x["mean"]) for x in per_dim])),
                             "mean_std": float(np.mean([x["std"] for x in per_dim])),
                             "frac_at_clip": float(np.mean([x["frac_at_clip"] for x in per_dim]))}
    L = r.lines
    L.append(f"stats {src.label}: {runner.label}, {r.data['policy']} closed loop, {steps} steps x {rows} rows, seed {seed}")
    L.append(f"  dynamics: {FORMULA}")
    L.append(f"  {'✓ bounded' if bounded else '✗ NOT bounded'}: finite={finite}, max |u|={g(max_u, 4)} (guard {U_MAX:g}, "
             f"hits {guard_hits}), beyond the ±5 normalizer clip {g(r.data['frac_beyond_normalizer_clip'], 3)}")
    if per_dim:
        L.append("  dim      mean       std       min       max  at ±1")
        for x in per_dim:
            L.append(f"  {x['dim']:>3} {x['mean']:+9.4f} {x['std']:9.4f} {x['min']:+9.4f} {x['max']:+9.4f}  {x['frac_at_clip']:.3f}")
    for b in branches:
        L.append(f"  branch {b['branch']} ({b['choices']} choices): " + " ".join(f"{f:.3f}" for f in b["frequency"]))
    L.append(f"  trajectory sha256 {r.data['trajectory_sha256']}")
    return r
