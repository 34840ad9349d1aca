"""Batch: every checkpoint of an ML-Agents run directory converted, exported and verified in one process.

``huggy-convert results/<run-id>/ out/`` (or a behavior folder, or any folder holding ``.pt`` files).

Finding the checkpoints
    ``rundir.discover``: every run directory under SOURCE (a ``results/<run-id>/``, or the Hub clones
    ``downloads/<repo>/`` side by side), each with its own ``run_logs/training_status.json`` (steps,
    rewards, creation times), else the ``<Behavior>-<step>.pt`` file names; a listed checkpoint whose
    file is gone is ``missing`` (a failure).

``checkpoint.pt``
    ML-Agents saves the newest step twice: ``<Behavior>-<step>.pt`` and ``checkpoint.pt``. The latter
    is recognised by content (its ``Policy`` tensors bitwise equal to those of the step file with
    its global step, else of the behavior's newest step) and recorded as ``same_as`` that entry,
    not converted twice. If it matches none it is converted as ``<Behavior>-checkpoint``.

The deployed ``<Behavior>.onnx``
    The run-root copy of the final export (``batch.deployed``): the manifest's ``deployed``
    entries say which checkpoint it is the export of (the same bytes as its official ONNX, else the
    same content by checks 2-3) and its verdict; one that equals none fails the batch (exit 1).

Output layout (``huggy-convert verify out/`` sees every policy, in OUT and the folders below it)
    ``out/<stem>.{safetensors,onnx,pt2,verify.json,golden.npz}`` for one run, where ``<stem>`` is the
    checkpoint's file stem (``Huggy-99972``: ML-Agents already prefixes steps with the behavior,
    so several behaviors of one run stay apart). Two sources of one run with the same stem (loose
    files in different folders) both take their path below the run, ``/`` replaced by ``-``. With
    several runs under SOURCE, each run's files go to ``out/<the run's path below SOURCE>/<stem>.*``
    (``out/ppo-Huggy/Huggy-245828.onnx``); the manifest's ``stem`` is that path without the suffix
    and ``source`` the checkpoint's path below SOURCE. Plus ``out/manifest.json`` (its ``runs``: each
    run found, its status file and output folder) and ``out/manifest.csv``.

Verification profile
    Each checkpoint is verified against its own ``<stem>.onnx`` when ML-Agents wrote one. The newest
    checkpoint of each behavior gets the full profile of a single conversion (the command's
    options: 64 probe rows, float32/float16/bfloat16 module checks, the ``.pt2`` reloaded with
    ``torch.export.load``, 64- and 128-step fingerprints). Every other checkpoint gets the batch
    profile: checks 1-3 in full (check 3 on 16 probe rows plus ML-Agents' golden inputs when
    present), check 4 with the module in float32 on the CPU and on every accelerator present
    (the ``.pt2`` is run through ``torch.export.load`` for the newest checkpoint only: ~110 ms a
    file; check 6 compares every ``.pt2`` read back with the bytes written),
    check 5 with 16-step fingerprints. What it drops against the full profile: the float16 and
    bfloat16 module checks, 48 of the 64 probe rows, the 64- and 128-step fingerprints and
    ``torch.export.load`` of the ``.pt2``. The manifest records which profile each entry got, and
    ``verify OUT/`` re-verifies each entry with it (``--profile full``: the full one everywhere).
    Each checkpoint goes through ``pipeline.convert_one``,
    as a single conversion does: the verification reads the files it wrote.

Speed and memory
    A pool of worker processes (``workers.Pool``: ``--jobs``, default the cores; one torch thread
    each), forked after every import and after the ``.pt2`` template of the first checkpoint's
    architecture is traced in the parent (``warm_up``), with ``gc.freeze()``: the workers share the
    parent's pages, so the PSS summed over the pool stays near one process's, and torch._dynamo is
    imported once. Where fork is unavailable the same tasks run in threads (``EXPORT_GATE`` keeps
    torch.export alone), with ``--jobs 1`` in this process; the summary's ``workers`` says which.
    A checkpoint is read once (hashed and its ``Policy`` read from the same bytes, by the
    allow-listed ``converter.checkpoint.fast_policy_load``). ``torch.export`` traces once per
    architecture and the graph is serialized once (``exporters.pt2.ProgramWriter(fast=True)``:
    torch's own archive writer, checked once per architecture to give ``torch.export.save``'s bytes,
    else ``torch.export.save`` itself). Nothing of a finished checkpoint stays in memory but its
    manifest entry. The newest checkpoint of each behavior (the full profile: the longest task) is
    handed out first, ``checkpoint.pt`` last (it is compared with the step entries' results).
    Hashing in a parent thread would not help: the workers already keep every core busy.

Idempotent and resumable
    An entry is skipped when the manifest has it verified with the same source sha256, tool
    version and options, and each of its output files still has the recorded sha256 (``--force``
    redoes it). Every file is written under ``.<name>.<random>.tmp`` and renamed; the manifest is
    rewritten that way (and fsynced) every ``HUGGY_CONVERT_MANIFEST_INTERVAL`` seconds (default 1)
    and at the end; stale ``.*.tmp`` files of a killed run (of the names it writes:
    ``core.artifacts.clean_stale_temporaries``) are removed first. One batch at a time holds
    ``OUT/.manifest.json.lock`` (``core.artifacts.locked``; taking it also proves OUT writable before any
    work), and each checkpoint's set is written under its stem's lock, as a single conversion's. After a ``kill -9``
    a rerun skips what the manifest holds and redoes the rest, with the same bytes (artifacts and
    reports are deterministic: one torch thread, and nothing in them depends on the order).
    Artifacts are not fsynced one by one: after a power cut a rerun finds any torn file by its
    sha256 and redoes that checkpoint.

Exit codes: 0 all converted and verified (or skipped), 1 some checkpoint failed (conversion error,
missing file or failed verification), 2 nothing could be converted, or no checkpoint at all.
"""
from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .. import contract as C
from ..core.artifacts import SUFFIXES, check_out, clean_stale_temporaries, locked, make_dirs
from ..core.version import __version__
from ..errors import InputError
from ..exporters.pt2 import ProgramWriter
from ..exporters.registry import require_targets
from ..host import host_info
from ..pipeline import ConvertOptions, default_reference, prepare_conversion
from ..verify.engine import check_devices, check_tolerance_outputs, named_tolerances
from .deployed import check_deployed
from .item import (BATCH_FINGERPRINT_STEPS, BATCH_ROWS, NEWEST_NOTE, _alias_task, _Context, _convert_task,
                   batch_profiles, convert_item, load_item, profile_note, warm_up)
