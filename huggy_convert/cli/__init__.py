"""The command line: a thin layer over the stages. Errors become one line and an exit code."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .. import __version__
from .. import contract as C
from ..console import show_verdict
from ..errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_VERIFY_FAILED, HuggyError, InputError, from_foreign
from .modes import Command  # one-line usage errors

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class DefaultGroup(click.Group):
    """``huggy-convert SOURCE OUT`` is ``huggy-convert convert SOURCE OUT``."""

    default_command = "convert"

    def main(self, *args, **kwargs):
        """Every command's output through ``console.guard``: a character the console cannot encode is
        written as its ASCII fallback or escaped, a failed write drops the rest; the exit code stays
        the command's (its verdict), whatever the console."""
        from ..console import guard

        with guard():
            return super().main(*args, **kwargs)

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command] + list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """The top level: what a command's own guard did not turn into one line (the modes' guard
        takes only ``HuggyError``) goes through ``errors.from_foreign`` here."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C: one line, and not exit 1 (a verdict)
            click.echo("huggy-convert: error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except HuggyError as e:
            fail(e)
        except Exception as e:  # noqa: BLE001
            fail(from_foreign(e, getattr(e, "filename", None)))

    def format_usage(self, ctx, formatter):
        formatter.write_usage("huggy-convert", "CHECKPOINT|ONNX|RUN_DIR OUT/ [OPTIONS]  |  huggy-convert COMMAND [ARGS]...")


def fail(err: HuggyError, as_json: bool = False) -> None:
    click.echo(f"huggy-convert: error: {err.one_line()}", err=True)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": err.one_line(), "exit_code": err.exit_code}))
    sys.exit(err.exit_code)


def run_guarded(fn, as_json: bool = False, subject=None):
    """``fn()``; any error becomes one line: a ``HuggyError`` as it is, a foreign failure through
    ``errors.from_foreign`` (an ``OSError`` names its path and reason, a ``MemoryError`` is "too
    large", exit 2); anything else is a bug: "internal error: <type>: <message>", exit 3, no traceback."""
    try:
        return fn()
    except HuggyError as e:
        fail(e, as_json)
    except Exception as e:  # noqa: BLE001 - the one place foreign failures become typed errors
        fail(from_foreign(e, getattr(e, "filename", None) or subject), as_json)


def parse_obs_sizes(text: str):
    """``--obs-sizes``: comma-separated widths (``8,5``), a camera as ``CxHxW`` (``3x84x84,6``)."""
    out = []
    for part in text.split(","):
        try:
            dims = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            raise InputError(f"--obs-sizes '{text}' is not a comma-separated list of widths or CxHxW shapes") from None
        if len(dims) not in (1, 3) or min(dims) < 1:
            raise InputError(f"--obs-sizes '{text}': '{part}' is neither a width nor a CxHxW camera shape")
        out.append(dims[0] if len(dims) == 1 else dims)
    return out


def verify_options(atol, rtol, cosine, devices, dtypes, rows=64, seed=0):
    from ..verify import VerifyOptions, parse_overrides

    return VerifyOptions(rows=rows, seed=seed, devices=list(devices) or None, dtypes=tuple(dtypes),
                         atol=parse_overrides(atol), rtol=parse_overrides(rtol), cosine=parse_overrides(cosine))


tolerance_options = [
    click.option("--atol", multiple=True, metavar="[OUTPUT:]TOL",
                 help="absolute tolerance for module checks, per output (Polygraphy style), in place of the "
                      "derived float32 bound for that output (fp16/bf16: of their thresholds); repeatable. "
                      "OUTPUT: an output of the policy (of one of them, over several), else exit 2 before "
                      "anything is written; * or none: every output"),
    click.option("--rtol", multiple=True, metavar="[OUTPUT:]TOL",
                 help="relative tolerance: an element fails only past both atol and rtol (with --atol: "
                      "an --atol override alone means absolute only)"),
    click.option("--cosine", multiple=True, metavar="[OUTPUT:]MIN", help="minimum cosine similarity, per output"),
    click.option("--verify-device", "devices", multiple=True, metavar="DEV",
                 help="devices to verify on (default: every device present: cpu, cuda:i, npu:i)"),
    click.option("--verify-dtype", "dtypes", multiple=True, default=("float32", "float16", "bfloat16"),
                 show_default=True, type=click.Choice(["float32", "float16", "bfloat16"])),
]


def with_options(opts):
    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="huggy-convert")
