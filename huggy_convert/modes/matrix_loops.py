"""The matrix's cases, groups 8-10: closed-loop stats, latency percentiles, export and multi-device
consistency (registered into ``matrix_table.TABLE`` in order; see there)."""
from __future__ import annotations

from functools import partial

import numpy as np

from .. import contract as C
from ..contract.targets import TARGETS
from ..core.artifacts import TARGET_OF
from ..exporters.devices import resolve_device
from ..exporters.targets import missing
from ..exporters.torch_module import build_module, export_program, save_program
from ..pipeline import ConvertOptions, convert_one
from ..runtime import ModuleRunner, ProgramRunner
from ..verify import VerifyOptions
from ..verify.checks import check_onnx_structure
from .benchmark import Timing, benchmark
from .export import export
from .matrix_table import LATENCY_BUDGET_MS, Outcome, Skip, case
from .ports import main_output
from .sources import make_feed
from .stats import rollout

# 8 closed-loop stats -------------------------------------------------------------------------------
def roll(m, path, stochastic=False, runtime="auto", device="cpu", steps=256, rows=8):
    return rollout(m.src(path), device, "float32", runtime, steps, rows, 0, stochastic)


def stat_figs(r):
    d = r.data
    f = {"bounded": d["bounded"], "max_abs_u": round(d["max_abs_u"], 6), "traj": d["trajectory_sha256"][:16]}
    if "summary" in d:
        f.update({"frac_at_clip": round(d["summary"]["frac_at_clip"], 6),
                  "mean_std": round(d["summary"]["mean_std"], 6)})
    return f


def c_roll(m, stochastic):
    r = roll(m, m.ck, stochastic)
    return Outcome(r.ok, stat_figs(r))


case(8, "deterministic, 256 steps x 8: bounded", lambda m: m.cmd("stats", m.ck))(partial(c_roll, stochastic=False))
case(8, "stochastic (seeded CPU noise): bounded", lambda m: m.cmd("stats", m.ck, "--stochastic"))(
    partial(c_roll, stochastic=True))


@case(8, "the stochastic rollout repeats exactly", lambda m: m.cmd("stats", m.ck, "--stochastic"))
def c_repeat(m):
    a, b = roll(m, m.ck, True), roll(m, m.ck, True)
    same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
    return Outcome(same, {"identical": same})


@case(8, "rebuilt vs official ONNX in the closed loop: identical trajectories",
      lambda m: m.cmd("stats", m.off or "<stem>.onnx") + " == " + m.cmd("stats", m.ck, "--runtime onnxruntime"),
      needs=("official",))
def c_roll_onnx(m):
    a, b = roll(m, m.ck, runtime="onnxruntime"), roll(m, m.off)
    same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
    return Outcome(same and a.ok, {"identical": same, "traj": b.data["trajectory_sha256"][:16]})


def _stat_diff(a, b) -> float:
    da = np.array([[x["mean"], x["std"]] for cols in a.data["real"].values() for x in cols])
    db = np.array([[x["mean"], x["std"]] for cols in b.data["real"].values() for x in cols])
    return float(np.max(np.abs(da - db)))


@case(8, "torch vs onnxruntime in the closed loop: per-dim mean/std agree (<= 1e-3)",
      lambda m: m.cmd("stats", m.ck) + " ~ " + m.cmd("stats", m.off or "<stem>.onnx"), needs=("official", "normal_sample"))
def c_roll_torch_ort(m):
    a, b = roll(m, m.ck), roll(m, m.off)
    diff = _stat_diff(a, b)
    return Outcome(diff <= 1e-3 and a.ok and b.ok, {"max_stat_diff": diff})


def c_var_roll(m, stochastic):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        r = roll(m, vck, stochastic, steps=128)
        figs[name] = f"max|u|={r.data['max_abs_u']:.4f}"
        ok = ok and r.ok
    return Outcome(ok, figs)


