"""Issue 6: the run modes on the real fixtures (Huggy and the ML-Agents variants)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import FIXTURES, HUGGY_RUN, VARIANTS, run_cli, step_checkpoints
from onnx import numpy_helper

from huggy_convert import contract as C
from huggy_convert.cli import main
from huggy_convert.converter import save_policy
from huggy_convert.exporters.onnx_export import build_onnx, with_noise_input
from huggy_convert.runtime import ort_run, ort_session

HUGGY = step_checkpoints(HUGGY_RUN)[-1]
OFFICIAL = HUGGY.with_suffix(".onnx")
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
HUGGY_FACTS = next(r for r in MANIFEST["runs"] if r["name"] == "huggy")["facts"]
HAS_CUDA = torch.cuda.is_available()


def variant(name: str) -> Path:
    files = step_checkpoints(VARIANTS / name) if (VARIANTS / name).is_dir() else []
    if not files:
        pytest.skip(f"fixture variant {name} not present")
    return files[-1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread, as the matrix runs it (shared cores make spinning threads crawl)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cli(*args, code=0):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == code, (res.exit_code, res.stdout[-2000:], res.stderr[-2000:], res.exception)
    return res


def cli_json(*args, code=0):
    res = cli(*args, "--json", code=code)
    return json.loads(res.stdout)


def one_line_error(res, name: str) -> str:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("huggy-convert: error: ") and name in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def huggy_policy():
    """As a conversion and the modes read it: the official ONNX beside it decides the divisor."""
    from huggy_convert.converter import load_checkpoint
    from huggy_convert.pipeline import prepare_conversion

    return prepare_conversion(load_checkpoint(HUGGY), OFFICIAL).conversion.policy


def agree(policy, feed, name, a, b, noise=None) -> bool:
    """Two float32 runtimes agree as float32 can on every host: both within the derived bound of the
    float64 reference (modes.common.fp32_agree), not a constant tuned on this CPU."""
    from huggy_convert.modes.common import fp32_agree, fp32_reference

    j = fp32_agree(fp32_reference(policy, feed, noise), name, np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert j, j  # a Comparison: true when it passes
    return True


def policy_of(ck: Path):
    """A checkpoint's canonical policy as a conversion makes it (the official ONNX beside it decides)."""
    from huggy_convert.converter import load_checkpoint
    from huggy_convert.pipeline import prepare_conversion

    return prepare_conversion(load_checkpoint(ck), ck.with_suffix(".onnx")).conversion.policy


def ort_official(feed):
    return ort_run(ort_session(onnx.load(str(OFFICIAL)).SerializeToString()), feed)


# --- info ---------------------------------------------------------------------------------
def test_info_huggy_parameters_and_normalizer(huggy_policy):
    d = cli_json("info", HUGGY)
    assert d["parameters"]["linear"] == 566_805 == huggy_policy.spec.parameter_count(include_log_sigma=False)
    assert d["parameters"]["with_log_sigma"] == 566_826 == huggy_policy.spec.parameter_count(include_log_sigma=True)
    assert d["parameters"]["tensors_linear"] == 566_805  # counted from the tensors, not the formula
    assert d["spec"]["obs_sizes"] == [59] and d["spec"]["continuous_size"] == 21
    n = d["normalizer"][0]
    assert n["steps"] == HUGGY_FACTS["normalization_steps"]
    assert n["variance_range"][1] == pytest.approx(HUGGY_FACTS["max_running_variance"])
    assert HUGGY_FACTS["constant_dim"] in n["constant_dims"]
    assert n["fp16_overflow"] is True
    assert d["checkpoint"]["training_step"] == int(HUGGY.stem.rsplit("-", 1)[1])
    env = d["environment"]
    assert env["torch"] == torch.__version__ and "cpu" in env["devices"] and env["onnxruntime"]


def test_info_run_directory_inventory():
    d = cli_json("info", HUGGY_RUN)
    status = json.loads((HUGGY_RUN / "run_logs" / "training_status.json").read_text())
    want = [c["steps"] for c in status["Huggy"]["checkpoints"]]
    rows = d["inventory"]["behaviors"]["Huggy"]["checkpoints"]
    assert [r["steps"] for r in rows] == want
    assert all(r["pt_present"] and r["onnx_present"] for r in rows)
    assert [r["reward"] for r in rows] == [c["reward"] for c in status["Huggy"]["checkpoints"]]
    assert d["file"].endswith(HUGGY.name)  # the newest step checkpoint
    text = cli("info", HUGGY_RUN).stdout
    assert "566,805" in text and "566,826" in text