def main():
    """Convert Unity ML-Agents checkpoints into verified deployable artifacts.

    \b
    huggy-convert Huggy-2000049.pt out/      one checkpoint -> out/Huggy-2000049.{safetensors,onnx,pt2,verify.json,golden.npz}
    huggy-convert Huggy.onnx out/            an ML-Agents ONNX alone, read back into its policy
    huggy-convert results/Huggy/ out/        a whole run directory (convert's --jobs, --force)
    huggy-convert downloads/ out/            every run below, e.g. Hub clones -> out/<repo>/<Behavior>-<step>.*
    huggy-convert verify out/                re-check the artifacts in out/

    Exit codes: 0 success, 1 a verification failed, 2 bad input, output or usage, 3 internal error (a bug),
    4 verify: passed, but checks its conversion ran could not be run again (a source moved or changed),
    130 interrupted.
    """


@main.command("convert", cls=Command)
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--opset", type=click.IntRange(C.ONNX_OPSETS[0], C.ONNX_OPSETS[-1]), default=C.ONNX_OPSET_DEFAULT,
              show_default=True, help=f"ONNX opset of the rebuilt model ({C.opset_story()})")
@click.option("--reference", type=click.Path(path_type=Path), help="official ONNX to verify against "
              "(default: <stem>.onnx beside the checkpoint)")
@click.option("--divisor", type=click.Choice(["auto", "ieee"]), default="auto", show_default=True,
              help="normalizer divisor: auto adopts the official ONNX's when it is within 1 ulp of the IEEE "
              "sqrt(variance/steps) (folded by a sqrt that is not correctly rounded), so outputs are bitwise equal to it; ieee always "
              "uses the IEEE value (the same bytes on every machine)")
@click.option("--no-verify", is_flag=True, help="skip verification")
@click.option("--no-program", is_flag=True, help="do not write <stem>.pt2")
@click.option("--obs-sizes", help="split of the observation width, e.g. 8,5 (only needed for normalize:false "
              "policies with several observations and no official ONNX); a camera as CxHxW, e.g. 3x84x84,6 "
              "(its height and width, where no official ONNX states them)")
@click.option("--jobs", "-j", type=click.IntRange(0, 256), default=0,
              help="parallel workers for a run directory (default: cores)")
@click.option("--force", is_flag=True, help="run directory: redo checkpoints the manifest already has")
@click.option("--json", "as_json", is_flag=True, help="print a machine-readable summary on stdout")
@with_options(tolerance_options)
def convert_cmd(source, out, opset, reference, divisor, no_verify, no_program, obs_sizes, jobs, force, as_json,
                atol, rtol, cosine, devices, dtypes):
    """Convert a checkpoint (or every checkpoint of a run directory, or an ML-Agents ONNX alone) into OUT/."""
    from ..pipeline import ConvertOptions, convert_one

    def go():
        sizes = None
        if obs_sizes:
            sizes = parse_obs_sizes(obs_sizes)
        vo = verify_options(atol, rtol, cosine, devices, dtypes)
        opts = ConvertOptions(opset=opset, obs_sizes=sizes, reference=reference, divisor=divisor, verify=not no_verify,
                              program=not no_program, verify_options=vo)
        if source.is_dir():
            from ..batch import run_batch

            return run_batch(source, out, opts, jobs=jobs or None, force=force, as_json=as_json)
        res = convert_one(source, out, opts)  # the files are written and the verdict decided: then the display
        return show_verdict(lambda: show(res), EXIT_OK if res.ok else EXIT_VERIFY_FAILED)

    def show(res):
        s, atc = res.summary(), res.atc()
        s["atc"] = atc
        if as_json:
            click.echo(json.dumps(s, indent=2))
        else:
            from ..exporters.atc import render

            click.echo(f"{source} -> {out}/")
            step = s['training_step'] if s['training_step'] is not None else "unknown"
            click.echo(f"  {s['spec']['family']}, {s['spec']['parameters']:,} parameters, step {step}")
            if s.get("recovered_from"):
                from ..converter.from_onnx import describe_recovered

                click.echo(f"  {describe_recovered(s['recovered_from'])}")
            if s.get("divisor"):
                click.echo(f"  divisor: {s['divisor']}")
            for kind, a in res.artifacts.items():
                click.echo(f"  wrote {Path(a['path']).name}  sha256 {a['sha256'][:16]}…")
            for line in render(atc) if atc else ():
                click.echo(line)
            if res.report is not None:
                click.echo(res.report.render())
            click.echo(f"  {res.seconds:.2f} s")

    sys.exit(run_guarded(go, as_json, source))


