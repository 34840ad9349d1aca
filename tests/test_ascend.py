"""Ascend, stated correctly: one opset story (Barracuda 9; Sentis 7-15; ATC 9-13 on CANN 5.0/6.0 and
9-18 on CANN 7.0+) in every help text and the user docs (docs/ascend.md, docs/unity.md; no wrong
range in the README or any docs page); the ``atc`` command for the ONNX written, read off that file;
the precision modes measured by the ``precision`` mode; and onnxruntime's CANN execution provider
(``device_id``, ``precision_mode``) with a fake provider list (no NPU here)."""
from __future__ import annotations

import json
import re
import shlex

import numpy as np
import onnx
import onnxruntime
import pytest

from conftest import ROOT, run_cli, variant_ckpt
from huggy_convert import contract as C
from huggy_convert.errors import DeviceError
from huggy_convert.runtime import OrtRunner, make_probes
from huggy_convert.runtime import ort as ort_mod

# the pages that state the opsets, and every user doc (README.md, docs/*.md) for the wrong ranges
OPSET_DOCS = {name: (ROOT / name).read_text() for name in ("docs/ascend.md", "docs/unity.md")}
USER_DOCS = {p.relative_to(ROOT).as_posix(): p.read_text()
             for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


def test_one_opset_story_in_help_texts_and_docs():
    story = C.opset_story()
    assert "9 = ML-Agents/Barracuda" in story and "Unity Sentis: 7-15" in story
    assert "CANN 5.0/6.0: 9-13" in story and "CANN 7.0: 9-18" in story and "CANN 8.x: 11-15" in story
    for cmd in ("convert", "export"):  # click wraps lines (also after a hyphen): compare without whitespace
        assert "".join(story.split()) in "".join(run_cli(cmd, "--help").stdout.split()), cmd
    for name, text in OPSET_DOCS.items():
        flat = " ".join(text.split())
        assert "9–13 on CANN 5.0/6.0" in flat and "9–18 on CANN 7.0" in flat and "11–15 on CANN 8" in flat, name
    for name, text in USER_DOCS.items():
        flat = " ".join(text.split())
        for wrong in (r"CANN [5-7]\.0[^.\n|]*11\s*(\.\.|-|–)\s*15", r"11\s*(\.\.|-|–)\s*15 on CANN [5-7]", r"CANN 7\.0\+"):
            assert not re.search(wrong, flat), (name, wrong)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """convert --json on the LSTM variant (observation + memory input, the memory among the outputs),
    and export --opset 15 --json of the hybrid one (an action mask input, two heads)."""
    out = tmp_path_factory.mktemp("atc")
    ck = variant_ckpt("lstm")
    r = run_cli(ck, out / "lstm", "--json", "--no-program", "--verify-dtype", "float32")
    assert r.returncode == 0, r.stderr
    h = run_cli("export", variant_ckpt("hybrid"), "--opset", "15", "-o", out / "hybrid.onnx", "--json")
    assert h.returncode == 0, h.stderr
    return json.loads(r.stdout), json.loads(h.stdout), out


def _check_plan(plan, onnx_path):
    model = onnx.load(str(onnx_path))
    sig_in = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    argv = plan["argv"]
    assert shlex.split(plan["command"]) == argv and argv[0] == C.ATC
    opts = dict(a[2:].split("=", 1) for a in argv[1:])
    assert opts["framework"] == "5" and opts["model"] == str(onnx_path) and opts["output"] == str(onnx_path)[:-5]
    assert opts["soc_version"] == C.ATC_SOC_PLACEHOLDER and opts["precision_mode"] == C.PRECISION_KEEP_ORIGIN
    shapes = dict(s.split(":") for s in opts["input_shape"].split(";"))
    assert set(shapes) == set(sig_in)
    for name, dims in sig_in.items():  # the batch axis -1 (dynamic), the others as the file has them
        assert shapes[name].split(",") == ["-1"] + [str(d) for d in dims[1:]], name
    assert [int(b) for b in opts["dynamic_batch_size"].split(",")] == list(C.ATC_BATCH_PROFILES)
    # --out_nodes: node:index of the deterministic outputs; the graph cut there has no random branch
    nodes = {n.name: n for n in model.graph.node}
    outs = [nodes[name].output[int(i)] for name, i in (s.rsplit(":", 1) for s in opts["out_nodes"].split(";"))]
    sampled = {C.OUT_CONT, C.OUT_DISC}
    assert outs and not set(outs) & sampled and set(outs) <= {o.name for o in model.graph.output}
    cut = onnx.utils.Extractor(model).extract_model(list(sig_in), outs)
    assert "RandomNormalLike" not in {n.op_type for n in cut.graph.node} and "Multinomial" not in {n.op_type for n in cut.graph.node}
    assert "RandomNormalLike" in {n.op_type for n in model.graph.node}
    # --keep_dtype: the normalizer's Sub, Div and Clip, which read the observation
    keep = plan["keep_dtype_nodes"]
    assert sorted(nodes[k].op_type for k in keep) == ["Clip", "Div", "Sub"]
    assert nodes[keep[0]].input[0] in sig_in and plan["keep_dtype_file_content"] == "".join(k + "\n" for k in keep)
    faster = dict(a[2:].split("=", 1) for a in plan["faster_argv"][1:])
    assert faster["precision_mode"] == C.PRECISION_ALLOW_FP32_TO_FP16 and faster["keep_dtype"] == plan["keep_dtype_file"]
    return model, cut, outs


def test_atc_command_of_the_written_onnx(converted):
    summary, exported, out = converted
    onnx_path = summary["artifacts"]["onnx"]["path"]
    model, cut, outs = _check_plan(summary["atc"], onnx_path)
    assert C.RECURRENT_OUT in outs and summary["atc"]["opset"] == 9
    assert {t["target"]: t["accepts"] for t in summary["atc"]["opset_accepted_by"]} == {
        "Ascend ATC, CANN 5.0/6.0": True, "Ascend ATC, CANN 7.0": True, "Ascend ATC, CANN 8.x": False}
    # the cut graph gives the full graph's deterministic outputs, bit for bit
    pol_feed = {i.name: np.random.default_rng(0).standard_normal(
        [3] + [d.dim_value for d in i.type.tensor_type.shape.dim[1:]]).astype(np.float32) for i in model.graph.input}
    full = OrtRunner(model).infer(pol_feed)
    part = OrtRunner(cut).infer(pol_feed)
    for k in outs:
        assert full[k].tobytes() == part[k].tobytes(), k
    plan = exported["atc"]
    _check_plan(plan, out / "hybrid.onnx")
    assert plan["opset"] == 15
    assert {t["target"]: t["accepts"] for t in plan["opset_accepted_by"]} == {
        "Ascend ATC, CANN 5.0/6.0": False, "Ascend ATC, CANN 7.0": True, "Ascend ATC, CANN 8.x": True}


def test_atc_command_in_the_text_output(tmp_path):
    r = run_cli("export", variant_ckpt("small"), "--opset", "13", "-o", tmp_path / "s.onnx")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("Ascend ATC (opset 13"))
    assert lines[i + 1].split()[0] == C.ATC and f"--precision_mode={C.PRECISION_KEEP_ORIGIN}" in lines[i + 1]
    assert C.PRECISION_FORCE_FP16 in r.stdout and "--keep_dtype=" in r.stdout


