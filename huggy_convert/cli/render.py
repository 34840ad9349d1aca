"""The one renderer of the CLI: what the stages return, as text or JSON, and an error as one line.

Nothing here decides anything: the results are complete (files written, verdicts decided) before they
are shown, and ``console.show_verdict`` keeps a failure while printing from changing the exit code."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import click

from ..batch.deployed import describe as describe_deployed
from ..batch.manifest import DEPLOYED_FAILING, ERROR, MANIFEST_CSV, MISSING, PROFILE_BATCH, VERIFY_FAILED
from ..batch.run import DEPLOYED, ENTRY, START, WARNING
from ..console import show_verdict
from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_VERIFY_FAILED, HuggyError, error_line
from ..exporters.atc import render as atc_lines
from ..importers.from_onnx import describe_recovered
from .group import envelope

QUIET, NORMAL, VERBOSE = 0, 1, 2  # how much a command prints (-q, the default, -v)
PROGRESS_INTERVAL = 10.0  # seconds between a batch's progress lines where stderr is not a terminal
PROGRESS_ENV = "HUGGY_CONVERT_PROGRESS_INTERVAL"  # another interval in seconds; 0: no progress lines


def progress_interval() -> float:
    """The seconds between a batch's progress lines without a terminal (``PROGRESS_ENV``, else 10)."""
    try:
        return max(0.0, float(os.environ.get(PROGRESS_ENV, PROGRESS_INTERVAL)))
    except ValueError:
        return PROGRESS_INTERVAL


def level(quiet: bool, verbose: bool) -> int:
    return QUIET if quiet else VERBOSE if verbose else NORMAL


def emit_json(command: str, code: int, data: dict) -> None:
    """The one ``--json`` output: ``group.envelope`` (schema, ok, exit_code) around the command's data."""
    click.echo(json.dumps(envelope(command, code, data), indent=2))


def json_error(command: str, line: str, code: int) -> None:
    if command:
        emit_json(command, code, {"error": " ".join(line.split())[:400]})


# --- errors -------------------------------------------------------------------------------------
def fail(err: HuggyError, as_json: bool = False, command: str = "") -> None:
    """The one way a command ends on an error: one line on stderr (and ``--json``'s envelope with
    ``error``), its exit code."""
    click.echo(error_line(err), err=True)
    if as_json and command:
        emit_json(command, err.exit_code, {"error": err.one_line()})
    sys.exit(err.exit_code)


def interrupted(as_json: bool = False, command: str = "") -> None:
    click.echo(error_line("interrupted"), err=True)
    if as_json and command:
        emit_json(command, EXIT_INTERRUPTED, {"error": "interrupted"})
    sys.exit(EXIT_INTERRUPTED)


def usage_error(message: str) -> None:
    click.echo(error_line(" ".join(message.split())[:400]), err=True)


def warning(text: str) -> None:
    click.echo(f"huggy-convert: warning: {text}", err=True)


def outcome(result, as_json: bool, command: str = "") -> int:
    """A command's return: its exit code as it is, or a mode's result rendered (text or JSON) and its
    verdict's code (1 when a check failed)."""
    if result is None or isinstance(result, int):
        return result or EXIT_OK
    code = EXIT_OK if result.ok else EXIT_VERIFY_FAILED

    def show():
        if as_json:
            emit_json(command, code, result.to_dict())
        else:
            click.echo(result.render())
        if not result.ok:
            click.echo(f"huggy-convert: {result.mode}: a check failed (see above)", err=True)

    return show_verdict(show, code)


# --- convert, to-checkpoint ---------------------------------------------------------------------
def worst_figure(report: dict) -> str:
    """The worst figure of a report (``Report.to_dict()``): the runtimes' largest error over its derived
    bound (float32, then the half formats checked), else ''."""
    run = next((c for c in report.get("checks", ()) if c.get("id") == "runtimes"), None)
    f = (run or {}).get("figures") or {}
    if not isinstance(f.get("max_bound_ratio"), (int, float)):
        return ""
    half = ", ".join(f"{k} {v:.3g}" for k, v in (f.get("max_bound_ratio_half") or {}).items()
                     if isinstance(v, (int, float)))
    return f"worst error/bound {f['max_bound_ratio']:.3g} float32" + (f" ({half})" if half else "")