@main.command("verify", cls=Command)
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--reference", type=click.Path(path_type=Path), help="official ONNX to compare with (default: the one "
              "each report records, where it is still there unchanged)")
@click.option("--checkpoint", type=click.Path(path_type=Path), help="the source checkpoint, or the ONNX a policy was "
              "recovered from (default: the one each report records, where it is still there unchanged)")
@click.option("--json", "as_json", is_flag=True, help="print the JSON report instead of the tree")
@click.option("--jobs", "-j", type=click.IntRange(0, 256), default=0,
              help="parallel workers (default: cores; a batch's worker pool)")
@click.option("--profile", type=click.Choice(["recorded", "full"]), default="recorded", show_default=True,
              help="recorded: each policy with the profile its batch gave it (OUT/manifest.json); full: the full "
                   "profile for every policy")
@click.option("--require-complete", is_flag=True, help=f"a partial verification (checks its conversion ran that "
              f"could not be run again) fails: exit {EXIT_VERIFY_FAILED} instead of {EXIT_INCOMPLETE}")
@with_options(tolerance_options)
def verify_cmd(out, reference, checkpoint, as_json, jobs, profile, require_complete, atol, rtol, cosine, devices,
               dtypes):
    """Verify the artifacts in OUT/ (against --reference, or the golden I/O written at conversion).
    One policy: its report's tree; several: one line each and a count (the trees in --json and in
    each <stem>.verify.json).

    \b
    Every file a report (<stem>.verify.json) records must be there, unchanged (.safetensors, .onnx,
    .pt2, .golden.npz): one missing or changed fails. Checks 1-2 run again on the checkpoint and
    official ONNX the report records, where they are still there with the same sha256 (else
    --checkpoint / --reference). Where they are not, the verdict names the checks not run:
    'PASS (checks 1-2 not run: checkpoint not found)', exit 4.

    \b
    Exit codes: 0 every check passed and every recorded check was run; 1 a check failed (or,
    with --require-complete, a check was not run); 2 bad input; 3 internal error; 4 every check run
    passed, but some recorded checks could not be run (partial PASS)."""
    from ..batch import raise_error_record, verify_out

    def go():
        recs, workers = verify_out(out, reference=reference, checkpoint=checkpoint,
                          options=verify_options(atol, rtol, cosine, devices, dtypes), jobs=jobs or None,
                          profile=profile, render=not as_json, progress=sys.stderr.isatty(),
                          require_complete=require_complete)
        errors = [r["error"] for r in recs if "error" in r]
        done = [r for r in recs if "error" not in r]
        if as_json and not errors:
            reps = [r["report"] for r in recs]
            click.echo(json.dumps(reps if len(reps) > 1 else reps[0], indent=2))
        elif len(recs) == 1 and not errors:
            click.echo(recs[0]["render"])
        elif not as_json and len(recs) > 1:
            for r in recs:
                if "error" in r:
                    click.echo(f"verify: ERROR: {r['error']['line']}")
                    continue
                line = r["verdict"] if r["ok"] else f"FAIL: {r['first_failure']}"
                click.echo(f"verify {r['subject']}: {line}{' (batch profile)' if r['profile'] == 'batch' else ''}")
            passed = sum(1 for r in done if r["ok"])
            partly = sum(1 for r in done if r["ok"] and not r["complete"])
            click.echo(f"{len(recs)} policies: {passed} passed"
                       + (f" ({partly} with checks not run)" if partly else "")
                       + f", {len(done) - passed} failed verification, "
                       f"{len(errors)} could not be verified ({workers})")
        failed = [r for r in done if not r["ok"]]
        for r in failed:
            click.echo(f"huggy-convert: verification failed: {r['subject']}: {r['first_failure']}", err=True)
        partial = [r for r in done if r["ok"] and not r["complete"]]
        for r in partial:
            click.echo(f"huggy-convert: verification incomplete: {r['subject']}: {r['incomplete']} (exit "
                       f"{EXIT_INCOMPLETE}; --checkpoint / --reference give the sources)", err=True)
        for e in errors[1:]:
            click.echo(f"huggy-convert: error: {e['line']}", err=True)
        if errors:
            raise_error_record(errors[0])
        return EXIT_VERIFY_FAILED if failed else EXIT_INCOMPLETE if partial else EXIT_OK

    sys.exit(run_guarded(go, as_json, out))