def test_info_onnx_reads_spec_from_the_graph():
    d = cli_json("info", OFFICIAL)
    assert d["kind"] == "onnx" and d["onnx"]["opset"] == 9
    assert (d["parameters"]["linear"], d["parameters"]["with_log_sigma"]) == (566_805, 566_826)
    assert d["spec"]["hidden_units"] == 512 and d["spec"]["num_layers"] == 3
    assert d["normalizer"][0]["steps"] is None  # folded into the divisor


# --- act ----------------------------------------------------------------------------------
def test_act_zeros_matches_official_and_rebuilt(huggy_policy):
    feed = {"obs_0": np.zeros((1, 59), np.float32)}
    torch_out = np.array(cli_json("act", HUGGY, "--obs", "zeros")["outputs"][C.OUT_CONT_DET], np.float32)
    off = ort_official(feed)[C.OUT_CONT_DET]
    assert agree(huggy_policy, feed, C.OUT_CONT_DET, torch_out, off)
    ort_out = np.array(cli_json("act", HUGGY, "--obs", "zeros", "--runtime", "onnxruntime")["outputs"][C.OUT_CONT_DET],
                       np.float32)
    rebuilt = ort_run(ort_session(build_onnx(huggy_policy)), feed)[C.OUT_CONT_DET]
    assert ort_out.tobytes() == rebuilt.tobytes() == off.tobytes()  # bitwise, ORT against ORT
    onnx_in = np.array(cli_json("act", OFFICIAL, "--obs", "zeros")["outputs"][C.OUT_CONT_DET], np.float32)
    assert onnx_in.tobytes() == off.tobytes()


def test_act_random_is_seeded_at_normalizer_scale(huggy_policy):
    a = cli_json("act", HUGGY, "--obs", "random", "--seed", "3", "--rows", "4")
    b = cli_json("act", HUGGY, "--obs", "random", "--seed", "3", "--rows", "4")
    c = cli_json("act", HUGGY, "--obs", "random", "--seed", "4", "--rows", "4")
    assert a["outputs"] == b["outputs"] and a["outputs"] != c["outputs"]
    assert np.array(a["outputs"][C.OUT_CONT_DET]).shape == (4, 21)
    # an ONNX input draws the same observations (its folded mean/divisor are the checkpoint's)
    o = cli_json("act", OFFICIAL, "--obs", "random", "--seed", "3", "--rows", "4")
    from huggy_convert.modes.sources import load_source, make_feed

    feed = make_feed(load_source(HUGGY), "random", 4, 3)
    assert make_feed(load_source(OFFICIAL), "random", 4, 3)["obs_0"].tobytes() == feed["obs_0"].tobytes()
    assert agree(huggy_policy, feed, C.OUT_CONT_DET, o["outputs"][C.OUT_CONT_DET], a["outputs"][C.OUT_CONT_DET])


def test_act_observation_files(tmp_path, huggy_policy):
    x = np.random.default_rng(0).standard_normal((3, 59)).astype(np.float32) * 5
    np.save(tmp_path / "o.npy", x)
    (tmp_path / "o.json").write_text(json.dumps(x.tolist()))
    (tmp_path / "named.json").write_text(json.dumps({"obs_0": x.tolist()}))
    np.savez(tmp_path / "o.npz", obs_0=x)
    outs = [cli_json("act", HUGGY, "--obs", tmp_path / f)["outputs"][C.OUT_CONT_DET]
            for f in ("o.npy", "o.json", "named.json", "o.npz")]
    assert all(o == outs[0] for o in outs)
    want = ort_official({"obs_0": x})[C.OUT_CONT_DET]
    assert agree(huggy_policy, {"obs_0": x}, C.OUT_CONT_DET, outs[0], want)


def test_act_two_observations_by_name(tmp_path):
    ck = variant("twoobs")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    np.savez(tmp_path / "two.npz", obs_0=a, obs_1=b)
    np.save(tmp_path / "flat.npy", np.concatenate([a, b], axis=1))
    x = cli_json("act", ck, "--obs", tmp_path / "two.npz")["outputs"]
    y = cli_json("act", ck, "--obs", tmp_path / "flat.npy")["outputs"]
    assert x == y
    off = ort_run(ort_session(onnx.load(str(ck.with_suffix(".onnx"))).SerializeToString()), {"obs_0": a, "obs_1": b})
    assert agree(policy_of(ck), {"obs_0": a, "obs_1": b}, C.OUT_CONT_DET, x[C.OUT_CONT_DET], off[C.OUT_CONT_DET])