from .manifest import (ERROR, FAILED, MANIFEST_CSV, MANIFEST_FORMAT, MANIFEST_FORMAT_VERSION, MANIFEST_JSON,
                       MISSING, OK, Manifest, base_entry, best_entry, options_record, read_previous, summarize)
from .rundir import STATUS_FILE, STATUS_KEY, Item, discover
from .workers import Pool, default_jobs

# (their home before batch.item: what benchmarks/batch.py and the callers of batch.run use)
__all__ = ["run_batch", "BatchResult", "check_tolerances", "WARNING", "START", "ENTRY", "DEPLOYED", "batch_profiles",
           "profile_note", "convert_item", "warm_up", "_Context", "NEWEST_NOTE", "BATCH_ROWS", "BATCH_FINGERPRINT_STEPS"]


# what run_batch reports while it runs (``events(kind, data)``); it prints nothing
WARNING = "warning"  # data: a sentence (before any checkpoint is converted)
START = "start"  # data: the number of checkpoints
ENTRY = "entry"  # data: a checkpoint's manifest entry, once it is done (a failed one has "error")
DEPLOYED = "deployed"  # data: a run-root <Behavior>.onnx's record (``deployed.check_deployed``)


@dataclass
class BatchResult:
    """A finished batch: its summary (``OUT/manifest.json``'s; ``exit_code`` the verdict) and what a
    display needs beside it."""

    source: Path
    out: Path
    summary: dict
    deployed: List[dict]  # the run-root <Behavior>.onnx files' records, in full
    found_by: str
    runs: int  # run directories found under SOURCE

    @property
    def exit_code(self) -> int:
        return self.summary["exit_code"]

    @property
    def manifest(self) -> Path:
        return self.out / MANIFEST_JSON


def _no_events(kind: str, data) -> None:
    pass


def run_batch(source, out, options: Optional[ConvertOptions] = None, jobs: Optional[int] = None, force: bool = False,
              processes: bool = True, events: Callable[[str, object], None] = _no_events) -> BatchResult:
    """Convert every checkpoint under ``source`` into ``out``; returns the result (its ``exit_code``),
    reporting warnings and each finished checkpoint through ``events`` as it goes."""
    t0 = time.perf_counter()
    o = options or ConvertOptions()
    require_targets(o.targets)  # a deploy target's missing extra: one line, before anything is written
    source, out = Path(source), Path(out)
    if o.reference:
        raise InputError("--reference names one official ONNX; with a run directory each checkpoint is verified "
                         "against its own <stem>.onnx", o.reference)
    check_out(out)
    found = discover(source, out)
    items = found.items
    if not items:
        raise InputError("no ML-Agents checkpoints (.pt files) or SB3 model zips in this directory", source)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", out)
    outr = out.resolve()
    clash = next((it for it in items if it.path.parent.resolve() == (outr / it.sub).resolve()), None)
    if clash is not None:
        raise InputError(f"OUT is the folder of {clash.path.name}: its <stem>.onnx would overwrite the official ONNX "
                         "that ML-Agents wrote there; choose another output directory", out)
    if o.verify:
        check_devices(getattr(o.verify_options, "devices", None))
    found.warnings.extend(check_tolerances(items, o))
    make_dirs(out)
    with locked(out, MANIFEST_JSON):  # one batch at a time in OUT (it owns the manifest); proves OUT writable
        return _run_batch(_Batch(source, out, o, found, max(1, int(jobs or default_jobs())), force, t0, processes,
                                 events))


