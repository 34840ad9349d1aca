"""Array comparison in Polygraphy's style: per-output statistics (:func:`array_stats`), one result
struct (:class:`Comparison`, true when it passes) and one tolerance rule (:class:`Tolerance`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional

import numpy as np

from .. import contract as C
from ..core.numerics import ulp_distance  # noqa: F401 (re-exported: verify.compare.ulp_distance)
from ..errors import InputError


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


FIGURES = ("count", "bitwise_equal", "max_abs", "max_rel", "max_ulp", "mean_abs", "cosine", "mismatches",
           "shape_mismatch", "non_finite")


@dataclass(frozen=True)
class Comparison:
    """One output of a runtime against its reference: the figures of :func:`array_stats` and the verdict
    of one rule (``rule``: "bitwise", a :class:`Tolerance`, or "derived float32 bound"). True when it
    passes. ``integer``: an integer output (``bitwise_equal`` counts equal elements; ``cosine`` is None).
    ``bound_ratio``: under the derived bound, the worst error over the bound (< 1 passes)."""

    count: int
    bitwise_equal: int
    max_abs: float
    ok: bool
    rule: str = "bitwise"
    cosine: Optional[float] = None
    integer: bool = False
    shape_mismatch: Optional[list] = None
    max_rel: Optional[float] = None
    max_ulp: Optional[int] = None
    mean_abs: Optional[float] = None
    non_finite: Optional[int] = None
    violations: Optional[int] = None
    bound_ratio: Optional[float] = None

    def __bool__(self) -> bool:
        return self.ok

    @property
    def bitwise(self) -> bool:
        return self.shape_mismatch is None and self.bitwise_equal == self.count

    @property
    def mismatches(self) -> Optional[int]:
        return self.count - self.bitwise_equal if self.integer and self.shape_mismatch is None else None

    @classmethod
    def of(cls, stats: Dict[str, object], ok: Optional[bool] = None, rule: str = "bitwise", **kw) -> "Comparison":
        """From :func:`array_stats`' figures (or a check's, which are the same); ``ok`` None: bitwise."""
        c = cls(count=int(stats.get("count", 0)), bitwise_equal=int(stats.get("bitwise_equal", 0)),
                max_abs=float(stats.get("max_abs", 0.0)), ok=False, rule=rule, cosine=stats.get("cosine"),
                integer=stats.get("mismatches") is not None, shape_mismatch=stats.get("shape_mismatch"),
                max_rel=stats.get("max_rel"), max_ulp=stats.get("max_ulp"), mean_abs=stats.get("mean_abs"),
                non_finite=stats.get("non_finite"), **kw)
        return replace(c, ok=c.bitwise if ok is None else bool(ok))

    def figures(self) -> Dict[str, object]:
        """The figures for JSON (the keys :func:`array_stats` gives, those that apply)."""
        d = {k: getattr(self, k) for k in FIGURES}
        return {k: v for k, v in d.items() if v is not None}

    def line(self) -> str:
        """One line of text, the same on every run."""
        if self.shape_mismatch is not None:
            return f"shape {self.shape_mismatch[1]} != expected {self.shape_mismatch[0]}"
        if self.integer:
            return f"{self.bitwise_equal}/{self.count} equal"
        return (f"max_abs={self.max_abs:.3g} cos={self.cosine:.9f} max_ulp={self.max_ulp} "
                f"bitwise={self.bitwise_equal}/{self.count}")


def compare_arrays(ref: np.ndarray, got: np.ndarray, tolerance: Optional["Tolerance"] = None) -> Comparison:
    """``got`` against ``ref``: bitwise, or by ``tolerance``'s element-wise rule."""
    if tolerance is not None:
        return tolerance.compare(ref, got)
    return Comparison.of(array_stats(ref, got))


@dataclass(frozen=True)
class Tolerance:
    """The one tolerance rule, Polygraphy's, element by element: an element fails only when its
    absolute error exceeds ``atol`` *and* its relative error exceeds ``rtol`` (``rtol=None``: absolute
    only); the whole output must also keep ``cosine`` similarity. Integer outputs must agree exactly,
    shapes must match."""

    atol: float
    cosine: float
    rtol: Optional[float] = None

    @property
    def rule(self) -> str:
        return f"atol {self.atol:g}" + (f", rtol {self.rtol:g}" if self.rtol is not None else "") + \
            f", cosine >= {self.cosine:g}"

    def violations(self, ref: np.ndarray, got: np.ndarray) -> int:
        r, g = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        d = np.abs(r - g)
        bad = ~(d <= self.atol)  # NaN counts as bad
        if self.rtol is not None:
            bad &= ~(d <= self.rtol * np.abs(r))
        return int(bad.sum())

    def compare(self, ref: np.ndarray, got: np.ndarray) -> Comparison:
        s = array_stats(ref, got)
        if "shape_mismatch" in s:
            return Comparison.of(s, False, self.rule)
        if s.get("mismatches") is not None:  # integer outputs: must agree exactly
            return Comparison.of(s, s["mismatches"] == 0, self.rule)
        n = self.violations(ref, got)
        return Comparison.of(s, s["cosine"] >= self.cosine and n == 0, self.rule, violations=n)

    def passes(self, stats: Dict[str, object], ref: np.ndarray, got: np.ndarray) -> bool:
        """verify.checks' form of :meth:`compare` (``stats``: its array_stats of the same arrays)."""
        return bool(self.compare(ref, got))


# float32, float16 and bfloat16 runtimes are judged by the derived bound (verify.bounds), not by these
# numbers: each entry is the base of an explicit --atol/--rtol/--cosine override (over a user's bfloat16
# threshold: a warning), the rule for an ONNX input without canonical tensors (no float64 reference to
# bound against), and the thresholds the `precision` mode and the matrix still apply.
DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-6, cosine=0.999999, rtol=1e-5),
    "float16": Tolerance(atol=1e-2, cosine=0.999),
    "bfloat16": Tolerance(atol=5e-2, cosine=0.995),
}


def parse_overrides(values) -> Dict[str, float]:
    """Polygraphy-style ``[OUTPUT:]VALUE`` list -> {output or '*': value}."""
    out: Dict[str, float] = {}
    for v in values or ():
        name, _, num = v.rpartition(":")
        try:
            out[name or "*"] = float(num)
        except ValueError:
            raise InputError(f"bad tolerance '{v}': expected [OUTPUT:]NUMBER, e.g. {C.OUT_CONT_DET}:1e-5") from None
    return out


def stats_text(s: Dict) -> str:
    """One line of ``array_stats`` figures."""
    if "shape_mismatch" in s:
        return f"shape {s['shape_mismatch'][1]} != expected {s['shape_mismatch'][0]}"
    if s.get("mismatches") is not None:
        return f"{s['bitwise_equal']}/{s['count']} equal"
    return (f"max_abs={s['max_abs']:.3g} max_rel={s['max_rel']:.3g} max_ulp={s['max_ulp']} "
            f"mean_abs={s['mean_abs']:.3g} p99_abs={s['p99_abs']:.3g} cos={s['cosine']:.9f} "
            f"bitwise={s['bitwise_equal']}/{s['count']}")


def first_diff_text(name: str, s: Dict) -> str:
    """Where ``array_stats`` saw the first difference ('' where none)."""
    fd = s.get("first_diff")
    if not fd:
        return ""
    ulps = f", {fd['ulps']} ulp" if "ulps" in fd else ""
    return f"; first difference {name}{fd['index']}: expected {fd['expected']!r}, got {fd['got']!r}{ulps}"
