"""Issue 23 (items 2 and 3): a tolerance option that names no output is bad input (exit 2, nothing
written); ``verify OUT/`` checks every file its report records, re-runs checks 1-2 on the sources it
records while they are there unchanged, and otherwise says which checks it did not run (exit 4, or a
failure with --require-complete).

Real files only: the Small and Discrete variants ML-Agents wrote (fixtures/variants), copied so that a
test can move, change or delete them.
"""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import VARIANTS, copy_sources, step_checkpoints

from huggy_convert.cli import main
from huggy_convert.errors import EXIT_INCOMPLETE
from huggy_convert.pipeline import convert_one

SMALL = step_checkpoints(VARIANTS / "small")[-1]
STEM = SMALL.stem
FAST = ("--verify-dtype", "float32")
SMALL_OUTPUTS = "version_number, memory_size, continuous_actions, continuous_action_output_shape, " \
                "deterministic_continuous_actions"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _moved(root):
    """``root/before`` renamed ``root/tree``: a tree moved as a whole (sources and OUT), so the absolute
    paths the reports record are gone and only the paths they record relative to OUT find the sources."""
    (root / "before").rename(root / "tree")
    return root / "tree"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """``src/`` (the sources) and ``out/`` side by side."""
    root = tmp_path_factory.mktemp("small")
    res = convert_one(copy_sources(SMALL, root / "before" / "src"), root / "before" / "out")
    assert res.report.ok, res.report.render()
    return _moved(root)