def test_precision_measures_each_atc_mode_on_huggy(huggy_ckpt):
    """ATC's default casts the normalizer: on Huggy's probes its fp16 emulation is over the derived fp16
    bound, the normalizer kept float32 is within it, and the ONNX in float32 is within the derived bound."""
    r = run_cli("precision", huggy_ckpt, "--dtype", "float32", "--json")
    assert r.returncode == 0, r.stderr
    atc = json.loads(r.stdout)["atc"]
    rows = {row["precision_mode"]: row for row in atc["modes"]}
    out = C.OUT_CONT_DET
    force, kept, origin = (rows[m]["outputs"][out] for m in (C.PRECISION_FORCE_FP16,
                                                             f"{C.PRECISION_ALLOW_FP32_TO_FP16} + --keep_dtype",
                                                             C.PRECISION_KEEP_ORIGIN))
    assert force["rule"] == kept["rule"] == "derived float16 bound"
    assert force["bound_ratio"] > 1 and not rows[C.PRECISION_FORCE_FP16]["within_bound"]
    assert kept["bound_ratio"] < 1 and rows[f"{C.PRECISION_ALLOW_FP32_TO_FP16} + --keep_dtype"]["within_bound"]
    assert force["max_abs"] > 5 * kept["max_abs"]
    assert origin["rule"] == "derived float32 bound" and origin["bound_ratio"] < 1 and origin["within"]
    assert atc["recommended"] == f"{C.PRECISION_ALLOW_FP32_TO_FP16} + --keep_dtype"


# --- onnxruntime's CANN execution provider, with a fake provider list --------------------------------
class FakeSession:
    """Records what the factory asked for; runs the model on the real CPU provider. ``start`` False: the
    CANN provider did not start (onnxruntime fell back to the CPU)."""

    calls = []
    start = True
    real = onnxruntime.InferenceSession

    def __init__(self, model, sess_options=None, providers=None):
        FakeSession.calls.append(providers)
        self._s = FakeSession.real(model, sess_options=sess_options, providers=[ort_mod.CPU_EP])
        self._asked = [p[0] if isinstance(p, tuple) else p for p in providers]

    def get_providers(self):
        return self._asked if FakeSession.start else [ort_mod.CPU_EP]

    def __getattr__(self, name):
        return getattr(self._s, name)


@pytest.fixture
def fake_cann(monkeypatch):
    monkeypatch.setattr(ort_mod, "ort_providers", lambda: [C.CANN_EP, ort_mod.CPU_EP])
    monkeypatch.setattr(onnxruntime, "InferenceSession", FakeSession)
    FakeSession.calls, FakeSession.start = [], True
    return FakeSession


@pytest.fixture(scope="module")
def small_policy():
    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.exporters.onnx_export import build_onnx

    policy = convert_checkpoint(variant_ckpt("small")).policy
    return policy, build_onnx(policy, 9)


