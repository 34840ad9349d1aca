"""The one renderer of the CLI: what the stages return, as text or JSON, and an error as one line.

Nothing here decides anything: the results are complete (files written, verdicts decided) before they
are shown, and ``console.show_verdict`` keeps a failure while printing from changing the exit code."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..batch.deployed import describe as describe_deployed
from ..batch.manifest import DEPLOYED_FAILING, ERROR, MANIFEST_CSV, MISSING, PROFILE_BATCH, VERIFY_FAILED
from ..batch.run import DEPLOYED, ENTRY, START, WARNING
from ..console import show_verdict
from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_VERIFY_FAILED, HuggyError, error_line
from ..exporters.atc import render as atc_lines
from ..importers.from_onnx import describe_recovered


# --- errors -------------------------------------------------------------------------------------
def fail(err: HuggyError, as_json: bool = False) -> None:
    """The one way a command ends on an error: one line on stderr (and ``--json``'s object), its exit code."""
    click.echo(error_line(err), err=True)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": err.one_line(), "exit_code": err.exit_code}))
    sys.exit(err.exit_code)


def interrupted() -> None:
    click.echo(error_line("interrupted"), err=True)
    sys.exit(EXIT_INTERRUPTED)


def usage_error(message: str) -> None:
    click.echo(error_line(" ".join(message.split())[:400]), err=True)


def warning(text: str) -> None:
    click.echo(f"huggy-convert: warning: {text}", err=True)


def outcome(result, as_json: bool) -> int:
    """A command's return: its exit code as it is, or a mode's result rendered (text or JSON) and its
    verdict's code (1 when a check failed)."""
    if result is None or isinstance(result, int):
        return result or EXIT_OK

    def show():
        click.echo(result.to_json() if as_json else result.render())
        if not result.ok:
            click.echo(f"huggy-convert: {result.mode}: a check failed (see above)", err=True)

    return show_verdict(show, EXIT_OK if result.ok else EXIT_VERIFY_FAILED)


# --- convert, to-checkpoint ---------------------------------------------------------------------
def conversion(res, source, out, as_json: bool) -> None:
    """One conversion (``pipeline.ConvertResult``)."""
    s, atc = res.summary(), res.atc()
    s["atc"] = atc
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    click.echo(f"{source} -> {out}/")
    step = s['training_step'] if s['training_step'] is not None else "unknown"
    click.echo(f"  {s['spec']['family']}, {s['spec']['parameters']:,} parameters, step {step}")
    if s.get("recovered_from"):
        click.echo(f"  {describe_recovered(s['recovered_from'])}")
    if s.get("divisor"):
        click.echo(f"  divisor: {s['divisor']}")
    for kind, a in res.artifacts.items():
        click.echo(f"  wrote {Path(a['path']).name}  sha256 {a['sha256'][:16]}…")
    for line in atc_lines(atc) if atc else ():
        click.echo(line)
    if res.report is not None:
        click.echo(res.report.render())
    click.echo(f"  {res.seconds:.2f} s")


def checkpoint_written(res, policy, as_json: bool) -> None:
    """``to-checkpoint`` (``pipeline.ToCheckpointResult``)."""
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


# --- a run directory, verify OUT/ ---------------------------------------------------------------
class Progress:
    """The events of a run over many policies (``batch.run.run_batch``, ``batch.reverify.verify_out``)
    as they come: each warning, a line on stderr per checkpoint that failed (and per run-root ONNX that
    matches none), and a progress bar (``label`` formatted with the count) where ``bar`` says, for at
    least ``least`` items. Closed (``with``) after the run, before its result is shown."""

    def __init__(self, label: str, file, bar: bool, least: int = 1):
        self.label, self.file, self.bar, self.least = label, file, bar, least
        self._ctx = self._bar = None

    def __call__(self, kind: str, data) -> None:
        if kind == WARNING:
            warning(data)
        elif kind == START and self.bar and data >= self.least:
            self._ctx = click.progressbar(length=data, label=self.label.format(data), file=self.file)
            self._bar = self._ctx.__enter__()
        elif kind == DEPLOYED and data["status"] in DEPLOYED_FAILING:
            click.echo(f"huggy-convert: {'error' if data['status'] == ERROR else 'verification failed'}: "
                       f"{data['error']}", err=True)
        elif kind != DEPLOYED and kind != START:  # a checkpoint converted, a set verified
            if kind == ENTRY and data.get("status") in (ERROR, MISSING):
                click.echo(error_line(data.get("error")), err=True)
            elif kind == ENTRY and data.get("status") == VERIFY_FAILED:
                click.echo(f"huggy-convert: verification failed: {data['stem']}: "
                           f"{(data.get('verify') or {}).get('first_failure')}", err=True)
            if self._bar is not None:
                self._bar.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
        return False


def batch(res, as_json: bool) -> None:
    """A run directory's summary (``batch.run.BatchResult``)."""
    s, out = res.summary, res.out
    if as_json:
        click.echo(json.dumps(dict(s, manifest=str(res.manifest)), indent=2))
        return
    several = res.runs > 1
    runs = f" in {res.runs} runs" if several else ""
    click.echo(f"{res.source} -> {out}/: {s['checkpoints']} checkpoints{runs} ({res.found_by}): {s['converted']} "
               f"converted, {s['skipped']} skipped, {s['failed']} failed, {s['same_as']} same as another")
    for rec in s["runs"] if several else []:
        best = f", best reward {rec['best_reward']:.4g} at step {rec['best_step']}" \
            if rec["best_reward"] is not None else ""
        click.echo(f"  {rec['dir']}/ -> {out / rec['out']}/: {rec['checkpoints']} checkpoints ({rec['found_by']})"
                   f"{best}")
    if s["best_reward"] is not None and not several:
        click.echo(f"  best reward {s['best_reward']:.4g} at step {s['best_step']} ({s['best_stem']})")
    for d in res.deployed:
        click.echo(f"  {describe_deployed(d)}")
    click.echo(f"  manifest: {res.manifest}, {out / MANIFEST_CSV}")
    click.echo(f"  {s['seconds']:.2f} s ({s['ms_per_checkpoint']} ms per checkpoint, {s['workers']})")


# --- verify OUT/ --------------------------------------------------------------------------------
def verification(recs, workers: str, as_json: bool) -> None:
    """``verify OUT/``'s records (``batch.reverify.verify_out``): one set's tree, or a line per set and a
    count; then a line on stderr per set that failed or is incomplete, and per error after the first
    (the first is the command's own error)."""
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
            click.echo(f"verify {r['subject']}: {line}{' (batch profile)' if r['profile'] == PROFILE_BATCH else ''}")
        passed = sum(1 for r in done if r["ok"])
        partly = sum(1 for r in done if r["ok"] and not r["complete"])
        click.echo(f"{len(recs)} policies: {passed} passed"
                   + (f" ({partly} with checks not run)" if partly else "")
                   + f", {len(done) - passed} failed verification, "
                   f"{len(errors)} could not be verified ({workers})")
    for r in done:
        if not r["ok"]:
            click.echo(f"huggy-convert: verification failed: {r['subject']}: {r['first_failure']}", err=True)
    for r in done:
        if r["ok"] and not r["complete"]:
            click.echo(f"huggy-convert: verification incomplete: {r['subject']}: {r['incomplete']} (exit "
                       f"{EXIT_INCOMPLETE}; --checkpoint / --reference give the sources)", err=True)
    for e in errors[1:]:
        click.echo(error_line(e["line"]), err=True)
