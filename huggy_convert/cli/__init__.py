"""The command line: a thin layer over the stages. ``group`` (the group: commands loaded on first use, an
unknown command named at once, the JSON envelope), ``options`` (the command class, its one guard, the
option groups), ``render`` (text and JSON, an error as one line), the commands in ``convert`` (convert,
verify, to-checkpoint) and ``modes``."""
from __future__ import annotations

import gc

import click

from ..core.version import __version__
from .group import DefaultGroup


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="huggy-convert")
def main():
    """Convert Unity ML-Agents checkpoints into verified deployable artifacts.

    \b
    huggy-convert Huggy-2000049.pt out/      one checkpoint -> out/Huggy-2000049.{safetensors,onnx,pt2,verify.json,golden.npz}
    huggy-convert Huggy.onnx out/            an ML-Agents ONNX alone, read back into its policy
    huggy-convert model.zip out/             a Stable-Baselines3 policy (vec_normalize.pkl beside it) into Unity's contract
    huggy-convert results/Huggy/ out/        a whole run directory (convert's --jobs, --force)
    huggy-convert downloads/ out/            every run below, e.g. Hub clones -> out/<repo>/<Behavior>-<step>.*
    huggy-convert verify out/                re-check the artifacts in out/
    huggy-convert X.pt out/ -q  (or -v)      the verdict line only (or everything: the tree, the ATC command)
    huggy-convert COMMAND --json             one JSON object: {"schema": "huggy-convert/COMMAND/1", "ok", "exit_code", ...}

    Exit codes: 0 success, 1 a verification failed, 2 bad input, output or usage, 3 internal error (a bug),
    4 verify: passed, but checks its conversion ran could not be run again (a source moved or changed),
    130 interrupted.
    """


def entry() -> None:  # console script
    """Run the CLI and exit with its code.

    Interpreter shutdown took ~0.5 s after the work was done (measured after ``act``: 0.44-0.55 s):
    CPython's finalization runs full garbage collections while it clears modules, and each one walks
    every object torch created at import. ``gc.freeze()`` moves those objects to the permanent
    generation first, so the collections have almost nothing to traverse (0.14 s left: plain module
    teardown, which os._exit used to skip).
    Nothing is skipped: atexit handlers, buffered output and open files are finalised as usual;
    only cyclic garbage left at exit is not collected, which the operating system reclaims."""
    try:
        main()
    finally:
        gc.freeze()

