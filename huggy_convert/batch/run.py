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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .. import contract as C
from ..converter import load_checkpoint
from ..converter.reference import describe as describe_divisor
from ..converter.reference import divisor_record
from ..core import torchcompat
from ..core.artifacts import SUFFIXES, check_out, sha256_bytes, clean_stale_temporaries, locked, make_dirs
from ..core.files import read_input_file
from ..core.version import __version__
from ..errors import InputError, one_line
from ..exporters import onnx_export, torch_module  # noqa: F401 (warm_up: imported before the workers fork)
from ..exporters.pt2 import EXPORT_GATE, ProgramWriter
from ..host import host_info
from ..pipeline import ConvertOptions, InBatch, convert_one, default_reference, prepare_conversion
from ..runtime import ort  # noqa: F401 (warm_up)
from ..verify import VerifyOptions
from ..verify.engine import CHECK_IDS, check_devices, check_tolerance_outputs, named_tolerances
from .alias import check_alias
from .deployed import check_deployed
from .manifest import (CONVERTED, ERROR, FAILED, MANIFEST_CSV, MANIFEST_FORMAT, MANIFEST_FORMAT_VERSION, MANIFEST_JSON,
                       MISSING, OK, PROFILE_FULL, SKIPPED, VERIFY_FAILED, Manifest, base_entry, best_entry, options_record, read_previous,
                       sha_file, summarize)
from .rundir import STATUS_FILE, STATUS_KEY, Item, discover
from .workers import Pool, default_jobs, shared


BATCH_ROWS = 16
BATCH_FINGERPRINT_STEPS = (16,)


def _key_figures(rep_dict: dict) -> dict:
    """The numbers worth a glance: per-check status, bitwise counts, module max abs, fingerprints."""
    out: dict = {"checks": {}}
    for c in rep_dict.get("checks", []):
        num = str(CHECK_IDS.index(c["id"]) + 1) if c.get("id") in CHECK_IDS else c["title"].split(" ", 1)[0]
        out["checks"][num] = c["status"]
        kids = c.get("checks", [])
        if num == "1" and c.get("figures"):
            out["safetensors_bitwise"] = [c["figures"].get("bitwise_equal"), c["figures"].get("tensors")]
        elif num == "2":
            for k in kids:
                f = k.get("figures") or {}
                if k["title"] == "initializers" and "paired" in f:
                    out["onnx_initializers_bitwise"] = [f["paired"] - len(f.get("differences", [])), f["paired"]]
        elif num == "3":
            eq = sum((k.get("figures") or {}).get("bitwise_equal", 0) for k in kids)
            n = sum((k.get("figures") or {}).get("count", 0) for k in kids)
            out["outputs_bitwise"] = [eq, n] if n else None
        elif num == "4":
            mx = {}
            for k in kids:
                vals = [(g.get("figures") or {}).get("max_abs") for g in k.get("checks", [])]
                vals = [v for v in vals if isinstance(v, (int, float))]
                mx[k["title"].split(" (")[0].replace("torch module ", "")] = max(vals) if vals else None
            out["module_max_abs"] = mx
            out["max_bound_ratio"] = (c.get("figures") or {}).get("max_bound_ratio")
        elif num == "5":
            fps = (c.get("figures") or {}).get("fingerprints", {})
            out["fingerprints"] = {str(s): v.get("reference") for s, v in fps.items()}
        elif num == "6":
            out["files"] = {k["title"]: k["status"] for k in kids}
    return out


@dataclass
class _Context:
    out: Path
    options: ConvertOptions
    light: object  # VerifyOptions
    full: object
    previous: Dict[str, dict]
    force: bool
    writer: ProgramWriter


def _outputs_intact(out: Path, prev: dict) -> bool:
    outs = prev.get("outputs") or {}
    if not outs:
        return False
    for a in outs.values():
        p = out / a["file"]
        if sha_file(p) != a.get("sha256"):
            return False
    return True


