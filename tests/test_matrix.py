"""Issue 6: the numbered matrix: >= 50 cases in 10 groups, reproducible figures, real verdicts."""
from __future__ import annotations

import json
import os
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


# --- the matrix on the user's input, from an installed copy (no source tree, no fixtures beside it) -----
VARIANT_CASES = {"1.5", "2.9", *(f"2.{i}" for i in range(10, 17)), "3.8", "3.9", "3.10", "4.6", "4.7", "5.11",
                 *(f"6.{i}" for i in range(7, 14)), "7.6", "8.6", "8.7", "10.12"}  # need a variant fixture


def test_matrix_runs_from_an_installed_copy_on_a_given_checkpoint(tmp_path, huggy_ckpt):
    import shutil
    import subprocess
    import sys

    site, work = tmp_path / "site", tmp_path / "elsewhere"
    shutil.copytree(Path(__file__).resolve().parents[1] / "huggy_convert", site / "huggy_convert",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "huggy_convert.cli", *map(str, args)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)

    where = subprocess.run([sys.executable, "-c", "import huggy_convert; print(huggy_convert.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True).stdout
    assert where.startswith(str(site)), where  # the copy runs, not the source tree
    p = run("matrix", huggy_ckpt, "--quick", "--out", work / "m", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    s, cases = doc["summary"], {c["number"]: c for c in doc["cases"]}
    assert s["cases"] >= 50 and s["groups"] == 10 and s["fail"] == 0
    skipped = {n for n, c in cases.items() if c["verdict"] == "SKIP"}
    # every variant case says which kind of policy it needs; the rest skip only for an accelerator
    assert {n for n in skipped if "policy" in cases[n]["note"] or "variant" in cases[n]["note"]} == VARIANT_CASES
    for n in skipped - VARIANT_CASES:
        note = cases[n]["note"]
        assert "--quick" in note or (note.startswith("needs") and any(d in note for d in ("cuda", "npu", "CUDA"))), n
    assert s["pass"] == s["cases"] - len(skipped) >= 57
    # what lies beside the checkpoint is found: its official ONNX, the run directory, the older checkpoint
    for n in ("1.4", "1.7", "2.1", "2.8", "6.1", "6.4", "6.5", "10.8"):
        assert cases[n]["verdict"] == "PASS", (n, cases[n])
    assert cases["6.1"]["figures"]["bitwise"] is True
    assert cases["6.6"]["verdict"] == "PASS" and cases["6.6"]["figures"]["bitwise"] is False  # tamper caught
    assert cases["1.2"]["figures"]["linear"] == 566_805
    assert (work / "m" / "matrix.log").is_file()
    # no input and no source checkout: one line, exit 2
    p = run("matrix")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("huggy-convert: error: "), p.stderr
    p = run("matrix", work / "missing.pt")
    assert p.returncode == 2 and "missing.pt" in p.stderr and p.stderr.count("\n") == 1


def test_matrix_on_a_discrete_checkpoint_runs_the_discrete_cases_on_it(tmp_path):
    from conftest import variant_ckpt

    ck = variant_ckpt("discrete")
    r = run_matrix(tmp_path, quick=True, source=ck, only=["3", "4"], echo=False)
    cases = {c["number"]: c for c in r.data["cases"]}
    assert r.ok
    assert cases["3.8"]["verdict"] == "PASS" and cases["3.8"]["figures"]["valid"] is True  # the input stands in
    assert cases["4.6"]["verdict"] == "PASS"
    assert cases["3.1"]["verdict"] == "SKIP" and "continuous actions" in cases["3.1"]["note"]
    assert cases["4.7"]["verdict"] == "SKIP" and "LSTM" in cases["4.7"]["note"]


def test_the_matrix_on_each_variant_fails_nothing_and_says_why_it_skips(tmp_path):
    """Any checkpoint can be the input: what it lacks (a continuous head, a normalizer, memory, an
    accelerator...) is a SKIP that names the need, never a failure or a crash."""
    from conftest import variant_ckpt, variant_names

    for name in variant_names():
        r = run_matrix(tmp_path / name, quick=True, source=variant_ckpt(name), echo=False)
        assert r.ok, (name, [(c["number"], c["note"]) for c in r.data["cases"] if c["verdict"] == "FAIL"])
        notes = [c["note"] for c in r.data["cases"] if c["verdict"] == "SKIP"]
        assert all(n.startswith("needs") or "--quick" in n for n in notes), (name, notes)
        assert r.data["summary"]["pass"] >= 40, name
