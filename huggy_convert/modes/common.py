"""What every mode returns: figures (reproducible), timings (not), text lines and a verdict."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..verify.bounds import judge, reference_forward, within_both
from ..verify.compare import DEFAULT_TOLERANCES, Comparison, Tolerance, array_stats, compare_arrays
from .sources import to_jsonable

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
FP32_BOUND = "derived float32 bound"  # the rule of fp32_agree


@dataclass
class ModeResult:
    """``data``: the figures (seeded inputs: the same on every run); ``timings``: latencies, load
    times and memory (they change run to run); ``ok``: False makes the command exit 1."""

    mode: str
    data: Dict[str, Any] = field(default_factory=dict)
    lines: List[str] = field(default_factory=list)
    ok: bool = True
    timings: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        d = {"mode": self.mode, "ok": self.ok}
        d.update(self.data)
        if self.timings:
            d["timings"] = self.timings
        return to_jsonable(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def render(self) -> str:
        return "\n".join(self.lines)


def g(x, digits: int = 6) -> str:
    """A float as text, the same on every run."""
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def tolerance(dtype: str) -> Tolerance:
    """verify's tolerance of ``dtype`` (float32 runtimes of a policy with tensors: :func:`fp32_agree`)."""
    return DEFAULT_TOLERANCES[dtype]


def compare_outputs(ref: Dict[str, np.ndarray], got: Dict[str, np.ndarray], names: Sequence[str],
                    tol: Optional[Tolerance] = None) -> Dict[str, Comparison]:
    """Per output in ``names`` that both have: ``got`` against ``ref``, bitwise or by ``tol``."""
    return {n: compare_arrays(ref[n], got[n], tol) for n in names if n in ref and n in got}


def fp32_reference(policy, feed: Dict[str, np.ndarray], noise=None):
    """The float64 reference of ``policy`` on ``feed`` (verify.bounds), for :func:`fp32_agree`."""
    return reference_forward(policy, feed, noise)


def half_agree(ref, name: str, ref32: np.ndarray, got: np.ndarray) -> Comparison:
    """verify's rule for a float16 / bfloat16 run ``got``: every element within the derived bound of
    ``ref`` (``verify.bounds.Float64Policy.forward`` with that format's ``core.bounds.Precision``; an
    argmax flip within its float64 logit margin passes). The figures are ``got`` against ``ref32``
    (the CPU float32 run); ``bound_ratio`` = max error / bound."""
    j = judge(ref, name, got)
    s = array_stats(ref32, got)
    return Comparison.of(s, j["ok"], f"derived {ref.precision.name} bound", bound_ratio=j.get("ratio"))


def fp32_agree(ref, name: str, a: np.ndarray, b: np.ndarray) -> Comparison:
    """Whether two float32 runs of one policy on one feed agree as well as float32 can promise on
    every host: each float element within the derived bound of the float64 reference ``ref``
    (:func:`fp32_reference`), so ``|a - b| <= 2 bound`` (verify.bounds.within_both); argmax outputs:
    each equal to the reference's or a float32 tie. The figures are ``a`` against ``b``;
    ``bound_ratio`` = max |a - b| / (2 bound)."""
    if name not in ref.values:
        return Comparison(count=0, bitwise_equal=0, max_abs=float("inf"), ok=False,
                          rule=f"'{name}' is not an output of the reference")
    s = array_stats(a, b)
    if "shape_mismatch" in s:
        return Comparison.of(s, False, FP32_BOUND)
    if ref.values[name].dtype.kind in "iu":
        return Comparison.of(s, judge(ref, name, a)["ok"] and judge(ref, name, b)["ok"], FP32_BOUND)
    j = within_both(ref, ref, name, a, b)
    return Comparison.of(s, j["ok"], FP32_BOUND, bound_ratio=j["ratio"])


def percentiles(samples_s: Sequence[float]) -> Dict[str, float]:
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {"mean_ms": float(a.mean()), "p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "min_ms": float(a.min()), "max_ms": float(a.max()),
            "iters": int(a.size)}


def time_calls(fn, warmup: int, iters: int) -> List[float]:
    for _ in range(max(warmup, 0)):
        fn()
    out = []
    for _ in range(max(iters, 1)):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])

        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r if sys.platform == "darwin" else r * 1024
