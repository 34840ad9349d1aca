"""Issue 5: a whole ML-Agents run directory converted, exported and verified in one command.

Real files only: the committed run directory fixtures/huggy (its training_status.json, step
checkpoints with their official ONNX, checkpoint.pt), copies of it, and run directories built by
benchmarks/batch.py from the committed variants (perturbed copies saved with torch.save).
"""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import HUGGY_RUN, ROOT, VARIANTS, run_cli, step_checkpoints

from huggy_convert.core.version import __version__
from huggy_convert.batch.manifest import MANIFEST_CSV, MANIFEST_JSON
from huggy_convert.cli import main

ARTIFACT_SUFFIXES = (".safetensors", ".onnx", ".pt2", ".verify.json", ".golden.npz")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_batch", ROOT / "benchmarks" / "batch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _status(run: Path) -> dict:
    return json.loads((run / "run_logs" / "training_status.json").read_text())


def _listed(run: Path):
    """(behavior, step, reward, pt name) of every checkpoint training_status.json lists."""
    out = []
    for b, v in _status(run).items():
        if b == "metadata":
            continue
        for e in v["checkpoints"]:
            out.append((b, e["steps"], e["reward"], Path(e["auxillary_file_paths"][0]).name))
    return out


def batch(*args):
    """The real command, in-process; returns (exit code, stdout, stderr)."""
    res = CliRunner().invoke(main, [str(a) for a in args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST_JSON).read_text())


def entries(out: Path) -> dict:
    return {e["source"]: e for e in manifest(out)["checkpoints"]}


def artifacts(out: Path) -> dict:
    return {p.name: _sha(p) for p in sorted(out.iterdir()) if p.name.endswith(ARTIFACT_SUFFIXES)}


@pytest.fixture(scope="module")
def huggy_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("batch") / "out"
    code, stdout, stderr = batch(HUGGY_RUN, out, "--json", "--jobs", "2")
    return out, code, json.loads(stdout), stderr


# --- the committed run directory ----------------------------------------------------------------
def test_run_dir_every_listed_checkpoint_with_its_step_reward_and_verdict(huggy_out):
    out, code, summary, stderr = huggy_out
    assert code == 0, stderr
    listed = _listed(HUGGY_RUN)
    assert listed and len(listed) == len(step_checkpoints(HUGGY_RUN))
    es = entries(out)
    doc = manifest(out)
    assert doc["tool"]["version"] == __version__ and doc["found_by"] == "run_logs/training_status.json"
    host = doc["host"]  # where the figures were computed
    assert host["cpu"] and host["torch"] and host["onnxruntime"] and "isa" in host and "mkl_cbwr" in host
    for behavior, step, reward, name in listed:
        e = es[f"{behavior}/{name}"]
        src = HUGGY_RUN / behavior / name
        assert (e["behavior"], e["step"], e["reward"], e["global_step"]) == (behavior, step, reward, step)
        assert e["source_sha256"] == _sha(src) and e["status"] == "ok" and e["run"] == "converted"
        assert e["tool_version"] == __version__ and e["seconds"] > 0
        assert e["reference"] == f"{src.stem}.onnx"  # its own official ONNX
        v = e["verify"]
        assert v["verdict"] == "PASS" and v["checks"] == {"1": "pass", "2": "pass", "3": "pass", "4": "pass",
                                                          "5": "pass", "6": "pass"}
        assert v["safetensors_bitwise"][0] == v["safetensors_bitwise"][1] > 0
        assert v["onnx_initializers_bitwise"][0] == v["onnx_initializers_bitwise"][1] > 0
        assert v["outputs_bitwise"][0] == v["outputs_bitwise"][1] > 0
        assert v["module_max_abs"]["cpu float32"] is not None
        assert 0 < v["max_bound_ratio"] < 1  # every float32 runtime within its derived bound
        # the .pt2: run through torch.export.load (the newest: full profile), or (the batch profile) its
        # bytes are torch.export.save's for the policy read back from the .safetensors
        if name == step_checkpoints(HUGGY_RUN)[-1].name:
            assert any(k.startswith("saved program") for k in v["module_max_abs"]) and e["profile"] == "full"
        else:
            assert v["files"][f"{src.stem}.pt2 from {src.stem}.safetensors"] == "pass" and e["profile"] == "batch"
        assert all(status == "pass" for status in v["files"].values()) and len(v["files"]) >= 3
        # the divisor decision: ML-Agents folded these on MKL's generic sqrt path, 1 ulp off IEEE in places
        d = e["divisor"]
        assert d["mode"] == "auto" and d["source"] == "official" and d["reference"] == f"{src.stem}.onnx"
        assert d["observations"]["0"]["max_ulp"] == 1 and d["summary"].startswith("adopted from the official ONNX")
        for kind, a in e["outputs"].items():
            assert a["sha256"] == _sha(out / a["file"]), kind
        assert sorted(a["file"] for a in e["outputs"].values()) == sorted(f"{src.stem}{s}" for s in ARTIFACT_SUFFIXES)
        rep = json.loads((out / f"{src.stem}.verify.json").read_text())
        assert rep["verdict"] == "PASS" and rep["checks"][1]["title"].endswith(f"(official {src.stem}.onnx)")
    best = max(listed, key=lambda x: x[2])
    assert (summary["best_reward"], summary["best_step"]) == (best[2], best[1])
    assert summary["converted"] == len(listed) and summary["failed"] == 0 and summary["skipped"] == 0
    assert summary["warnings"] == []  # the .pt2 weight swap reproduced torch.export.save


