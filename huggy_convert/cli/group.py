"""The command group: its commands loaded on first use, an unknown command named at once, and the hidden
default conversion (``huggy-convert SOURCE OUT/``) only when the first argument is a path that exists.

Nothing here imports torch: ``huggy-convert inof X.pt`` is refused (one line, exit 2, its nearest
command names) before any command module is imported; a command's module (``convert``, ``modes``:
torch, onnx) is imported when that command runs, when ``--help`` lists them all, or by shell completion.
This is click's documented lazy-loading pattern (``get_command``/``list_commands``); ``LAZY`` is
checked against the modules' ``COMMANDS`` by tests/test_cli_surface.py."""
from __future__ import annotations

import difflib
import importlib
import json
import os
import sys

import click

from ..console import guard, step
from ..errors import EXIT_BAD_INPUT as EXIT_USAGE, error_line

# command name -> the module of this package that defines it (its ``COMMANDS``)
LAZY = {
    "convert": "convert", "verify": "convert", "to-checkpoint": "convert",
    "info": "modes", "act": "modes", "sample": "modes", "batch-sizes": "modes", "precision": "modes",
    "onnx-compare": "modes", "fingerprint": "modes", "stats": "modes", "benchmark": "modes", "export": "modes",
    "matrix": "modes", "check": "modes",
}
# names a command had before: the one line says where it went
RENAMED = {"batch": "renamed 'batch-sizes'; a run directory converts as 'huggy-convert RUN_DIR OUT/'"}
VERBOSITY = ("-q", "--quiet", "-v", "--verbose")  # taken before a command name too (huggy-convert -v verify OUT/)
JSON_SCHEMA_VERSION = 1  # the version in every --json envelope's "schema" (huggy-convert/<command>/<version>)


def envelope(command: str, exit_code: int, data: dict) -> dict:
    """Every ``--json``: ``{"schema": "huggy-convert/<command>/1", "ok", "exit_code", ...the data}``
    (``ok``: the exit code is 0); the schemas ship in ``huggy_convert/schemas/<command>.json``."""
    out = {"schema": f"huggy-convert/{command}/{JSON_SCHEMA_VERSION}", "ok": exit_code == 0, "exit_code": exit_code}
    out.update((k, v) for k, v in data.items() if k not in out)
    return out


def usage_fail(message: str, command: str = "", as_json: bool = False) -> None:
    """A usage error: one line on stderr (and ``--json``'s envelope with the same line), exit 2."""
    line = " ".join(message.split())[:400]
    click.echo(error_line(line), err=True)
    if as_json and command:
        click.echo(json.dumps(envelope(command, EXIT_USAGE, {"error": line}), indent=2))
    sys.exit(EXIT_USAGE)


def unknown_command(name: str) -> str:
    """``no such command 'inof'. Did you mean 'info'?``; a word that looks like a path: no such file."""
    if name in RENAMED:
        return f"no such command '{name}' ({RENAMED[name]})"
    near = difflib.get_close_matches(name, list(LAZY), n=3, cutoff=0.6)
    if near:
        return f"no such command '{name}'. Did you mean " + " or ".join(f"'{n}'" for n in near) + "?"
    if os.sep in name or "/" in name or "." in name:
        return f"{name}: no such file or directory (and no command of that name)"
    return f"no such command '{name}', and no file or directory of that name (the commands: huggy-convert --help)"


class DefaultGroup(click.Group):
    """``huggy-convert SOURCE OUT`` is ``huggy-convert convert SOURCE OUT`` when SOURCE exists; any other
    first word that is not a command is refused at once, naming the nearest commands."""

    default_command = "convert"

    def main(self, *args, **kwargs):
        """Every command's output through ``console.guard``: a character the console cannot encode is
        written as its ASCII fallback or escaped, a failed write drops the rest; the exit code stays
        the command's (its verdict), whatever the console."""
        with guard():
            return super().main(*args, **kwargs)

    def list_commands(self, ctx):
        return sorted(LAZY)

    def get_command(self, ctx, name):
        if name not in LAZY:
            return None
        if not ctx.resilient_parsing and not any(a in ("-h", "--help") for a in sys.argv[1:3]):
            step(f"loading {name} (torch, onnx)")  # a terminal sees a line at once; importing torch takes a second or two
        module = importlib.import_module(f"{__package__}.{LAZY[name]}")
        return next(c for c in module.COMMANDS if c.name == name)

    def parse_args(self, ctx, args):
        words = list(args)
        first = next((a for a in words if not a.startswith("-")), None)
        if words and not words[0].startswith("-") and first not in LAZY:
            if os.path.lexists(first):
                words = [self.default_command] + words
            elif not ctx.resilient_parsing:
                usage_fail(unknown_command(first), "usage", "--json" in words)
        elif words and words[0].startswith("-") and words[0] not in ("--help", "-h", "--version") \
                and first is not None and first not in LAZY and os.path.lexists(first):
            words = [self.default_command] + words  # huggy-convert -v X.pt OUT/
        elif first in LAZY and words.index(first) and all(w in VERBOSITY for w in words[:words.index(first)]):
            i = words.index(first)  # huggy-convert -v verify OUT/: the command's own -q/-v
            words = [first] + words[:i] + words[i + 1:]
        try:
            return super().parse_args(ctx, words)
        except click.UsageError as exc:
            if ctx.resilient_parsing:
                raise
            usage_fail(exc.format_message(), "usage", "--json" in words)

    def format_usage(self, ctx, formatter):
        formatter.write_usage("huggy-convert", "CHECKPOINT|ONNX|RUN_DIR OUT/ [OPTIONS]  |  huggy-convert COMMAND [ARGS]...")