TOLERANCE_TRIES = 3  # checkpoints tried per folder for its spec (a broken one is its own task's error)


def check_tolerances(items: List[Item], o: ConvertOptions) -> List[str]:
    """A tolerance option (``--atol/--rtol/--cosine OUTPUT:VALUE``) naming an output of none of the
    batch's policies is refused before anything is written (``verify.engine.check_tolerance_outputs``):
    the spec of one checkpoint per behavior folder (the newest first; ML-Agents keeps one architecture
    per behavior within a run), read only when an option names an output. A name that is the output of
    some policies only applies to those (each other report notes it; returned: the warnings)."""
    if not named_tolerances(o.verify_options):
        return []
    groups: Dict[tuple, List[Item]] = {}
    for it in items:
        if not it.missing and it.kind != "checkpoint":
            groups.setdefault((it.sub, it.behavior, str(it.path.parent)), []).append(it)
    specs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in groups.values():
            for it in sorted(group, key=lambda it: not it.newest)[:TOLERANCE_TRIES]:
                try:
                    ckpt = load_item(it)
                    prep = prepare_conversion(ckpt, default_reference(it.path), o.obs_sizes, o.divisor, lenient=True)
                except Exception:  # noqa: BLE001 - its task reports it
                    continue
                specs.append((it.out_stem, prep.conversion.policy.spec))
                break
    return check_tolerance_outputs(o.verify_options, specs)


def _runs_record(found, out: Path) -> List[dict]:
    """Each run directory the batch found: where it is, how its checkpoints were found, where its outputs go."""
    return [{"dir": (r.root.relative_to(found.root).as_posix() if r.root != found.root else ".")
             if found.root in (r.root, *r.root.parents) else str(r.root),
             "out": r.sub or ".", STATUS_KEY: str(r.status) if r.status else None, "found_by": r.found_by,
             "checkpoints": r.checkpoints, "deployed": [d.rel for d in r.deployed]} for r in found.runs]


@dataclass
class _Batch:
    """One batch as ``run_batch`` starts it: what it was given (``jobs``: the workers) and what it found."""

    source: Path
    out: Path
    o: ConvertOptions
    found: object  # rundir.discover's
    jobs: int
    force: bool
    t0: float
    processes: bool
    events: Callable[[str, object], None]


def _header(b: _Batch, light, full) -> dict:
    """The manifest's header: the format, the tool and host, what was found where, the options and profiles."""
    import torch

    found, status = b.found, b.found.status
    several = len(found.runs) > 1
    return {"format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION,
            "tool": {"name": "huggy-convert", "version": __version__, "torch": torch.__version__},
            "host": host_info(),
            "source": str(b.source), "run_dir": str(found.root), STATUS_KEY: str(status) if status else None,
            "found_by": ", ".join(sorted({r.found_by for r in found.runs})) if several else
            (C.STATUS_FILE if status else "file names"),
            "layout": f"out/{'<run>/' if several else ''}<stem>.{{safetensors,onnx,pt2,verify.json,golden.npz}}",
            "runs": _runs_record(found, b.out),
            "options": options_record(b.o, light, full),
            "verification": {
                "newest_of_each_behavior": "full profile (as a single conversion)",
                "others": profile_note(light) if b.o.verify else None}}


def _run_batch(b: _Batch) -> BatchResult:
    import torch

    items, warns = b.found.items, b.found.warnings
    for sub in sorted({""} | {it.sub for it in items}):
        make_dirs(b.out / sub)
        clean_stale_temporaries(b.out / sub, ([MANIFEST_JSON, MANIFEST_CSV] if not sub else []) +
                                [f"{it.stem}{suffix}" for it in items if it.stem and it.sub == sub
                                 for suffix in SUFFIXES.values()])
    light, full = batch_profiles(b.o)
    header = _header(b, light, full)
    previous, warn = read_previous(b.out, header) if not b.force else ({}, None)
    warns += [warn] if warn else []
    for w in warns:
        b.events(WARNING, w)
    ctx = _Context(out=b.out, options=b.o, light=light, full=full, previous=previous, force=b.force,
                   writer=ProgramWriter(fast=True))
    running = _Running(b, ctx, Manifest(b.out, header))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one torch thread per worker: the workers are the parallelism
    b.events(START, len(items))
    quiet = warnings.catch_warnings()  # entered and left by this thread only; the workers see its filter
    quiet.__enter__()
    warnings.simplefilter("ignore")  # torch's warnings would break the one-line errors
    try:
        running.all()
    finally:
        if running.pool is not None:
            running.pool.close(interrupted=sys.exc_info()[0] is not None)
        quiet.__exit__(None, None, None)
        torch.set_num_threads(threads)
        summary = running.summary(header)
        running.manifest.write(summary, csv_too=summary is not None)
    return BatchResult(b.source, b.out, summary, running.manifest.deployed, header["found_by"], len(b.found.runs))