@main.command("to-checkpoint", cls=Command)
@click.argument("policy", type=click.Path(path_type=Path), metavar="POLICY.safetensors")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--global-step", type=click.IntRange(0, 2 ** 63 - 1), default=None,
              help="the step stored in the file (default: the policy's training step; --initialize-from "
                   "restarts at 0 anyway, --resume continues from it)")
@click.option("--json", "as_json", is_flag=True, help="print a machine-readable summary on stdout")
def to_checkpoint_cmd(policy, out, global_step, as_json):
    """Write OUT/checkpoint.pt, the file ML-Agents 1.1.0 initializes a run from: the Policy state dict
    under ML-Agents' key names, dtypes and shapes (normalizer alias keys and int64 step counts included)
    and global_step. The optimizer, critic and reward-signal state are not in a canonical policy:
    ML-Agents starts them fresh (it logs 'Failed to load for module ...' for each)."""
    from ..pipeline import to_checkpoint

    def go():
        res = to_checkpoint(policy, out, global_step)  # written and read back: then the display
        return show_verdict(lambda: show(res), EXIT_OK if res.ok else EXIT_VERIFY_FAILED)

    def show(res):
        s = res.summary()
        if as_json:
            click.echo(json.dumps(s, indent=2))
            return
        rb = s["read_back"]
        click.echo(f"{policy} -> {res.path}")
        click.echo(f"  {s['family']}, step {res.global_step}")
        click.echo(f"  wrote {res.path.name}  sha256 {res.sha256[:16]}…  ({len(res.keys)} keys of "
                   f"{s['modules'][0]} + {s['modules'][1]}; no optimizer or critic: ML-Agents starts them fresh)")
        click.echo(f"  {'✓' if res.ok else '✗'} read back: spec {'equal' if rb['spec_equal'] else 'DIFFERS'}, "
                   f"{rb['bitwise_equal']}/{rb['tensors']} tensors bitwise equal, step {rb['training_step']}")
        for w in s["warnings"]:
            click.echo(f"  warning: {w}")
        first, *rest = s["usage"]
        click.echo(f"  use: {first}")
        for line in rest:
            click.echo(f"       {line}")

    sys.exit(run_guarded(go, as_json, policy))


from .modes import COMMANDS as _MODE_COMMANDS  # noqa: E402

for _cmd in _MODE_COMMANDS:
    main.add_command(_cmd)


def entry() -> None:  # console script
    """Run the CLI and exit with its code.

    Interpreter shutdown took ~0.5 s after the work was done (measured after ``act``: 0.44-0.55 s):
    CPython's finalization runs full garbage collections while it clears modules, and each one walks
    every object torch created at import. ``gc.freeze()`` moves those objects to the permanent
    generation first, so the collections have almost nothing to traverse (0.14 s left: plain module
    teardown, which os._exit used to skip).
    Nothing is skipped: atexit handlers, buffered output and open files are finalised as usual;
    only cyclic garbage left at exit is not collected, which the operating system reclaims."""
    import gc

    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    entry()
