"""Issue 6: the numbered matrix: >= 50 cases in 10 groups, reproducible figures, real verdicts."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from huggy_convert.cli import main
from huggy_convert.modes.matrix import GROUPS, list_cases, run_matrix

LINE = re.compile(r"^(\d+)\.(\d+)\s*\| (PASS|FAIL|SKIP)\s*\| (huggy-convert .*?) \| (.*) \| latency: ?(.*)$")


@pytest.fixture(scope="module")
def two_quick_runs(tmp_path_factory):
    a = run_matrix(tmp_path_factory.mktemp("m1"), quick=True, echo=False)
    b = run_matrix(tmp_path_factory.mktemp("m2"), quick=True, echo=False)
    return a, b


def test_full_listing_has_50_numbered_cases_in_10_groups():
    cases = list_cases()
    assert len(cases) >= 50
    assert {c["group"] for c in cases} == set(range(1, 11)) == set(GROUPS)
    numbers = [c["number"] for c in cases]
    assert len(set(numbers)) == len(numbers)
    for gnum in range(1, 11):
        mine = [int(n.split(".")[1]) for n in numbers if int(n.split(".")[0]) == gnum]
        assert mine == list(range(1, len(mine) + 1)) and len(mine) >= 3, gnum
    assert all(c["command"].startswith("huggy-convert ") for c in cases)
    res = CliRunner().invoke(main, ["matrix", "--list", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["count"] == len(cases)


def test_quick_matrix_passes_and_repeats_its_figures(two_quick_runs):
    a, b = two_quick_runs
    assert a.ok and b.ok, [c for c in a.data["cases"] if c["verdict"] == "FAIL"]
    s = a.data["summary"]
    assert s["cases"] >= 50 and s["groups"] == 10 and s["fail"] == 0
    assert s["pass"] >= 60  # the quick part really runs (only accelerator and latency cases skip)
    ca, cb = a.data["cases"], b.data["cases"]
    assert [c["number"] for c in ca] == [c["number"] for c in cb]
    for x, y in zip(ca, cb):
        assert (x["verdict"], x["figures"]) == (y["verdict"], y["figures"]), x["number"]
    skipped = {c["number"]: c["note"] for c in ca if c["verdict"] == "SKIP"}
    assert all(("needs" in n) or ("--quick" in n) or ("not present" in n) for n in skipped.values()), skipped


def test_key_cases_carry_real_figures(two_quick_runs):
    cases = {c["number"]: c for c in two_quick_runs[0].data["cases"]}
    assert cases["1.2"]["figures"]["linear"] == 566_805 and cases["1.2"]["figures"]["with_log_sigma"] == 566_826
    assert cases["6.1"]["figures"]["bitwise"] is True and cases["6.1"]["figures"]["structure"] == "pass"
    tamper = next(c for c in cases.values() if "negative control" in c["title"] and c["group"] == 6)
    assert tamper["verdict"] == "PASS" and tamper["figures"]["bitwise"] is False
    for c in cases.values():
        if c["verdict"] == "PASS" and c["group"] in (2, 5, 6, 8, 10):
            assert c["figures"], c["number"]


def test_log_and_json_files(two_quick_runs, tmp_path):
    a, b = two_quick_runs
    logs = []
    for r in (a, b):
        text = Path(r.data["log"]).read_text()
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        rows = [LINE.match(ln) for ln in lines if not ln.startswith("##")]
        assert all(rows), [ln for ln in lines if not ln.startswith("##") and not LINE.match(ln)][:3]
        assert len(rows) == r.data["summary"]["cases"]
        logs.append([(m.group(1), m.group(2), m.group(3), m.group(5)) for m in rows])  # latency column dropped
        doc = json.loads(Path(r.data["log"]).with_name("matrix.json").read_text())
        assert doc["summary"] == r.data["summary"] and "total_s" in doc["timings"]
        assert all("case_s" in c["timings"] for c in doc["cases"] if c["verdict"] != "SKIP")
    assert logs[0] == logs[1]


def test_matrix_cli_exit_code(tmp_path):
    res = CliRunner().invoke(main, ["matrix", "--quick", "--out", str(tmp_path), "--only", "1", "--only", "6.6"])
    assert res.exit_code == 0, res.stdout[-2000:]
    assert "1.2 " in res.stdout and "# summary:" in res.stdout
    assert (tmp_path / "matrix.log").is_file() and (tmp_path / "matrix.json").is_file()
    res = CliRunner().invoke(main, ["matrix", "--fixtures", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "nowhere" in res.stderr
