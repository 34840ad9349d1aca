"""The deploy targets of issue 27 (OpenVINO, LiteRT, ExecuTorch), each an optional extra, and the device
benchmark's dry run.

A target whose extra is not importable is skipped, with the one line saying what to install; where it is
(each in its own environment: docs/targets.md), a small fixture and a Huggy-size one are converted with the
target's official converter and every deterministic output of its runtime is judged against the float64
reference with the derived float32 bound on verification's probes, twice, bit for bit the same."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, ROOT, variant_ckpt
from huggy_convert.contract import targets as T
from huggy_convert.exporters import targets as X

SCHEMA = ROOT / "benchmarks" / "device.schema.json"


def _policy(pt: Path):
    from huggy_convert.converter import load_checkpoint
    from huggy_convert.pipeline import prepare_conversion

    return prepare_conversion(load_checkpoint(pt), pt.with_suffix(".onnx")).conversion.policy


# --- without the extras ----------------------------------------------------------------------------

@pytest.mark.parametrize("target", T.TARGETS)
def test_a_missing_extra_is_one_line_naming_what_to_install(target, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in T.MODULES[target]
                        else real(name, *a))
    line = X.missing(target)
    assert line is not None and "\n" not in line
    assert f"pip install 'huggy-convert[{target}]'" in line
    for m in T.MODULES[target]:
        assert m in line
    with pytest.raises(X.MissingExtra) as e:
        X.TARGET_EXPORTERS[target](_policy(variant_ckpt("small")))
    assert e.value.one_line() == line


def test_the_targets_and_their_files():
    assert set(X.TARGET_EXPORTERS) == set(T.TARGETS) == set(T.SUFFIXES)
    assert T.SUFFIXES[T.OPENVINO] == (".xml", ".bin")
    assert T.SUFFIXES[T.LITERT] == (".tflite",) and T.SUFFIXES[T.EXECUTORCH] == (".pte",)
    # OpenVINO's CPU plugin runs bf16 on CPUs that have it unless told f32
    assert (T.OV_PRECISION_HINT, T.OV_PRECISION_F32) == ("INFERENCE_PRECISION_HINT", "f32")


def test_a_converter_error_becomes_one_line_naming_the_operator():
    err = X.refusal(T.LITERT, RuntimeError("Lowering not found: aten.lstm.input\nmore"))
    assert err.one_line().startswith("the litert target lacks the operator aten.lstm.input (RuntimeError: ")
    assert "\n" not in err.one_line()
    assert "cannot convert it" in X.refusal(T.OPENVINO, ValueError("something else")).one_line()


# --- with an extra -----------------------------------------------------------------------------------

def _needs(target):
    line = X.missing(target)
    if line:
        pytest.skip(line)


def _judge_target(target, pt: Path):
    from huggy_convert.runtime import make_probes
    from huggy_convert.runtime.base import STOCHASTIC
    from huggy_convert.runtime.targets import build_target
    from huggy_convert.verify.bounds import judge, reference_forward

    policy = _policy(pt)
    files, runner = build_target(target, policy)
    assert set(files) == set(T.SUFFIXES[target]) and all(len(b) > 0 for b in files.values())
    assert runner.dtype == "float32", runner.dtype
    probes = make_probes(policy, 64, 0)
    ref = reference_forward(policy, probes)
    a, b = runner.infer(probes), runner.infer(probes)
    names = [n for n in ref.values if n not in STOCHASTIC]
    assert names and set(names) <= set(a), (names, sorted(a))
    for n in names:
        j = judge(ref, n, a[n])
        assert j["ok"], (target, pt.name, n, j)
        assert a[n].tobytes() == b[n].tobytes(), (target, n, "two runs differ")
    constants = [n for n in a if n not in ref.values and n not in STOCHASTIC]
    if constants:  # the constants (version, memory size, action shapes: OpenVINO's): the ONNX's values
        ort = _ort_outputs(policy, probes)
        for n in constants:
            assert np.array_equal(a[n].ravel(), np.asarray(ort[n]).ravel()), n
    return runner


def _ort_outputs(policy, feed):
    from huggy_convert.exporters.onnx_export import build_onnx
    from huggy_convert.runtime import OrtRunner

    return OrtRunner(build_onnx(policy), spec=policy.spec).infer(feed)


@pytest.mark.parametrize("target", T.TARGETS)
def test_a_small_policy_within_the_float32_bound(target):
    _needs(target)
    _judge_target(target, variant_ckpt("small"))


@pytest.mark.parametrize("target", T.TARGETS)
def test_a_huggy_size_policy_within_the_float32_bound(target, huggy_ckpt):
    _needs(target)
    _judge_target(target, huggy_ckpt)


# --- benchmarks/device.py's dry run ------------------------------------------------------------------

def _validate(doc, schema, where="$"):
    """The JSON Schema subset device.schema.json uses (type, enum, required, properties,
    additionalProperties, items, minItems, minimum); jsonschema, where installed, checks it all again."""
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
             "integer": int, "number": (int, float)}
    want = schema.get("type")
    if want:
        allowed = want if isinstance(want, list) else [want]
        ok = any(isinstance(doc, types[t]) and not (t in ("integer", "number") and isinstance(doc, bool))
                 for t in allowed)
        assert ok, f"{where}: {doc!r} is not {want}"
    if "enum" in schema:
        assert doc in schema["enum"], f"{where}: {doc!r} not in {schema['enum']}"
    if "minimum" in schema and isinstance(doc, (int, float)) and not isinstance(doc, bool):
        assert doc >= schema["minimum"], f"{where}: {doc} < {schema['minimum']}"
    if isinstance(doc, dict):
        for k in schema.get("required", ()):
            assert k in doc, f"{where}: {k} missing"
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for k, v in doc.items():
            if k in props:
                _validate(v, props[k], f"{where}.{k}")
            elif extra is False:
                raise AssertionError(f"{where}: unexpected {k}")
            elif isinstance(extra, dict):
                _validate(v, extra, f"{where}.{k}")
    if isinstance(doc, list):
        assert len(doc) >= schema.get("minItems", 0), f"{where}: too few items"
        for i, v in enumerate(doc):
            _validate(v, schema.get("items", {}), f"{where}[{i}]")


def test_the_device_benchmark_dry_run_writes_json_of_its_schema(tmp_path):
    out = tmp_path / "device.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device.py"), "--dry-run", "--no-convert",
                        "--out", str(out)], capture_output=True, text=True, cwd=str(ROOT), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    schema = json.loads(SCHEMA.read_text())
    _validate(doc, schema)
    if importlib.util.find_spec("jsonschema"):
        import jsonschema

        jsonschema.validate(doc, schema)
    assert doc["dry_run"] is True and doc["host"]["kind"] == "cpu" and doc["batches"] == [1, 1024]
    (fx,) = doc["fixtures"]
    assert fx["fixture"] == "small" and (FIXTURES.parent / fx["checkpoint"]).is_file()
    runs = {(r["runtime"], r["dtype"]): r for r in fx["runs"]}
    # the module and the .pt2 in every format, onnxruntime in float32: each within its format's bound
    for rt in ("torch", "torch.export"):
        for dt in ("float32", "float16", "bfloat16"):
            r = runs[(rt, dt)]
            assert r["status"] == "ok" and r["ok"], r
            assert set(r["latency_ms"]) == {"1", "1024"}
            assert all(0 <= o["ratio"] <= 1 for o in r["outputs"].values()), r
    assert runs[("onnxruntime", "float32")]["ok"]


def test_the_schema_rejects_what_it_should():
    schema = json.loads(SCHEMA.read_text())
    with pytest.raises(AssertionError):
        _validate({"schema": "huggy-convert/device-benchmark/1"}, schema)
    run = {"runtime": "torch", "device": "cpu", "dtype": "float8", "status": "ok"}
    with pytest.raises(AssertionError):
        _validate(run, schema["properties"]["fixtures"]["items"]["properties"]["runs"]["items"])
