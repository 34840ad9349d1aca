"""The float64 reference of a policy and the judging of a runtime's outputs against it.

:class:`Float64Policy` runs the policy's float32 tensors in float64 with a bound on each element of
a float32 (or float16, bfloat16) runtime's error: a loop over the blocks, stage by stage, each block's
``reference_*`` hooks doing its arithmetic with the functions of :mod:`huggy_convert.core.bounds`
(where the model behind the bounds is stated). :func:`judge` compares one runtime's output with it;
:func:`within_both` two results of two references.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from .. import blocks
from ..core.bounds import FLOAT32, Bounded, Precision, concat
from ..core.flow import ReferenceFlow


@dataclass
class Reference:
    """The float64 forward: per output, values and bounds (and, for discrete heads, the masked logits)."""

    values: Dict[str, np.ndarray]
    bounds: Dict[str, np.ndarray]
    logits: Dict[int, Bounded]
    precision: Precision = FLOAT32  # the format the bounds are for

    def rows(self, n: int) -> "Reference":
        """The first ``n`` rows (rows are independent: the reference of a feed's first ``n`` rows)."""
        return Reference({k: v[:n] for k, v in self.values.items()}, {k: v[:n] for k, v in self.bounds.items()},
                         {b: Bounded(lg.v[:n], lg.err[:n]) for b, lg in self.logits.items()}, self.precision)


class Float64Policy:
    """The policy's float32 tensors in float64, prepared once (each block's ``reference_init``);
    :meth:`forward` runs the float64 reference (with bounds, or ``bounds=False`` for the values
    alone): a loop over the blocks (``huggy_convert.blocks``), stage by stage, as the exporters."""

    def __init__(self, policy):
        spec = policy.spec
        self.spec = spec
        self._own_obs, appending = blocks.encoding_order(spec)
        prepared = [(b, b.reference_init(policy)) for b in blocks.active(spec)]
        self._observe = [(b, w) for b, w in prepared if b.stage == blocks.OBSERVE and b.has("reference_observe")]
        self._append = [(b, w) for b, w in prepared if b in appending]
        self._encode = [(b, w) for b, w in prepared if b.stage == blocks.ENCODE and b.has("reference_encode")]
        self._outputs = [(b, w) for b, w in prepared if b.has("reference_output")]

    def forward(self, feed: Dict[str, np.ndarray], noise: Optional[np.ndarray] = None, bounds: bool = True,
                precision: Precision = FLOAT32) -> "Reference":
        """The float64 forward; ``precision``: the format whose runtime the bounds are for (float32, or a
        half format: ``core.bounds.PRECISIONS``)."""
        # IEEE arithmetic as the float32 runtimes do it: exp(-z) of a very negative z is inf (sigmoid 0, swish -0,
        # as intended); a divisor that underflowed to 0 or an exp(log_sigma) that overflowed gives inf/NaN,
        # which judge() counts against the runtime (a NaN value or bound is no bound): no numpy warnings
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return self._forward(feed, noise, bounds, precision)

    def values32(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The deterministic outputs rounded once to float32 (fingerprints)."""
        vals = self.forward(feed, bounds=False).values
        return {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in vals.items()}

    def _forward(self, feed, noise, bounds: bool, precision: Precision) -> "Reference":
        r = ReferenceFlow(feed, bounds, noise, precision=precision)
        for b, w in self._observe:
            b.reference_observe(r, w)
        parts = [r.encoded[i] for i in self._own_obs]  # observation order, then the appended encodings
        r.h = (parts[0] if len(parts) == 1 else concat(parts)) if parts else None
        if self._append:
            appended = [b.reference_append(r, w) for b, w in self._append]
            r.h = concat(([r.h] if r.h is not None else []) + appended)
        for b, w in self._encode:
            b.reference_encode(r, w)
        for b, w in self._outputs:
            b.reference_output(r, w)
        return Reference(r.values, r.errs, r.logits, precision)


def reference_forward(policy, feed: Dict[str, np.ndarray], noise: Optional[np.ndarray] = None) -> "Reference":
    """Deterministic outputs and their bounds (and, with ``noise``, ``continuous_actions`` for that
    injected noise). Prepares the weights each call: keep a :class:`Float64Policy` to run several."""
    return Float64Policy(policy).forward(feed, noise)


def judge(ref: Reference, name: str, got: np.ndarray) -> Dict[str, object]:
    """Compare one runtime's output with the reference (its bounds for the runtime's format,
    ``ref.precision``): figures + ``ok``.

    Floats: every element within its bound (``ratio`` = max observed error / bound). Argmax outputs:
    equal, or a flip within its bound: the float64 margin between the two logits (the reference's
    pick and the runtime's) at most their two bounds plus the softmax's tie (``precision.tie``
    relative), a tie that format cannot resolve. ``flips`` lists the flipped rows with their margin
    and bound (``first_failure`` too, for one over its bound)."""
    want = ref.values[name]
    got = np.asarray(got)
    d: Dict[str, object] = {"count": int(want.size)}
    if got.shape != want.shape:
        d.update(ok=False, shape_mismatch=[list(want.shape), list(got.shape)])
        return d
    if want.dtype.kind in "iu":
        bad, ties = 0, 0
        first = None
        flips = []
        tie = ref.precision.tie
        for b, lg in ref.logits.items():
            g = got[:, b].astype(np.int64)
            w = want[:, b]
            rows = np.nonzero(g != w)[0]
            for r in rows:
                n = lg.v.shape[1]
                if not 0 <= g[r] < n:
                    bad += 1
                    first = first or {"index": [int(r), b], "expected": int(w[r]), "got": int(g[r])}
                    continue
                gap = lg.v[r, w[r]] - lg.v[r, g[r]]
                slack = lg.err[r, w[r]] + lg.err[r, g[r]] + tie * max(1.0, abs(lg.v[r, w[r]]))
                flip = {"index": [int(r), b], "expected": int(w[r]), "got": int(g[r]), "margin": float(gap),
                        "bound": float(slack)}
                flips.append(flip)
                if gap <= slack:
                    ties += 1
                else:
                    bad += 1
                    first = first or dict(flip, logit_gap=float(gap))
        d.update(ok=bad == 0, equal=int((got == want).sum()), ties=ties, mismatches=bad, first_failure=first)
        if flips:
            d["flips"] = flips
        return d
    g64 = got.astype(np.float64)
    bound, d2 = _over_bound(g64, want, ref.bounds[name], np.isfinite(g64) & np.isfinite(want))
    d.update(ok=d2["ok"], max_abs=d2["max_abs"], max_bound=float(bound.max()) if bound.size else 0.0,
             median_bound=float(np.median(bound)) if bound.size else 0.0, ratio=d2["ratio"], over=d2["over"])
    if "unbounded" in d2:
        d["unbounded"] = d2["unbounded"]
    if "first" in d2:
        k, err = d2["first"]
        d["first_failure"] = {"index": list(k), "reference": float(want[k]), "got": float(g64[k]),
                              "error": err, "bound": float(bound[k])}
    return d


def _over_bound(x: np.ndarray, y: np.ndarray, bound: np.ndarray, finite: np.ndarray, nan_unbounded: bool = True):
    """The one rule of :func:`judge` and :func:`within_both`: an element passes only where every value
    it compares (the runtime's and the reference's: ``finite``) is finite and ``|x - y|`` is within its
    bound. ``nan_unbounded``: a NaN bound, which no arithmetic gave, is no bound: inf, counted as
    unbounded (:func:`judge`); otherwise (:func:`within_both`) it bounds nothing and the element fails.
    An element without a finite bound still needs finite values, so inf/NaN never pass. Returns (the bound, NaN as inf; {ok, max_abs, ratio, over, unbounded (where any), first: (the
    first element over, its error) where any})."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        bound = np.asarray(bound, np.float64)
        if nan_unbounded and np.isnan(bound).any():
            bound = np.where(np.isnan(bound), np.inf, bound)
        err = np.where(finite, np.abs(x - y), np.inf)
        over = ~finite | ~(err <= bound)
        ratio = np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))
    d: Dict[str, object] = {"ok": not bool(over.any()), "max_abs": float(err.max()) if err.size else 0.0,
                            "ratio": float(ratio.max()) if ratio.size else 0.0, "over": int(over.sum())}
    if np.isinf(bound).any():
        d["unbounded"] = int(np.isinf(bound).sum())
    if over.any():
        k = tuple(int(i) for i in np.argwhere(over)[0])
        d["first"] = (k, float(err[k]))
    return bound, d