def _can_skip(prev: Optional[dict], sha: str, item: Item, ctx: _Context) -> bool:
    if ctx.force or not prev or prev.get("status") != OK:
        return False
    if prev.get("source_sha256") != sha or prev.get("tool_version") != __version__ or prev.get("stem") != item.out_stem:
        return False
    if item.newest and ctx.options.verify and prev.get("profile") != PROFILE_FULL:
        return False
    return _outputs_intact(ctx.out, prev)


def _skipped(entry: dict, prev: dict) -> dict:
    keep = {k: prev.get(k) for k in ("source_sha256", "source_bytes", C.CKPT_GLOBAL_STEP, "spec", "reference", "outputs",
                                     "verify", "profile", "seconds", "same_as", "same_as_sha256")}
    entry.update({k: v for k, v in keep.items() if v is not None})
    entry.update(status=prev["status"], run=SKIPPED)
    return entry


def convert_item(item: Item, ctx: _Context, ckpt=None) -> dict:
    """One checkpoint through ``pipeline.convert_one`` (``ckpt``: already loaded); returns its manifest
    entry (nothing else is kept)."""
    t0 = time.perf_counter()
    entry = base_entry(item)
    try:
        if ckpt is None:
            data = read_input_file(item.path)
            sha = sha256_bytes(data)
            entry.update(source_sha256=sha, source_bytes=len(data))
            prev = ctx.previous.get(item.rel)
            if _can_skip(prev, sha, item, ctx):
                entry = _skipped(entry, prev)
                entry["seconds_this_run"] = round(time.perf_counter() - t0, 3)
                return entry
            # the bytes already read and hashed: the file is read once (torch's warnings are silenced
            # for the whole batch by run_batch: catch_warnings is not thread-safe)
            ckpt = load_checkpoint(item.path, data=data, sha256=sha, quiet_warnings=False)
            data = None
        else:
            entry.update(source_sha256=ckpt.sha256, source_bytes=item.path.stat().st_size)
        entry[C.CKPT_GLOBAL_STEP] = ckpt.global_step
        res = convert_one(item.path, ctx.out / item.sub, ctx.options, profile=ctx.full if item.newest else ctx.light,
                          batch=InBatch(ckpt, ctx.writer, item.stem, [NEWEST_NOTE if item.newest else profile_note(ctx.light)],
                                        fsync=False, suggest_reference=False, check_tolerances=False))
        s = res.summary()
        decision = divisor_record(res.conversion.policy)  # (summary()'s is None without a normalizer)
        entry["spec"] = s["spec"]
        entry["reference"] = res.reference.name if res.reference else None
        entry["divisor"] = dict(decision, summary=describe_divisor(decision))
        entry["outputs"] = {k: dict(a, file=f"{item.sub}/{a['file']}" if item.sub else a["file"])
                            for k, a in res.outputs().items()}  # paths below OUT
        entry["status"] = OK
        rep = res.report
        if rep is not None:
            v = dict(s["verify"])  # verdict, ok, first_failure
            v.update(_key_figures(rep.to_dict()))
            entry["verify"] = v
            if not v["ok"]:
                entry["status"] = VERIFY_FAILED
                entry["error"] = f"verification failed: {v['first_failure']}"
        entry["run"] = CONVERTED if entry["status"] == OK else FAILED
    except Exception as exc:  # one bad checkpoint never stops the others
        entry.update(status=ERROR, run=FAILED, error=one_line(exc, item.path))
    entry["seconds"] = round(time.perf_counter() - t0, 3)
    return entry


def _convert_task(item: Item):
    """A worker's task: ``convert_item`` with the context the parent set before forking; returns the
    entry and the ``.pt2`` writer's notes (both plain data)."""
    ctx = shared()["ctx"]
    with EXPORT_GATE.shared():  # threads: torch.export runs alone (a process has one thread)
        return convert_item(item, ctx), list(ctx.writer.notes)


def _alias_task(item: Item, candidates):
    ctx = shared()["ctx"]
    with EXPORT_GATE.shared():
        return check_alias(item, ctx, candidates, convert_item), list(ctx.writer.notes)


