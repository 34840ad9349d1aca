"""The matrix's cases, groups 4-7: batch sizes, precision, ONNX cross-validation, sequence
fingerprints (registered into ``matrix_table.TABLE`` in order; see there)."""
from __future__ import annotations

from functools import partial
from typing import Dict

from .. import contract as C
from ..core.bounds import PRECISIONS
from ..errors import DeviceError
from ..exporters.torch_module import build_module
from ..runtime import module_runner
from ..verify.bounds import Float64Policy
from ..verify.checks import fingerprint as fp
from .actions import act
from .batch_sizes import batch_sizes
from .common import FAIL, PASS, SKIP, half_agree
from .compare import onnx_compare
from .fingerprint import fingerprint
from .matrix_table import TAMPER, VARIANTS, Outcome, Skip, case
from .ports import normal_noise_names, variant_with
from .precision import precision
from .sources import make_feed, make_runner

# 4 batch sizes -------------------------------------------------------------------------------------
def c_batch(m, path=None, dtype="float32", runtime="auto", device="cpu", variant=None):
    path = m.variant(variant) if variant else (path(m) if callable(path) else m.ck)
    r = batch_sizes(m.src(path), device, dtype, runtime, repeats=1 if m.quick else 5)
    figs = {}
    for row in r.data["results"]:
        for k, s in row["outputs"].items():
            key = "equal" if "mismatches" in s else "max_abs"
            val = f"{s['bitwise_equal']}/{s['count']}" if key == "equal" else float(s["max_abs"])
            figs.setdefault(f"{k}:{key}", []).append(val)
    figs["bitwise_sizes"] = sum(all(s["bitwise"] for s in row["outputs"].values()) for row in r.data["results"])
    return Outcome(r.ok, figs, {"median_ms": {k: round(v["median_ms"], 3) for k, v in r.timings["per_batch"].items()}})


case(4, "torch cpu fp32: rows stable across sizes (derived float32 bound)",
     lambda m: m.cmd("batch-sizes", m.ck))(c_batch)
case(4, "onnxruntime (rebuilt) cpu: rows stable across sizes",
     lambda m: m.cmd("batch-sizes", m.ck, "--runtime onnxruntime"))(partial(c_batch, runtime="onnxruntime"))
case(4, "official ONNX input: rows stable across sizes", lambda m: m.cmd("batch-sizes", m.off or "<stem>.onnx"),
     needs=("official",))(partial(c_batch, path=lambda m: m.off))
case(4, "torch cpu fp16: rows stable (<= 1e-2)", lambda m: m.cmd("batch-sizes", m.ck, "--dtype float16"))(
    partial(c_batch, dtype="float16"))
case(4, "torch cpu bf16: rows stable (<= 5e-2)", lambda m: m.cmd("batch-sizes", m.ck, "--dtype bfloat16"))(
    partial(c_batch, dtype="bfloat16"))
for _trait, _what in (("integer_output", "integers equal"), ("carried_state", "carried state out too")):
    _name = variant_with(_trait)
    case(4, f"variant {_name}: rows stable ({_what})",
         lambda m, name=_name: m.cmd("batch-sizes", m.variant_label(name)))(partial(c_batch, variant=_name))
for _dev in ("cuda", "npu"):
    case(4, f"{_dev} fp32: rows stable across sizes", lambda m, dev=_dev: m.cmd("batch-sizes", m.ck, f"--device {dev}"),
         needs=(_dev,))(partial(c_batch, device=_dev))


# 5 precision ---------------------------------------------------------------------------------------
case(5, "the CPU fp32 module vs official ONNX on 64 probes (derived float32 bound)",
     lambda m: m.cmd("act", m.ck, "--obs probes --rows 64"), needs=("official",))(
    lambda m: m.vs_official(m.ck, make_feed(m.main, "probes", 64, 0)))


def c_prec(m, dev, dtype):
    r = precision(m.main, [dev], [dtype], 64, 0)
    row = r.data["results"][0]
    if row["status"] == SKIP:
        raise Skip(row["reason"])
    figs = {}
    for k, s in row["outputs"].items():
        figs[k] = ({"equal": f"{s['bitwise_equal']}/{s['count']}"} if "mismatches" in s else
                   {"cosine": round(float(s["cosine"]), 9), "max_abs": float(s["max_abs"])})
    return Outcome(row["status"] == PASS, figs)


for _dev in ("cpu", "cuda", "npu"):
    for _dtype in ("float32", "float16", "bfloat16") if _dev != "cpu" else ("float16", "bfloat16"):
        case(5, f"{_dev} {_dtype} vs cpu fp32 (within its derived {_dtype} bound)",
             lambda m, dev=_dev, dtype=_dtype: m.cmd("precision", m.ck, f"--device {dev} --dtype {dtype}"),
             needs=() if _dev == "cpu" else (_dev,))(partial(c_prec, dev=_dev, dtype=_dtype))


@case(5, "fp16 keeps the normalizer fp32: an fp16 normalizer is caught (Huggy overflows fp16)",
      lambda m: m.cmd("precision", m.ck, "--device cpu --dtype float16"), needs=("normalizer", "normal_sample"))
