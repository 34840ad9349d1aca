"""``act`` (deterministic actions) and ``sample`` (seeded stochastic actions)."""
from __future__ import annotations

from typing import Dict

import numpy as np

from .common import ModeResult
from .sources import Source, make_feed, make_runner


def _obs_label(obs: str, seed: int) -> str:
    return f"random (seed {seed})" if obs == "random" else obs


def _render(r: ModeResult, header: str, outputs: Dict[str, np.ndarray], max_rows: int = 16) -> None:
    r.lines.append(header)
    for name, a in outputs.items():
        r.lines.append(f"  {name} {list(a.shape)} {a.dtype}:")
        flat = a.reshape(a.shape[0], -1)
        for i, row in enumerate(flat[:max_rows]):
            if a.dtype.kind == "f":
                r.lines.append(f"    [{i}] " + " ".join(f"{v:+.6f}" for v in row))
            else:
                r.lines.append(f"    [{i}] " + " ".join(str(int(v)) for v in row))
        if flat.shape[0] > max_rows:
            r.lines.append(f"    … {flat.shape[0] - max_rows} more rows (--json prints all)")


def _base(src: Source, runner, obs, rows, seed, feed) -> Dict[str, object]:
    return {"source": src.label, "kind": src.kind, "runtime": runner.runtime, "device": runner.device,
            "dtype": runner.dtype, "obs": _obs_label(obs, seed), "seed": seed,
            "rows": int(next(iter(feed.values())).shape[0]), "inputs": {k: list(v.shape) for k, v in feed.items()}}


def _noise_text(spec) -> str:
    """How ``sample`` draws the noise of each sampled output, in output order."""
    draws = {"normal": "randn", "uniform": "rand"}
    return "torch.Generator('cpu').manual_seed(seed): " + ", ".join(
        f"{draws.get(p.noise, p.noise)} [rows, {p.width}] ({p.name})" for p in spec.io_signature().noise_outputs())


def act(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto", obs: str = "random",
        rows: int = 1, seed: int = 0) -> ModeResult:
    """Deterministic actions for seeded random observations, zeros, or a file."""
    runner = make_runner(src, device, dtype, runtime)
    feed = make_feed(src, obs, rows, seed)
    out = runner.deterministic(feed)
    outputs = {k: out[k] for k in src.spec.deterministic_output_names() if k in out}
    r = ModeResult("act")
    r.data = dict(_base(src, runner, obs, rows, seed, feed), outputs=outputs)
    r.timings = {"build_s": runner.build_seconds}
    _render(r, f"act {src.label}: {runner.label}, obs {_obs_label(obs, seed)}", outputs)
    for k, v in outputs.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            r.ok = False
            r.lines.append(f"  ✗ {k} has non-finite values")
    return r


def sample(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto", obs: str = "random",
           rows: int = 1, seed: int = 0, obs_seed: int = 0) -> ModeResult:
    """Stochastic actions for ``seed``: the noise is drawn on the CPU from the seed
    (``PolicyModule.sample(seed=...)``), so a seed gives one sample on every device; an ONNX
    runs with its RandomNormalLike replaced by the same noise (``with_noise_input``)."""
    runner = make_runner(src, device, dtype, runtime)
    feed = make_feed(src, obs, rows, obs_seed)
    outputs = runner.sample(feed, seed)
    r = ModeResult("sample")
    r.data = dict(_base(src, runner, obs, rows, obs_seed, feed), noise_seed=seed, outputs=outputs,
                  noise=_noise_text(src.spec))
    if runner.note:
        r.data["note"] = runner.note
    r.timings = {"build_s": runner.build_seconds}
    _render(r, f"sample {src.label}: {runner.label}, obs {_obs_label(obs, obs_seed)}, noise seed {seed}", outputs)
    if runner.note:
        r.lines.append(f"  note: {runner.note}")
    for k, v in outputs.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            r.ok = False
            r.lines.append(f"  ✗ {k} has non-finite values")
    return r