def test_act_discrete_and_lstm_variants():
    d = cli_json("act", variant("discrete"), "--obs", "probes", "--rows", "16")
    assert np.array(d["outputs"][C.OUT_DISC_DET]).shape == (16, 2)
    l = cli_json("act", variant("lstm"), "--obs", "zeros", "--rows", "2")
    assert np.array(l["outputs"][C.RECURRENT_OUT]).shape == (2, 1, 16)


def test_act_bad_observation_file(tmp_path):
    np.save(tmp_path / "wide.npy", np.zeros((2, 60), np.float32))
    res = cli("act", HUGGY, "--obs", tmp_path / "wide.npy", code=2)
    assert "[rows, 59]" in one_line_error(res, "wide.npy")
    (tmp_path / "bad.json").write_text("{not json")
    one_line_error(cli("act", HUGGY, "--obs", tmp_path / "bad.json", code=2), "bad.json")
    one_line_error(cli("act", HUGGY, "--obs", tmp_path / "none.npy", code=2), "none.npy")


# --- sample -------------------------------------------------------------------------------
def test_sample_seeded_and_the_same_for_an_onnx(huggy_policy):
    a = cli_json("sample", HUGGY, "--seed", "7", "--rows", "8")["outputs"][C.OUT_CONT]
    b = cli_json("sample", HUGGY, "--seed", "7", "--rows", "8")["outputs"][C.OUT_CONT]
    c = cli_json("sample", HUGGY, "--seed", "8", "--rows", "8")["outputs"][C.OUT_CONT]
    assert a == b
    assert np.mean(np.array(a) != np.array(c)) > 0.5
    o = cli_json("sample", OFFICIAL, "--seed", "7", "--rows", "8")["outputs"][C.OUT_CONT]
    from huggy_convert.modes.sources import load_source, make_feed
    from huggy_convert.runtime import draw_noise

    feed, (eps, _) = make_feed(load_source(HUGGY), "random", 8, 0), draw_noise(huggy_policy.spec, 8, 7)
    assert agree(huggy_policy, feed, C.OUT_CONT, o, a, noise=eps)
    r = cli_json("sample", HUGGY, "--seed", "7", "--rows", "8", "--runtime", "onnxruntime")["outputs"][C.OUT_CONT]
    assert np.array(r, np.float32).tobytes() == np.array(o, np.float32).tobytes()  # ORT vs ORT: bitwise


def test_sample_noise_is_drawn_on_the_cpu(huggy_policy):
    d = cli_json("sample", HUGGY, "--seed", "11", "--rows", "4", "--obs", "zeros")
    eps = torch.randn(4, 21, generator=torch.Generator().manual_seed(11)).numpy()
    noised = ort_run(ort_session(with_noise_input(onnx.load(str(OFFICIAL))).SerializeToString()),
                     {"obs_0": np.zeros((4, 59), np.float32), C.NOISE_INPUT: eps})[C.OUT_CONT]
    assert agree(huggy_policy, {"obs_0": np.zeros((4, 59), np.float32)}, C.OUT_CONT, d["outputs"][C.OUT_CONT], noised,
                 noise=eps)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device here")
def test_sample_same_on_cuda(huggy_policy):  # pragma: no cover - needs a GPU
    from huggy_convert.modes.sources import load_source, make_feed
    from huggy_convert.runtime import draw_noise

    a = cli_json("sample", HUGGY, "--seed", "7", "--rows", "8")["outputs"][C.OUT_CONT]
    b = cli_json("sample", HUGGY, "--seed", "7", "--rows", "8", "--device", "cuda")["outputs"][C.OUT_CONT]
    feed, (eps, _) = make_feed(load_source(HUGGY), "random", 8, 0), draw_noise(huggy_policy.spec, 8, 7)
    assert agree(huggy_policy, feed, C.OUT_CONT, a, b, noise=eps)


def test_sample_discrete_only_onnx_is_refused():
    ck = variant("discrete")
    res = cli("sample", ck.with_suffix(".onnx"), code=2)
    assert "Multinomial" in one_line_error(res, ck.with_suffix(".onnx").name)
    d = cli_json("sample", ck, "--rows", "32")["outputs"][C.OUT_DISC]
    assert np.all((np.array(d) >= 0) & (np.array(d) < np.array([3, 2])))