def test_cann_provider_options(fake_cann, small_policy):
    policy, model = small_policy
    feed = make_probes(policy, 4, 0)
    r = OrtRunner(model, "npu:1", spec=policy.spec, precision_mode=C.PRECISION_ALLOW_FP32_TO_FP16)
    assert fake_cann.calls[-1] == [(C.CANN_EP, {C.EP_OPT_DEVICE_ID: "1", C.CANN_OPT_PRECISION: C.PRECISION_ALLOW_FP32_TO_FP16}),
                                   ort_mod.CPU_EP]
    assert r.device == "npu:1" and r.infer(feed)[C.OUT_CONT_DET].shape == (4, policy.spec.continuous_size)
    OrtRunner(model, "npu", spec=policy.spec)  # default: device 0, the graph's float32
    assert fake_cann.calls[-1][0] == (C.CANN_EP, {C.EP_OPT_DEVICE_ID: "0", C.CANN_OPT_PRECISION: C.PRECISION_KEEP_ORIGIN})
    assert ort_mod.ort_provider_for("auto") == (C.CANN_EP, "npu")
    with pytest.raises(DeviceError, match="precision mode 'fp8'"):
        OrtRunner(model, "npu:0", precision_mode="fp8")
    with pytest.raises(DeviceError, match="option of the CANN execution provider"):
        OrtRunner(model, "cpu", precision_mode=C.PRECISION_FORCE_FP16)
    fake_cann.start = False
    with pytest.raises(DeviceError, match=f"could not start {C.CANN_EP} on npu:0"):
        OrtRunner(model, "npu:0")


def test_without_onnxruntime_cann_an_npu_is_refused(monkeypatch, small_policy):
    from huggy_convert.verify.engine import check_devices

    monkeypatch.setattr(ort_mod, "ort_providers", lambda: [ort_mod.CPU_EP])
    with pytest.raises(DeviceError, match="no CANN execution provider"):
        OrtRunner(small_policy[1], "npu:0")
    with pytest.raises(DeviceError, match="torch_npu is not installed"):
        check_devices(["npu:0"])


def test_verification_runs_the_onnx_on_the_npu_through_cann(fake_cann, small_policy, tmp_path):
    """``--verify-device npu`` where only onnxruntime-cann is installed: check 4 runs the written ONNX on
    the NPU (must_keep_origin_dtype, judged by the derived float32 bound) and says the torch module
    cannot run there; the precision mode runs each ATC precision mode on it."""
    from huggy_convert.modes.precision import precision
    from huggy_convert.modes.sources import load_source
    from huggy_convert.pipeline import ConvertOptions, convert_one
    from huggy_convert.verify import VerifyOptions
    from huggy_convert.verify.engine import check_devices

    check_devices(["cpu", "npu:0"])
    vo = VerifyOptions(devices=["cpu", "npu:0"], dtypes=("float32",))
    res = convert_one(variant_ckpt("small"), tmp_path, ConvertOptions(program=False, verify_options=vo))
    c4 = res.report.check("runtimes")
    npu = [ch for ch in c4.children if "npu:0" in ch.title]
    titles = {ch.title: ch.status for ch in npu}
    title = f"onnxruntime: rebuilt ONNX (npu:0 {C.CANN_EP}, {C.CANN_OPT_PRECISION}={C.PRECISION_KEEP_ORIGIN})"
    assert titles == {title: "pass", "torch module npu:0": "skip"}, titles
    assert res.ok
    asked = [c[0] for c in fake_cann.calls if isinstance(c[0], tuple)]
    assert (C.CANN_EP, {C.EP_OPT_DEVICE_ID: "0", C.CANN_OPT_PRECISION: C.PRECISION_KEEP_ORIGIN}) in asked
    fake_cann.calls.clear()
    r = precision(load_source(variant_ckpt("small")), ["cpu", "npu:0"], ["float32"], 16, 0)
    npu_rows = [row for row in r.data["atc"]["modes"] if row["where"].startswith("npu:0")]
    assert [row["precision_mode"] for row in npu_rows] == [C.PRECISION_FORCE_FP16, C.PRECISION_ALLOW_FP32_TO_FP16,
                                                           C.PRECISION_KEEP_ORIGIN]
    modes = [c[0][1][C.CANN_OPT_PRECISION] for c in fake_cann.calls if isinstance(c[0], tuple)]
    assert modes == [C.PRECISION_FORCE_FP16, C.PRECISION_ALLOW_FP32_TO_FP16, C.PRECISION_KEEP_ORIGIN]


def test_cann_is_named_in_runtime_ort_only():
    """onnxruntime's CANN provider is reached through runtime/ort.py alone (its name lives in the contract)."""
    pkg = ROOT / "huggy_convert"
    users = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
                   if "CANNExecutionProvider" in p.read_text() or "onnxruntime_cann" in p.read_text())
    assert users == ["contract/ascend.py"], users
    sessions = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if "provider_options" in p.read_text()]
    assert sessions == ["runtime/ort.py"], sessions
