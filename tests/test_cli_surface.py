"""Issue 25: the command line where users are.

- concise by default: a conversion prints what it read, what it wrote and one verdict line with the
  worst figure, last (at most 12 lines); the tree on failure and with -v; -q the verdict only;
- one JSON envelope for every command's ``--json``, validated against the schema shipped in
  ``huggy_convert/schemas/<command>.json`` (errors included);
- an unknown command named at once, before torch is imported, with the nearest commands;
- help true to behaviour: each integer option's stated range is its type's, every command's summary a
  whole sentence, and what ``export --help`` says of an ONNX input is what it does.
"""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import ROOT, VARIANTS, run_cli, step_checkpoints

from huggy_convert.cli import main
from huggy_convert.cli import render
from huggy_convert.cli.group import LAZY

DYNAMO = Path(__file__).resolve().parents[1] / "fixtures" / "dynamo" / "Hybrid-4191.onnx"
from huggy_convert.cli.options import range_text

jsonschema = pytest.importorskip("jsonschema")

SMALL_RUN = VARIANTS / "small"
SMALL = step_checkpoints(SMALL_RUN)[-1]
SCHEMAS = ROOT / "huggy_convert" / "schemas"


def _commands():
    with click.Context(main) as ctx:
        return {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}


# --- unknown commands, the default conversion ----------------------------------------------------
DRIVER = r"""
import sys, time
t0 = time.process_time()  # CPU time: the same on a loaded machine
from huggy_convert.cli import main
try:
    main.main(args=sys.argv[1:], prog_name="huggy-convert")
except SystemExit as e:
    print(e.code, "torch" in sys.modules, round(time.process_time() - t0, 3), file=sys.stderr)
"""