# --- batch / precision ----------------------------------------------------------------------
def test_batch_sizes_rows_are_stable_across_sizes():
    d = cli_json("batch-sizes", HUGGY, "--repeats", "1")
    assert d["sizes"] == [16, 32, 64, 128, 256, 512] and d["ok"]
    for row in d["results"]:
        s = row["outputs"][C.OUT_CONT_DET]
        assert row["ok"] and 0 <= s["bound_ratio"] < 1 and s["count"] == row["batch"] * 21
    assert set(d["timings"]["per_batch"]) == {"16", "32", "64", "128", "256", "512"}
    d = cli_json("batch-sizes", OFFICIAL, "--sizes", "16,512", "--repeats", "1")
    assert all(r["outputs"][C.OUT_CONT_DET]["bitwise"] for r in d["results"])


def test_precision_fp16_and_bf16_on_cpu():
    d = cli_json("precision", HUGGY, "--device", "cpu")
    rows = {r["dtype"]: r for r in d["results"]}
    assert all(r["status"] == "PASS" for dt, r in rows.items() if dt != "bfloat16")
    # the figures are those of the policy run at each dtype, as `act --dtype` runs it on the same probes
    ref = np.array(cli_json("act", HUGGY, "--obs", "probes", "--rows", "64")["outputs"][C.OUT_CONT_DET], np.float32)
    half = np.array(cli_json("act", HUGGY, "--obs", "probes", "--rows", "64", "--dtype", "float16")["outputs"][
        C.OUT_CONT_DET], np.float32)
    assert rows["float16"]["outputs"][C.OUT_CONT_DET]["max_abs"] == float(np.max(np.abs(ref.astype(np.float64) - half)))
    assert rows["float16"]["outputs"][C.OUT_CONT_DET]["max_abs"] > 0  # fp16 really ran
    assert rows["float16"]["outputs"][C.OUT_CONT_DET]["cosine"] >= 0.999
    assert rows["float16"]["outputs"][C.OUT_CONT_DET]["max_abs"] <= 1e-2
    assert rows["bfloat16"]["outputs"][C.OUT_CONT_DET]["cosine"] >= 0.995
    d = cli_json("precision", OFFICIAL, "--device", "cpu")
    rows = {r["dtype"]: r for r in d["results"]}
    assert rows["float32"]["status"] == "PASS"
    assert rows["float16"]["status"] == "SKIP" and "canonical tensors" in rows["float16"]["reason"]


# --- onnx-compare ---------------------------------------------------------------------------
def test_onnx_compare_official_bitwise_and_tampered_fails(tmp_path):
    d = cli_json("onnx-compare", HUGGY, "--rows", "32", "--rows", "128", "--bitwise")
    f = d["files"][0]
    assert f["ok"] and f["bitwise"] and f["structure"]["status"] == "pass"
    assert {r["rows"] for r in f["runs"]} == {32, 128}
    assert f["runs"][0]["outputs"][C.OUT_CONT + " (injected noise)"]["bitwise"]
    cli("onnx-compare", OFFICIAL)  # an ONNX alone finds the checkpoint beside it
    m = onnx.load(str(OFFICIAL))
    for t in m.graph.initializer:
        if t.name.endswith("mu.bias"):
            a = numpy_helper.to_array(t).copy()
            a[3] += 1e-3
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    bad = tmp_path / "tampered.onnx"
    bad.write_bytes(m.SerializeToString())
    res = cli("onnx-compare", HUGGY, bad, code=1)
    assert "FAIL" in res.stdout and "a check failed" in res.stderr
    d = cli_json("onnx-compare", HUGGY, bad, code=1)
    assert d["files"][0]["structure"]["status"] == "fail"
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    one_line_error(cli("onnx-compare", HUGGY, tmp_path / "junk.onnx", code=2), "junk.onnx")


def test_onnx_compare_variants_bitwise():
    for name in ("lstm", "hybrid", "sac"):
        d = cli_json("onnx-compare", variant(name), "--bitwise")
        assert d["files"][0]["bitwise"], name