@dataclass
class _Running:
    """A batch while its checkpoints run: the manifest, each finished entry (``results``), the ``.pt2``
    writer's notes the workers returned, the pool."""

    b: _Batch
    ctx: _Context
    manifest: Manifest
    results: Dict[str, dict] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    pool: Optional[Pool] = None

    def __post_init__(self):
        for i, it in enumerate(self.b.found.items):
            self.manifest.order[it.rel] = i

    def report(self, entry: dict) -> None:
        self.results[entry["source"]] = entry
        self.manifest.entries[entry["source"]] = entry
        self.b.events(ENTRY, entry)
        self.manifest.maybe_write()

    def run(self, tasks, subjects) -> None:
        for i, ok, res in self.pool.run(tasks):
            if ok:
                entry, more = res
                self.notes.extend(n for n in more if n not in self.notes)
            else:  # only a worker's death reaches here: every task catches its own errors
                entry = base_entry(subjects[i])
                entry.update(status=ERROR, run=FAILED, error=f"{subjects[i].path}: {res}")
            self.report(entry)

    def all(self) -> None:
        """Every checkpoint (a missing one reported as such), then each ``checkpoint.pt`` against the step
        entries' results, then the run-root ``<Behavior>.onnx`` files."""
        b, items, previous = self.b, self.b.found.items, self.ctx.previous
        aliases = [it for it in items if it.kind == "checkpoint"]
        work = [it for it in items if it.kind != "checkpoint"]
        for it in work:
            if it.missing:
                e = base_entry(it)
                e.update(status=MISSING, run=FAILED,
                         error=f"{it.path}: listed in {STATUS_FILE.as_posix()} but no such file under {b.source}")
                self.report(e)
        todo = [it for it in work if not it.missing]
        # the .pt2 template is traced before the fork unless every checkpoint is likely to be skipped
        # (each has a verified entry in the manifest; a worker traces for itself if it must convert)
        likely_skipped = all((previous.get(it.rel) or {}).get("status") == OK for it in todo)
        self.pool = Pool(b.jobs, {"ctx": self.ctx}, warm=lambda: warm_up([] if likely_skipped else todo, self.ctx),
                         processes=b.processes)
        # the newest of each behavior first (the full profile: the longest task), then the others
        ordered = sorted(todo, key=lambda it: not it.newest)
        self.run([(_convert_task, (it,)) for it in ordered], ordered)
        tasks = []
        for it in aliases:
            folder = [w for w in work if w.path.parent == it.path.parent and not w.missing and w.kind == "step"
                      and not w.foreign]  # (an SB3 zip beside checkpoint.pt is never its alias)
            newest = max(folder, key=lambda w: (w.step if w.step is not None else -1, w.rel), default=None)
            cands = [(w, self.results.get(w.rel, {})) for w in sorted(folder, key=lambda w: w is not newest)]
            tasks.append((_alias_task, (it, cands)))
        self.run(tasks, aliases)
        self.pool.close()
        for dep in (d for r in b.found.runs for d in r.deployed):  # the run-root <Behavior>.onnx files
            d = check_deployed(dep, items, self.results, b.out, b.o.verify, self.ctx.light)
            self.manifest.deployed.append(d)
            b.events(DEPLOYED, d)

    def summary(self, header: dict) -> Optional[dict]:
        """The manifest's summary, once every checkpoint has an entry (None before)."""
        b, entries = self.b, self.manifest.sorted_entries()
        if len(entries) != len(b.found.items):
            return None
        summary = summarize(entries, time.perf_counter() - b.t0, b.jobs, self.manifest.deployed)
        writer_notes = self.ctx.writer.notes
        summary["warnings"] = b.found.warnings + [n for n in writer_notes if n not in self.notes] + self.notes
        summary["workers"] = self.pool.describe() if self.pool is not None else None
        summary["runs"] = header["runs"]
        for r, rec in zip(b.found.runs, summary["runs"]):
            got = [self.results[it.rel] for it in b.found.items if it.sub == r.sub and it.rel in self.results]
            best = best_entry(got)
            rec.update(best_reward=best["reward"] if best else None, best_step=best.get("step") if best else None,
                       best_stem=best["stem"] if best else None)
        return summary