def test_checkpoint_pt_is_recognised_as_the_newest_step(huggy_out):
    out, _, summary, _ = huggy_out
    newest = step_checkpoints(HUGGY_RUN)[-1]
    e = entries(out)["Huggy/checkpoint.pt"]
    assert e["status"] == "same_as" and e["same_as"] == newest.stem and e["stem"] is None
    assert e["source_sha256"] == _sha(HUGGY_RUN / "Huggy" / "checkpoint.pt") != _sha(newest)
    assert summary["same_as"] == 1
    assert not list(out.glob("*checkpoint*"))  # not converted twice


def test_profiles_newest_full_others_batch(huggy_out):
    out, _, _, _ = huggy_out
    ckpts = step_checkpoints(HUGGY_RUN)
    es = entries(out)
    newest = es[f"Huggy/{ckpts[-1].name}"]
    assert newest["profile"] == "full"
    assert set(newest["verify"]["module_max_abs"]) >= {"cpu float32", "cpu float16", "cpu bfloat16"}
    assert set(newest["verify"]["fingerprints"]) == {"64", "128"}
    for c in ckpts[:-1]:
        e = es[f"Huggy/{c.name}"]
        assert e["profile"] == "batch" and "cpu float16" not in e["verify"]["module_max_abs"]
        rep = json.loads((out / f"{c.stem}.verify.json").read_text())
        assert any("batch verification profile" in n for n in rep["notes"])
    # the batch profile's 16-step fingerprints (the reference's read off the 16 probe rows' forward):
    # what the files give, computed afresh
    from huggy_convert.converter import load_policy
    from huggy_convert.runtime import ort_run, ort_session
    from huggy_convert.verify.fingerprints import fingerprint, reference_fingerprint

    c = ckpts[0]
    pol = load_policy(out / f"{c.stem}.safetensors")
    fps = json.loads((out / f"{c.stem}.verify.json").read_text())["checks"][4]["figures"]["fingerprints"]
    sess = ort_session((out / f"{c.stem}.onnx").read_bytes())
    assert list(fps) == ["16"] and fps["16"]["reference"] == reference_fingerprint(pol, 16, 0)
    assert fps["16"]["onnxruntime_rebuilt"] == fingerprint(lambda f: ort_run(sess, f), pol, 16, 0)


def test_artifacts_equal_a_single_conversion(huggy_out, tmp_path):
    """The .pt2 of later checkpoints is the traced archive with its weights swapped: byte-identical
    to what torch.export.save writes for that checkpoint alone."""
    out, _, _, _ = huggy_out
    for c in step_checkpoints(HUGGY_RUN):
        code, _, err = batch(c, tmp_path / "single", "--no-verify")
        assert code == 0, err
        for s in (".safetensors", ".onnx", ".pt2"):
            assert _sha(tmp_path / "single" / f"{c.stem}{s}") == _sha(out / f"{c.stem}{s}"), (c.name, s)