# --- fingerprint ----------------------------------------------------------------------------
def test_fingerprint_matches_verify_and_expect(huggy_policy, tmp_path):
    from huggy_convert.exporters.torch_module import build_module
    from huggy_convert.verify.checks import fingerprint, reference_fingerprint
    from huggy_convert.runtime import module_runner

    d = cli_json("fingerprint", HUGGY)
    want = reference_fingerprint(huggy_policy, 64, 0)
    local = fingerprint(module_runner(build_module(huggy_policy)), huggy_policy, 64, 0)
    f64 = d["fingerprints"]["64"]
    assert f64["sha256"] == want and f64["host_independent"] and f64["runtime_sha256"] == local
    assert d["fingerprints"]["128"]["stable"]
    cli("fingerprint", HUGGY, "--steps", "64", "--expect", want)
    cli("fingerprint", HUGGY, "--steps", "64", "--expect", want[:12])  # the prefix the verify tree prints
    cli("fingerprint", HUGGY, "--steps", "64", "--expect", want[:12] + "…")
    cli("fingerprint", HUGGY, "--steps", "64", "--expect", "0" * 64, code=1)
    assert "first 8+ hex digits" in one_line_error(cli("fingerprint", HUGGY, "--expect", "abc", code=2), "--expect")
    assert cli_json("fingerprint", HUGGY, "--seed", "1")["fingerprints"]["64"]["sha256"] != want
    # the tree of a conversion prints the same prefix
    res = cli(HUGGY, tmp_path, "--no-program", "--verify-dtype", "float32", "-v")  # -v: the tree
    assert f"5 determinism fingerprints: 64: {want[:12]}" in res.stdout


# --- stats ----------------------------------------------------------------------------------
def test_stats_closed_loop_is_bounded_and_repeatable():
    d = cli_json("stats", HUGGY, "--steps", "64")
    assert d["bounded"] and d["finite"] and d["guard_hits"] == 0 and d["max_abs_u"] < 10
    assert list(d["real"]) == [C.OUT_CONT_DET] and d["levels"] == {}
    assert len(d["real"][C.OUT_CONT_DET]) == 21
    for x in d["real"][C.OUT_CONT_DET]:
        assert -1 <= x["min"] <= x["mean"] <= x["max"] <= 1 and 0 <= x["frac_at_clip"] <= 1
    again = cli_json("stats", HUGGY, "--steps", "64")
    assert again["trajectory_sha256"] == d["trajectory_sha256"]
    s = cli_json("stats", variant("hybrid"), "--steps", "32", "--stochastic")
    assert s["bounded"] and list(s["levels"]) == [C.OUT_DISC] and list(s["real"]) == [C.OUT_CONT]
    assert len(s["levels"][C.OUT_DISC]) == 1 and sum(s["levels"][C.OUT_DISC][0]["frequency"]) == pytest.approx(1.0)
    assert "0.9 * u_t" in cli("stats", "--help").stdout


# --- benchmark / export ---------------------------------------------------------------------
def test_benchmark_reports_percentiles():
    d = cli_json("benchmark", HUGGY, "--device", "cpu", "--batch", "4", "--warmup", "1", "--iters", "5")
    rows = {r["runtime"]: r for r in d["timings"]["rows"]}
    assert set(rows) == {"torch", "onnxruntime"}
    for r in rows.values():
        p = r["batches"]["4"]
        # what was asked is what was timed, and every figure is a real, finite latency
        assert p["iters"] == 5 and r["load_s"] > 0 and r["outputs_finite"]
        assert all(np.isfinite(p[k]) and p[k] > 0 for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "min_ms", "max_ms"))
    d = cli_json("benchmark", OFFICIAL, "--device", "cpu", "--batch", "1", "--warmup", "1", "--iters", "3")
    rows = {r["runtime"]: r for r in d["timings"]["rows"]}  # an ONNX: torch runs the tensors recovered from it
    assert set(rows) == {"torch", "onnxruntime"} and all(r["batches"]["1"]["iters"] == 3 for r in rows.values())


def test_export_opset13_passes_full_check(tmp_path, huggy_policy):
    out = tmp_path / "h13.onnx"
    d = cli_json("export", HUGGY, "--opset", "13", "-o", out)
    assert d["checker_full_check"] == "pass" and d["matches_reference"] and d["bitwise"]
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert {o.domain or "": o.version for o in m.opset_import}[""] == 13
    feed = {"obs_0": np.random.default_rng(2).standard_normal((5, 59)).astype(np.float32) * 100}
    assert ort_run(ort_session(m), feed)[C.OUT_CONT_DET].tobytes() == \
        ort_run(ort_session(build_onnx(huggy_policy, 9)), feed)[C.OUT_CONT_DET].tobytes()
    st = tmp_path / "h.safetensors"
    save_policy(huggy_policy, st)
    cli("export", st, "--opset", "13", "-o", tmp_path / "h13b.onnx")
    assert (tmp_path / "h13b.onnx").read_bytes() == out.read_bytes()


