"""The artifact commands: ``convert`` (a checkpoint, an ONNX or a run directory), ``verify OUT/`` and
``to-checkpoint``. Each parses its options, calls one stage and hands the result to ``render``."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import contract as C
from ..batch.manifest import PROFILE_FULL
from ..batch.reverify import RECORDED, Asked, raise_error_record, verify_out
from ..batch.run import run_batch
from ..batch.alone import onnx_alone
from ..console import show_verdict, step
from ..errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_VERIFY_FAILED
from ..conformance.target import apply_target
from ..core.artifacts import ONNX
from ..pipeline import ConvertOptions, convert_one, to_checkpoint
from . import render
from .options import (GLOBAL_STEP, JOBS, JOBS_RANGE, OPSET, OPSET_HELP, Command, json_opt, parse_obs_sizes, range_text,
                      target_opt, targeted_opset, targets_option, tolerance_options, verbosity_opts, verify_options)


@click.command("convert", cls=Command, subject="source",
               short_help="Convert a checkpoint, an ONNX or a run directory into OUT/.")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--opset", type=OPSET, default=C.ONNX_OPSET_DEFAULT, show_default=True, help=OPSET_HELP)
@target_opt
@click.option("--reference", type=click.Path(path_type=Path), help="official ONNX to verify against "
              "(default: <stem>.onnx beside the checkpoint)")
@click.option("--divisor", type=click.Choice(["auto", "ieee"]), default="auto", show_default=True,
              help="normalizer divisor: auto adopts the official ONNX's when it is within 1 ulp of the IEEE "
              "sqrt(variance/steps) (folded by a sqrt that is not correctly rounded), so outputs are bitwise equal to it; ieee always "
              "uses the IEEE value (the same bytes on every machine)")
@click.option("--no-verify", is_flag=True, help="skip verification")
@click.option("--no-program", is_flag=True, help="do not write <stem>.pt2")
@targets_option
@click.option("--obs-sizes", help="split of the observation width, e.g. 8,5 (only needed for normalize:false "
              "policies with several observations and no official ONNX); an image observation as CxHxW, e.g. "
              "3x84x84,6 (its height and width, where no official ONNX states them)")
@click.option("--jobs", "-j", type=JOBS, default=0,
              help=f"parallel workers for a run directory, {JOBS_RANGE} (default 0: the cores)")
@click.option("--force", is_flag=True, help="run directory: redo checkpoints the manifest already has")
@json_opt
@verbosity_opts
@tolerance_options
def convert_cmd(source, out, opset, target, reference, divisor, no_verify, no_program, targets, obs_sizes, jobs, force,
                as_json, quiet, verbose, atol, rtol, cosine, devices, dtypes):
    """Convert a checkpoint (or every checkpoint of a run directory, an ML-Agents ONNX alone, or a
    Stable-Baselines3 model zip) into OUT/.

    It prints what it read, what it wrote and the verdict with the worst figure, last; the full
    verification tree on failure and with -v (always in OUT/<stem>.verify.json), the Ascend ATC
    command with -v; -q the verdict line only."""
    opset = targeted_opset(target, opset)
    opts = ConvertOptions(opset=opset, obs_sizes=parse_obs_sizes(obs_sizes) if obs_sizes else None,
                          reference=reference, divisor=divisor, verify=not no_verify,
                          program=not no_program and targets.program, targets=targets.extra,
                          verify_options=verify_options(atol, rtol, cosine, devices, dtypes))
    if source.is_dir():
        source = onnx_alone(source, out) or source  # a Hub download with only its <Behavior>.onnx: that file
    if source.is_dir():
        with render.Progress("converting {} checkpoints", sys.stdout, bar=not as_json and not quiet and sys.stdout.isatty(),
                             ticks=not quiet) as p:
            res = run_batch(source, out, opts, jobs=jobs or None, force=force, events=p)
        return show_verdict(lambda: render.batch(res, as_json, render.level(quiet, verbose)), res.exit_code)
    step(f"converting {source} -> {out}/")
    res = convert_one(source, out, opts)  # the files are written and the verdict decided: then the display
    aimed = apply_target(target, res.artifacts[ONNX]["path"], res.conversion.policy.spec) \
        if target and ONNX in res.artifacts else None
    ok = res.ok and (aimed is None or aimed.ok)
    return show_verdict(lambda: render.conversion(res, source, out, as_json, render.level(quiet, verbose), aimed),
                        EXIT_OK if ok else EXIT_VERIFY_FAILED)


@click.command("verify", cls=Command, subject="out",
               short_help="Re-verify the artifacts a conversion wrote in OUT/.")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--reference", type=click.Path(path_type=Path), help="official ONNX to compare with (default: the one "
              "each report records, where it is still there unchanged)")
@click.option("--checkpoint", type=click.Path(path_type=Path), help="the source checkpoint, or the ONNX a policy was "
              "recovered from (default: the one each report records, where it is still there unchanged)")
@json_opt
@click.option("--jobs", "-j", type=JOBS, default=0,
              help=f"parallel workers, {JOBS_RANGE} (default 0: the cores; a batch's worker pool)")
@click.option("--profile", type=click.Choice([RECORDED, PROFILE_FULL]), default=RECORDED, show_default=True,
              help="recorded: each policy with the profile its batch gave it (OUT/manifest.json); full: the full "
                   "profile for every policy")
@click.option("--require-complete", is_flag=True, help=f"a partial verification (checks its conversion ran that "
              f"could not be run again) fails: exit {EXIT_VERIFY_FAILED} instead of {EXIT_INCOMPLETE}")
@verbosity_opts
@tolerance_options
def verify_cmd(out, reference, checkpoint, as_json, jobs, profile, require_complete, quiet, verbose, atol, rtol,
               cosine, devices, dtypes):
    """Verify the artifacts in OUT/ (against --reference, or the golden I/O written at conversion).
    One policy: its verdict with the worst figure (its tree on failure and with -v); several: one line
    each and a count (the trees in --json and in each <stem>.verify.json).

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
    with render.Progress("verifying {} policies", sys.stderr, bar=sys.stderr.isatty() and not quiet, least=2,
                         ticks=not quiet) as p:
        asked = Asked(reference, checkpoint, verify_options(atol, rtol, cosine, devices, dtypes), profile, require_complete)
        recs, workers = verify_out(out, asked, jobs=jobs or None, render=not as_json, events=p)
    # the reports are written and the verdicts decided: the exit code first (the first error's, where a set
    # could not be verified), then the display
    errors = [r["error"] for r in recs if "error" in r]
    done = [r for r in recs if "error" not in r]
    code = errors[0]["exit_code"] if errors else EXIT_VERIFY_FAILED if any(not r["ok"] for r in done) else \
        EXIT_INCOMPLETE if any(not r["complete"] for r in done) else EXIT_OK
    show_verdict(lambda: render.verification(recs, workers, as_json, code, render.level(quiet, verbose)), code)
    if errors and not as_json:  # --json: the envelope holds the error, and its line is on stderr
        raise_error_record(errors[0])  # its one line and that code (options.Command's guard)
    return code