def test_the_batch_program_writer_writes_what_torch_export_save_writes():
    """A batch's .pt2 (traced once per architecture, the graph serialized once, torch's archive
    writer) is byte for byte what a fresh trace of that checkpoint alone gives with torch.export.save,
    and torch.export.load reads that checkpoint's weights back from it."""
    import io
    from dataclasses import replace

    import numpy as np
    import torch

    from huggy_convert import contract as C
    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.exporters.pt2 import ProgramWriter

    a, b = (convert_checkpoint(c).policy for c in step_checkpoints(HUGGY_RUN)[-2:])
    fast = ProgramWriter(fast=True)
    fa, fb = fast.program_bytes(a), fast.program_bytes(b)
    alone = ProgramWriter(fast=False).program_bytes(b)  # its own trace, torch.export.save
    assert fa != fb and fb == alone and not fast.notes
    ep = torch.export.load(io.BytesIO(fb))
    assert ep.state_dict["mu.bias"].numpy().tobytes() == b.tensors[C.C_MU_B].tobytes()
    # check 6 asks again for the policy read back (bitwise-equal tensors: the bytes just written); a
    # policy 1 ulp away in one weight, or changed in place since, gets its own program
    def copy(p, **change):
        return replace(p, tensors=dict({k: v.copy() for k, v in p.tensors.items()}, **change))

    assert fast.program_bytes(copy(b)) == fb
    w = b.tensors[C.C_MU_B].copy()
    w[0] = np.nextafter(w[0], np.float32(np.inf))
    c = copy(b, **{C.C_MU_B: w})
    fc = fast.program_bytes(c)
    assert fc != fb and torch.export.load(io.BytesIO(fc)).state_dict["mu.bias"].numpy().tobytes() == w.tobytes()
    w[0] = b.tensors[C.C_MU_B][0]  # c is b again, changed in place
    assert fast.program_bytes(c) == fb and fast.program_bytes(copy(c)) == fb


def test_manifest_csv_has_a_row_per_checkpoint(huggy_out):
    out, _, _, _ = huggy_out
    rows = list(csv.DictReader((out / MANIFEST_CSV).open()))
    es = entries(out)
    assert [r["source"] for r in rows] == [e["source"] for e in manifest(out)["checkpoints"]]
    for r in rows:
        e = es[r["source"]]
        assert r["source_sha256"] == e["source_sha256"] and r["status"] == e["status"]
        if e["status"] == "ok":
            assert int(r["step"]) == e["step"] and float(r["reward"]) == e["reward"] and r["verdict"] == "PASS"
            assert r["pt2_sha256"] == e["outputs"]["pt2"]["sha256"]


def test_rerun_skips_force_redoes_and_a_damaged_output_is_redone(huggy_out, tmp_path):
    src_out, _, _, _ = huggy_out
    out = tmp_path / "out"
    shutil.copytree(src_out, out)
    before = artifacts(out)
    code, stdout, err = batch(HUGGY_RUN, out, "--json")
    s = json.loads(stdout)
    assert code == 0, err
    assert (s["converted"], s["skipped"], s["failed"]) == (0, len(_listed(HUGGY_RUN)) + 1, 0)
    assert all(e["run"] == "skipped" for e in entries(out).values())
    assert artifacts(out) == before
    # a damaged output: only that checkpoint is redone, to the same bytes
    victim = step_checkpoints(HUGGY_RUN)[0]
    (out / f"{victim.stem}.onnx").write_bytes(b"damaged")
    code, stdout, err = batch(HUGGY_RUN, out, "--json")
    s = json.loads(stdout)
    assert code == 0 and s["converted"] == 1 and entries(out)[f"Huggy/{victim.name}"]["run"] == "converted"
    assert artifacts(out) == before
    code, stdout, err = batch(HUGGY_RUN, out, "--json", "--force")
    s = json.loads(stdout)
    assert code == 0 and s["converted"] == len(_listed(HUGGY_RUN)) and s["skipped"] == 0
    assert artifacts(out) == before


def test_a_checkpoint_pt_that_matches_no_step_is_converted_as_its_own_entry(tmp_path):
    import torch

    run = tmp_path / "run"
    shutil.copytree(HUGGY_RUN, run)
    ck = torch.load(run / "Huggy" / "checkpoint.pt", map_location="cpu", weights_only=True)
    w = "action_model._continuous_distribution.mu.bias"
    ck["Policy"][w] = ck["Policy"][w] + 1e-3
    torch.save(ck, run / "Huggy" / "checkpoint.pt")
    out = tmp_path / "out"
    code, stdout, err = batch(run, out, "--json", "--no-program")
    assert code == 0, err
    e = entries(out)["Huggy/checkpoint.pt"]
    assert e["status"] == "ok" and e["stem"] == "Huggy-checkpoint" and "matches no step" in e["note"]
    assert e["global_step"] == int(step_checkpoints(HUGGY_RUN)[-1].stem.rsplit("-", 1)[1])
    assert e["verify"]["verdict"] == "PASS" and (out / "Huggy-checkpoint.safetensors").is_file()
    assert json.loads(stdout)["same_as"] == 0


