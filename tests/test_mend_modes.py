"""The run modes after the review's mends: precision's references computed once and its fixed
thresholds recorded only where they judged; the matrix's half-format cases judged by the derived bound."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import HUGGY_RUN, step_checkpoints

from huggy_convert import contract as C
from huggy_convert.modes import precision as precision_mode
from huggy_convert.modes.matrix import run_matrix
from huggy_convert.modes.sources import load_source
from huggy_convert.verify.bounds import Float64Policy

HUGGY = step_checkpoints(HUGGY_RUN)[-1]
OFFICIAL = HUGGY.with_suffix(".onnx")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_precision_prepares_one_float64_policy_and_one_forward_per_dtype(monkeypatch):
    """One Float64Policy per call, one float64 forward per dtype (the ATC emulations reuse the
    float32 and float16 ones); every row judged by a derived bound records no fixed threshold."""
    made, forwards = [], []

    class Counting(Float64Policy):
        def __init__(self, policy):
            made.append(policy)
            super().__init__(policy)

        def forward(self, feed, noise=None, bounds=True, precision=None, **kw):
            forwards.append(precision.name)
            return super().forward(feed, noise, bounds, precision)

    monkeypatch.setattr(precision_mode, "Float64Policy", Counting)
    r = precision_mode.precision(load_source(HUGGY), ["cpu"], rows=16)
    assert r.ok and len(made) == 1
    assert sorted(forwards) == ["bfloat16", "float16", "float32"]
    rows = {row["dtype"]: row for row in r.data["results"]}
    assert {dt: row["status"] for dt, row in rows.items()} == {"float32": "PASS", "float16": "PASS",
                                                                "bfloat16": "PASS"}
    for row in rows.values():
        assert "atol" not in row and "min_cosine" not in row, row
        assert row["outputs"][C.OUT_CONT_DET]["bound_ratio"] < 1
    assert r.data["atc"]["modes"] and "WARN" not in r.render()
    made.clear(), forwards.clear()
    precision_mode.precision(load_source(HUGGY), ["cpu"], ["bfloat16"], rows=16)
    assert len(made) == 1 and sorted(forwards) == ["bfloat16", "float16", "float32"]  # ATC needs fp32 and fp16


def test_precision_without_tensors_records_the_float32_tolerance_it_applied():
    """Without canonical tensors only float32 runs (onnxruntime), judged by verify's float32 Tolerance,
    which the row records; the half formats are skipped, and there are no ATC emulations."""
    src = dataclasses.replace(load_source(OFFICIAL), policy=None, unrecovered="stripped by the test")
    r = precision_mode.precision(src, ["cpu"], rows=16)
    rows = {row["dtype"]: row for row in r.data["results"]}
    assert rows["float32"]["status"] == "PASS" and r.ok
    assert rows["float32"]["atol"] == 1e-6 and rows["float32"]["min_cosine"] == 0.999999
    assert "bound_ratio" not in rows["float32"]["outputs"][C.OUT_CONT_DET]
    for dt in ("float16", "bfloat16"):
        assert rows[dt]["status"] == "SKIP" and "canonical tensors" in rows[dt]["reason"]
    assert "atc" not in r.data


def test_matrix_half_cases_use_the_derived_bound(tmp_path):
    """Group 5's half-format titles name the derived bound, and the fp16-normalizer case judges by it:
    the float32-normalizer module within the float16 bound, the fp16-normalizer one over it (Huggy)."""
    r = run_matrix(tmp_path, quick=True, only=["5.2", "5.3", "5.10"], echo=False)
    cases = {c["number"]: c for c in r.data["cases"]}
    for n in ("5.2", "5.3", "5.10"):
        assert cases[n]["verdict"] == "PASS", cases[n]
    assert "derived float16 bound" in cases["5.2"]["title"] and "derived bfloat16 bound" in cases["5.3"]["title"]
    assert all("cosine >=" not in c["title"] for c in r.data["cases"])
    figs = cases["5.10"]["figures"]
    assert figs["fp32_normalizer"]["bound_ratio"] < 1 < figs["fp16_normalizer"]["bound_ratio"]


def test_export_reuses_the_reference_load_source_read(tmp_path, monkeypatch):
    """export against the reference load_source already read and decided the divisors against (the
    checkpoint's sibling ONNX, an ONNX input itself) reads it no second time; another --reference is
    read and decided against as before. Each export verifies against its official ONNX and passes."""
    import shutil

    from huggy_convert.modes import export as export_mode

    calls = []
    for name in ("load_reference", "prepare_conversion"):
        real = getattr(export_mode, name)
        monkeypatch.setattr(export_mode, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    for path in (HUGGY, OFFICIAL):
        src = load_source(path)
        assert src.prepared is not None and src.prepared.reference == OFFICIAL
        r = export_mode.export(src, 13, tmp_path / f"{path.suffix[1:]}.onnx")
        assert r.ok and r.data["checks"] and calls == [], (path, calls)
    other = tmp_path / "elsewhere.onnx"
    shutil.copyfile(OFFICIAL, other)
    r = export_mode.export(load_source(HUGGY), 13, tmp_path / "other.onnx", export_mode.ExportOptions(reference=other))
    assert r.ok and r.data["checks"] and calls == ["load_reference", "prepare_conversion"]
    assert "elsewhere.onnx" in r.data["reference"]