@click.command("to-checkpoint", cls=Command, subject="policy",
               short_help=f"Write a .safetensors policy as ML-Agents' {C.CHECKPOINT_FILE}.")
@click.argument("policy", type=click.Path(path_type=Path), metavar="POLICY.safetensors")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--global-step", type=GLOBAL_STEP, default=None,
              help=f"the step stored in the file, {range_text(GLOBAL_STEP)} (default: the policy's training step; --initialize-from "
                   "restarts at 0 anyway, --resume continues from it)")
@json_opt
def to_checkpoint_cmd(policy, out, global_step, as_json):
    """Write OUT/checkpoint.pt, the file ML-Agents 1.1.0 initializes a run from: the Policy state dict
    under ML-Agents' key names, dtypes and shapes (normalizer alias keys and int64 step counts included)
    and global_step. The optimizer, critic and reward-signal state are not in a canonical policy:
    ML-Agents starts them fresh (it logs 'Failed to load for module ...' for each)."""
    res = to_checkpoint(policy, out, global_step)  # written and read back: then the display
    return show_verdict(lambda: render.checkpoint_written(res, policy, as_json),
                        EXIT_OK if res.ok else EXIT_VERIFY_FAILED)


COMMANDS = (convert_cmd, verify_cmd, to_checkpoint_cmd)
