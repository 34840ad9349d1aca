"""What installing promises, kept true: setup.cfg's floors are the pins CI's floors step installs
(constraints-floors.txt), its Pythons the ones .ci/run tests, the README's test command is .ci/run's
first command; ``python -m huggy_convert`` and the console script's shell completion work."""
from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQ = re.compile(r"^([A-Za-z0-9_.-]+)\s*(==|>=)\s*([0-9][0-9A-Za-z.]*)$")


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    return cfg


def _requirements(text: str):
    """(name, operator, version) of each requirement line (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = REQ.match(line)
            assert m, f"not a plain floor or pin: {line!r}"
            out.append((m.group(1).lower(), m.group(2), m.group(3)))
    return out


def _ci_script() -> str:
    return (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_setup_cfg_floors_are_the_pins_ci_installs():
    declared = _requirements(_setup_cfg()["options"]["install_requires"])
    pinned = _requirements((ROOT / "constraints-floors.txt").read_text(encoding="utf-8"))
    assert [n for n, _, _ in declared] == [n for n, _, _ in pinned]
    for (name, op, version), (_, pin_op, pin) in zip(declared, pinned):
        assert op == ">=", f"{name}: setup.cfg declares a floor, not {op}"
        # a pin here is the floor there; torch keeps its range (CI runs the torch the machines have)
        assert version == pin, f"{name}: setup.cfg says >={version}, constraints-floors.txt {pin_op}{pin}"
    assert {n for n, op, _ in pinned if op == "=="} == {"onnx", "onnxruntime", "numpy", "safetensors", "click"}
    assert "-c constraints-floors.txt" in _ci_script()


def test_python_versions_declared_are_the_ones_ci_runs():
    m = re.search(r'^PYTHONS="([0-9. ]+)"', _ci_script(), re.M)
    assert m, ".ci/run names the Pythons it tests in PYTHONS=\"...\""
    tested = m.group(1).split()
    cfg = _setup_cfg()
    classified = re.findall(r"Programming Language :: Python :: (3\.\d+)", cfg["metadata"]["classifiers"])
    assert classified == tested
    assert cfg["options"]["python_requires"].strip() == ">=" + tested[0]


def test_readme_test_command_is_ci_first_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    test_cmd = next(b for b in blocks if "pytest" in b)
    commands = [ln for ln in _ci_script().splitlines()
                if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert commands[0] == test_cmd


def test_python_m_huggy_convert():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "huggy_convert", "--help"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Usage: huggy-convert" in r.stdout and "verify" in r.stdout
    r = subprocess.run([sys.executable, "-m", "huggy_convert", "--version"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("huggy-convert, version ")


def _script() -> Path:
    script = Path(sys.executable).parent / "huggy-convert"
    if not script.is_file():
        pytest.skip("no huggy-convert console script beside this interpreter (pip install -e . installs one)")
    return script


def test_shell_completion_as_the_readme_says():
    """``eval "$(_HUGGY_CONVERT_COMPLETE=bash_source huggy-convert)"`` (README): the script, then what it
    asks for on a TAB: the commands, an option."""
    script = _script()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert '_HUGGY_CONVERT_COMPLETE=bash_source huggy-convert' in readme

    def run(**extra):
        r = subprocess.run([str(script)], capture_output=True, text=True, env=dict(env, **extra), timeout=120)
        assert r.returncode == 0 and not r.stderr, r.stderr
        return r.stdout

    assert "_huggy_convert_completion()" in run(_HUGGY_CONVERT_COMPLETE="bash_source")
    words = run(_HUGGY_CONVERT_COMPLETE="bash_complete", COMP_WORDS="huggy-convert ver", COMP_CWORD="1")
    assert words.split() == ["plain,verify"]
    words = run(_HUGGY_CONVERT_COMPLETE="bash_complete", COMP_WORDS="huggy-convert export --ops", COMP_CWORD="2")
    assert words.split() == ["plain,--opset"]