@pytest.fixture
def tree(converted, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(converted, d)
    return d / "src", d / "out"


def _report(r):
    """``verify --json``'s envelope: the one report (one set) or the list of them (several)."""
    env = json.loads(r.stdout)
    assert env["schema"] == "huggy-convert/verify/1" and env["exit_code"] == r.exit_code and env["errors"] == []
    reps = env["policies"]
    return reps[0] if len(reps) == 1 else reps


def _reverified_record(out):
    return json.loads((out / f"{STEM}.verify.json").read_text())["recorded"]


# --- item 3: checks 1-2 on the recorded sources -------------------------------------------------------
def test_the_report_records_every_file_written_and_the_sources_read(converted):
    rec = json.loads((converted / "out" / f"{STEM}.verify.json").read_text())["recorded"]
    assert set(rec["artifacts"]) == {"safetensors", "onnx", "pt2", "golden"}
    for a in rec["artifacts"].values():
        assert len(a["sha256"]) == 64 and (converted / "out" / a["file"]).is_file()
    ck, off = rec["sources"]["checkpoint"], rec["sources"]["official"]
    assert ck["relative"] == f"../src/{SMALL.name}" and ck["path"].endswith(f"before/src/{SMALL.name}")
    assert off["relative"] == f"../src/{STEM}.onnx"
    assert ck["sha256"] == json.loads((converted / "out" / f"{STEM}.verify.json").read_text())[
        "checks"][0]["figures"]["checkpoint_sha256"]


def test_sources_in_place_rerun_checks_1_and_2(tree):
    src, out = tree
    recorded = _reverified_record(out)
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 0, r.output
    rep = _report(r)
    assert rep["verdict"] == "PASS" and rep["complete"] is True and rep["not_run"] == []
    c1, c2 = rep["checks"][:2]
    assert c1["id"] == "safetensors" and c1["status"] == "pass" and c1["figures"]["checkpoint_sha256"]
    assert c2["id"] == "official" and c2["status"] == "pass" and c2["title"].endswith(f"(official {STEM}.onnx)")
    assert _reverified_record(out) == recorded  # the rewritten report keeps the conversion's record


def test_a_moved_checkpoint_gives_a_labelled_partial_pass(tree, tmp_path):
    src, out = tree
    moved = tmp_path / "elsewhere.pt"
    (src / SMALL.name).rename(moved)
    r = invoke("verify", out, *FAST, "-v")  # -v: the tree
    assert r.exit_code == EXIT_INCOMPLETE == 4, r.output
    assert "\nverdict: PASS (check 1 not run: checkpoint not found), 5/6 checks passed, 1 not run, " in r.stdout
    assert "- 1 safetensors vs checkpoint: not run: checkpoint not found (recorded at " in r.stdout
    assert "✓ 2 rebuilt ONNX vs official" in r.stdout  # the official ONNX is still there: check 2 ran
    assert "verification incomplete" in r.stderr and "check 1 not run: checkpoint not found" in r.stderr
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 4
    rep = _report(r)
    assert rep["complete"] is False and rep["ok"] is True and rep["verdict"].startswith("PASS (")
    assert [(n["check"], n["id"], n["reason"]) for n in rep["not_run"]] == [(1, "safetensors", "checkpoint not found")]
    assert SMALL.name in rep["not_run"][0]["detail"]
    r = invoke("verify", out, *FAST, "--require-complete")
    assert r.exit_code == 1, r.output
    assert "\nverdict: FAIL (check 1 not run: checkpoint not found; --require-complete), 5/6 checks passed, 1 not run, " \
           "first failure: incomplete (check 1 not run: checkpoint not found) and --require-complete" in r.stdout
    assert "verification failed" in r.stderr
    # the report rewritten by these runs still records the sources: named, check 1 is complete again
    r = invoke("verify", out, *FAST, "--checkpoint", moved)
    assert r.exit_code == 0 and "\nverdict: PASS, 6/6 checks passed, " in r.stdout, r.output
    moved.rename(src / SMALL.name)
    r = invoke("verify", out, *FAST, "--require-complete")
    assert r.exit_code == 0 and "\nverdict: PASS, 6/6 checks passed, " in r.stdout, r.output


def test_both_sources_gone_names_checks_1_and_2(tree):
    src, out = tree
    shutil.rmtree(src)
    r = invoke("verify", out, *FAST, "-v")  # -v: the tree
    assert r.exit_code == 4, r.output
    assert "verdict: PASS (checks 1-2 not run: checkpoint not found, official ONNX not found), 4/6 checks passed, 2 not run, " in r.stdout
    assert "golden" in r.stdout  # check 3 against the golden file written at conversion


def test_a_changed_checkpoint_is_not_used(tree):
    """Another file under the recorded name (another sha256) is not taken for the checkpoint: check 1
    is reported not run, naming both hashes, not run against the wrong tensors."""
    src, out = tree
    shutil.copy(step_checkpoints(VARIANTS / "discrete")[-1], src / SMALL.name)
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 4, r.output
    rep = _report(r)
    assert rep["verdict"] == "PASS (check 1 not run: checkpoint changed since the conversion)"
    assert rep["checks"][0]["status"] == "skip" and "recorded" in rep["not_run"][0]["detail"]
    assert rep["checks"][1]["status"] == "pass"
    # the official ONNX changed too: check 2 is not run against it either
    shutil.copy(step_checkpoints(VARIANTS / "discrete")[-1].with_suffix(".onnx"), src / f"{STEM}.onnx")
    r = invoke("verify", out, *FAST)
    assert r.exit_code == 4, r.output
    assert "verdict: PASS (checks 1-2 not run: checkpoint changed since the conversion, official ONNX changed " \
           "since the conversion)" in r.stdout


def test_a_report_without_a_record_is_partial(tree):
    """No <stem>.verify.json (or one written before the record): what the conversion read is unknown."""
    src, out = tree
    (out / f"{STEM}.verify.json").unlink()
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 4, r.output
    rep = _report(r)
    assert rep["verdict"] == "PASS (checks 1-2 not run: no record of its sources)"
    assert rep["not_run"][0]["detail"] == f"no {STEM}.verify.json"
    r = invoke("verify", out, *FAST, "--checkpoint", src / SMALL.name, "--reference", src / f"{STEM}.onnx")
    assert r.exit_code == 0, r.output


def test_a_report_written_before_the_record_is_partial_and_still_checks_the_files(tree):
    """A report of an earlier huggy-convert (no ``recorded``): checks 1-2 not run (what the conversion read
    is unknown); check 6 still compares each file with the sha256 its check 6 recorded."""
    src, out = tree
    p = out / f"{STEM}.verify.json"
    rep = json.loads(p.read_text())
    del rep["recorded"]
    p.write_text(json.dumps(rep))
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 4, r.output
    got = _report(r)
    assert got["verdict"] == "PASS (checks 1-2 not run: no record of its sources)"
    assert "records no sources" in got["not_run"][0]["detail"]
    files = next(c for c in got["checks"] if c["id"] == "files")
    assert {k["title"]: k["status"] for k in files["checks"]}[f"{STEM}.pt2"] == "pass"


# --- item 3: every recorded artifact -----------------------------------------------------------------
@pytest.mark.parametrize("suffix,where", [(".pt2", "6 files"), (".golden.npz", "6 files"),
                                          (".onnx", "2 rebuilt ONNX vs official"),
                                          (".safetensors", "1 safetensors vs checkpoint")])
def test_a_deleted_artifact_fails(tree, suffix, where):
    """(Before issue 23 a deleted .pt2 or golden file gave '3/3 file checks pass', PASS, exit 0; a deleted
    .onnx was bad input, exit 2; a deleted .safetensors hid its set.)"""
    src, out = tree
    (out / f"{STEM}{suffix}").unlink()
    r = invoke("verify", out, *FAST)
    assert r.exit_code == 1, r.output
    line = next(ln for ln in r.stderr.splitlines() if "verification failed" in ln)
    assert where in line and f"{STEM}{suffix}" in line and "missing" in line, line
    # and with the sources gone too: still a failure, not a partial pass
    shutil.rmtree(src)
    assert invoke("verify", out, *FAST).exit_code == 1


def test_an_unreadable_or_changed_artifact_fails(tree):
    src, out = tree
    g = out / f"{STEM}.golden.npz"
    g.write_bytes(b"not a golden file")  # check 3 runs on the official ONNX: check 6 catches it
    r = invoke("verify", out, *FAST)
    assert r.exit_code == 1 and f"6 files › {STEM}.golden.npz: changed since its conversion wrote it" in r.stderr, \
        r.output
    g.unlink()
    g.mkdir()  # not a regular file
    r = invoke("verify", out, *FAST)
    assert r.exit_code == 1 and f"{STEM}.golden.npz: cannot be read" in r.stderr, r.output


# --- item 2: tolerance options that name no output -----------------------------------------------------
@pytest.mark.parametrize("option,value", [("--atol", "determinstic_continuous_actions:1e-3"),
                                          ("--rtol", "nosuchoutput:1e-3"),
                                          ("--cosine", "deterministic_discrete_actions:0.9")])
def test_convert_refuses_a_tolerance_for_no_output_and_writes_nothing(tmp_path, option, value):
    """A typo, or an output of another kind of policy (discrete), is refused before anything is written."""
    out = tmp_path / "out"
    r = invoke(SMALL, out, option, value)
    assert r.exit_code == 2, r.output
    name = value.split(":")[0]
    assert r.stderr.startswith(f"huggy-convert: error: {option} {name}:") and len(r.stderr.splitlines()) == 1
    assert f"not an output of {STEM}" in r.stderr and SMALL_OUTPUTS in r.stderr, r.stderr
    if name.startswith("determinstic"):
        assert "did you mean deterministic_continuous_actions?" in r.stderr
    assert not out.exists()


def test_verify_refuses_a_tolerance_for_no_output_and_rewrites_nothing(tree):
    src, out = tree
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    r = invoke("verify", out, "--atol", "determinstic_continuous_actions:1e-3")
    assert r.exit_code == 2, r.output
    assert "did you mean deterministic_continuous_actions?" in r.stderr and SMALL_OUTPUTS in r.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    r = invoke("verify", out, *FAST, "--atol", "*:1e-3", "--cosine", "deterministic_continuous_actions:0.99")
    assert r.exit_code == 0, r.output  # '*' and a real name are fine


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A folder of two runs (Small: continuous; Discrete) converted as a batch with a tolerance that names
    an output of the Discrete policy only: accepted (it names an output of one of them)."""
    root = tmp_path_factory.mktemp("runs")
    for name in ("small", "discrete"):
        shutil.copytree(VARIANTS / name, root / "before" / "runs" / name)
    r = invoke(root / "before" / "runs", root / "before" / "out", "--atol", "deterministic_discrete_actions:0.5",
               *FAST, "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "huggy-convert: warning: --atol deterministic_discrete_actions: an output of 1 of the 2 policies, not " \
           "of small/Small-4157: applied where it is one" in r.stderr, r.stderr
    return _moved(root)


def test_batch_refuses_a_tolerance_for_an_output_of_none_of_its_policies(two_runs, tmp_path):
    out = tmp_path / "out"
    r = invoke(two_runs / "runs", out, "--atol", "discrete_actionz:1e-3")
    assert r.exit_code == 2, r.output
    assert "an output of none of the 2 policies (did you mean discrete_actions?)" in r.stderr
    assert SMALL_OUTPUTS in r.stderr and "deterministic_discrete_actions" in r.stderr
    assert not out.exists()


def test_verify_out_over_several_sets(two_runs, tmp_path):
    shutil.copytree(two_runs, tmp_path / "copy")
    out, runs = tmp_path / "copy" / "out", tmp_path / "copy" / "runs"
    before = {p: p.read_bytes() for p in out.rglob("*.verify.json")}
    # a name of none of the sets: refused before any report is rewritten
    r = invoke("verify", out, "--rtol", "deterministic_discret_actions:1e-3")
    assert r.exit_code == 2 and "an output of none of the 2 policies" in r.stderr, r.output
    assert {p: p.read_bytes() for p in out.rglob("*.verify.json")} == before
    # a name of one of them: applied there, noted in the other's report
    r = invoke("verify", out, *FAST, "--atol", "deterministic_discrete_actions:0.5", "--jobs", "1", "--json")
    assert r.exit_code == 0, r.output
    assert "an output of 1 of the 2 policies, not of small/Small-4157" in r.stderr
    reps = {rep["subject"].split(" (")[0]: rep for rep in _report(r)}
    assert all(rep["complete"] and rep["verdict"] == "PASS" for rep in reps.values())
    assert any("--atol deterministic_discrete_actions: not an output of this policy" in n
               for n in reps["Small-4157"]["notes"])
    assert all(rep["checks"][0]["status"] == "pass" for rep in reps.values())  # check 1 ran on every set
    # one run's sources gone: that set is partial, the count says so, exit 4; --require-complete: 1
    shutil.rmtree(runs / "discrete")
    r = invoke("verify", out, *FAST, "--jobs", "2")
    assert r.exit_code == 4, r.output
    lines = r.stdout.splitlines()
    assert any(ln.startswith("verify Discrete-4101 (") and ln.endswith(
        ": PASS (checks 1-2 not run: checkpoint not found, official ONNX not found)") for ln in lines), lines
    assert any(ln.startswith("verify Small-4157 (") and ln.endswith(": PASS") for ln in lines), lines
    assert lines[-1].startswith("2 policies: 2 passed (1 with checks not run), 0 failed verification"), lines
    r = invoke("verify", out, *FAST, "--jobs", "1", "--json")
    assert r.exit_code == 4
    reps = {rep["subject"].split(" (")[0]: rep for rep in _report(r)}
    assert reps["Small-4157"]["complete"] and not reps["Discrete-4101"]["complete"]
    assert [n["check"] for n in reps["Discrete-4101"]["not_run"]] == [1, 2]
    r = invoke("verify", out, *FAST, "--require-complete")
    assert r.exit_code == 1 and "Discrete-4101" in r.stderr and "--require-complete" in r.stderr, r.output
    # a deleted .pt2 in one set: that set fails, exit 1
    next(out.rglob("Small-4157.pt2")).unlink()
    r = invoke("verify", out, *FAST)
    assert r.exit_code == 1 and "Small-4157.pt2: missing" in r.stderr, r.output


# --- a malformed record of a source is no record of it (only a real null says the conversion had none) ---
MALFORMED_SOURCE = {
    "not_a_dict": lambda s: "x",
    "a_list": lambda s: [s],
    "no_sha256": lambda s: {k: v for k, v in s.items() if k != "sha256"},
    "sha256_not_a_str": lambda s: dict(s, sha256=5),
    "path_not_a_str": lambda s: dict(s, path=5, relative=None),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_SOURCE))
@pytest.mark.parametrize("role,cid", [("checkpoint", "safetensors"), ("official", "official")])
def test_a_malformed_source_record_leaves_its_check_not_run(kind, role, cid, tree):
    src, out = tree
    p = out / f"{STEM}.verify.json"
    rep = json.loads(p.read_text())
    rep["recorded"]["sources"][role] = MALFORMED_SOURCE[kind](rep["recorded"]["sources"][role])
    p.write_text(json.dumps(rep))
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == EXIT_INCOMPLETE, r.output
    got = _report(r)
    assert [(n["id"], n["reason"]) for n in got["not_run"]] == [(cid, "no record of its sources")], got["not_run"]
    assert f"record of its {role} is malformed" in got["not_run"][0]["detail"], got["not_run"]
    assert got["complete"] is False and got["ok"] is True


def test_malformed_sources_and_a_real_null(tree):
    """``sources`` that is not an object: checks 1-2 not run; a real null (the conversion had no official
    ONNX): check 2 skipped as it was then, the verification complete."""
    src, out = tree
    p = out / f"{STEM}.verify.json"
    rep = json.loads(p.read_text())
    sources = rep["recorded"]["sources"]
    rep["recorded"]["sources"] = [sources]
    p.write_text(json.dumps(rep))
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == EXIT_INCOMPLETE, r.output
    assert [n["id"] for n in _report(r)["not_run"]] == ["safetensors", "official"]
    rep["recorded"]["sources"] = dict(sources, official=None)
    p.write_text(json.dumps(rep))
    r = invoke("verify", out, *FAST, "--json")
    assert r.exit_code == 0, r.output
    got = _report(r)
    assert got["complete"] is True and got["not_run"] == [] and got["checks"][1]["status"] == "skip"
