"""The bad-input promise, checked the same way for every fuzz case (tests/test_fuzz_*.py).

README: a bad input (a file, an option, an environment) ends in exactly one stderr line
``huggy-convert: error: <file>: <reason>`` of bounded length, exit 2, no traceback, nothing of the
user's changed, no temporary left behind, and no code from any file run.

``promise(args, watch=[...], marker=...)`` runs the CLI in-process (click's runner: no interpreter
start per case) and asserts all of it; ``promise_subprocess`` does the same in a real process with a
timeout (for cases that could hang or need a real exit). Cases are generated from the committed
fixtures at test time.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

from click.testing import CliRunner

MAX_LINE = 600  # characters of the one error line (a message quotes no unbounded input)
PREFIX = "huggy-convert: error: "


def snapshot(paths: Iterable[Path]) -> Dict[str, Optional[str]]:
    """name -> sha256 (or a marker for what is not a regular file) of everything below ``paths``."""
    out: Dict[str, Optional[str]] = {}
    for root in paths:
        root = Path(root)
        if not root.exists() and not root.is_symlink():
            out[str(root)] = None
            continue
        items = [root] if not root.is_dir() or root.is_symlink() else sorted(root.rglob("*"))
        for p in items:
            if p.is_symlink():
                out[str(p)] = f"-> {os.readlink(p)}"
            elif p.is_file():
                try:
                    h = hashlib.sha256()
                    with open(p, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 20), b""):
                            h.update(chunk)
                    out[str(p)] = h.hexdigest()
                except OSError as exc:
                    out[str(p)] = f"unreadable {exc.errno}"
            elif p.is_dir():
                out[str(p)] = "dir"
            else:
                out[str(p)] = "special"
    return out


def temporaries(paths: Iterable[Path]) -> list:
    found = []
    for root in paths:
        root = Path(root)
        if root.is_dir() and not root.is_symlink():
            found += [str(p) for p in root.rglob("*.tmp")]
    return found


def check_line(stderr: str, stdout: str = "", where: str = "") -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1, f"{where}: stderr has {len(lines)} lines:\n{stderr[:3000]}"
    line = lines[0]
    assert line.startswith(PREFIX), f"{where}: {line[:500]}"
    assert len(line) <= MAX_LINE, f"{where}: {len(line)} characters: {line[:300]}…"
    assert "Traceback" not in stderr + stdout, f"{where}: traceback"
    return line


def _kept(where: str, rc: int, code: int, stderr: str, stdout: str, expect: str, watch, before,
          marker: Optional[Path]) -> str:
    assert rc == code, f"{where}: exit {rc}\n{stderr[-2000:]}"
    line = check_line(stderr, stdout, where)
    assert expect in line, f"{where}: {expect!r} not in {line!r}"
    assert snapshot(watch) == before, f"{where}: files changed"
    assert temporaries(watch) == [], f"{where}: temporaries left: {temporaries(watch)}"
    if marker is not None:
        assert not Path(marker).exists(), f"{where}: code from a file ran"
    return line


def promise(args: Sequence, watch: Iterable[Path] = (), marker: Optional[Path] = None, expect: str = "",
            code: int = 2, env: Optional[dict] = None) -> str:
    """Run ``huggy-convert ARGS`` in-process; assert the promise; return the error line."""
    from huggy_convert.cli import main

    watch = [Path(p) for p in watch]
    before = snapshot(watch)
    r = CliRunner().invoke(main, [str(a) for a in args], env=env)
    where = " ".join(map(str, args))[:200]
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"{where}: raised {type(r.exception).__name__}: {r.exception}"
    return _kept(where, r.exit_code, code, r.stderr, r.stdout, expect, watch, before, marker)


def promise_subprocess(args: Sequence, watch: Iterable[Path] = (), marker: Optional[Path] = None, expect: str = "",
                       code: int = 2, timeout: float = 120, env: Optional[dict] = None) -> str:
    """The same promise in a real process (``python -m huggy_convert.cli``), with a timeout."""
    watch = [Path(p) for p in watch]
    before = snapshot(watch)
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, "-m", "huggy_convert.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e)
    where = " ".join(map(str, args))[:200]
    return _kept(where, r.returncode, code, r.stderr, r.stdout, expect, watch, before, marker)
