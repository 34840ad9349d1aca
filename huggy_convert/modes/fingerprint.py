"""``fingerprint``: sha256 of seeded 64- and 128-step action sequences (verify's check 5).

The fingerprint that identifies a policy is the float64 reference's (verify.checks.reference_fingerprint):
the same on every host, so ``--expect`` can gate a deploy on another machine. The chosen runtime's
float32 fingerprint is printed beside it: it is host-local (float32 kernels differ by CPU and
device), and it must not change between two runs on this host."""
from __future__ import annotations

from typing import Sequence

from ..errors import InputError
from ..verify.checks import fingerprint as fp
from ..verify.checks import reference_fingerprint
from .common import ModeResult
from .sources import Source, make_runner

STEPS = (64, 128)
MIN_PREFIX = 8  # hex digits of a fingerprint prefix that --expect accepts (the tree prints 12)


def matches(expected: str, full: str) -> bool:
    """``expected`` is the fingerprint or a prefix of it of at least 8 hex digits (the tree prints 12)."""
    e = expected.strip().lower().rstrip("…").rstrip(".")
    if len(e) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in e):
        raise InputError(f"--expect '{expected}': give a fingerprint (or its first {MIN_PREFIX}+ hex digits)")
    return full.startswith(e)


def fingerprint(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto",
                steps: Sequence[int] = STEPS, seed: int = 0, expect: Sequence[str] = ()) -> ModeResult:
    """Observation t drawn by runtime.feeds.make_probes at the normalizer's scale (an ONNX: its folded
    mean/divisor), memories fed back, masks all ones; sha256 over the float32 bytes of the
    deterministic actions. ``sha256``: the float64 reference's (host-independent) where the source
    has canonical tensors, else the runtime's (an ONNX input: host-local). The runtime's sequence is
    run twice: one that changes between runs fails; so does a fingerprint that differs from ``expect``."""
    runner = make_runner(src, device, dtype, runtime)
    pol = src.probe_policy()
    has_ref = src.has_tensors
    r = ModeResult("fingerprint")
    results = {}
    for n in steps:
        a = fp(runner.infer, pol, int(n), seed)
        b = fp(runner.infer, pol, int(n), seed)
        ref = reference_fingerprint(pol, int(n), seed) if has_ref else a
        results[str(n)] = {"sha256": ref, "host_independent": has_ref, "runtime_sha256": a, "stable": a == b}
        r.ok = r.ok and a == b
    expected = {}
    for i, e in enumerate(expect or ()):
        key = str(list(steps)[i]) if i < len(steps) else str(i)
        hit = key in results and matches(e, results[key]["sha256"])
        expected[key] = {"expected": e, "match": hit}
        r.ok = r.ok and hit
    r.data = {"source": src.label, "runtime": runner.runtime, "device": runner.device, "dtype": runner.dtype,
              "seed": seed, "fingerprints": results}
    if expected:
        r.data["expect"] = expected
    if not has_ref:
        r.data["note"] = ("no canonical tensors could be recovered from this ONNX: the fingerprint is onnxruntime's "
                          "float32 one, host-local; observations from its folded normalizer (mean, divisor)")
    r.lines.append(f"fingerprint {src.label}: " + ("float64 reference (the same on every host); " if has_ref else "")
                   + f"{runner.label} beside it, seed {seed}")
    for n, v in results.items():
        extra = ""
        if n in expected:
            extra = ", matches --expect" if expected[n]["match"] else f", DIFFERS from --expect {expected[n]['expected'][:16]}…"
        ok = v["stable"] and expected.get(n, {}).get("match", True)
        local = (f"; this host's {runner.runtime} {v['runtime_sha256'][:12]}… "
                 f"({'stable over two runs' if v['stable'] else 'CHANGED between runs'})")
        r.lines.append(f"  {'✓' if ok else '✗'} {n:>4} steps: {v['sha256']}{extra}" + (local if has_ref else
                       f" ({'stable over two runs' if v['stable'] else 'CHANGED between runs'}, host-local)"))
    return r