for _stochastic in (False, True):
    case(8, f"every variant {'stochastic' if _stochastic else 'deterministic'}, 128 steps: bounded",
         lambda m, st=_stochastic: m.variants_cmd("stats", "--steps 128" + (" --stochastic" if st else "")),
         needs=("variants",))(partial(c_var_roll, stochastic=_stochastic))


def c_roll_dev(m, dev):
    a, b = roll(m, m.ck, device=dev), roll(m, m.ck)
    diff = _stat_diff(a, b)
    return Outcome(a.ok and diff <= 1e-3, stat_figs(a) | {"max_stat_diff_vs_cpu": diff})


for _dev in ("cuda", "npu"):
    case(8, f"{_dev}: bounded, stats agree with cpu (<= 1e-3)", lambda m, dev=_dev: m.cmd("stats", m.ck, f"--device {dev}"),
         needs=(_dev, "normal_sample"))(partial(c_roll_dev, dev=_dev))


# 9 latency -----------------------------------------------------------------------------------------
def c_lat(m, runtime, device="cpu", batch=1, onnx_input=False):
    path = m.off if onnx_input else m.ck
    r = benchmark(path, [device], [runtime], [batch], Timing("float32", warmup=20, iters=200), src=m.src(path))
    row = r.timings["rows"][0]
    if "skipped" in row:
        raise Skip(row["skipped"])
    p = row["batches"][str(batch)]
    ok = row["outputs_finite"] and p["p99_ms"] <= LATENCY_BUDGET_MS * max(1, batch // 64)
    t = {k: round(p[k], 4) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")}
    t["load_ms"] = round(row["load_s"] * 1e3, 2)
    t["rss_delta_mb"] = round(row["rss_delta_mb"], 1)
    if "cuda_max_memory_allocated_mb" in row:
        t["cuda_peak_mb"] = round(row["cuda_max_memory_allocated_mb"], 1)
    return Outcome(ok, {"runtime": runtime, "batch": batch, "iters": p["iters"], "finite": row["outputs_finite"],
                        "budget_p99_ms": LATENCY_BUDGET_MS * max(1, batch // 64)}, t)


for _b in (1, 64):
    case(9, f"torch eager cpu, batch {_b}",
         lambda m, b=_b: m.cmd("benchmark", m.ck, f"--device cpu --runtime torch --batch {b}"), quick=False)(
        partial(c_lat, runtime="torch", batch=_b))
    case(9, f"onnxruntime cpu (rebuilt), batch {_b}",
         lambda m, b=_b: m.cmd("benchmark", m.ck, f"--device cpu --runtime onnxruntime --batch {b}"), quick=False)(
        partial(c_lat, runtime="onnxruntime", batch=_b))
case(9, "onnxruntime cpu, official ONNX input, batch 1",
     lambda m: m.cmd("benchmark", m.off or "<stem>.onnx", "--device cpu --batch 1"), needs=("official",),
     quick=False)(partial(c_lat, runtime="onnxruntime", onnx_input=True))


@case(9, "load time (file -> ready) and RSS delta, torch and onnxruntime", lambda m: m.cmd("benchmark", m.ck, "--device cpu"),
      quick=False)
def c_load(m):
    r = benchmark(m.ck, ["cpu"], ["torch", "onnxruntime"], [1], Timing("float32", warmup=2, iters=10))
    t = {f"{x['runtime']}_load_ms": round(x["load_s"] * 1e3, 2) for x in r.timings["rows"]}
    t.update({f"{x['runtime']}_rss_delta_mb": round(x["rss_delta_mb"], 1) for x in r.timings["rows"]})
    ok = all(x["load_s"] < 10.0 and x["rss_delta_mb"] < 1024 for x in r.timings["rows"])
    return Outcome(ok and r.ok, {"load_budget_s": 10, "rss_budget_mb": 1024}, t)


case(9, "cuda torch eager, batch 64 (max_memory_allocated)",
     lambda m: m.cmd("benchmark", m.ck, "--device cuda --runtime torch --batch 64"), needs=("cuda",), quick=False)(
    partial(c_lat, runtime="torch", device="cuda", batch=64))
case(9, "cuda onnxruntime CUDA EP, batch 64",
     lambda m: m.cmd("benchmark", m.ck, "--device cuda --runtime onnxruntime --batch 64"), needs=("cuda_ep",),
     quick=False)(partial(c_lat, runtime="onnxruntime", device="cuda", batch=64))
case(9, "npu torch eager, batch 64", lambda m: m.cmd("benchmark", m.ck, "--device npu --runtime torch --batch 64"),
     needs=("npu",), quick=False)(partial(c_lat, runtime="torch", device="npu", batch=64))


# 10 export and multi-device ------------------------------------------------------------------------
def c_export(m, opset):
    _, r = m.exported(opset)
    d = r.data
    return Outcome(r.ok and d["checker_full_check"] == "pass" and d["matches_reference"],
                   {"checker": d["checker_full_check"], "bitwise": d["bitwise"], "sha256": d["sha256"][:16],
                    "bytes": d["bytes"]})


for _opset in C.ONNX_OPSETS:
    case(10, f"export opset {_opset}: onnx.checker full_check, matches the reference",
         lambda m, opset=_opset: m.cmd("export", m.ck, f"--opset {opset} -o {m.p(m.out)}/{m.ck.stem}.opset{opset}.onnx"))(
        partial(c_export, opset=_opset))


@case(10, "opset-9 export vs official: same I/O, op sequence, attributes, initializers bitwise",
      lambda m: m.cmd("export", m.ck, f"--opset 9 -o {m.p(m.out)}/{m.ck.stem}.opset9.onnx"), needs=("official",))
def c_struct(m):
    import onnx

    p, _ = m.exported(9)
    c = check_onnx_structure(onnx.load(str(p)), onnx.load(str(m.off)), "rebuilt", m.p(m.off))
    return Outcome(c.status == "pass", {k.title: k.status for k in c.children})


@case(10, "export from the safetensors policy = export from the checkpoint (bytes)",
      lambda m: m.cmd("export", m.out / f"{m.ck.stem}.safetensors", "--opset 13"))
def c_st_export(m):
    p = m.file(f"{m.ck.stem}.from-safetensors.opset13.onnx")
    export(m.src(m.safetensors()), 13, p)
    q, _ = m.exported(13)
    same = p.read_bytes() == q.read_bytes()
    return Outcome(same, {"identical_bytes": same})


@case(10, "an ONNX alone re-exported at opset 13: rebuilt from the tensors recovered from it, bitwise against it",
      lambda m: m.cmd("export", m.off or "<stem>.onnx", "--opset 13"), needs=("official",))
def c_onnx_reexport(m):
    r = export(m.src(m.off), 13, m.file(f"{m.off.stem}.from-onnx.opset13.onnx"))
    return Outcome(r.ok and r.data["bitwise"], {"bitwise": r.data["bitwise"], "checker": r.data["checker_full_check"],
                                                "outputs": len(r.data["outputs"])})


@case(10, "export opset 11 with the noise input: sample bitwise vs the reference with the same noise",
      lambda m: m.cmd("export", m.ck, "--opset 11 --noise-input"), needs=("normal_sample",))
def c_noise(m):
    _, r = m.exported(11, noise=True)
    o = r.data["outputs"].get(C.OUT_CONT, {})
    return Outcome(r.ok and o.get("bitwise", False), {C.OUT_CONT: f"{o.get('bitwise_equal')}/{o.get('count')}",
                                                      "checker": r.data["checker_full_check"]})


@case(10, "every variant exports at opset 13 (checker + reference)", lambda m: m.variants_cmd("export", "--opset 13"),
      needs=("variants",))
def c_var_export(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        _, r = m.exported(13, vck)
        figs[name] = "bitwise" if r.data["bitwise"] else \
            f"max_abs={max(o.get('max_abs', 0) for o in r.data['outputs'].values()):.3g}"
        ok = ok and r.ok
    return Outcome(ok, figs)


@case(10, "torch.export .pt2: loads with torch.export.load, equals the module (derived float32 bound)",
      lambda m: f"huggy-convert {m.p(m.ck)} {m.p(m.out)}/ --no-verify", quick=False)
def c_pt2(m):
    s = m.main
    mod = build_module(s.policy)
    p = m.file(f"{m.ck.stem}.pt2")
    save_program(export_program(mod), p)
    prog = ProgramRunner(p, s.spec.input_names(), s.spec.deterministic_output_names())
    feed = make_feed(s, "probes", 64, 0)
    out = main_output(s.spec)
    o = m.agree(m.ck, feed, ModuleRunner(mod).infer(feed), prog.infer(feed), [out])
    return Outcome(o.ok and all(v == "float32" for v in prog.buffers.values()),
                   o.figures | {"normalizer": sorted(set(prog.buffers.values()))})


@case(10, "--device auto resolves and agrees with cpu", lambda m: m.cmd("act", m.ck, "--obs probes --rows 64 --device auto"))
def c_auto(m):
    feed = make_feed(m.main, "probes", 64, 0)
    a = m.det(m.ck, feed, device="auto")
    b = m.det(m.ck, feed)
    o = m.agree(m.ck, feed, b, a, [main_output(m.spec)])
    return Outcome(o.ok, {"auto": resolve_device("auto").split(":")[0]} | o.figures)


def c_dev_act(m, dev):
    figs, ok = {}, True
    for path in [m.ck] + [v for _, v in m.present_variants()]:
        feed = make_feed(m.src(path), "probes", 64, 0)
        o = m.agree(path, feed, m.det(path, feed), m.det(path, feed, device=dev))
        ok = ok and o.ok
        figs[path.parent.parent.name] = o.figures
    return Outcome(ok, figs)


for _dev in ("cuda", "npu"):
    case(10, f"{_dev} vs cpu, fp32, the input and every variant (derived float32 bound)",
         lambda m, dev=_dev: m.cmd("act", m.ck, f"--obs probes --rows 64 --device {dev}"), needs=(_dev,))(
        partial(c_dev_act, dev=_dev))


@case(10, "onnxruntime CUDA EP vs CPU EP on the official ONNX (derived float32 bound)",
      lambda m: m.cmd("act", m.off or "<stem>.onnx", "--obs probes --rows 64 --device cuda"),
      needs=("cuda_ep", "official"))
def c_ep(m):
    feed = make_feed(m.src(m.off), "probes", 64, 0)
    a, b = m.det(m.off, feed), m.det(m.off, feed, device="cuda")
    return m.agree(m.ck, feed, a, b, [main_output(m.spec)])


def c_target(m, target):
    """Convert the input with a deploy target (issue 27) and verify it: its runtime within the derived float32
    bound (check 4, twice bitwise), its files as written (check 6)."""
    line = missing(target)
    if line:
        raise Skip(line)
    res = convert_one(m.ck, m.out / target, ConvertOptions(program=False, targets=(target,),
                                                           verify_options=VerifyOptions(dtypes=("float32",))))
    rep = res.report
    mine = [ch for ch in rep.check("runtimes").children if ch.title.startswith(f"{target}:")]
    files = [a["file"] for k, a in res.artifacts.items() if k in TARGET_OF]
    return Outcome(rep.ok and len(mine) == 1 and mine[0].status == "pass",
                   {"verdict": rep.verdict, "files": files,
                    "error_bound": mine[0].figures.get("max_bound_ratio") if mine else None})


for _target in TARGETS:
    case(10, f"deploy target {_target}: convert --targets {_target}, verify passes (derived float32 bound, "
         "two runs bitwise, files as written)",
         lambda m, t=_target: f"huggy-convert {m.p(m.ck)} {m.p(m.out)}/{t}/ --targets onnx,{t}", quick=False)(
        partial(c_target, target=_target))
