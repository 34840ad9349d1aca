"""``precision``: float32 / float16 / bfloat16 on every device against the CPU float32 reference."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .. import contract as C
from ..core.bounds import PRECISIONS
from ..errors import HuggyError
from ..exporters.devices import NPU
from ..exporters.torch_module import build_module
from ..runtime import ModuleRunner, OrtRunner, cann_available
from ..verify.bounds import Float64Policy
from .common import FAIL, PASS, SKIP, ModeResult, fp32_agree, g, half_agree, tolerance
from .sources import DTYPES, KIND_ONNX, Source, devices_present, make_feed, make_runner


def precision(src: Source, devices: Optional[Sequence[str]] = None, dtypes: Sequence[str] = DTYPES,
              rows: int = 64, seed: int = 0, runtime: str = "auto") -> ModeResult:
    """Each device x dtype against the CPU float32 reference (torch eager; onnxruntime for an ONNX)
    on verify's seeded probes. Verdicts use verify's rules: float32 within twice the derived bound
    of the float64 reference (verify.bounds; an ONNX input, without canonical tensors: verify's
    float32 Tolerance, atol 1e-6 / rtol 1e-5 element-wise and cosine >= 0.999999); float16 and
    bfloat16 within the bound derived for their format (over it: a failure; an argmax flip within its
    float64 logit margin passes). The figures are each run against the CPU float32 run. The half
    formats run only from canonical tensors; a row records ``atol`` / ``min_cosine`` only where that
    fixed Tolerance judged it (float32 without canonical tensors)."""
    devices = list(devices) if devices else devices_present()
    feed = make_feed(src, "probes", rows, seed)
    names = src.spec.deterministic_output_names()
    ref_runner = make_runner(src, "cpu", "float32", runtime)
    ref = ref_runner.deterministic(feed)
    reference = _references(src, feed)
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
            # a half runner exists only from canonical tensors, so only float32 can lack the float64 reference
            tol = tolerance(dt) if reference is None else None
            outs, status = _judged(names, ref, got, dt, tol, reference)
            row.update(status=status, runtime=runner.runtime, resolved=runner.device)
            if tol is not None:
                row.update(atol=tol.atol, min_cosine=tol.cosine)
            row["outputs"] = outs
            if status == FAIL:
                r.ok = False
            results.append(row)
    r.data = {"source": src.label, "reference": ref_runner.label, "rows": rows, "seed": seed, "probes":
              "runtime.feeds.make_probes (normalizer scale + clip-hitting outliers)", "results": results}
    _render(r, src, results)
    if reference is not None:
        _atc_modes(r, src, feed, ref, reference, names, devices)
    return r


def _judged(names, ref, got, dt: str, tol, reference):
    """(each output's figures against the CPU float32 run, PASS or FAIL): ``tol`` (float32 without
    canonical tensors: verify's float32 Tolerance), else the bound derived for ``dt``."""
    status, outs = PASS, {}
    for k in names:
        if tol is not None:
            c = tol.compare(ref[k], got[k])
            outs[k] = c.figures()
        elif dt == "float32":  # the derived bound: the same rule on every host
            c = fp32_agree(reference("float32"), k, ref[k], got[k])
            outs[k] = dict(c.figures(), bound_ratio=c.bound_ratio)
        else:  # the bound derived for the format
            c = half_agree(reference(dt), k, ref[k], got[k])
            outs[k] = dict(c.figures(), bound_ratio=c.bound_ratio)
        if not c:
            status = FAIL
    return outs, status


def _render(r: ModeResult, src: Source, results: List[Dict]) -> None:
    d = r.data
    r.lines.append(f"precision {src.label}: against {d['reference']} on {d['rows']} probes (seed {d['seed']})")
    mark = {PASS: "✓", FAIL: "✗", SKIP: "-"}
    for row in results:
        head = f"  {mark[row['status']]} {row['device']:<7} {row['dtype']:<8}"
        if row["status"] == SKIP:
            r.lines.append(f"{head} skipped: {row['reason']}")
            continue
        parts = []
        for k, s in row["outputs"].items():
            parts.append(f"{k}: " + (f"{s['bitwise_equal']}/{s['count']} equal" if "mismatches" in s else
                                      f"cos={s['cosine']:.6f} max_abs={g(s['max_abs'], 3)}"))
        r.lines.append(f"{head} {'; '.join(parts)}")
    if src.kind == KIND_ONNX:
        r.lines.append("  note: an ONNX runs through onnxruntime in float32 only; float16/bfloat16 need canonical tensors"
                       + (": --runtime torch uses those recovered from it" if src.has_tensors else ""))


def _references(src: Source, feed):
    """``reference(dtype)``: the float64 reference of ``src.policy`` on ``feed`` with the bounds of a
    ``dtype`` runtime, one :class:`Float64Policy` and one forward per dtype; None without canonical tensors."""
    if src.policy is None:
        return None
    fp = Float64Policy(src.policy)
    done: Dict[str, object] = {}

    def reference(dtype: str):
        if dtype not in done:
            done[dtype] = fp.forward(feed, precision=PRECISIONS[dtype])
        return done[dtype]
    return reference


# ATC's precision modes, each emulated on the CPU: (mode, short, what runs, weights dtype, normalizer dtype)
KEEP_DTYPE = f"{C.PRECISION_ALLOW_FP32_TO_FP16} + --keep_dtype"
ATC_EMULATIONS = (
    (C.PRECISION_FORCE_FP16, "fp16 everywhere, the normalizer too",
     "ATC's inference default: every op that has an fp16 kernel in fp16, the normalizer's Sub/Div/Clip included "
     "(the torch module in float16 with its normalizer in float16)", "float16", "float16"),
    (KEEP_DTYPE, "the normalizer fp32, the rest fp16",
     f"the normalizer's nodes kept float32 by --keep_dtype, every other op in fp16: the worst case of "
     f"{C.PRECISION_ALLOW_FP32_TO_FP16} and {C.PRECISION_ALLOW_MIX} with the normalizer kept (the torch module in "
     "float16, its normalizer pinned float32)", "float16", "float32"),
    (C.PRECISION_KEEP_ORIGIN, "float32 throughout",
     "the graph's own float32 (onnxruntime on the rebuilt ONNX)", None, None),
)


def _atc_modes(r: ModeResult, src: Source, feed, ref, reference, names, devices) -> None:
    """Each ATC precision mode against the CPU float32 reference, measured: fp16 modes emulated with the
    torch module in float16 (the normalizer in fp16 or kept fp32), judged by verify's derived fp16 bound;
    ``must_keep_origin_dtype`` as the rebuilt ONNX in onnxruntime, judged by the derived float32 bound.
    Where onnxruntime-cann is installed and an NPU is among the devices, the same ONNX runs on it
    through the CANN execution provider with each precision mode. Advisory: none fails the command.
    ``reference``: :func:`_references`' (the float64 reference per dtype, computed once)."""
    f64, f16 = reference("float32"), reference("float16")
    rows: List[Dict] = []

    def judge(mode, short, what, got, fp32, where="cpu emulation"):
        row = {"precision_mode": mode, "short": short, "emulates": what, "where": where, "outputs": {}}
        ok = True
        for k in names:
            if fp32:
                c = fp32_agree(f64, k, ref[k], got[k])
                bound = {"rule": "derived float32 bound", "bound_ratio": c.bound_ratio}
            else:
                c = half_agree(f16, k, ref[k], got[k])
                bound = {"rule": "derived float16 bound", "bound_ratio": c.bound_ratio}
            row["outputs"][k] = dict(c.figures(), **bound, within=bool(c))
            ok = ok and bool(c)
        row["within_bound"] = ok
        rows.append(row)

    for mode, short, what, dt, ndt in ATC_EMULATIONS:
        try:
            if dt is None:
                got = OrtRunner(src.reference_onnx(), "cpu", spec=src.spec).deterministic(feed)
            else:
                got = ModuleRunner(build_module(src.policy, "cpu", dt, normalizer_dtype=ndt)).deterministic(feed)
        except HuggyError as exc:
            rows.append({"precision_mode": mode, "short": short, "emulates": what, "where": "cpu emulation",
                         "skipped": exc.message})
            continue
        judge(mode, short, what, got, dt is None)
    npus = [d for d in devices if d.split(":")[0] == NPU]
    if npus and cann_available():
        for mode in (C.PRECISION_FORCE_FP16, C.PRECISION_ALLOW_FP32_TO_FP16, C.PRECISION_KEEP_ORIGIN):
            where = f"{npus[0]} {C.CANN_EP}"
            try:
                got = OrtRunner(src.reference_onnx(), npus[0], spec=src.spec, precision_mode=mode).deterministic(feed)
            except HuggyError as exc:
                rows.append({"precision_mode": mode, "where": where, "skipped": exc.message})
                continue
            judge(mode, "measured on the NPU", "onnxruntime's CANN execution provider with this precision_mode",
                  got, mode == C.PRECISION_KEEP_ORIGIN, where)
    # the fastest mode within its bound that keeps the normalizer float32 (force_fp16 is the evidence
    # against ATC's default, never the advice: an observation past fp16's range would overflow it)
    kept = [row for row in rows if row.get("within_bound") and row["where"] == "cpu emulation"
            and (row["precision_mode"] != C.PRECISION_FORCE_FP16 or not src.spec.normalize)]
    fastest = kept[0]["precision_mode"] if kept else None
    r.data["atc"] = {"reference": "the CPU float32 run above", "modes": rows, "recommended": fastest,
                     "note": "ATC's --keep_dtype keeps the listed nodes' dtype; must_keep_origin_dtype ignores it"}
    _render_atc(r, rows, fastest, src.spec.normalize)


def _render_atc(r: ModeResult, rows: List[Dict], fastest: Optional[str], normalize: bool) -> None:
    r.lines.append("  Ascend ATC precision modes against the CPU float32 run (judged by the bounds derived for "
                   "float16, or float32):")
    for row in rows:
        if "skipped" in row:
            r.lines.append(f"    - {row['precision_mode']:<34} skipped: {row['skipped']}")
            continue
        parts = [f"{k}: " + (f"{o['bitwise_equal']}/{o['count']} equal" if "mismatches" in o else
                             f"max_abs={g(o['max_abs'], 3)}" + (f" (bound ratio {g(o['bound_ratio'], 3)})"
                                                                if o.get("bound_ratio") is not None else ""))
                 for k, o in row["outputs"].items()]
        mark = "✓" if row["within_bound"] else "✗"
        r.lines.append(f"    {mark} {row['precision_mode']:<34} {'; '.join(parts)}  ({row['where']}: {row['short']})"
                       + ("" if row["within_bound"] else "  OVER THE BOUND"))
    if fastest:
        kept_text = " that keeps the normalizer float32" if normalize else ""
        r.lines.append(f"    recommended: {fastest} (the fastest mode within its bound{kept_text}; convert and export "
                       "print the atc command)")