def _refused(*args):
    r = subprocess.run([sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    *lines, last = r.stderr.strip().splitlines()
    code, torch_loaded, seconds = last.split()
    return int(code), torch_loaded == "True", float(seconds), lines, r.stdout


def test_the_lazy_table_names_every_command():
    from huggy_convert.cli import convert, modes

    assert {c.name: m.__name__.rsplit(".", 1)[1] for m in (convert, modes) for c in m.COMMANDS} == LAZY


@pytest.mark.parametrize("args, line", [
    (["inof", "X.pt"], "huggy-convert: error: no such command 'inof'. Did you mean 'info'?"),
    (["verfy", "out/"], "huggy-convert: error: no such command 'verfy'. Did you mean 'verify'?"),
    (["batch", "X.pt"], "huggy-convert: error: no such command 'batch' (renamed 'batch-sizes'; a run directory "
                        "converts as 'huggy-convert RUN_DIR OUT/')"),
    (["missing.pt", "out/"], "huggy-convert: error: missing.pt: no such file or directory (and no command of that name)"),
])
def test_an_unknown_command_is_named_at_once_before_torch(args, line):
    code, torch_loaded, seconds, lines, out = _refused(*args)
    assert (code, lines, out) == (2, [line], "")
    assert not torch_loaded and seconds < 0.5, seconds


def test_an_unknown_command_with_json_is_the_usage_envelope():
    code, torch_loaded, _, lines, out = _refused("inof", "X.pt", "--json")
    d = json.loads(out)
    jsonschema.validate(d, json.loads((SCHEMAS / "usage.json").read_text()))
    assert code == d["exit_code"] == 2 and not d["ok"] and "'inof'" in d["error"] and not torch_loaded


def test_the_default_conversion_takes_an_existing_path_and_options_first(tmp_path):
    r = CliRunner().invoke(main, ["-q", str(SMALL), str(tmp_path / "o"), "--no-program"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [r.stdout.strip()] and r.stdout.startswith("verdict: PASS, ")


# --- concise by default ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def huggy_outputs(tmp_path_factory):
    """One Huggy conversion printed three ways (-q, default, -v) and one that fails (a tolerance no
    runtime meets)."""
    base = tmp_path_factory.mktemp("huggy")
    ck = step_checkpoints(ROOT / "fixtures" / "huggy")[-1]
    runs = {}
    for how, extra in (("default", []), ("quiet", ["-q"]), ("verbose", ["--verbose"]),
                       ("failing", ["--atol", "1e-30", "--rtol", "0", "--verify-dtype", "float32"])):
        runs[how] = run_cli(ck, base / how, *extra)
    return ck, base, runs


def test_a_default_conversion_prints_at_most_12_lines_the_verdict_last(huggy_outputs):
    ck, base, runs = huggy_outputs
    r = runs["default"]
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    short = [x.replace(str(base), "OUT").replace(str(ck.parent), "RUN") for x in lines]  # paths are the user's
    assert len(lines) <= 12 and all(len(x) <= 120 for x in short), lines
    assert lines[0] == f"read {ck} (step 245828) and its official ONNX {ck.stem}.onnx"
    assert any(x.startswith(f"wrote {base / 'default'}/{ck.stem}.") for x in lines), lines
    assert re.fullmatch(r"verdict: PASS, 6/6 checks passed, worst error/bound [0-9.e-]+ float32 \(float16 [0-9.e-]+, "
                        r"bfloat16 [0-9.e-]+\), [0-9.]+ s", lines[-1]), lines[-1]
    rep = json.loads((base / "default" / f"{ck.stem}.verify.json").read_text())  # the report keeps the whole tree
    assert render.worst_figure(rep) in lines[-1]
    assert "atc" not in r.stdout and "├─" not in r.stdout


def test_quiet_prints_the_verdict_only_and_verbose_everything(huggy_outputs):
    _, _, runs = huggy_outputs
    q, v, d = runs["quiet"], runs["verbose"], runs["default"]
    assert q.returncode == v.returncode == 0
    untimed = [x.rsplit(", ", 1)[0] for x in q.stdout.splitlines()]  # the seconds differ run to run
    assert untimed == [d.stdout.splitlines()[-1].rsplit(", ", 1)[0]] and untimed[0].startswith("verdict: PASS, ")
    vl = v.stdout.splitlines()
    assert "├─ ✓ 1 safetensors vs checkpoint" in v.stdout and "Ascend ATC (opset 9" in v.stdout
    assert "divisor: " in v.stdout and "wrote " in v.stdout and vl[-1].startswith("verdict: PASS, 6/6 checks passed")
    assert len(vl) > 40


def test_a_failure_prints_the_tree_and_the_first_failure_last(huggy_outputs):
    _, _, runs = huggy_outputs
    r = runs["failing"]
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stderr
    assert any(x.startswith("├─ ✗ 4 runtimes") for x in lines), lines
    assert lines[-1].startswith("verdict: FAIL, ") and "first failure: 4 runtimes" in lines[-1], lines[-1]


def test_verify_is_concise_too(huggy_outputs):
    ck, base, _ = huggy_outputs
    r = run_cli("verify", base / "default")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"verify {ck.stem} ({base / 'default'})"
    assert r.stdout.splitlines()[-1].startswith("verdict: PASS, 6/6 checks passed, worst error/bound")
    assert len(r.stdout.splitlines()) == 2
    tree = run_cli("verify", base / "default", "-v").stdout
    assert "├─ ✓ 1 safetensors" in tree and "└─ ✓ 6 files" in tree


def test_a_batch_without_a_terminal_prints_progress_at_a_steady_interval(tmp_path, monkeypatch):
    """Every 10 s by default (``render.PROGRESS_INTERVAL``; the tests' conftest turns them off through
    ``HUGGY_CONVERT_PROGRESS_INTERVAL=0``, here 1 ms: a tick however fast the machine converts); -q: none."""
    assert render.PROGRESS_INTERVAL == 10.0
    monkeypatch.setenv(render.PROGRESS_ENV, "0.001")
    r = CliRunner().invoke(main, [str(SMALL_RUN), str(tmp_path / "o"), "--jobs", "1", "--no-program"])
    assert r.exit_code == 0, r.output
    ticks = [x for x in r.stderr.splitlines() if x.startswith("huggy-convert: converting ")]
    assert ticks and all(re.fullmatch(r"huggy-convert: converting \d+ checkpoints: \d+/\d+ done, \d+ s", x)
                         for x in ticks), r.stderr
    r = CliRunner().invoke(main, [str(SMALL_RUN), str(tmp_path / "q"), "--jobs", "1", "--no-program", "-q"])
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert len(r.stdout.splitlines()) == 1 and " 1 converted, 0 skipped, 0 failed, " in r.stdout, r.stdout


def test_a_terminal_sees_the_step_within_a_second(tmp_path):
    """On a terminal, a line naming the step before torch is imported; erased by the output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pty
        os.environ["PYTHONPATH"] = str(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "huggy_convert.cli", str(SMALL), str(tmp_path / "o"),
                                  "--no-program", "-q"])
    t0, first, out = time.monotonic(), None, b""
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        try:
            chunk = os.read(fd, 4096) if ready else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        first = first if first is not None else time.monotonic() - t0
        out += chunk
    os.waitpid(pid, 0)
    text = out.decode()
    assert text.startswith("huggy-convert: loading convert"), text
    assert first < 1.0, first
    assert "huggy-convert: converting " in text and "\r\x1b[K" in text and "verdict: PASS" in text


# --- one JSON envelope, the shipped schemas -------------------------------------------------------
def _json_table(here: Path):
    s = str(SMALL)
    return [
        ("convert", [s, "one", "--no-program"]), ("convert", [str(here / "run"), "runout", "--jobs", "1", "--no-program"]),
        ("convert", [s, "bad", "--atol", "nosuch:1"]),
        ("verify", ["verify", "one"]), ("verify", ["verify", "runout"]), ("verify", ["verify", "nothing-here"]),
        ("to-checkpoint", ["to-checkpoint", f"one/{SMALL.stem}.safetensors", "ckpt"]),
        ("info", ["info", str(here / "run")]), ("act", ["act", s]), ("sample", ["sample", s]),
        ("batch-sizes", ["batch-sizes", s, "--sizes", "1,2", "--repeats", "1"]),
        ("precision", ["precision", s, "--rows", "4"]), ("onnx-compare", ["onnx-compare", s, "--rows", "4"]),
        ("fingerprint", ["fingerprint", s, "--steps", "4"]), ("stats", ["stats", s, "--steps", "4", "--rows", "2"]),
        ("benchmark", ["benchmark", s, "--warmup", "0", "--iters", "1", "--batch", "1"]),
        ("export", ["export", s, "-o", "x.onnx", "--rows", "4"]), ("export", ["export", s, "--opset", "16"]),
        ("matrix", ["matrix", "--list"]), ("matrix", ["matrix", s, "--out", "m", "--only", "1.2"]),
        ("check", ["check", str(SMALL.with_suffix(".onnx"))]), ("check", ["check", str(DYNAMO)]),
        ("check", ["check", str(here / "nope.onnx")]),
        ("usage", ["inof", s]),
    ]


@pytest.mark.slow
def test_every_command_json_validates_against_its_shipped_schema(tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(SMALL_RUN, tmp_path / "run")
    table = _json_table(tmp_path)
    assert {c for c, _ in table} == set(LAZY) | {"usage"}
    assert {p.stem for p in SCHEMAS.glob("*.json")} == set(LAZY) | {"usage"}
    seen = set()
    for command, args in table:
        r = CliRunner().invoke(main, args + ["--json"])
        assert r.stdout.strip(), (args, r.exit_code, r.stderr[-1000:])
        d = json.loads(r.stdout)  # one JSON document on stdout, whatever the outcome
        schema = json.loads((SCHEMAS / f"{command}.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.validate(d, schema, cls=jsonschema.Draft202012Validator)
        assert d["schema"] == f"huggy-convert/{command}/1" and d["exit_code"] == r.exit_code, (args, d)
        assert d["ok"] == (r.exit_code == 0)
        seen.add((command, "error" in d))
    assert ("verify", True) in seen and ("convert", True) in seen and ("export", True) in seen
    one = json.loads(CliRunner().invoke(main, ["verify", "one", "--json"]).stdout)
    many = json.loads(CliRunner().invoke(main, ["verify", "runout", "--json"]).stdout)
    assert one.keys() == many.keys() and len(one["policies"]) == 1  # one policy or several: the same shape


def test_the_schemas_ship_as_package_data():
    cfg = (ROOT / "setup.cfg").read_text()
    assert re.search(r"\[options\.package_data\]\s+huggy_convert = schemas/\*\.json", cfg)


# --- help true to behaviour -----------------------------------------------------------------------
RANGE = re.compile(r"(\d+)\.\.(2\^63-1|\d+)")


def test_each_integer_option_states_the_range_it_accepts():
    checked = 0
    for name, cmd in _commands().items():
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            stated = RANGE.findall(p.help or "")
            if isinstance(p.type, click.IntRange):
                assert stated, (name, p.opts, p.help)
                lo, hi = stated[0]
                assert (int(lo), 2 ** 63 - 1 if hi == "2^63-1" else int(hi)) == (p.type.min, p.type.max), (name, p.opts)
                assert not p.type.min_open and not p.type.max_open
                checked += 1
            elif p.opts == ["--sizes"]:  # a list of integers, each a row count: checked in the command's body
                assert stated[0] == tuple(range_text(click.IntRange(1, 1 << 16)).split(".."))
            else:
                assert not stated, (name, p.opts, p.help)
    assert checked >= 15


@pytest.mark.parametrize("value, code", [("8", 2), ("16", 2), ("9", None), ("15", None)])
def test_opset_refuses_outside_its_stated_range_before_any_work(value, code, tmp_path):
    r = CliRunner().invoke(main, ["convert", str(SMALL), str(tmp_path / "o"), "--opset", value, "--no-verify",
                                  "--no-program", "-q"])
    assert r.exit_code == (code or 0), r.output
    if code:
        assert "9<=x<=15" in r.stderr and not (tmp_path / "o").exists()


def test_every_command_summary_is_a_whole_sentence():
    text = CliRunner().invoke(main, ["--help"]).stdout
    rows = text.split("Commands:", 1)[1].splitlines()
    for name, cmd in _commands().items():
        assert cmd.short_help and cmd.short_help.endswith(".") and cmd.short_help[0].isupper(), name
        assert any(row.split() and row.split()[0] == name and row.rstrip().endswith(cmd.short_help) for row in rows), name
    assert "..." not in text.split("Commands:", 1)[1]


def test_export_writes_an_onnx_input_at_another_opset_as_its_help_says(tmp_path):
    help_text = " ".join(CliRunner().invoke(main, ["export", "--help"]).stdout.split())
    assert "so any opset of --opset can be written from it too" in help_text
    r = CliRunner().invoke(main, ["export", str(SMALL.with_suffix(".onnx")), "--opset", "13", "-o",
                                  str(tmp_path / "x.onnx"), "--rows", "4"])
    assert r.exit_code == 0, r.output
    import onnx

    assert onnx.load(str(tmp_path / "x.onnx")).opset_import[0].version == 13


def test_quiet_and_verbose_before_the_command_name_are_the_command_s(huggy_outputs):
    _, base, _ = huggy_outputs
    r = CliRunner().invoke(main, ["-q", "verify", str(base / "default")])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1 and r.stdout.startswith("verdict: PASS, "), r.output
    assert CliRunner().invoke(main, ["-v", "info", str(SMALL)]).stderr.startswith("huggy-convert: error: No such option")


def test_verbose_is_an_option_not_a_suggestion(tmp_path):
    for cmd in (["convert", str(SMALL), str(tmp_path / "o")], ["verify", str(tmp_path / "o")]):
        r = CliRunner().invoke(main, cmd + ["--help"])
        assert "-v, --verbose" in r.stdout and "-q, --quiet" in r.stdout
