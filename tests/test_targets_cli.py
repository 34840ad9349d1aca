"""The deploy targets through the real CLI (issue 27): ``convert --targets onnx,<target>`` writes the target's
files in the same set, check 4 runs its runtime against the float64 reference within the derived float32 bound
(twice, bitwise), check 6 records its files; ``verify OUT/`` regenerates them from the ``.safetensors`` and
compares the bytes (a flipped byte fails); a missing extra is one line, exit 2, nothing written.

A target whose extra is not importable here is skipped with the line saying what to install (each extra has
its own environment: docs/targets.md); the missing-extra tests run everywhere (the extra's modules hidden)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, family_step, run_cli, variant_ckpt
from huggy_convert.contract import targets as T
from huggy_convert.core.artifacts import TARGET_KINDS
from huggy_convert.exporters import targets as X


def _needs(target):
    line = X.missing(target)
    if line:
        pytest.skip(line)


def _report(out: Path, stem: str) -> dict:
    return json.loads((out / f"{stem}.verify.json").read_text())


def _check(rep: dict, cid: str) -> dict:
    return next(c for c in rep["checks"] if c.get("id") == cid)


def _converted(target, ck: Path, out: Path):
    p = run_cli("convert", ck, out, "--targets", f"onnx,{target}", "--verify-dtype", "float32")
    assert p.returncode == 0, p.stdout + p.stderr
    stem = ck.stem
    files = {k: out / f"{stem}{s}" for k, s in TARGET_KINDS[target].items()}
    assert all(f.is_file() and f.stat().st_size > 0 for f in files.values()), sorted(x.name for x in out.iterdir())
    assert not (out / f"{stem}.pt2").exists()  # --targets onnx,<target>: no program
    rep = _report(out, stem)
    assert rep["ok"] is True
    (run,) = [c for c in _check(rep, "runtimes")["checks"] if c["title"].startswith(f"{target}:")]
    assert run["status"] == "pass" and run["figures"]["dtype"] == "float32", run
    ratio = run["figures"]["max_bound_ratio"]  # None: argmax outputs only (each pick as the reference's)
    assert (0 < ratio <= 1) if ratio is not None else \
        all(" equal" in c["summary"] for c in run["checks"] if c["title"] != "two runs bitwise"), run
    twice = next(c for c in run["checks"] if c["title"] == "two runs bitwise")
    assert twice["status"] == "pass", twice
    recorded = rep["recorded"]["artifacts"]
    for k, f in files.items():  # check 6's record: each file's sha256, as on disk
        assert recorded[k]["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    return stem, files


def _reverified(out: Path, stem: str, files):
    p = run_cli("verify", out)
    assert p.returncode == 0, p.stdout + p.stderr
    c6 = _check(_report(out, stem), "files")
    for f in files.values():
        same = [c for c in c6["checks"] if c["title"].startswith(f.name)]
        assert [c["status"] for c in same] == ["pass", "pass"], same  # as written, and as regenerated
        assert any("from" in c["title"] for c in same)


@pytest.mark.parametrize("target", T.TARGETS)
def test_convert_with_a_target_then_verify_out_and_a_flipped_byte(target, tmp_path):
    _needs(target)
    out = tmp_path / "out"
    stem, files = _converted(target, variant_ckpt("small"), out)
    _reverified(out, stem, files)
    # where the extra is missing, verify OUT/ still checks the recorded sha256 and is a partial PASS (exit 4)
    p = _hidden(target, "verify", out)
    assert p.returncode == 4 and f"check 4 not run: {target} not installed" in p.stderr, p.stdout + p.stderr
    c6 = _check(_report(out, stem), "files")
    assert [c["status"] for c in c6["checks"] if c["title"] == list(files.values())[0].name] == ["pass"]
    last = list(files.values())[-1]  # OpenVINO: the .bin
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x01
    last.write_bytes(bytes(data))
    p = run_cli("verify", out)
    assert p.returncode == 1, p.stdout + p.stderr
    c6 = _check(_report(out, stem), "files")  # the rewritten report: check 6 fails on that file
    bad = {c["title"]: c["summary"] for c in c6["checks"] if c["status"] == "fail"}
    assert c6["status"] == "fail" and "changed since its conversion wrote it" in bad[last.name], bad


@pytest.mark.parametrize("target", T.TARGETS)
def test_huggy_with_a_target(target, tmp_path, huggy_ckpt):
    _needs(target)
    out = tmp_path / "out"
    stem, files = _converted(target, huggy_ckpt, out)
    _reverified(out, stem, files)


# one fixture of each family: vector, visual, attention, LSTM, discrete, hybrid, goal-conditioned
FAMILIES = {"visual_simple": "family", "attention": "family", "lstm": "variant", "discrete": "variant",
            "hybrid": "variant", "goal_hyper": "family"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("target", T.TARGETS)
def test_every_family_with_a_target(target, name, tmp_path):
    """Converted and verified, then ``verify OUT/`` in another process (whose check 4 reads and compiles the
    files before check 6 regenerates them: a converter naming nodes by a process-wide counter shows here)."""
    _needs(target)
    ck = family_step(name)[0] if FAMILIES[name] == "family" else variant_ckpt(name)
    out = tmp_path / "out"
    stem, files = _converted(target, ck, out)
    _reverified(out, stem, files)


def _hidden(target, *args):
    """The real CLI in a fresh interpreter where ``target``'s modules are not found (its extra missing)."""
    code = ("import importlib.util as u, sys; real = u.find_spec; "
            f"u.find_spec = lambda n, *a: None if n in {T.MODULES[target]!r} else real(n, *a); "
            "sys.argv = ['huggy-convert'] + sys.argv[1:]; from huggy_convert.cli import entry; entry()")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=600)


