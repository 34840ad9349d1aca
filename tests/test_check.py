"""``huggy-convert check``: each consumer's loader rules on real files (the official ONNX files ML-Agents
wrote, the ones we rebuild, a dynamo export ML-Agents wrote under torch 2.13) and on files crafted with
onnx.helper from a fixture to break one rule each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import FIXTURES, run_cli, step_checkpoints, variant_ckpt
from onnx import TensorProto, helper, numpy_helper

from huggy_convert import contract as C
from huggy_convert.conformance import check_file
from huggy_convert.contract import consumers as K
from huggy_convert.converter import load_checkpoint
from huggy_convert.exporters.onnx_export import build_onnx, model_bytes
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime import ort_run, ort_session
from huggy_convert.runtime.feeds import make_probes

DYNAMO = FIXTURES / "dynamo" / "Hybrid-4191.onnx"
HYBRID = variant_ckpt("hybrid")


def _official_files():
    out = []
    for manifest in (FIXTURES / "manifest.json", FIXTURES / "families" / "manifest.json"):
        for run in json.loads(manifest.read_text())["runs"]:
            out.append(FIXTURES / run["checkpoints"][-1]["onnx"])
    return out


OFFICIAL = _official_files()


def _window(c: K.Consumer, opset: int) -> bool:
    return c.opsets is None or c.opsets[0] <= opset <= c.opsets[1]


def _accepted_where_the_window_allows(path: Path, opset: int):
    r = check_file(path)
    assert r.facts.opset == opset
    accepts = r.accepts()
    for c in K.CONSUMERS:
        assert accepts[c.name] == _window(c, opset), (c.name, [f.line() for f in r.findings])
    assert not r.dynamo and r.facts.zero_run_error is None
    return r


@pytest.mark.parametrize("path", OFFICIAL, ids=[p.stem for p in OFFICIAL])
def test_every_official_file_is_accepted_by_each_consumer_whose_window_has_its_opset(path):
    _accepted_where_the_window_allows(path, 9)


REBUILT = [HYBRID, variant_ckpt("lstm"), step_checkpoints(FIXTURES / "huggy")[-1]] + [
    FIXTURES / json.loads((FIXTURES / "families" / "manifest.json").read_text())["runs"][i]["checkpoints"][-1]["pt"]
    for i in range(len(json.loads((FIXTURES / "families" / "manifest.json").read_text())["runs"]))]


@pytest.mark.parametrize("ckpt", REBUILT, ids=[p.stem for p in REBUILT])
def test_every_rebuilt_file_is_accepted_at_opsets_9_and_13(ckpt, tmp_path):
    policy = prepare_conversion(load_checkpoint(ckpt), ckpt.with_suffix(".onnx")).conversion.policy
    for opset in (9, 13):
        path = tmp_path / f"rebuilt-{opset}.onnx"
        path.write_bytes(model_bytes(build_onnx(policy, opset)))
        _accepted_where_the_window_allows(path, opset)


# --- crafted files: one broken rule each --------------------------------------------------------------
def _hybrid() -> onnx.ModelProto:
    return onnx.load(str(HYBRID.with_suffix(".onnx")))


def _set_constant(m: onnx.ModelProto, output: str, value: np.ndarray) -> None:
    """Give ``output``'s initializer (behind ML-Agents' Identity) a new value and type."""
    node = next(n for n in m.graph.node if n.output[0] == output)
    init = next(t for t in m.graph.initializer if t.name == node.input[0])
    init.CopyFrom(numpy_helper.from_array(value, init.name))
    out = next(o for o in m.graph.output if o.name == output)
    out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)


def _drop_output(m: onnx.ModelProto, name: str) -> None:
    keep = [o for o in m.graph.output if o.name != name]
    del m.graph.output[:]
    m.graph.output.extend(keep)


def _findings(m: onnx.ModelProto, tmp_path: Path, consumers=None, **save):
    path = tmp_path / "crafted.onnx"
    onnx.save(m, str(path), **save)
    r = check_file(path, consumers)
    return r, {(f.consumer, f.rule) for f in r.findings if f.rejects}


def test_an_int64_version_number_is_named(tmp_path):
    m = _hybrid()
    _set_constant(m, C.OUT_VERSION, np.array([3], np.int64))
    r, bad = _findings(m, tmp_path)
    mla = [c.name for c in K.CONSUMERS if c.mlagents]
    assert {(c, "constants") for c in mla} <= bad
    assert "InvalidCastException" in next(f.found for f in r.findings if f.rule == "constants")
    assert r.accepts()["sentis-2"] and r.accepts()["cann-7"]  # the runtimes themselves take it


def test_a_missing_deterministic_output_is_named_where_the_option_exists(tmp_path):
    m = _hybrid()
    _drop_output(m, C.OUT_CONT_DET)
    r, bad = _findings(m, tmp_path)
    assert ("mlagents-4", "action-heads") in bad and ("mlagents-3", "action-heads") in bad
    assert r.accepts()["mlagents-2"]  # 2.x has no Deterministic Inference option
    assert C.OUT_CONT_DET in next(f.found for f in r.findings if f.consumer == "mlagents-4")


def test_an_action_size_of_0_is_named(tmp_path):
    m = _hybrid()
    _set_constant(m, C.OUT_CONT_SHAPE, np.array([0], np.float32))
    r, bad = _findings(m, tmp_path, ["mlagents-4"])
    assert bad == {("mlagents-4", "action-heads")}
    assert C.OUT_CONT_SHAPE in r.findings[0].found and "[0.0]" in r.findings[0].found


def test_a_state_size_without_its_input_is_named(tmp_path):
    m = _hybrid()
    _set_constant(m, C.OUT_MEMORY, np.array([16], np.float32))
    r, bad = _findings(m, tmp_path, ["mlagents-3"])
    assert bad == {("mlagents-3", "carried-state")}
    assert C.RECURRENT_IN in r.findings[0].found


def test_version_4_is_named(tmp_path):
    m = _hybrid()
    _set_constant(m, C.OUT_VERSION, np.array([4], np.float32))
    r, bad = _findings(m, tmp_path, ["mlagents-2", "mlagents-4"])
    assert bad == {("mlagents-2", "api-version"), ("mlagents-4", "api-version")}
    assert "2..3" in r.findings[0].found


def test_a_policy_with_branches_but_no_masks_input_is_named(tmp_path):
    m = _hybrid()
    # the masks input becomes an initializer of ones: the graph still computes, the input is gone
    masks = next(i for i in m.graph.input if i.name == C.ACTION_MASKS)
    m.graph.input.remove(masks)
    m.graph.initializer.append(numpy_helper.from_array(np.ones((1, 3), np.float32), C.ACTION_MASKS))
    r, bad = _findings(m, tmp_path, ["mlagents-4"])
    assert bad == {("mlagents-4", "action-heads")}
    assert C.ACTION_MASKS in r.findings[0].found


def test_opset_18_is_named_with_each_window(tmp_path):
    m = _hybrid()
    m.opset_import[0].version = 18
    r, bad = _findings(m, tmp_path)
    for c in K.CONSUMERS:
        assert ((c.name, "opset") in bad) == (not _window(c, 18)), c.name
    assert ("cann-7", "opset") not in bad and ("sentis-1", "opset") in bad


def test_external_data_and_a_missing_side_file_are_named(tmp_path):
    m = _hybrid()
    r, bad = _findings(m, tmp_path, save_as_external_data=True, all_tensors_to_one_file=True,
                       location="crafted.onnx.data", size_threshold=0)
    assert r.facts.external == ["crafted.onnx.data"] and r.facts.zero_run_error is None
    assert {c for c, rule in bad if rule == "external-data"} == {c.name for c in K.CONSUMERS if not c.external_data}
    (tmp_path / "crafted.onnx.data").unlink()
    r = check_file(tmp_path / "crafted.onnx")
    assert r.facts.missing_external == ["crafted.onnx.data"]
    assert not any(r.accepts().values())
    assert all("not beside the file" in f.found for f in r.findings if f.rule == "external-data")


def test_an_operator_sentis_does_not_import_is_named(tmp_path):
    m = _hybrid()
    m.graph.initializer.extend([numpy_helper.from_array(np.array([1, 2], np.uint8), "q"),
                                numpy_helper.from_array(np.array(0.5, np.float32), "q_scale")])
    m.graph.node.append(helper.make_node("DequantizeLinear", ["q", "q_scale"], ["dq"]))
    m.graph.output.append(helper.make_tensor_value_info("dq", TensorProto.FLOAT, [2]))
    m.opset_import[0].version = 10  # DequantizeLinear is opset 10+
    r, bad = _findings(m, tmp_path, ["sentis-1", "sentis-2", "cann-7"])
    assert ("sentis-1", "operators") in bad and ("sentis-2", "operators") in bad
    assert not any(c == "cann-7" for c, _ in bad)
    assert "DequantizeLinear" in next(f.found for f in r.findings if f.rule == "operators")


def test_an_output_no_input_reaches_is_named_before_sentis_2_4(tmp_path):
    m = _hybrid()
    m.graph.node.append(helper.make_node("Add", ["version_number.1", "memory_size_vector"], ["lonely"]))
    m.graph.output.append(helper.make_tensor_value_info("lonely", TensorProto.FLOAT, [1]))
    r, bad = _findings(m, tmp_path)
    assert {c for c, rule in bad if rule == "pruned-outputs"} == {c.name for c in K.CONSUMERS if c.prunes_unconnected}
    assert r.facts.unconnected == ["lonely"]  # ML-Agents' own Identity-of-an-initializer constants are kept


def test_a_declared_output_nothing_computes_is_judged_as_unity_does(tmp_path):
    m = _hybrid()
    m.graph.output.append(helper.make_tensor_value_info("never", TensorProto.FLOAT, [1]))
    path = tmp_path / "crafted.onnx"
    onnx.save(m, str(path))
    with pytest.raises(Exception):  # onnxruntime refuses the file outright
        ort_session(path.read_bytes())
    r = check_file(path)
    assert r.facts.not_computed == ["never"] and r.facts.zero_run_error is None
    assert r.accepts()["mlagents-4"] and r.accepts()["sentis-1"]
    assert any(f.rule == "dropped-outputs" and not f.rejects for f in r.findings)


# --- a dynamo export ML-Agents wrote, and the way back --------------------------------------------------
def test_the_dynamo_export_is_detected_and_refused_by_unity(tmp_path):
    r = check_file(DYNAMO)
    assert r.dynamo[0] == "opset 18" and any("onnx.data" in s for s in r.dynamo)
    accepts = r.accepts()
    assert not any(accepts[c.name] for c in K.CONSUMERS if c.mlagents or c.name.startswith(("sentis", "barracuda")))
    # beside its checkpoint, the way back names that checkpoint
    shutil.copy(DYNAMO, tmp_path / "Hybrid-4191.onnx")
    shutil.copy(DYNAMO.with_suffix(".onnx.data"), tmp_path / "Hybrid-4191.onnx.data")
    shutil.copy(HYBRID, tmp_path / "Hybrid-4191.pt")
    assert f"huggy-convert {tmp_path / 'Hybrid-4191.pt'} OUT/" in check_file(tmp_path / "Hybrid-4191.onnx").recovery


def test_the_recovery_is_accepted_and_bitwise_the_official_file(tmp_path):
    out = tmp_path / "out"
    res = run_cli(HYBRID, out, "--no-program")
    assert res.returncode == 0, res.stderr
    rebuilt = out / "Hybrid-4191.onnx"
    _accepted_where_the_window_allows(rebuilt, 9)
    official = HYBRID.with_suffix(".onnx").read_bytes()
    policy = prepare_conversion(load_checkpoint(HYBRID), HYBRID.with_suffix(".onnx")).conversion.policy
    feed = make_probes(policy, 64, seed=5)
    a, b = ort_run(ort_session(rebuilt.read_bytes()), feed), ort_run(ort_session(official), feed)
    for name in (C.OUT_CONT_DET, C.OUT_DISC_DET, C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_DISC_SHAPE):
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    # the dynamo file computes the same policy (within float32 rounding: another graph)
    # (a path: onnxruntime reads the side file beside it; its unused state input is 0 wide)
    d = ort_run(ort_session(str(DYNAMO)), dict(feed, **{C.RECURRENT_IN: np.zeros((64, 1, 0), np.float32)}))
    np.testing.assert_allclose(d[C.OUT_CONT_DET], b[C.OUT_CONT_DET], rtol=1e-5, atol=1e-5)
    assert (d[C.OUT_DISC_DET] == b[C.OUT_DISC_DET]).all()


# --- the command ---------------------------------------------------------------------------------------
def test_the_command_exit_codes_and_json():
    ok = run_cli("check", HYBRID.with_suffix(".onnx"), "--for", "mlagents-4", "--for", "cann-7")
    assert ok.returncode == 0, ok.stderr
    assert "mlagents-4" in ok.stdout and "cann-7" in ok.stdout
    bad = run_cli("check", DYNAMO, "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["dynamo_export"][0] == "opset 18"
    assert {c["name"]: c["accepts"] for c in data["consumers"]}["cann-7"] is True
    assert {(f["consumer"], f["rule"]) for f in data["findings"] if f["rejects"]} >= {("mlagents-4", "opset")}
    unknown = run_cli("check", DYNAMO, "--for", "unity-7")
    assert unknown.returncode == 2 and "unity-7" in unknown.stderr
    missing = run_cli("check", FIXTURES / "nope.onnx")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


# --- the ATC command per CANN version ------------------------------------------------------------------
def test_the_atc_command_follows_the_cann_version(tmp_path):
    from huggy_convert.exporters.atc import atc_plan

    policy = prepare_conversion(load_checkpoint(HYBRID), HYBRID.with_suffix(".onnx")).conversion.policy
    target = K.TARGETS_BY_NAME["ascend-cann8"]
    model = build_onnx(policy, target.opset)
    path = tmp_path / "h.onnx"
    path.write_bytes(model_bytes(model))
    plan = atc_plan(model, path, policy.spec, cann=target.cann)
    assert 11 <= plan["opset"] <= 15
    assert "--precision_mode_v2=origin" in plan["argv"] and not any(a.startswith("--precision_mode=") for a in plan["argv"])
    assert "--precision_mode_v2=mixed_float16" in plan["faster_argv"] and f"--keep_dtype={plan['keep_dtype_file']}" in plan["faster_argv"]
    assert {t["target"]: t["accepts"] for t in plan["opset_accepted_by"]}["Ascend ATC, CANN 8.x"] is True
    assert check_file(path, target.consumers).ok
    old = atc_plan(model, path, policy.spec, cann="7.0")
    assert "--precision_mode=must_keep_origin_dtype" in old["argv"] and "cann_8_5_precision_flag" not in old
    both = atc_plan(model, path, policy.spec)
    assert both["precision_flag"] == "--precision_mode=must_keep_origin_dtype"
    assert both["cann_8_5_precision_flag"] == "--precision_mode_v2=origin"
    # the ML-Agents default, opset 9, is outside CANN 8.x's window: the hint says so
    nine = build_onnx(policy, 9)
    assert {t["target"]: t["accepts"] for t in atc_plan(nine, path, policy.spec)["opset_accepted_by"]}[
        "Ascend ATC, CANN 8.x"] is False


def test_info_says_which_consumers_load_an_onnx():
    r = run_cli("info", HYBRID.with_suffix(".onnx"))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("loads in:"))
    assert line.split("loads in: ")[1].split(";")[0].split(", ") == [
        c.name for c in K.CONSUMERS if _window(c, 9)]
    assert "not in: cann-8" in line
    data = json.loads(run_cli("info", HYBRID.with_suffix(".onnx"), "--json").stdout)
    assert data["onnx"]["consumers"]["reject"] == ["cann-8"]


# --- --target ------------------------------------------------------------------------------------------
def test_convert_for_ascend_cann8_writes_opset_13_its_atc_command_and_keep_dtype_file(tmp_path):
    r = run_cli(HYBRID, tmp_path / "out", "--target", "ascend-cann8", "--no-program", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    t = d["target"]
    assert t["target"] == "ascend-cann8" and t["ok"] and t["accepted_by"] == ["cann-8"] and t["opset"] == 13
    assert "--precision_mode_v2=origin" in d["atc"]["argv"] and d["atc"]["cann"] == "8.5"
    keep = tmp_path / "out" / "Hybrid-4191.keep_dtype.cfg"
    assert t["keep_dtype_file"] == str(keep)
    assert keep.read_text().splitlines() == d["atc"]["keep_dtype_nodes"] and len(d["atc"]["keep_dtype_nodes"]) == 3
    m = onnx.load(str(tmp_path / "out" / "Hybrid-4191.onnx"))
    assert m.opset_import[0].version == 13
    text = run_cli(HYBRID, tmp_path / "text", "--target", "ascend-cann8", "--no-program")
    assert "target ascend-cann8: loads in cann-8" in text.stdout and "--precision_mode_v2=origin" in text.stdout
    assert text.stdout.strip().splitlines()[-1].startswith("verdict: PASS")


def test_a_target_keeps_the_opset_within_its_consumers_window(tmp_path):
    r = run_cli(HYBRID, tmp_path / "out", "--target", "unity", "--opset", "13")
    assert r.returncode == 2 and not (tmp_path / "out").exists()
    assert r.stderr.strip().splitlines() == [
        "huggy-convert: error: --opset 13 with --target unity: its consumers (mlagents-2, mlagents-3, mlagents-4) "
        "import opset 9"]
    ok = run_cli("export", HYBRID, "--target", "sentis", "--opset", "13", "-o", tmp_path / "s.onnx", "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["opset"] == 13 and d["target"]["accepted_by"] == ["mlagents-3", "mlagents-4", "sentis-1", "sentis-2"]
    plain = json.loads(run_cli("export", HYBRID, "--target", "unity", "-o", tmp_path / "u.onnx", "--json").stdout)
    assert plain["opset"] == 9 and plain["target"]["ok"]


def test_the_target_in_json_validates_against_the_shipped_schemas(tmp_path):
    import jsonschema

    schemas = Path(__file__).resolve().parents[1] / "huggy_convert" / "schemas"
    for command, args in (("convert", [HYBRID, tmp_path / "o", "--target", "ascend", "--no-program"]),
                          ("export", ["export", HYBRID, "--target", "ascend", "-o", tmp_path / "e.onnx"])):
        d = json.loads(run_cli(*args, "--json").stdout)
        assert d["target"]["accepted_by"] == ["cann-5", "cann-6", "cann-7"] and d["target"]["opset"] == 13
        jsonschema.validate(d, json.loads((schemas / f"{command}.json").read_text()),
                            cls=jsonschema.Draft202012Validator)
