"""``batch-sizes``: batch sizes 16..512, time per size and stability of rows across sizes."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..errors import InputError
from .common import ModeResult, fp32_agree, fp32_reference, g, tolerance
from .sources import Source, make_feed, make_runner

BATCH_SIZES = (16, 32, 64, 128, 256, 512)


def batch_sizes(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto",
                sizes: Sequence[int] = BATCH_SIZES, seed: int = 0, repeats: int = 5) -> ModeResult:
    """Run the largest batch once as the reference, then every size on its first rows: row i of a
    smaller batch must equal row i of the largest (float32 with canonical tensors: both within the
    derived bound of the float64 reference, verify.bounds; otherwise the dtype's Tolerance, the rule
    verify applies; bitwise reported). Times: median of ``repeats`` runs after one warm-up."""
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise InputError(f"batch sizes must be positive integers, got {list(sizes)}")
    runner = make_runner(src, device, dtype, runtime)
    big = sizes[-1]
    feed = make_feed(src, "random", big, seed)
    names = src.spec.deterministic_output_names()
    ref = runner.deterministic(feed)
    tol = tolerance(runner.dtype)
    bounded = runner.dtype == "float32" and src.policy is not None
    f64 = fp32_reference(src.policy, feed) if bounded else None  # rows are independent: sliced per size
    r = ModeResult("batch-sizes")
    rows, times = [], {}
    for n in sizes:
        sub = {k: np.ascontiguousarray(v[:n]) for k, v in feed.items()}
        runner.deterministic(sub)  # warm-up
        ts = []
        out = None
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            out = runner.deterministic(sub)
            ts.append(time.perf_counter() - t0)
        per = {}
        ok = True
        for k in names:
            if bounded:  # float32 with canonical tensors: the derived bound, the same rule on every host
                c = fp32_agree(f64.rows(n), k, ref[k][:n], out[k])
                per[k] = dict(c.figures(), bound_ratio=c.bound_ratio)
            else:
                c = tol.compare(ref[k][:n], out[k])
                per[k] = c.figures()
            ok = ok and bool(c)
            per[k]["bitwise"] = c.bitwise
        rows.append({"batch": n, "ok": ok, "outputs": per})
        times[str(n)] = {"median_ms": float(np.median(ts) * 1e3), "per_row_us": float(np.median(ts) * 1e6 / n)}
        r.ok = r.ok and ok
    r.data = {"source": src.label, "runtime": runner.runtime, "device": runner.device, "dtype": runner.dtype,
              "seed": seed, "sizes": sizes, "reference_batch": big, "atol": tol.atol, "results": rows}
    r.timings = {"per_batch": times, "build_s": runner.build_seconds}
    rule = "within twice the derived float32 bound" if bounded else tol.rule
    r.lines.append(f"batch-sizes {src.label}: {runner.label}; row i of each batch vs row i of batch {big} ({rule})")
    for row in rows:
        n = row["batch"]
        parts = []
        for k, s in row["outputs"].items():
            if "mismatches" in s:
                parts.append(f"{k} {s['bitwise_equal']}/{s['count']} equal")
            else:
                parts.append(f"{k} max_abs {g(s['max_abs'], 3)} {'bitwise' if s['bitwise'] else 'not bitwise'}")
        t = times[str(n)]
        r.lines.append(f"  {'✓' if row['ok'] else '✗'} {n:>4}: {'; '.join(parts)}   "
                       f"[{t['median_ms']:.3f} ms, {t['per_row_us']:.2f} µs/row]")
    return r