# --- discovery ------------------------------------------------------------------------------------
def test_without_training_status_the_file_names_give_the_steps(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HUGGY_RUN, run)
    shutil.rmtree(run / "run_logs")
    out = tmp_path / "out"
    code, stdout, err = batch(run, out, "--json", "--no-program")
    assert code == 0, err
    doc = manifest(out)
    assert doc["found_by"] == "file names" and doc["training_status"] is None
    es = entries(out)
    for c in step_checkpoints(HUGGY_RUN):
        e = es[f"Huggy/{c.name}"]
        assert e["step"] == int(c.stem.rsplit("-", 1)[1]) == e["global_step"] and e["reward"] is None
        assert e["behavior"] == "Huggy" and e["verify"]["verdict"] == "PASS" and not e["listed"]
    assert es["Huggy/checkpoint.pt"]["same_as"] == step_checkpoints(HUGGY_RUN)[-1].stem


def test_the_behavior_folder_finds_the_run_logs_above_it(tmp_path):
    out = tmp_path / "out"
    code, stdout, err = batch(HUGGY_RUN / "Huggy", out, "--json", "--no-verify", "--no-program")
    assert code == 0, err
    es = entries(out)
    for behavior, step, reward, name in _listed(HUGGY_RUN):
        assert (es[f"{behavior}/{name}"]["step"], es[f"{behavior}/{name}"]["reward"]) == (step, reward)


def test_several_behaviors_keep_unique_stems(tmp_path):
    """Two behaviors in one run directory: flat OUT, stems are <Behavior>-<step>."""
    run = tmp_path / "run"
    status = {}
    for v in ("small", "twoobs"):
        for d in (VARIANTS / v).iterdir():
            if d.is_dir() and d.name != "run_logs":
                shutil.copytree(d, run / d.name)
        status.update({k: x for k, x in _status(VARIANTS / v).items() if k != "metadata"})
    (run / "run_logs").mkdir()
    (run / "run_logs" / "training_status.json").write_text(json.dumps(status))
    out = tmp_path / "out"
    code, stdout, err = batch(run, out, "--json", "--no-program")
    assert code == 0, err
    s = json.loads(stdout)
    assert s["converted"] == 2 and s["same_as"] == 2
    for behavior, step, reward, name in _listed(run):
        e = entries(out)[f"{behavior}/{name}"]
        assert e["step"] == step and e["verify"]["verdict"] == "PASS"
        assert (out / f"{behavior}-{step}.safetensors").is_file()


# --- failures -------------------------------------------------------------------------------------
def test_a_corrupt_checkpoint_does_not_stop_the_others(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HUGGY_RUN, run)
    ckpts = step_checkpoints(run)
    bad = ckpts[0]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 3])
    out = tmp_path / "out"
    code, stdout, err = batch(run, out, "--json", "--no-program")
    assert code == 1
    s = json.loads(stdout)
    assert s["failed"] == 1 and s["converted"] == len(ckpts) - 1 and not s["ok"]
    e = entries(out)[f"Huggy/{bad.name}"]
    assert e["status"] == "error" and "not a readable torch checkpoint" in e["error"] and "\n" not in e["error"]
    assert str(bad) in e["error"]
    assert s["failures"] == [{"source": f"Huggy/{bad.name}", "error": e["error"]}]
    assert f"huggy-convert: error: {e['error']}" in err.splitlines()
    for c in ckpts[1:]:
        assert entries(out)[f"Huggy/{c.name}"]["verify"]["verdict"] == "PASS"
    assert not (out / f"{bad.stem}.safetensors").exists()


def test_a_verification_failure_exits_1(tmp_path):
    """A checkpoint whose official ONNX is another checkpoint's: check 2 fails, exit 1."""
    run = tmp_path / "run"
    shutil.copytree(HUGGY_RUN, run)
    a, b = step_checkpoints(run)[:2]
    shutil.copyfile(b.with_suffix(".onnx"), a.with_suffix(".onnx"))
    a.with_suffix(".golden.npz").unlink(missing_ok=True)
    out = tmp_path / "out"
    code, stdout, err = batch(run, out, "--json", "--no-program")
    assert code == 1
    e = entries(out)[f"Huggy/{a.name}"]
    assert e["status"] == "verify_failed" and e["verify"]["verdict"] == "FAIL" and e["verify"]["checks"]["2"] == "fail"
    assert (out / f"{a.stem}.safetensors").is_file()  # artifacts kept, the report says why
    assert f"verification failed: {a.stem}" in err
    assert entries(out)[f"Huggy/{b.name}"]["status"] == "ok"