def test_export_from_onnx_rebuilds_from_the_recovered_tensors(tmp_path):
    """An ONNX alone exports at another opset: rebuilt from the tensors recovered from it (importers.from_onnx)
    and verified against it by verify's checks 2 and 3 (bitwise); the same bytes as from the checkpoint."""
    d = cli_json("export", OFFICIAL, "--opset", "13", "-o", tmp_path / "x.onnx")
    assert d["checker_full_check"] == "pass" and d["matches_reference"] and d["bitwise"] and d["outputs"]
    assert "recovered" in d["note"] and OFFICIAL.name in d["reference"]
    cli("export", HUGGY, "--opset", "13", "-o", tmp_path / "from_pt.onnx")
    a, b = (onnx.load(str(tmp_path / n)) for n in ("x.onnx", "from_pt.onnx"))  # the divisor's record aside
    assert a.graph.SerializeToString() == b.graph.SerializeToString()
    one_line_error(cli("export", HUGGY, "--dtype", "float16", "-o", tmp_path / "y.onnx", code=2), HUGGY.name)


# --- bad input, devices, subprocess ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["info", "act", "sample", "batch-sizes", "precision", "fingerprint", "stats", "benchmark",
                                  "export", "onnx-compare"])
def test_bad_input_is_one_line_exit_2(tmp_path, mode):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint")
    one_line_error(cli(mode, junk, code=2), "junk.pt")
    one_line_error(cli(mode, tmp_path / "missing.pt", code=2), "missing.pt")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    one_line_error(cli(mode, other, code=2), "notes.txt")


def test_bad_onnx_and_bad_device(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07garbage")
    one_line_error(cli("act", tmp_path / "broken.onnx", code=2), "broken.onnx")
    # a graph with ML-Agents' I/O that is not its export: onnxruntime runs it; torch needs the tensors (exit 2)
    m = onnx.load(str(OFFICIAL))
    sub = next(n for n in m.graph.node if n.op_type == "Sub")
    m.graph.node.insert(list(m.graph.node).index(sub) + 1, onnx.helper.make_node("Relu", [sub.output[0]], ["r"]))
    next(n for n in m.graph.node if n.op_type == "Div").input[0] = "r"
    odd = tmp_path / "odd.onnx"
    odd.write_bytes(m.SerializeToString())
    cli("act", odd)
    assert "Relu" in one_line_error(cli("act", odd, "--runtime", "torch", code=2), "odd.onnx")
    one_line_error(cli("act", HUGGY, "--device", "tpu", code=2), "tpu")
    if not HAS_CUDA:
        one_line_error(cli("act", HUGGY, "--device", "cuda", code=2), "cuda")
    res = cli("act", HUGGY, "--device", "npu", "--json", code=2)
    assert json.loads(res.stdout)["exit_code"] == 2


def test_real_subprocess_runs(tmp_path):
    p = run_cli("act", HUGGY, "--obs", "zeros", "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["outputs"][C.OUT_CONT_DET][0]) == 21
    shutil.copy(OFFICIAL, tmp_path / "copy.txt")
    p = run_cli("info", tmp_path / "copy.txt")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "copy.txt" in p.stderr


def test_benchmark_runs_both_runtimes_on_the_threads_asked_for():
    import torch

    from huggy_convert.cli import main

    ck = step_checkpoints(VARIANTS / "small")[-1]
    before = torch.get_num_threads()
    r = CliRunner().invoke(main, ["benchmark", str(ck), "--threads", "2", "--iters", "2", "--warmup", "0",
                                  "--batch", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["threads"] == 2 and [x["runtime"] for x in d["ran"] if x["ok"]] == ["torch", "onnxruntime"]
    assert torch.get_num_threads() == before  # torch's setting restored
    r = CliRunner().invoke(main, ["benchmark", str(ck), "--threads", "0"])
    assert r.exit_code == 2 and r.stderr.strip().startswith("huggy-convert: error:") and len(r.stderr.strip().splitlines()) == 1
