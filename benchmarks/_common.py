"""Helpers shared by the benchmark scripts (not part of the package)."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


def huggy_checkpoint() -> Path:
    files = sorted((FIXTURES / "huggy" / "Huggy").glob("Huggy-*.pt"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    if not files:
        sys.exit("no Huggy fixture checkpoint under fixtures/huggy/Huggy/")
    return files[-1]


def percentiles(samples_s):
    xs = sorted(samples_s)

    def pct(p):
        return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

    return {"median_ms": statistics.median(xs) * 1e3, "p95_ms": pct(95) * 1e3, "p99_ms": pct(99) * 1e3,
            "mean_ms": statistics.fmean(xs) * 1e3}


def time_calls(fn, warmup: int, iters: int):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
