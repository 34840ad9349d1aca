"""``precision``: float32 / float16 / bfloat16 on every device against the CPU float32 reference."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..errors import HuggyError
from .common import FAIL, PASS, SKIP, WARN, ModeResult, fp32_agree, fp32_reference, g, tolerance
from .sources import DTYPES, KIND_ONNX, Source, devices_present, make_feed, make_runner


def precision(src: Source, devices: Optional[Sequence[str]] = None, dtypes: Sequence[str] = DTYPES,
              rows: int = 64, seed: int = 0, runtime: str = "auto") -> ModeResult:
    """Each device x dtype against the CPU float32 reference (torch eager; onnxruntime for an ONNX)
    on verify's seeded probes. Verdicts use verify's rules: float32 within twice the derived bound
    of the float64 reference (verify.bounds; an ONNX input, without canonical tensors: verify's
    float32 Tolerance, atol 1e-6 / rtol 1e-5 element-wise and cosine >= 0.999999), float16 atol 1e-2 /
    cosine >= 0.999; bfloat16 (5e-2 / 0.995) is reported and over it marked not-for-production (WARN),
    not failed (verify.compare.Tolerance: an element fails only past both atol and rtol). Integer
    (discrete) outputs must agree exactly in float32; in reduced precision a flipped argmax is a WARN."""
    devices = list(devices) if devices else devices_present()
    feed = make_feed(src, "probes", rows, seed)
    names = src.spec.deterministic_output_names()
    ref_runner = make_runner(src, "cpu", "float32", runtime)
    ref = ref_runner.deterministic(feed)
    f64 = fp32_reference(src.policy, feed) if src.policy is not None else None
    r = ModeResult("precision")
    results: List[Dict] = []
    for dev in devices:
        for dt in dtypes:
            row: Dict = {"device": dev, "dtype": dt}
            try:
                runner = make_runner(src, dev, dt, runtime)
                got = runner.deterministic(feed)
            except HuggyError as exc:
                row.update(status=SKIP, reason=exc.message)
                results.append(row)
                continue
            tol = tolerance(dt)
            status = PASS
            outs = {}
            for k in names:
                if dt == "float32" and f64 is not None:  # the derived bound: the same rule on every host
                    c = fp32_agree(f64, k, ref[k], got[k])
                    outs[k] = dict(c.figures(), bound_ratio=c.bound_ratio)
                    if not c:
                        status = FAIL
                    continue
                c = tol.compare(ref[k], got[k])
                outs[k] = c.figures()
                # an argmax flipped in reduced precision, or a bf16 output over its threshold: a warning
                bad = FAIL if (dt == "float32" or (not c.integer and dt != "bfloat16")) else WARN
                if not c:
                    status = FAIL if FAIL in (status, bad) else WARN
            row.update(status=status, runtime=runner.runtime, resolved=runner.device, atol=tol.atol,
                       min_cosine=tol.cosine, outputs=outs)
            if status == FAIL:
                r.ok = False
            results.append(row)
    r.data = {"source": src.label, "reference": ref_runner.label, "rows": rows, "seed": seed, "probes":
              "runtime.feeds.make_probes (normalizer scale + clip-hitting outliers)", "results": results}
    r.lines.append(f"precision {src.label}: against {ref_runner.label} on {rows} probes (seed {seed})")
    mark = {PASS: "✓", FAIL: "✗", WARN: "!", SKIP: "-"}
    for row in results:
        head = f"  {mark[row['status']]} {row['device']:<7} {row['dtype']:<8}"
        if row["status"] == SKIP:
            r.lines.append(f"{head} skipped: {row['reason']}")
            continue
        parts = []
        for k, s in row["outputs"].items():
            parts.append(f"{k}: " + (f"{s['bitwise_equal']}/{s['count']} equal" if "mismatches" in s else
                                      f"cos={s['cosine']:.6f} max_abs={g(s['max_abs'], 3)}"))
        note = " (over the bf16 threshold: not for production)" if row["status"] == WARN and row["dtype"] == "bfloat16" else ""
        r.lines.append(f"{head} {'; '.join(parts)}{note}")
    if src.kind == KIND_ONNX:
        r.lines.append("  note: an ONNX runs through onnxruntime in float32 only; float16/bfloat16 need canonical tensors"
                       + (": --runtime torch uses those recovered from it" if src.has_tensors else ""))
    return r