def test_nothing_convertible_exits_2(tmp_path):
    run = tmp_path / "run"
    (run / "B").mkdir(parents=True)
    (run / "B" / "B-10.pt").write_bytes(b"not a checkpoint")
    code, stdout, err = batch(run, tmp_path / "out", "--json")
    assert code == 2 and json.loads(stdout)["failed"] == 1


def test_an_empty_directory_exits_2_with_one_line(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    code, stdout, err = batch(d, tmp_path / "out")
    assert code == 2
    assert err.strip().splitlines() == [f"huggy-convert: error: {d}: no ML-Agents checkpoints (.pt files) or SB3 model zips in this directory"]
    assert not (tmp_path / "out").exists()


# --- resumable: a real SIGKILL ----------------------------------------------------------------------
def _signal_after(run: Path, out: Path, entries: int, send):
    """Start a batch of ``run`` into ``out`` (2 workers, its own process group, a manifest after every
    checkpoint) and ``send(process)`` once the manifest lists ``entries`` checkpoints; returns the
    process and how many the manifest listed then (stderr is a pipe, stdout discarded)."""
    env = dict(os.environ, HUGGY_CONVERT_MANIFEST_INTERVAL="0")
    p = subprocess.Popen([sys.executable, "-m", "huggy_convert.cli", str(run), str(out), "--jobs", "2"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    deadline, seen = time.monotonic() + 120, 0
    while time.monotonic() < deadline and p.poll() is None:
        try:
            seen = len(manifest(out)["checkpoints"])
        except (OSError, ValueError):
            seen = 0
        if seen >= entries:
            send(p)
            break
        time.sleep(0.005)
    return p, seen


def test_sigkill_then_rerun_gives_byte_identical_artifacts_and_no_tmp(tmp_path):
    run = tmp_path / "results" / "small"
    _bench().build_run(run, count=24, source=VARIANTS / "small")
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    r = run_cli(run, whole, "--json", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["checkpoints"] == 25 and s["converted"] == 24 and s["same_as"] == 1

    p, killed_with = _signal_after(run, resumed, 3, lambda p: os.kill(p.pid, signal.SIGKILL))
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert 3 <= killed_with < 25
    (resumed / ".Small-1007.onnx.k1ll3d.tmp").write_bytes(b"half a file")  # what a kill mid-write leaves
    (resumed / ".notes.tmp").write_bytes(b"the user's")  # not a name the tool writes: it stays
    (resumed / ".draft.onnx.x1y2z3.tmp").write_bytes(b"the user's")
    r = run_cli(run, resumed, "--json", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["skipped"] >= 2 and s["failed"] == 0
    assert sum(e["run"] in ("converted", "skipped", "checked") for e in manifest(resumed)["checkpoints"]) == 25
    assert artifacts(resumed) == artifacts(whole) and len(artifacts(whole)) == 24 * len(ARTIFACT_SUFFIXES)
    assert sorted(p.name for p in resumed.iterdir() if p.name.endswith(".tmp")) == [".draft.onnx.x1y2z3.tmp",
                                                                                     ".notes.tmp"]
    users = {".draft.onnx.x1y2z3.tmp", ".notes.tmp"}
    assert sorted(p.name for p in resumed.iterdir() if p.name not in users) == sorted(p.name for p in whole.iterdir())

    # Ctrl-C (SIGINT to the process group, as a terminal sends it to the parent and its workers):
    # one line, exit 130, no temporary file, each stem written is a whole set with the right bytes
    stopped = tmp_path / "stopped"
    p, _ = _signal_after(run, stopped, 3, lambda p: os.killpg(p.pid, signal.SIGINT))
    err = p.communicate(timeout=60)[1].decode()
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "huggy-convert: error: interrupted", err
    assert not [q.name for q in stopped.iterdir() if q.name.endswith(".tmp")]
    got = artifacts(stopped)
    stems = {n.split(".")[0] for n in got}
    assert 3 <= len(stems) < 24 and len(got) == len(stems) * len(ARTIFACT_SUFFIXES)
    assert all(whole_sha == got[n] for n, whole_sha in artifacts(whole).items() if n in got)


def test_a_worker_that_dies_fails_its_task_in_one_line_and_is_replaced():
    from huggy_convert.batch.workers import PROCESSES, Pool

    with Pool(2, {"base": 10}) as pool:
        assert pool.mode == PROCESSES
        got = sorted(pool.run([(_task, (i,)) for i in range(6)]))
        pids = pool.pids()
    assert [g[:2] for g in got] == [(0, True), (1, True), (2, False), (3, True), (4, True), (5, False)]
    assert got[0][2] == 10 and got[4][2] == 14
    assert got[2][2] == "a worker process died (killed by signal SIGKILL) while it had this checkpoint; " \
                        "its files were not written"
    assert got[5][2].startswith("internal error: ValueError: no 5")
    assert len(pids) == 2 and os.getpid() not in pids


def test_a_worker_interrupted_twice_finishes_what_the_first_interrupt_began(tmp_path):
    """Ctrl-C reaches the worker and the parent, whose ``close(interrupted=True)`` sends one more:
    the second SIGINT is ignored, so what the task does on the first (its set's rollback) runs to
    the end; the worker then exits 130."""
    from huggy_convert.batch.workers import PROCESSES, Pool

    marker = tmp_path / "rolled-back"
    with Pool(2, {}) as pool:
        assert pool.mode == PROCESSES
        got = list(pool.run([(_interrupted_twice, (str(marker),))]))
    assert got == [(0, False, "a worker process died (exit 130) while it had this checkpoint; "
                               "its files were not written")]
    assert marker.read_text() == "rolled back"


def test_a_worker_whose_interrupt_a_library_swallowed_exits_130_when_its_task_ends(tmp_path):
    """Library code that swallows the one ``KeyboardInterrupt`` (later SIGINTs are ignored) does not
    leave the worker waiting for tasks, the parent waiting for it: the task runs to its end, its
    result is not sent, the worker exits 130."""
    from huggy_convert.batch.workers import Pool

    marker = tmp_path / "ran to its end"
    with Pool(2, {}) as pool:
        got = list(pool.run([(_swallowed, (str(marker),))]))
    assert got == [(0, False, "a worker process died (exit 130) while it had this checkpoint; "
                               "its files were not written")]
    assert marker.read_text() == "done"


def _swallowed(marker):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        pass  # as a library's catch-all would
    os.kill(os.getpid(), signal.SIGINT)  # ignored
    Path(marker).write_text("done")
    return "not sent"


def _interrupted_twice(marker):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the KeyboardInterrupt comes here
    except KeyboardInterrupt:
        os.kill(os.getpid(), signal.SIGINT)  # the parent's: it must not cut this short
        time.sleep(0.2)
        Path(marker).write_text("rolled back")
        raise
    raise AssertionError("not interrupted")


def _task(i):
    from huggy_convert.batch.workers import shared

    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 5:
        raise ValueError("no 5")
    return shared()["base"] + i


# --- verify OUT/ over the pool ----------------------------------------------------------------------
def test_verify_dir_with_jobs_gives_the_verdicts_of_jobs_1_and_a_worker_catches_a_flipped_bit(huggy_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(huggy_out[0], out)
    reports = {}
    for jobs in ("1", "2"):
        code, stdout, stderr = batch("verify", out, "--jobs", jobs, "--json")
        assert code == 0, stderr
        reports[jobs] = json.loads(stdout)["policies"]  # one envelope, the reports under "policies"
    strip = lambda r: (r["subject"], r["verdict"], [(c["id"], c["status"]) for c in r["checks"]])  # noqa: E731
    assert [strip(r) for r in reports["1"]] == [strip(r) for r in reports["2"]] and len(reports["1"]) == 2
    # one line per policy and a count; the batch profile recorded for the older one
    code, stdout, stderr = batch("verify", out, "--jobs", "2")
    assert code == 0 and stdout.splitlines() == [
        f"verify Huggy-149956 ({out}): PASS (batch profile)", f"verify Huggy-245828 ({out}): PASS",
        "2 policies: 2 passed, 0 failed verification, 0 could not be verified (2 worker processes)"], stdout
    p = out / "Huggy-149956.pt2"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    code, stdout, stderr = batch("verify", out, "--jobs", "2")
    assert code == 1
    assert stdout.splitlines()[0].startswith(f"verify Huggy-149956 ({out}): FAIL: 6 files") and "PASS" in stdout
    assert f"huggy-convert: verification failed: Huggy-149956 ({out}): 6 files" in stderr

