"""Array comparison in Polygraphy's style: per-output statistics and tolerances."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from .. import contract as C
from ..numerics import ulp_distance  # noqa: F401 (re-exported: verify.compare.ulp_distance)


def array_stats(ref: np.ndarray, got: np.ndarray) -> Dict[str, object]:
    """max abs / max rel / max ulp / mean abs / p99 abs / cosine / bitwise-equal count."""
    ref = np.asarray(ref)
    got = np.asarray(got)
    out: Dict[str, object] = {"shape": list(ref.shape), "count": int(ref.size)}
    if ref.shape != got.shape:
        out.update(shape_mismatch=[list(ref.shape), list(got.shape)], bitwise_equal=0, max_abs=float("inf"),
                   cosine=0.0)
        return out
    if ref.size == 0:
        out.update(bitwise_equal=0, max_abs=0.0, max_rel=0.0, max_ulp=0, mean_abs=0.0, p99_abs=0.0, cosine=1.0,
                   first_diff=None)
        return out
    same = (ref.tobytes() == got.tobytes()) if ref.dtype == got.dtype else False
    if ref.dtype.kind in "iub":
        eq = ref == got
        out.update(bitwise_equal=int(eq.sum()), mismatches=int((~eq).sum()),
                   max_abs=float(np.max(np.abs(ref.astype(np.int64) - got.astype(np.int64)))))
        out["first_diff"] = None if eq.all() else _first(ref, got, ~eq)
        return out
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    finite = np.isfinite(r) & np.isfinite(g)
    d = np.where(finite, np.abs(r - g), np.inf)
    d = np.where(np.isnan(r) & np.isnan(g), 0.0, d)
    rel = d / np.maximum(np.abs(r), 1e-30)
    bit = np.ascontiguousarray(ref, np.float32).view(np.int32) == np.ascontiguousarray(got, np.float32).view(np.int32)
    nr, ng = np.linalg.norm(np.where(finite, r, 0)), np.linalg.norm(np.where(finite, g, 0))
    cos = float(np.dot(np.where(finite, r, 0).ravel(), np.where(finite, g, 0).ravel()) / (nr * ng)) if nr > 0 and ng > 0 else (1.0 if nr == ng else 0.0)
    if not finite.all():
        cos = 0.0 if not same else cos
    out.update(
        bitwise_equal=int(bit.sum()) if not same else int(ref.size),
        max_abs=float(d.max()),
        max_rel=float(rel.max()),
        max_ulp=int(ulp_distance(ref, got).max()),
        mean_abs=float(d.mean()) if np.isfinite(d).all() else float("inf"),
        p99_abs=float(np.percentile(d, 99)) if np.isfinite(d).all() else float("inf"),
        cosine=cos,
        non_finite=int((~np.isfinite(g)).sum()),
    )
    out["first_diff"] = None if bit.all() else _first(ref, got, ~bit)
    return out


def _first(ref, got, diff_mask) -> Dict[str, object]:
    idx = tuple(int(i) for i in np.argwhere(diff_mask)[0])
    a, b = ref[idx], got[idx]
    d = {"index": list(idx), "expected": a.item(), "got": b.item()}
    if ref.dtype.kind == "f":
        d["ulps"] = int(ulp_distance(np.array([a]), np.array([b]))[0])
    return d


@dataclass(frozen=True)
class Tolerance:
    """Polygraphy's rule, element by element: an element fails only when its absolute error
    exceeds ``atol`` *and* its relative error exceeds ``rtol`` (``rtol=None``: absolute only);
    the whole output must also keep ``cosine`` similarity. Integer outputs must agree exactly."""

    atol: float
    cosine: float
    rtol: Optional[float] = None

    def violations(self, ref: np.ndarray, got: np.ndarray) -> int:
        r, g = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        d = np.abs(r - g)
        bad = ~(d <= self.atol)  # NaN counts as bad
        if self.rtol is not None:
            bad &= ~(d <= self.rtol * np.abs(r))
        return int(bad.sum())

    def passes(self, stats: Dict[str, object], ref=None, got=None) -> bool:
        if "shape_mismatch" in stats:
            return False
        if stats.get("mismatches") is not None:  # integer outputs: must agree exactly
            return stats["mismatches"] == 0
        if stats["cosine"] < self.cosine:
            return False
        if ref is not None and got is not None:
            return self.violations(ref, got) == 0
        return stats["max_abs"] <= self.atol


# float32 runtimes are judged by the derived bound (verify.bounds), not by these numbers: the float32
# entry is the base of an explicit --atol/--rtol/--cosine override, and the rule for an ONNX input
# without canonical tensors (no float64 reference to bound against).
DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-6, cosine=0.999999, rtol=1e-5),
    "float16": Tolerance(atol=1e-2, cosine=0.999),
    "bfloat16": Tolerance(atol=5e-2, cosine=0.995),  # reported; over it -> not-for-production, not a failure
}


def parse_overrides(values) -> Dict[str, float]:
    """Polygraphy-style ``[OUTPUT:]VALUE`` list -> {output or '*': value}."""
    out: Dict[str, float] = {}
    for v in values or ():
        name, _, num = v.rpartition(":")
        try:
            out[name or "*"] = float(num)
        except ValueError:
            from ..errors import InputError

            raise InputError(f"bad tolerance '{v}': expected [OUTPUT:]NUMBER, e.g. {C.OUT_CONT_DET}:1e-5") from None
    return out