def within_both(ref_a: Reference, ref_b: Reference, name: str, a: np.ndarray, b: np.ndarray) -> Dict[str, object]:
    """Two float32 results of (possibly) different references, e.g. the rebuilt and the official ONNX
    with divisors 1 ulp apart: ``|a - b| <= bound_a + |ref_a - ref_b| + bound_b`` (:func:`judge`'s rule:
    the four values finite; a NaN limit fails the element)."""
    wa, wb = ref_a.values[name], ref_b.values[name]
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    finite = np.isfinite(a64) & np.isfinite(b64) & np.isfinite(wa) & np.isfinite(wb)
    with np.errstate(over="ignore", invalid="ignore"):
        limit = ref_a.bounds[name] + ref_b.bounds[name] + np.abs(wa - wb)
    limit, d = _over_bound(a64, b64, limit, finite, nan_unbounded=False)
    out = {"ok": d["ok"], "count": int(a64.size), "max_abs": d["max_abs"], "ratio": d["ratio"], "over": d["over"]}
    if "unbounded" in d:
        out["unbounded"] = d["unbounded"]
    if "first" in d:
        k, err = d["first"]
        out["first_failure"] = {"index": list(k), "a": float(a64[k]), "b": float(b64[k]), "error": err,
                                "bound": float(limit[k])}
    return out