def c_fp16_norm(m):
    """The module in fp16 keeps its normalizer fp32 and stays within the derived float16 bound (as
    ``precision`` judges it). That an fp16 normalizer fails depends on the policy's scale: required on
    the bundled Huggy (the known trap), reported for any other input."""
    s = m.main
    out = C.OUT_CONT_DET
    feed = make_feed(s, "probes", 64, 0)
    ref = m.det(m.ck, feed)[out]
    ref16 = Float64Policy(s.policy).forward(feed, precision=PRECISIONS["float16"])
    good = module_runner(build_module(s.policy, "cpu", "float16"))(feed)[out]
    bad = module_runner(build_module(s.policy, "cpu", "float16", normalizer_dtype="float16"))(feed)[out]
    sg, sb = half_agree(ref16, out, ref, good), half_agree(ref16, out, ref, bad)
    figs = {"fp32_normalizer": {"cosine": round(sg.cosine, 6), "max_abs": sg.max_abs,
                                "bound_ratio": round(sg.bound_ratio, 6)},
            "fp16_normalizer": {"cosine": round(sb.cosine, 6), "max_abs": sb.max_abs,
                                "bound_ratio": round(sb.bound_ratio, 6)}}
    if m.t.expect_params is None:  # not the bundled Huggy: whether its fp16 normalizer fails is a figure
        return Outcome(sg.ok, figs | {"fp16_normalizer_caught": not sb.ok})
    return Outcome(sg.ok and not sb.ok, figs)


@case(5, "every variant in fp16 on cpu (within the derived float16 bound; an argmax flip within its margin passes)",
      lambda m: m.variants_cmd("precision", "--device cpu --dtype float16"), needs=("variants",))
def c_var_fp16(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        row = precision(m.src(vck), ["cpu"], ["float16"], 64, 0).data["results"][0]
        cos = [float(s["cosine"]) for s in row["outputs"].values() if "cosine" in s and "mismatches" not in s]
        eq = [f"{s['bitwise_equal']}/{s['count']}" for s in row["outputs"].values() if "mismatches" in s]
        figs[name] = " ".join(([f"cos={min(cos):.6f}"] if cos else []) + ([f"equal={','.join(eq)}"] if eq else []))
        ok = ok and row["status"] != FAIL
    return Outcome(ok, figs)


@case(5, "fp16 on an ONNX input: refused with a one-line error naming the file (exit 2)",
      lambda m: m.cmd("act", m.off or "<stem>.onnx", "--dtype float16"), needs=("official",))
def c_onnx_dtype(m):
    try:
        act(m.src(m.off), dtype="float16")
    except DeviceError as e:
        return Outcome(e.exit_code == 2 and str(m.p(m.off)) in e.one_line(), {"exit_code": e.exit_code,
                                                                              "says": "canonical tensors" in e.message})
    return Outcome(False, {"error": "none raised"})


# 6 ONNX cross-validation ---------------------------------------------------------------------------
def compare_onnx(m, ref, onnx_files, rows, expect_ok=True) -> Outcome:
    r = onnx_compare(m.src(ref), onnx_files, rows=rows, seed=0, bitwise=True)
    f = r.data["files"][0]
    figs = {"structure": f.get("structure", {}).get("status"), "bitwise": f.get("bitwise", False)}
    spec = m.src(ref).spec  # the deterministic outputs, the carried state, the normal samples with their noise
    looked = set(spec.io_signature().deterministic_output_names()) | {
        n + " (injected noise)" for n in normal_noise_names(spec)}
    for run in f.get("runs", []):
        for k, o in run["outputs"].items():
            if k in looked:
                figs[f"{run['rows']}:{k.split(' ')[0] + ('+noise' if 'noise' in k else '')}"] = \
                    (f"{o['bitwise_equal']}/{o['count']}" if "bitwise_equal" in o else "missing")
                if "max_abs" in o and not o.get("bitwise"):
                    figs[f"{run['rows']}:max_abs"] = float(o["max_abs"])
    structure_ok = f.get("structure", {}).get("status") in ("pass", "warn")
    if expect_ok:
        return Outcome(r.ok and structure_ok, figs)
    return Outcome(not r.ok, figs, note="negative control: a tampered ONNX must fail")


for _rows in (32, 64, 128):
    case(6, f"official ONNX at batch {_rows}: deterministic, constants and injected-noise sample bitwise",
         lambda m, rows=_rows: m.cmd("onnx-compare", m.ck, m.off or "<stem>.onnx", f"--rows {rows} --bitwise"),
         needs=("official",))(lambda m, rows=_rows: compare_onnx(m, m.ck, [m.off], [rows]))

case(6, f"run-root <Behavior>.onnx vs <Behavior>/{C.CHECKPOINT_FILE}",
     lambda m: m.cmd("onnx-compare", m.root_ck, m.root_onnx, "--rows 64 --bitwise"), needs=("run_root",))(
    lambda m: compare_onnx(m, m.root_ck, [m.root_onnx], [64]))
case(6, "older checkpoint vs its official ONNX", lambda m: m.cmd("onnx-compare", m.old or m.ck, "--rows 64 --bitwise"),
     needs=("older",))(lambda m: compare_onnx(m, m.old, [m.old.with_suffix(".onnx")], [64]))


@case(6, f"negative control: official ONNX with mu.bias[0] + {TAMPER:g} must FAIL the comparison",
      lambda m: m.cmd("onnx-compare", m.ck, m.out / "tampered.onnx", "--rows 64 --bitwise") + "  (expect exit 1)",
      needs=("official", "normal_sample"))
def c_tamper(m):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(m.off))
    for t in model.graph.initializer:
        if t.name == C.MU.format(p="bias"):  # the official initializer keeps the checkpoint key
            a = numpy_helper.to_array(t).copy()
            a[0] += TAMPER
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    p = m.file("tampered.onnx")
    p.write_bytes(model.SerializeToString())
    return compare_onnx(m, m.ck, [p], [64], expect_ok=False)