def verdict_line(report, seconds=None) -> str:
    """The last line of a conversion or a verification: the verdict, how many checks passed, the worst
    figure (or the first failure) and the time taken. ``report``: ``Report.to_dict()``, or None (not
    verified)."""
    tail = [f"{seconds:.2f} s"] if seconds is not None else []
    if report is None:
        return ", ".join(["verdict: not verified (--no-verify)"] + tail)
    checks = report.get("checks", ())
    passed = sum(1 for c in checks if c.get("status") in ("pass", "warn"))
    skipped = sum(1 for c in checks if c.get("status") == "skip")
    parts = [f"verdict: {report['verdict']}", f"{passed}/{len(checks)} checks passed"]
    parts += [f"{skipped} not run"] if skipped else []
    failures = [c for c in checks if c.get("status") == "fail"]
    if failures or not report.get("ok", True):
        parts.append(f"first failure: {report.get('first_failure') or failures[0].get('title')}")
    elif worst_figure(report):
        parts.append(worst_figure(report))
    return ", ".join(parts + tail)


def _tree(rendered: str) -> list:
    """A report's tree (``Report.render()``) without its last line (the verdict, which comes last)."""
    lines = rendered.splitlines()
    return lines[:-1] if lines and lines[-1].startswith("verdict:") else lines


def conversion(res, source, out, as_json: bool, how: int = NORMAL, target=None) -> None:
    """One conversion (``pipeline.ConvertResult``): what it read, what it wrote, the verdict last; the
    tree on failure and with -v (``how``), the Ascend ATC advice with -v or for an Ascend ``--target``
    (``target``: ``conformance.target.TargetOutcome``, whose rejection fails the command); -q the verdict only."""
    code = EXIT_OK if res.ok and (target is None or target.ok) else EXIT_VERIFY_FAILED
    rep = None
    if res.report is not None:
        rep = dict(res.report.to_dict(), first_failure=res.report.first_failure())
    if as_json:
        s = res.summary()
        s["atc"] = target.atc if target is not None and target.atc else res.atc()
        if target is not None:
            s["target"] = target.summary()
        emit_json("convert", code, s)
        return
    last = verdict_line(rep, res.seconds)
    if target is not None and not target.ok:
        last += f"; target {target.target.name}: rejected by {', '.join(target.summary()['rejected_by'])}"
    if how == QUIET:
        click.echo(last)
        return
    s = res.summary()
    at = s["training_step"] if s["training_step"] is not None else "unknown"
    ref = s.get("reference")
    official = ""
    if ref and Path(ref).resolve() != Path(source).resolve():
        beside = Path(ref).resolve().parent == Path(source).resolve().parent
        official = f" and its official ONNX {Path(ref).name if beside else ref}"
    click.echo(f"read {source} (step {at}){official}")
    click.echo(f"  {s['spec']['family']}, {s['spec']['parameters']:,} parameters")
    if s.get("recovered_from"):  # what an ONNX alone leaves out: with -v (and in the report)
        said = describe_recovered(s["recovered_from"])
        click.echo(f"  {said if how == VERBOSE else said.split('; ')[0]}")
    if how == VERBOSE:
        if s.get("divisor"):
            click.echo(f"  divisor: {s['divisor']}")
        for kind, a in res.artifacts.items():
            click.echo(f"  wrote {Path(a['path']).name}  sha256 {a['sha256'][:16]}…")
        atc = target.atc if target is not None and target.atc else res.atc()
        for line in atc_lines(atc) if atc else ():
            click.echo(line)
    else:
        names = [Path(a["path"]).name for a in res.artifacts.values()]
        stem = res.stem
        rest = [n[len(stem) + 1:] for n in names if n.startswith(stem + ".")]
        wrote = f"{stem}.{{{','.join(rest)}}}" if len(rest) == len(names) and len(rest) > 1 else ", ".join(names)
        click.echo(f"wrote {out}/{wrote}")
    if target is not None:
        for line in target.lines():
            click.echo(line)
        if target.atc and how != VERBOSE:
            for line in atc_lines(target.atc):
                click.echo(line)
    if res.report is not None and (how == VERBOSE or not res.ok):
        for line in _tree(res.report.render()):
            click.echo(line)
    click.echo(last)


