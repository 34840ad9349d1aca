"""``fingerprint``: sha256 of seeded 64- and 128-step action sequences (verify.checks.fingerprint)."""
from __future__ import annotations

from typing import Sequence

from ..verify.checks import fingerprint as fp
from .common import ModeResult
from .sources import KIND_ONNX, Source, make_runner

STEPS = (64, 128)


def fingerprint(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto",
                steps: Sequence[int] = STEPS, seed: int = 0, expect: Sequence[str] = ()) -> ModeResult:
    """The same function as verify's check 5: observation t drawn by verify.probes at the
    normalizer's scale (an ONNX: its folded mean/divisor), memories fed back, masks all ones;
    sha256 over the float32 bytes of the deterministic actions. Each sequence is run twice: a
    fingerprint that changes between runs fails; so does one that differs from ``expect``."""
    runner = make_runner(src, device, dtype, runtime)
    pol = src.probe_policy()
    r = ModeResult("fingerprint")
    results = {}
    for n in steps:
        a = fp(runner.run, pol, int(n), seed)
        b = fp(runner.run, pol, int(n), seed)
        results[str(n)] = {"sha256": a, "stable": a == b}
        r.ok = r.ok and a == b
    expected = {}
    for i, e in enumerate(expect or ()):
        key = str(list(steps)[i]) if i < len(steps) else str(i)
        hit = results.get(key, {}).get("sha256") == e
        expected[key] = {"expected": e, "match": hit}
        r.ok = r.ok and hit
    r.data = {"source": src.label, "runtime": runner.runtime, "device": runner.device, "dtype": runner.dtype,
              "seed": seed, "fingerprints": results}
    if expected:
        r.data["expect"] = expected
    if src.kind == KIND_ONNX:
        r.data["note"] = "observations from the ONNX's folded normalizer (mean, divisor)"
    r.lines.append(f"fingerprint {src.label}: {runner.label}, seed {seed}")
    for n, v in results.items():
        extra = ""
        if n in expected:
            extra = ", matches --expect" if expected[n]["match"] else f", DIFFERS from --expect {expected[n]['expected'][:16]}…"
        r.lines.append(f"  {'✓' if v['stable'] and expected.get(n, {}).get('match', True) else '✗'} {n:>4} steps: "
                       f"{v['sha256']} ({'stable over two runs' if v['stable'] else 'CHANGED between runs'}{extra})")
    return r