def c_variant_cmp(m, name):
    vck = m.variant(name)
    return compare_onnx(m, vck, [m.official_of(vck)], [64])


for _name in VARIANTS:
    case(6, f"variant {_name}: official ONNX bitwise at batch 64",
         lambda m, name=_name: m.cmd("onnx-compare", m.variant_label(name), "--rows 64 --bitwise"))(
        partial(c_variant_cmp, name=_name))


# 7 fingerprints ------------------------------------------------------------------------------------
def fpr(m, path, steps=(64, 128), seed=0, runtime="auto", device="cpu"):
    return fingerprint(m.src(path), device, "float32", runtime, steps, seed)


def c_fp(m, steps):
    r = fpr(m, m.ck, (steps,))
    v = r.data["fingerprints"][str(steps)]
    return Outcome(r.ok, {"sha256": v["sha256"], "stable": v["stable"]})


for _steps in (64, 128):
    case(7, f"torch cpu fp32, {_steps} steps: stable over two runs",
         lambda m, steps=_steps: m.cmd("fingerprint", m.ck, f"--steps {steps}"))(partial(c_fp, steps=_steps))


def _shas(r) -> Dict[str, str]:
    return {k: v["sha256"] for k, v in r.data["fingerprints"].items()}


@case(7, "rebuilt ONNX file and official ONNX: equal fingerprints (64, 128)",
      lambda m: m.cmd("fingerprint", m.out / f"{m.ck.stem}.opset9.onnx") + " == "
      + m.cmd("fingerprint", m.off or "<stem>.onnx"), needs=("official",))
def c_fp_onnx(m):
    p, _ = m.exported(9)
    a, b = fpr(m, p), fpr(m, m.off)
    fa, fb = _shas(a), _shas(b)
    return Outcome(fa == fb and a.ok and b.ok, {k: v[:16] for k, v in fb.items()} | {"equal": fa == fb})


@case(7, "safetensors policy: same fingerprints as the checkpoint",
      lambda m: m.cmd("fingerprint", m.out / f"{m.ck.stem}.safetensors"))
def c_fp_st(m):
    fa, fb = _shas(fpr(m, m.safetensors())), _shas(fpr(m, m.ck))
    return Outcome(fa == fb, {"equal": fa == fb})


@case(7, "another seed gives another fingerprint", lambda m: m.cmd("fingerprint", m.ck, "--steps 64 --seed 1"))
def c_fp_seed(m):
    a, b = fpr(m, m.ck, (64,), 0), fpr(m, m.ck, (64,), 1)
    return Outcome(a.data["fingerprints"]["64"]["sha256"] != b.data["fingerprints"]["64"]["sha256"],
                   {"seed1": b.data["fingerprints"]["64"]["sha256"][:16]})


@case(7, "every variant: torch stable, rebuilt ONNX = official ONNX on the same probes (carried state fed back)",
      lambda m: m.variants_cmd("fingerprint", "--steps 64 --runtime onnxruntime"), needs=("variants",))
def c_fp_variants(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        s = m.src(vck)
        t1 = fp(make_runner(s).infer, s.policy, 64, 0)
        t2 = fp(make_runner(s).infer, s.policy, 64, 0)
        o1 = fp(make_runner(s, runtime="onnxruntime").infer, s.policy, 64, 0)
        o2 = fp(make_runner(m.src(m.official_of(vck))).infer, s.policy, 64, 0)
        figs[name] = t1[:12]
        ok = ok and t1 == t2 and o1 == o2
    return Outcome(ok, figs)


def c_fp_dev(m, dev):
    a, b = fpr(m, m.ck, device=dev), fpr(m, m.ck)
    same = {k: a.data["fingerprints"][k]["sha256"] == b.data["fingerprints"][k]["sha256"] for k in ("64", "128")}
    return Outcome(a.ok, {"stable": a.ok, "equal_to_cpu": same},
                   note="device arithmetic may differ from the CPU: equality reported, stability required")


for _dev in ("cuda", "npu"):
    case(7, f"{_dev}: fingerprints stable (equality with cpu reported)",
         lambda m, dev=_dev: m.cmd("fingerprint", m.ck, f"--device {dev}"), needs=(_dev,))(partial(c_fp_dev, dev=_dev))