def checkpoint_written(res, policy, as_json: bool) -> None:
    """``to-checkpoint`` (``pipeline.ToCheckpointResult``)."""
    s = res.summary()
    if as_json:
        emit_json("to-checkpoint", EXIT_OK if res.ok else EXIT_VERIFY_FAILED, s)
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
    least ``least`` items; where stderr is not a terminal (CI, a log), a line on stderr every
    ``progress_interval()`` seconds (``label``, done/total, elapsed), from ``START`` to the end, unless
    ``ticks`` is off (-q). Closed (``with``) after the run, before its result is shown."""

    def __init__(self, label: str, file, bar: bool, least: int = 1, ticks: bool = True):
        self.label, self.file, self.bar, self.least = label, file, bar, least
        self.interval = progress_interval() if ticks else 0.0
        self._ctx = self._bar = None
        self.total, self.done, self.t0 = 0, 0, time.monotonic()
        self._stop = threading.Event()
        self._ticker = None

    def __call__(self, kind: str, data) -> None:
        if kind == WARNING:
            warning(data)
        elif kind == START:
            self.total = data
            if self.bar and data >= self.least:
                self._ctx = click.progressbar(length=data, label=self.label.format(data), file=self.file)
                self._bar = self._ctx.__enter__()
            elif self.interval and not sys.stderr.isatty() and data >= self.least and self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, daemon=True, name="huggy-progress")
                self._ticker.start()
        elif kind == DEPLOYED and data["status"] in DEPLOYED_FAILING:
            click.echo(f"huggy-convert: {'error' if data['status'] == ERROR else 'verification failed'}: "
                       f"{data['error']}", err=True)
        elif kind != DEPLOYED:  # a checkpoint converted, a set verified
            if kind == ENTRY and data.get("status") in (ERROR, MISSING):
                click.echo(error_line(data.get("error")), err=True)
            elif kind == ENTRY and data.get("status") == VERIFY_FAILED:
                click.echo(f"huggy-convert: verification failed: {data['stem']}: "
                           f"{(data.get('verify') or {}).get('first_failure')}", err=True)
            self.done += 1
            if self._bar is not None:
                self._bar.update(1)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            click.echo(f"huggy-convert: {self.label.format(self.total)}: {self.done}/{self.total} done, "
                       f"{time.monotonic() - self.t0:.0f} s", err=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
        return False


def batch(res, as_json: bool, how: int = NORMAL) -> None:
    """A run directory's summary (``batch.run.BatchResult``); -q: its first line (the counts) only."""
    s, out = res.summary, res.out
    if as_json:
        emit_json("convert", res.exit_code, dict(s, manifest=str(res.manifest)))
        return
    several = res.runs > 1
    runs = f" in {res.runs} runs" if several else ""
    click.echo(f"{res.source} -> {out}/: {s['checkpoints']} checkpoints{runs} ({res.found_by}): {s['converted']} "
               f"converted, {s['skipped']} skipped, {s['failed']} failed, {s['same_as']} same as another")
    if how == QUIET:
        return
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
def verification(recs, workers: str, as_json: bool, code: int, how: int = NORMAL) -> None:
    """``verify OUT/``'s records (``batch.reverify.verify_out``): one set's verdict line (its tree on
    failure and with -v), or a line per set and a count; ``--json``: one envelope, the reports under
    ``policies`` and the sets that could not be verified under ``errors``, whatever their number; then
    a line on stderr per set that failed or is incomplete, and per error after the first (the first is
    the command's own error)."""
    errors = [r["error"] for r in recs if "error" in r]
    done = [r for r in recs if "error" not in r]
    if as_json:
        data = {"policies": [r["report"] for r in done], "errors": errors, "workers": workers}
        if errors:
            data["error"] = errors[0]["line"]
        emit_json("verify", code, data)
    elif len(recs) == 1 and not errors:
        r = recs[0]
        if how == VERBOSE or (not r["ok"] and how == NORMAL and r.get("render")):
            for line in _tree(r["render"]):
                click.echo(line)
        elif how == NORMAL:
            click.echo(f"verify {r['subject']}")
        click.echo(verdict_line(dict(r["report"], first_failure=r["first_failure"])))
    elif len(recs) > 1:
        for r in recs if how != QUIET else ():
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
            hint = "--checkpoint / --reference give the sources" if "check 4 " not in r["incomplete"] else \
                "pip install 'huggy-convert[<target>]' runs the target again"
            click.echo(f"huggy-convert: verification incomplete: {r['subject']}: {r['incomplete']} (exit "
                       f"{EXIT_INCOMPLETE}; {hint})", err=True)
    for e in errors[1 if not as_json else 0:]:
        click.echo(error_line(e["line"]), err=True)