@pytest.mark.parametrize("target", T.TARGETS)
def test_a_missing_extra_is_one_line_exit_2_and_nothing_written(target, tmp_path):
    ck = variant_ckpt("small")
    for src in (ck, ck.parent.parent):  # a checkpoint, a run directory
        out = tmp_path / f"out-{src.name}"
        p = _hidden(target, "convert", src, out, "--targets", f"onnx,pt2,{target}")
        assert p.returncode == 2, p.stdout + p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pip install 'huggy-convert[{target}]'" in lines[0], p.stderr
        assert not out.exists()


def test_an_unknown_target_is_a_usage_error(tmp_path):
    p = run_cli("convert", variant_ckpt("small"), tmp_path / "out", "--targets", "onnx,tensorrt")
    assert p.returncode == 2 and "tensorrt: not a target" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_benchmark_reports_a_missing_extra_as_a_skipped_row():
    p = _hidden(T.LITERT, "benchmark", variant_ckpt("small"), "--targets", "litert", "--batch", "1",
                "--iters", "3", "--warmup", "0", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["runtime"]: r for r in json.loads(p.stdout)["timings"]["rows"]}
    assert set(rows) == {"torch", "onnxruntime", "litert"}
    assert "pip install 'huggy-convert[litert]'" in rows["litert"]["skipped"]
    assert rows["torch"]["batches"]["1"]["p50_ms"] > 0


@pytest.mark.parametrize("target", T.TARGETS)
def test_benchmark_times_an_installed_target(target):
    _needs(target)
    p = run_cli("benchmark", variant_ckpt("small"), "--targets", target, "--batch", "1", "--batch", "4",
                "--iters", "5", "--warmup", "1", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["runtime"]: r for r in json.loads(p.stdout)["timings"]["rows"]}
    assert set(rows) == {"torch", "onnxruntime", target}
    assert rows[target]["outputs_finite"] is True and set(rows[target]["batches"]) == {"1", "4"}
    assert rows[target]["batches"]["1"]["p50_ms"] > 0