def warm_up(items: List[Item], ctx: _Context) -> None:
    """In the parent, before the workers fork: the third-party modules the work imports (the package's
    are this module's imports), and the ``.pt2`` template of the first checkpoint's architecture traced (``torch._dynamo``'s import and the trace
    are then paid once, not once per worker). A checkpoint that does not load is left to its task."""
    import onnxruntime  # noqa: F401
    import safetensors.torch  # noqa: F401

    if not ctx.options.program or not items:
        return
    try:
        it = items[0]
        ckpt = load_checkpoint(it.path, quiet_warnings=False)  # (its sha256 is not needed here)
        prep = prepare_conversion(ckpt, default_reference(it.path), ctx.options.obs_sizes, ctx.options.divisor)
        ctx.writer.program_bytes(prep.conversion.policy)
        torchcompat.preload_export()  # what torch.export.load needs too
    except Exception:  # noqa: BLE001 - its task reports it
        pass


NEWEST_NOTE = "batch: newest checkpoint of its behavior, full verification profile"


def profile_note(light) -> str:
    """The batch profile (``batch_profiles``' first) in words: the note of every report it verified
    (a batch's, and ``verify OUT/``'s where the manifest records it)."""
    return (f"batch verification profile: checks 1-3 in full ({light.rows} probe rows), module "
            f"{'/'.join(light.dtypes)} on {', '.join(light.devices) if light.devices else 'every device present'}, "
            f"fingerprints of {'/'.join(map(str, light.fingerprint_steps))} steps, no torch.export.load of the "
            ".pt2 (check 6 compares its bytes); float16/bfloat16 and 128-step fingerprints on the newest "
            "checkpoint only")


def batch_profiles(options: ConvertOptions):
    """(batch profile, full profile) of VerifyOptions for a run directory."""
    full = options.verify_options or VerifyOptions()
    dts = ("float32",) if "float32" in full.dtypes else tuple(full.dtypes)[:1]
    light = replace(full, rows=min(full.rows, BATCH_ROWS), dtypes=dts, fingerprint_steps=BATCH_FINGERPRINT_STEPS,
                    program_load=False)
    return light, full


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
    source, out = Path(source), Path(out)
    if o.reference:
        raise InputError("--reference names one official ONNX; with a run directory each checkpoint is verified "
                         "against its own <stem>.onnx", o.reference)
    check_out(out)
    found = discover(source, out)
    items = found.items
    if not items:
        raise InputError("no ML-Agents checkpoints (.pt files) in this directory", source)
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
        return _run_batch(source, out, o, found, jobs, force, t0, processes, events)


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
                    ckpt = load_checkpoint(it.path, quiet_warnings=False)
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


