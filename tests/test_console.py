"""Issue 23 item 4: output never decides the exit code.

Every command runs on a console that cannot encode the tree (``PYTHONIOENCODING=cp1252``, what
``> log.txt`` gives on Windows; ``ascii``; ``LANG=C LC_ALL=C``) with the same exit code and the same
files (names and bytes) as on UTF-8, a run directory and an output folder whose names are not ASCII
among them; what the console cannot take is printed as an ASCII fallback (``|-``, ``ok``) or escaped.

One interpreter per console runs the whole command table through ``cli.main`` (an interpreter start
per command would be ~60 starts), its stdout and stderr the real pipes of that encoding, plus one
``python -m huggy_convert.cli`` per console (the console script's own exit, its last flush included).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, VARIANTS, step_checkpoints

SMALL_RUN = VARIANTS / "small"
SMALL = step_checkpoints(SMALL_RUN)[-1]
SMALL_ONNX = SMALL.with_suffix(".onnx")
RUN = "run-прогон-✓-é"  # copied into each console's folder: a run directory whose path is not ASCII
RUN_OUT = "out-вывод-é"

# every command of the CLI group, the smallest inputs (paths relative to the console's folder)
COMMANDS = {
    "convert": [[str(SMALL), "one", "--no-program"],  # one checkpoint: the tree
                [RUN, RUN_OUT, "--jobs", "1", "--no-program"],  # a run directory
                [str(SMALL_ONNX), "fromonnx", "--no-program"]],  # an ONNX alone
    "verify": [["verify", "one", "-v"]],  # -v: the tree, its marks the console may not encode
    "to-checkpoint": [["to-checkpoint", "fromonnx/Small-4157.safetensors", "ckpt"]],
    "info": [["info", RUN]],
    "act": [["act", str(SMALL)]],
    "sample": [["sample", str(SMALL)]],
    "batch-sizes": [["batch-sizes", str(SMALL), "--sizes", "1,2", "--repeats", "1"]],
    "precision": [["precision", str(SMALL), "--rows", "4"]],
    "onnx-compare": [["onnx-compare", str(SMALL), "--rows", "4"]],
    "fingerprint": [["fingerprint", str(SMALL), "--steps", "4"]],
    "stats": [["stats", str(SMALL), "--steps", "4", "--rows", "2"]],
    "benchmark": [["benchmark", str(SMALL), "--warmup", "0", "--iters", "1", "--batch", "1"]],
    "export": [["export", str(SMALL), "-o", "x.onnx", "--rows", "4"]],
    "matrix": [["matrix", str(SMALL), "--out", "m", "--only", "1.2"]],
    "check": [["check", str(SMALL_ONNX)],  # the table's marks, which a cp1252 console cannot encode
              ["check", str(SMALL_ONNX.parents[3] / "dynamo" / "Hybrid-4191.onnx")]],  # exit 1, the findings
}
# what legitimately differs between two runs on the same console, dropped from the files compared: the
# timings (seconds, latencies) and the reports' sha256 (a report records where its sources were)
TIMINGS = {"seconds", "ms_per_checkpoint", "total_s", "timings", "report_sha256"}

DRIVER = r"""
import json, os, sys
from huggy_convert.cli import main
codes = []
for args in json.load(open(sys.argv[1])):
    try:  # each argument as the interpreter decodes its own argv (the file system encoding, surrogateescape)
        main.main(args=[os.fsdecode(bytes.fromhex(a)) for a in args], prog_name="huggy-convert")
        codes.append(0)
    except SystemExit as e:
        codes.append(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
json.dump(codes, open(sys.argv[2], "w"))
"""

CONSOLES = {
    "utf8": {"PYTHONIOENCODING": "utf-8"},
    "cp1252": {"PYTHONIOENCODING": "cp1252"},
    "ascii": {"PYTHONIOENCODING": "ascii"},
    "C": {"LANG": "C", "LC_ALL": "C"},
}


def _env(console: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8", "LANG", "LC_ALL",
                                                               "LC_CTYPE")}
    env.update(CONSOLES[console])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _run(console: str, base: Path) -> dict:
    where = base / console
    where.mkdir()
    shutil.copytree(SMALL_RUN, where / RUN)
    table = [args for runs in COMMANDS.values() for args in runs]
    (base / f"{console}.json").write_text(json.dumps([[os.fsencode(a).hex() for a in args] for args in table]))
    env = _env(console)
    r = subprocess.run([sys.executable, "-c", DRIVER, str(base / f"{console}.json"), str(base / f"{console}.codes")],
                       cwd=where, env=env, capture_output=True, timeout=600)
    entry = subprocess.run([sys.executable, "-m", "huggy_convert.cli", str(SMALL), RUN_OUT + "-entry", "--no-program"],
                           cwd=where, env=env, capture_output=True, timeout=300)
    codes = json.loads((base / f"{console}.codes").read_text()) if (base / f"{console}.codes").exists() else None
    return {"rc": r.returncode, "codes": codes, "stdout": r.stdout, "stderr": r.stderr, "entry": entry,
            "files": _files(where)}


def _files(where: Path) -> dict:
    out = {}
    for p in sorted(where.rglob("*")):
        rel = p.relative_to(where)
        if rel.parts[0] == RUN or not p.is_file():
            continue
        out[str(rel)] = _without_timings(p)
    return out


def _without_timings(p: Path):
    data = p.read_bytes()
    if p.name in ("manifest.json", "matrix.json"):
        def drop(o):
            if isinstance(o, dict):
                return {k: drop({a: b for a, b in v.items() if a != "sha256"} if k == "report" and isinstance(v, dict) else v)
                        for k, v in o.items() if k not in TIMINGS and "latency" not in k}
            return [drop(v) for v in o] if isinstance(o, list) else o
        return drop(json.loads(data))
    if p.name.endswith(".verify.json"):  # where the sources were: each console converts its own copy of the run
        rep = json.loads(data)
        for src in rep.get("recorded", {}).get("sources", {}).values():
            src.pop("path", None), src.pop("relative", None)
        return rep
    if p.name == "manifest.csv":
        rows = [line.split(",") for line in data.decode().splitlines()]
        cols = [i for i, h in enumerate(rows[0]) if h not in TIMINGS]
        return [[r[i] for i in cols if i < len(r)] for r in rows]
    if p.name == "matrix.log":
        return [line.split("| latency")[0] for line in data.decode().splitlines() if "latency" not in line[:10]]
    return data


@pytest.fixture(scope="module")
def consoles(tmp_path_factory):
    base = tmp_path_factory.mktemp("consoles")
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(CONSOLES, pool.map(lambda c: _run(c, base), CONSOLES)))
    return runs


def test_the_table_has_every_command():
    import click

    from huggy_convert.cli import main

    with click.Context(main) as ctx:
        names = set(main.list_commands(ctx))
    assert names == set(COMMANDS), names ^ set(COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("console", [c for c in CONSOLES if c != "utf8"])
def test_every_command_on_a_console_that_cannot_encode_the_tree(console, consoles):
    base, run = consoles["utf8"], consoles[console]
    table = [" ".join(a) for runs in COMMANDS.values() for a in runs]
    assert base["rc"] == 0 and base["codes"] is not None, base["stderr"].decode("utf-8", "replace")[-3000:]
    assert all(c in (0, 1) for c in base["codes"]), list(zip(table, base["codes"]))
    err = run["stderr"].decode("ascii", "replace")
    assert run["rc"] == 0 and run["codes"] is not None, err[-3000:]
    assert run["codes"] == base["codes"], [(t, a, b) for t, a, b in zip(table, base["codes"], run["codes"]) if a != b]
    assert "internal error" not in err and "Traceback" not in err, err[-3000:]
    assert run["files"].keys() == base["files"].keys(), set(run["files"]) ^ set(base["files"])
    differ = [k for k in base["files"] if run["files"][k] != base["files"][k]]
    assert differ == [], differ
    out = run["stdout"]
    if console != "C":  # LANG=C: Python's UTF-8 mode, the tree as it is
        assert "├" not in out.decode(CONSOLES[console]["PYTHONIOENCODING"], "replace")
        assert b"|- ok 1 safetensors" in out and b"verdict: PASS" in out
    e = run["entry"]
    assert e.returncode == base["entry"].returncode == 0, e.stderr.decode("ascii", "replace")[-2000:]
    assert b"verdict: PASS" in e.stdout and e.stderr == b"", e.stderr[-2000:]


@pytest.mark.slow
def test_a_closed_pipe_or_a_full_disk_is_not_the_exit_code(tmp_path):
    """stdout gone (``| head`` that has exited, ``> /dev/full``): the verdict's exit code, the files written;
    one warning line for the full disk, none for the closed pipe."""
    env = _env("utf8")
    read, write = os.pipe()
    os.close(read)
    p = subprocess.run([sys.executable, "-m", "huggy_convert.cli", str(SMALL), "pipe", "--no-program"], cwd=tmp_path,
                       env=env, stdout=write, stderr=subprocess.PIPE, timeout=300)
    os.close(write)
    assert p.returncode == 0 and p.stderr == b"", p.stderr[-2000:]
    assert json.loads((tmp_path / "pipe" / f"{SMALL.stem}.verify.json").read_text())["ok"]
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "huggy_convert.cli", str(SMALL), "full", "--no-program"],
                               cwd=tmp_path, env=env, stdout=full, stderr=subprocess.PIPE, timeout=300)
        lines = p.stderr.decode().splitlines()
        assert p.returncode == 0 and len(lines) == 1 and os.strerror(errno.ENOSPC) in lines[0], p.stderr[-2000:]


def test_fallbacks_are_ascii_and_only_where_needed():
    from huggy_convert.console import FALLBACKS, printable

    assert all(v.isascii() for v in FALLBACKS.values())
    line = "├─ ✓ 1 … →\u00e9 \u4e2d \udce9"
    assert printable(line, "utf-8") == "├─ ✓ 1 … →\u00e9 \u4e2d \\udce9"  # a lone surrogate (a non-UTF-8 file name)
    assert printable(line, "cp1252") == "|- ok 1 … ->\u00e9 \\u4e2d \\udce9"  # cp1252 has … and é
    assert printable(line, "ascii") == "|- ok 1 ... ->\\xe9 \\u4e2d \\udce9"


def test_a_display_that_fails_after_the_files_are_written_is_not_the_exit_code(tmp_path, monkeypatch):
    """The files are written and the verdict decided before anything is printed: a display that then
    fails (a renderer's bug, the ONNX the ATC advice reads gone: -v prints that advice) is one warning
    line, and the exit code is the verdict the written .verify.json records."""
    from click.testing import CliRunner

    from huggy_convert.cli import main
    from huggy_convert.pipeline import ConvertResult

    def broken(self):
        raise RuntimeError("the display broke")

    monkeypatch.setattr(ConvertResult, "atc", broken)
    r = CliRunner().invoke(main, [str(SMALL), str(tmp_path / "out"), "--no-program", "-v"])
    assert r.exit_code == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "warning" in lines[0] and "the display broke" in lines[0], lines
    assert json.loads((tmp_path / "out" / f"{SMALL.stem}.verify.json").read_text())["ok"]


def test_a_step_line_shows_on_a_terminal_only_and_the_next_output_erases_it(monkeypatch):
    import io

    from huggy_convert import console

    class Tty(io.StringIO):
        def isatty(self):
            return True

    for tty in (True, False):
        err, out = (Tty() if tty else io.StringIO()), io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(sys, "stdout", out)
        with console.guard():
            console.step("converting X.pt")
            print("verdict: PASS")
            console.step("left on the line at the end")
        if tty:
            assert err.getvalue() == ("huggy-convert: converting X.pt ..." + console.ERASE
                                      + "huggy-convert: left on the line at the end ..." + console.ERASE)
        else:
            assert err.getvalue() == ""
        assert out.getvalue() == "verdict: PASS\n"
