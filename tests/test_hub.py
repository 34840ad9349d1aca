"""Issue 13: Hugging Face Hub downloads, as ``mlagents-load-from-hf`` leaves them.

Every tree here is built in the test (``hubkit.hub_repo``) from the committed run directories that
ML-Agents' own trainer wrote (fixtures/huggy, fixtures/variants/small): a few of their checkpoints
hard-linked, the Hub's extra files added, the status file's paths spelled as a Colab VM or a Windows
PC wrote them, and Git-LFS pointers in place of files a clone without git-lfs does not download.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import HUGGY_RUN, VARIANTS
from fuzzkit import promise
from hubkit import hub_repo, lfs_pointer, make_pointer
from test_batch import batch as _cli
from test_batch import entries as _entries
from test_batch import manifest as _manifest

SMALL_RUN = VARIANTS / "small"
HUGGY_STEPS = (149956, 245828)
ARTIFACTS = (".safetensors", ".onnx", ".verify.json", ".golden.npz")  # --no-program: no .pt2


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _deployed(out: Path) -> dict:
    return {e["source"]: e for e in _manifest(out)["deployed"]}


def _listed(run: Path) -> dict:
    """{pt name: (behavior, step, reward)} of the committed status file."""
    doc = json.loads((run / "run_logs" / "training_status.json").read_text())
    return {Path(e["auxillary_file_paths"][0]).name: (b, e["steps"], e["reward"])
            for b, v in doc.items() if b != "metadata" for e in v["checkpoints"]}


def _files(out: Path) -> list:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """downloads/ppo-Huggy (Colab paths) and downloads/ppo-Small (Windows paths), converted once."""
    base = tmp_path_factory.mktemp("hub")
    dl = base / "downloads"
    hub_repo(dl / "ppo-Huggy", HUGGY_RUN, steps=HUGGY_STEPS, machine="colab")
    hub_repo(dl / "ppo-Small", SMALL_RUN, machine="windows")
    out = base / "out"
    code, stdout, stderr = _cli(dl, out, "--no-program", "--jobs", "2")
    return dl, out, code, stdout, stderr


# --- several runs: each with its own status file, its own output folder ----------------------------
def test_each_hub_clone_is_a_run_with_its_own_status_file(hub):
    dl, out, code, stdout, stderr = hub
    assert code == 0, stderr
    assert stderr == ""  # the Hub's extra files (events, config.json, README.md, logs, .gitattributes): no warning
    # the status files say what the training machine said
    assert "/content/ml-agents/results/huggy/Huggy/Huggy-149956.pt" in (dl / "ppo-Huggy/run_logs/training_status.json").read_text()
    assert json.loads((dl / "ppo-Small/run_logs/training_status.json").read_text())["Small"]["checkpoints"][0][
        "auxillary_file_paths"] == ["C:\\Users\\me\\ml-agents\\results\\small\\Small\\Small-4157.pt"]
    doc = _manifest(out)
    assert doc["layout"].startswith("out/<run>/<stem>.")
    assert [(r["dir"], r["out"], r["found_by"], r["checkpoints"]) for r in doc["runs"]] == [
        ("ppo-Huggy", "ppo-Huggy", "run_logs/training_status.json", 3),
        ("ppo-Small", "ppo-Small", "run_logs/training_status.json", 2)]
    es = _entries(out)
    for repo, run in (("ppo-Huggy", HUGGY_RUN), ("ppo-Small", SMALL_RUN)):
        for name, (behavior, step, reward) in _listed(run).items():
            e = es[f"{repo}/{behavior}/{name}"]  # source: the checkpoint's path below SOURCE
            assert (e["behavior"], e["step"], e["reward"], e["global_step"]) == (behavior, step, reward, step)
            assert e["listed"] and e["status"] == "ok" and e["verify"]["verdict"] == "PASS"
            assert e["stem"] == f"{repo}/{behavior}-{step}" and e["reference"] == f"{behavior}-{step}.onnx"
            assert {a["file"] for a in e["outputs"].values()} == {f"{repo}/{behavior}-{step}{s}" for s in ARTIFACTS}
            for a in e["outputs"].values():
                assert a["sha256"] == _sha(out / a["file"])
    assert es["ppo-Huggy/Huggy/checkpoint.pt"]["same_as"] == "ppo-Huggy/Huggy-245828"
    assert es["ppo-Small/Small/checkpoint.pt"]["same_as"] == "ppo-Small/Small-4157"
    # the names are the documented ones, and nothing else is written
    assert _files(out) == sorted(["manifest.csv", "manifest.json"] + [f"ppo-Huggy/Huggy-{s}{x}" for s in HUGGY_STEPS
                                                                      for x in ARTIFACTS]
                                 + [f"ppo-Small/Small-4157{x}" for x in ARTIFACTS])
    lines = stdout.splitlines()
    assert lines[0].startswith(f"{dl} -> {out}/: 5 checkpoints in 2 runs (run_logs/training_status.json): "
                               "3 converted, 0 skipped, 0 failed, 2 same as another")
    assert f"  ppo-Huggy/ -> {out / 'ppo-Huggy'}/: 3 checkpoints (run_logs/training_status.json), best reward " \
           f"{_listed(HUGGY_RUN)['Huggy-245828.pt'][2]:.4g} at step 245828" in lines


def test_the_deployed_onnx_is_named_as_the_export_of_its_checkpoint_and_verified(hub):
    dl, out, code, stdout, _ = hub
    root, final, older = (dl / "ppo-Huggy" / "Huggy.onnx", dl / "ppo-Huggy/Huggy/Huggy-245828.onnx",
                          dl / "ppo-Huggy/Huggy/Huggy-149956.onnx")
    assert _sha(root) == _sha(final) != _sha(older)  # what ML-Agents wrote: a copy of the final export
    d = _deployed(out)
    assert sorted(d) == ["ppo-Huggy/Huggy.onnx", "ppo-Small/Small.onnx"]
    h = d["ppo-Huggy/Huggy.onnx"]
    assert (h["behavior"], h["sha256"], h["bytes"], h["final_step"]) == ("Huggy", _sha(root), root.stat().st_size, 245828)
    assert (h["equal_by"], h["equal_to"], h["same_as"], h["same_as_source"], h["step"]) == (
        "bytes", "ppo-Huggy/Huggy/Huggy-245828.onnx", "ppo-Huggy/Huggy-245828", "ppo-Huggy/Huggy/Huggy-245828.pt", 245828)
    assert h["status"] == "ok" and h["verify"]["verdict"] == "PASS" and h["verify"]["checks"] == {"2": "pass", "3": "pass"}
    assert _entries(out)["ppo-Huggy/Huggy/Huggy-245828.pt"]["verify"]["checks"]["2"] == "pass"
    assert d["ppo-Small/Small.onnx"]["same_as_source"] == "ppo-Small/Small/Small-4157.pt"
    assert ("  deployed ppo-Huggy/Huggy.onnx = ppo-Huggy/Huggy/Huggy-245828.onnx (same bytes): the export of "
            "ppo-Huggy/Huggy/Huggy-245828.pt, PASS") in stdout.splitlines()
    assert [x["source"] for x in _manifest(out)["summary"]["deployed"]] == sorted(d)


def test_verify_out_checks_every_run_folder(hub):
    _, out, _, _, _ = hub
    code, stdout, stderr = _cli("verify", out)
    assert code == 0, stderr
    subjects = re.findall(r"^verify (\S+ \(.*\)): PASS", stdout, re.M)  # one line per policy, and a count
    assert subjects == [f"Huggy-{s} ({out / 'ppo-Huggy'})" for s in HUGGY_STEPS] + [f"Small-4157 ({out / 'ppo-Small'})"]
    assert stdout.splitlines()[-1].startswith("3 policies: 3 passed, 0 failed verification, 0 could not be verified")


# --- names: predictable, whatever sits side by side ------------------------------------------------
def test_two_clones_of_one_run_and_a_loose_checkpoint_keep_their_plain_names(tmp_path):
    """The same behavior and steps in two repos: out/<repo>/<Behavior>-<step>.*, not a stem made of
    their paths; a checkpoint in no run directory goes to OUT itself."""
    dl = tmp_path / "downloads"
    hub_repo(dl / "ppo-Small", SMALL_RUN)
    hub_repo(dl / "ppo-Small-2", SMALL_RUN, machine="windows")
    (dl / "mine").mkdir()
    shutil.copyfile(SMALL_RUN / "Small" / "Small-4157.pt", dl / "mine" / "Small-4157.pt")
    out = tmp_path / "out"
    code, stdout, stderr = _cli(dl, out, "--no-verify", "--no-program", "--json")
    assert code == 0, stderr
    es = _entries(out)
    assert sorted((k, e["stem"], e["status"]) for k, e in es.items()) == [
        ("mine/Small-4157.pt", "Small-4157", "ok"),
        ("ppo-Small-2/Small/Small-4157.pt", "ppo-Small-2/Small-4157", "ok"),
        ("ppo-Small-2/Small/checkpoint.pt", None, "same_as"),
        ("ppo-Small/Small/Small-4157.pt", "ppo-Small/Small-4157", "ok"),
        ("ppo-Small/Small/checkpoint.pt", None, "same_as")]
    assert es["mine/Small-4157.pt"]["reward"] is None and es["ppo-Small-2/Small/Small-4157.pt"]["reward"] == \
        _listed(SMALL_RUN)["Small-4157.pt"][2]
    assert _files(out) == sorted(["manifest.csv", "manifest.json"] + [f"{d}Small-4157{x}" for d in
                                                                      ("", "ppo-Small/", "ppo-Small-2/")
                                                                      for x in (".safetensors", ".onnx")])
    assert [(r["dir"], r["out"], r["found_by"]) for r in _manifest(out)["runs"]] == [
        (".", ".", "file names"), ("ppo-Small", "ppo-Small", "run_logs/training_status.json"),
        ("ppo-Small-2", "ppo-Small-2", "run_logs/training_status.json")]
    # one clone under downloads/: out/<stem>.*, as for results/<run-id>/
    one = tmp_path / "one"
    hub_repo(one / "ppo-Small", SMALL_RUN)
    code, _, stderr = _cli(one, tmp_path / "out1", "--no-verify", "--no-program")
    assert code == 0, stderr
    assert sorted(_entries(tmp_path / "out1")) == ["Small/Small-4157.pt", "Small/checkpoint.pt"]
    assert (tmp_path / "out1" / "Small-4157.onnx").is_file()


@pytest.mark.parametrize("spelling", ["C:\\Users\\me\\ml-agents\\results\\small\\Small\\Small-4157.onnx",
                                      "/content/ml-agents/results/small/Small/Small-4157.onnx"])
def test_a_status_file_path_from_the_training_machine_resolves_by_its_base_name(spelling, tmp_path):
    """Only ``file_path`` (the .onnx), spelled by a Windows PC or a Colab VM: the .pt is found by name."""
    from huggy_convert.batch.rundir import discover

    run = hub_repo(tmp_path / "ppo-Small", SMALL_RUN)
    (run / "run_logs" / "training_status.json").write_text(json.dumps(
        {"Small": {"checkpoints": [{"steps": 4157, "file_path": spelling, "reward": 2.5}]}}))
    found = discover(tmp_path)
    step = [(it.rel, it.step, it.reward, it.missing) for it in found.items if it.kind == "step"]
    assert step == [("Small/Small-4157.pt", 4157, 2.5, False)] and found.warnings == []
    assert [d.rel for d in found.runs[0].deployed] == ["Small.onnx"]


# --- Git-LFS pointers ----------------------------------------------------------------------------
def _pointer_line(path: Path, size: int, clone: Path, what: str) -> str:
    return (f"{path}: a Git LFS pointer, not the {what}: its {size:,} bytes were not downloaded (cloned without "
            f"git-lfs?); run 'git lfs pull' in {clone}")


def test_a_clone_without_git_lfs_names_each_pointer_and_the_others_go_on(tmp_path):
    dl = tmp_path / "downloads"
    bare = hub_repo(dl / "ppo-Small", SMALL_RUN,
                    lfs=["Small/Small-4157.pt", "Small/checkpoint.pt", "Small/Small-4157.onnx", "Small.onnx"])
    hub_repo(dl / "ppo-Small-2", SMALL_RUN)
    assert (bare / "Small.onnx").read_bytes() == lfs_pointer((SMALL_RUN / "Small.onnx").read_bytes())
    out = tmp_path / "out"
    code, stdout, stderr = _cli(dl, out, "--no-program", "--json")
    assert code == 1  # some checkpoints failed, others converted
    size = (SMALL_RUN / "Small" / "Small-4157.pt").stat().st_size
    es = _entries(out)
    step_line = _pointer_line(bare / "Small" / "Small-4157.pt", size, bare, "checkpoint")
    assert es["ppo-Small/Small/Small-4157.pt"]["status"] == "error" and es["ppo-Small/Small/Small-4157.pt"]["error"] == step_line
    assert es["ppo-Small/Small/checkpoint.pt"]["error"] == _pointer_line(
        bare / "Small" / "checkpoint.pt", (SMALL_RUN / "Small" / "checkpoint.pt").stat().st_size, bare, "checkpoint")
    deployed_line = _pointer_line(bare / "Small.onnx", (SMALL_RUN / "Small.onnx").stat().st_size, bare, "ONNX model")
    assert _deployed(out)["ppo-Small/Small.onnx"]["error"] == deployed_line
    assert es["ppo-Small-2/Small/Small-4157.pt"]["verify"]["verdict"] == "PASS"
    assert _deployed(out)["ppo-Small-2/Small.onnx"]["status"] == "ok"
    errors = [x for x in stderr.splitlines() if x.startswith("huggy-convert: error: ")]
    assert sorted(errors) == sorted(f"huggy-convert: error: {x}" for x in (
        step_line, es["ppo-Small/Small/checkpoint.pt"]["error"], deployed_line))
    assert not (out / "ppo-Small").exists() or not list((out / "ppo-Small").iterdir())
    s = json.loads(stdout)
    assert s["failed"] == 2 and s["converted"] == 1 and [d["status"] for d in s["deployed"]] == ["error", "ok"]


def test_a_pointer_given_alone_is_one_line_exit_2(tmp_path):
    run = hub_repo(tmp_path / "ppo-Small", SMALL_RUN)
    ckpt, official = run / "Small" / "Small-4157.pt", run / "Small" / "Small-4157.onnx"
    out = tmp_path / "out"
    make_pointer(official)  # the checkpoint is there, its official ONNX is not
    line = promise([ckpt, out], watch=[out, run])
    assert line == "huggy-convert: error: " + _pointer_line(official, (SMALL_RUN / "Small/Small-4157.onnx").stat().st_size,
                                                            run, "reference ONNX")
    make_pointer(ckpt)
    line = promise([ckpt, out], watch=[out, run])
    assert line == "huggy-convert: error: " + _pointer_line(ckpt, (SMALL_RUN / "Small/Small-4157.pt").stat().st_size,
                                                            run, "checkpoint")
    assert "git lfs pull" in promise(["info", ckpt], watch=[run])


# --- the deployed ONNX matched by content, or by nothing -------------------------------------------
def test_a_deployed_onnx_is_matched_by_content_and_another_checkpoints_export_fails(tmp_path):
    """ppo-Small has lost its step ONNX: the deployed file is matched by checks 2-3 against the rebuilt
    one. ppo-Huggy holds step 245828 but deploys step 149956's export (ML-Agents' own file): it is the
    export of none of the checkpoints beside it, a failed verification."""
    dl = tmp_path / "downloads"
    small = hub_repo(dl / "ppo-Small", SMALL_RUN)
    (small / "Small" / "Small-4157.onnx").unlink()
    huggy = hub_repo(dl / "ppo-Huggy", HUGGY_RUN, steps=[245828])
    (huggy / "Huggy.onnx").unlink()
    shutil.copyfile(HUGGY_RUN / "Huggy" / "Huggy-149956.onnx", huggy / "Huggy.onnx")
    out = tmp_path / "out"
    code, stdout, stderr = _cli(dl, out, "--no-program")
    assert code == 1, stderr
    d = _deployed(out)
    s = d["ppo-Small/Small.onnx"]
    assert (s["status"], s["equal_by"], s["same_as_source"], s["equal_to"]) == (
        "ok", "content", "ppo-Small/Small/Small-4157.pt", "ppo-Small/Small-4157.onnx")
    assert s["verify"]["checks"] == {"2": "pass", "3": "pass"}
    assert _entries(out)["ppo-Small/Small/Small-4157.pt"]["reference"] is None  # no official ONNX beside it
    h = d["ppo-Huggy/Huggy.onnx"]
    assert h["status"] == "verify_failed" and h.get("same_as") is None
    assert h["error"].startswith("ppo-Huggy/Huggy.onnx: the export of none of the Huggy checkpoints beside it "
                                 "(1 compared: not the bytes of their official ONNX, and checks 2-3 fail")
    assert "initializers" in h["error"]
    assert f"huggy-convert: verification failed: {h['error']}" in stderr.splitlines()
    assert _entries(out)["ppo-Huggy/Huggy/Huggy-245828.pt"]["verify"]["verdict"] == "PASS"
    assert "  deployed ppo-Small/Small.onnx = the export of ppo-Small/Small/Small-4157.pt (same content: checks 2-3 " \
           "against its rebuilt ONNX), PASS" in stdout.splitlines()