def _run_batch(source: Path, out: Path, o: ConvertOptions, found, jobs, force: bool, t0: float, processes: bool,
               events: Callable[[str, object], None]) -> BatchResult:
    import torch

    root, status, items, warns = found.root, found.status, found.items, found.warnings
    several = len(found.runs) > 1
    for sub in sorted({""} | {it.sub for it in items}):
        make_dirs(out / sub)
        clean_stale_temporaries(out / sub, ([MANIFEST_JSON, MANIFEST_CSV] if not sub else []) +
                                [f"{it.stem}{suffix}" for it in items if it.stem and it.sub == sub
                                 for suffix in SUFFIXES.values()])
    jobs = max(1, int(jobs or default_jobs()))
    light, full = batch_profiles(o)
    header = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION,
              "tool": {"name": "huggy-convert", "version": __version__, "torch": torch.__version__},
              "host": host_info(),
              "source": str(source), "run_dir": str(root), STATUS_KEY: str(status) if status else None,
              "found_by": ", ".join(sorted({r.found_by for r in found.runs})) if several else
              (C.STATUS_FILE if status else "file names"),
              "layout": f"out/{'<run>/' if several else ''}<stem>.{{safetensors,onnx,pt2,verify.json,golden.npz}}",
              "runs": _runs_record(found, out),
              "options": options_record(o, light, full),
              "verification": {
                  "newest_of_each_behavior": "full profile (as a single conversion)",
                  "others": profile_note(light) if o.verify else None}}
    previous, warn = read_previous(out, header) if not force else ({}, None)
    warns += [warn] if warn else []
    for w in warns:
        events(WARNING, w)
    writer = ProgramWriter(fast=True)
    ctx = _Context(out=out, options=o, light=light, full=full, previous=previous, force=force, writer=writer)
    manifest = Manifest(out, header)
    for i, it in enumerate(items):
        manifest.order[it.rel] = i
    results: Dict[str, dict] = {}

    def report(entry: dict) -> None:
        results[entry["source"]] = entry
        manifest.entries[entry["source"]] = entry
        events(ENTRY, entry)
        manifest.maybe_write()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one torch thread per worker: the workers are the parallelism
    aliases = [it for it in items if it.kind == "checkpoint"]
    work = [it for it in items if it.kind != "checkpoint"]
    events(START, len(items))
    quiet = warnings.catch_warnings()  # entered and left by this thread only; the workers see its filter
    quiet.__enter__()
    warnings.simplefilter("ignore")  # torch's warnings would break the one-line errors
    notes: List[str] = []
    pool = None
    try:
        for it in work:
            if it.missing:
                e = base_entry(it)
                e.update(status=MISSING, run=FAILED,
                         error=f"{it.path}: listed in {STATUS_FILE.as_posix()} but no such file under {source}")
                report(e)
        todo = [it for it in work if not it.missing]
        # the .pt2 template is traced before the fork unless every checkpoint is likely to be skipped
        # (each has a verified entry in the manifest; a worker traces for itself if it must convert)
        likely_skipped = all((previous.get(it.rel) or {}).get("status") == OK for it in todo)
        pool = Pool(jobs, {"ctx": ctx}, warm=lambda: warm_up([] if likely_skipped else todo, ctx),
                    processes=processes)

        def run(tasks, subjects):
            for i, ok, res in pool.run(tasks):
                if ok:
                    entry, more = res
                    notes.extend(n for n in more if n not in notes)
                else:  # only a worker's death reaches here: every task catches its own errors
                    entry = base_entry(subjects[i])
                    entry.update(status=ERROR, run=FAILED, error=f"{subjects[i].path}: {res}")
                report(entry)

        # the newest of each behavior first (the full profile: the longest task), then the others
        ordered = sorted(todo, key=lambda it: not it.newest)
        run([(_convert_task, (it,)) for it in ordered], ordered)
        tasks = []
        for it in aliases:
            folder = [w for w in work if w.path.parent == it.path.parent and not w.missing and w.kind == "step"]
            newest = max(folder, key=lambda w: (w.step if w.step is not None else -1, w.rel), default=None)
            cands = [(w, results.get(w.rel, {})) for w in sorted(folder, key=lambda w: w is not newest)]
            tasks.append((_alias_task, (it, cands)))
        run(tasks, aliases)
        pool.close()
        for dep in (d for r in found.runs for d in r.deployed):  # the run-root <Behavior>.onnx files
            d = check_deployed(dep, items, results, out, o.verify, light)
            manifest.deployed.append(d)
            events(DEPLOYED, d)
    finally:
        if pool is not None:
            pool.close(interrupted=sys.exc_info()[0] is not None)
        quiet.__exit__(None, None, None)
        torch.set_num_threads(threads)
        entries = manifest.sorted_entries()
        summary = summarize(entries, time.perf_counter() - t0, jobs, manifest.deployed) \
            if len(entries) == len(items) else None
        if summary is not None:
            summary["warnings"] = warns + [n for n in writer.notes if n not in notes] + notes
            summary["workers"] = pool.describe() if pool is not None else None
            summary["runs"] = header["runs"]
            for r, rec in zip(found.runs, summary["runs"]):
                b = best_entry([results[it.rel] for it in items if it.sub == r.sub and it.rel in results])
                rec.update(best_reward=b["reward"] if b else None, best_step=b.get("step") if b else None,
                           best_stem=b["stem"] if b else None)
        manifest.write(summary, csv_too=summary is not None)
    return BatchResult(source, out, summary, manifest.deployed, header["found_by"], len(found.runs))
