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
    The run-root copy of the final export (``huggy_convert.deployed``): the manifest's ``deployed``
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
    ``artifacts.clean_stale_temporaries``) are removed first. One batch at a time holds
    ``OUT/.manifest.json.lock`` (``artifacts.locked``; taking it also proves OUT writable before any
    work), and each checkpoint's set is written under its stem's lock, as a single conversion's. After a ``kill -9``
    a rerun skips what the manifest holds and redoes the rest, with the same bytes (artifacts and
    reports are deterministic: one torch thread, and nothing in them depends on the order).
    Artifacts are not fsynced one by one: after a power cut a rerun finds any torn file by its
    sha256 and redoes that checkpoint.

Exit codes: 0 all converted and verified (or skipped), 1 some checkpoint failed (conversion error,
missing file or failed verification), 2 nothing could be converted, or no checkpoint at all.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import click

from .. import __version__
from .. import contract as C
from ..artifacts import SUFFIXES, check_out, clean_stale_temporaries, locked, make_dirs
from ..converter import atomic_write_bytes
from ..converter.reference import describe as describe_divisor
from ..converter.checkpoint import read_input_file
from ..converter.reference import divisor_record
from .deployed import FAILING as DEPLOYED_FAILING
from .deployed import check_deployed
from .deployed import describe as describe_deployed
from ..errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, HuggyError, InputError
from ..exporters.pt2 import EXPORT_GATE, ProgramWriter
from ..host import host_info
from ..pipeline import ConvertOptions, convert_one
from .rundir import STATUS_FILE, STATUS_KEY, Item, discover
from ..verify.engine import CHECK_IDS
from .workers import Pool, shared

MANIFEST_JSON = "manifest.json"
MANIFEST_CSV = "manifest.csv"
MANIFEST_FORMAT = "huggy-convert-batch-manifest"
MANIFEST_FORMAT_VERSION = 1
BATCH_ROWS = 16
BATCH_FINGERPRINT_STEPS = (16,)
try:  # seconds between manifest rewrites during a run (0: after every checkpoint)
    MANIFEST_INTERVAL_S = float(os.environ.get("HUGGY_CONVERT_MANIFEST_INTERVAL", "1.0"))
except ValueError:
    MANIFEST_INTERVAL_S = 1.0

# entry status (what the out directory holds) and what this run did with it
OK, VERIFY_FAILED, ERROR, MISSING, SAME_AS = "ok", "verify_failed", "error", "missing", "same_as"
CONVERTED, SKIPPED, FAILED, CHECKED = "converted", "skipped", "failed", "checked"
KINDS = tuple(SUFFIXES.items())


# --- writing ------------------------------------------------------------------------------------
def write_atomic(path: Path, data: bytes, fsync: bool = False) -> None:
    """Artifacts: temp name + rename without a per-file fsync (a torn file is found by its sha256)."""
    atomic_write_bytes(path, data, fsync=fsync)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha_file(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


# --- one checkpoint -----------------------------------------------------------------------------
def read_checkpoint(path: Path, data: bytes, sha256: str):
    """``converter.load_checkpoint`` from bytes already read (and hashed): the file is read once.
    (torch's warnings are silenced for the whole batch by run_batch: catch_warnings is not thread-safe.)"""
    from ..converter import load_checkpoint

    return load_checkpoint(path, data=data, sha256=sha256, quiet_warnings=False)


def _policy_state(path: Path):
    """The ``Policy`` state dict of a checkpoint through the one loader (``None`` if it does not load)."""
    from ..converter import load_checkpoint

    try:
        return load_checkpoint(path, quiet_warnings=False).policy  # run_batch silences torch's warnings
    except (HuggyError, OSError):
        return None


def _iso(t: Optional[float]) -> Optional[str]:
    if t is None:
        return None
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def _one_line(exc: BaseException, path: Path) -> str:
    if isinstance(exc, HuggyError):
        return exc.one_line()
    return f"{path}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


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


def _base_entry(item: Item) -> dict:
    return {"source": item.rel, "behavior": item.behavior, "step": item.step, "reward": item.reward,
            C.STATUS_CREATION_TIME: item.creation_time, f"{C.STATUS_CREATION_TIME}_utc": _iso(item.creation_time),
            "listed": item.listed, "kind": item.kind, "stem": item.out_stem,
            "profile": ("full" if item.newest else "batch") if item.kind != "checkpoint" else None,
            "tool_version": __version__}


def _outputs_intact(out: Path, prev: dict) -> bool:
    outs = prev.get("outputs") or {}
    if not outs:
        return False
    for a in outs.values():
        p = out / a["file"]
        if _sha_file(p) != a.get("sha256"):
            return False
    return True


def _can_skip(prev: Optional[dict], sha: str, item: Item, ctx: _Context) -> bool:
    if ctx.force or not prev or prev.get("status") != OK:
        return False
    if prev.get("source_sha256") != sha or prev.get("tool_version") != __version__ or prev.get("stem") != item.out_stem:
        return False
    if item.newest and ctx.options.verify and prev.get("profile") != "full":
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
    entry = _base_entry(item)
    try:
        if ckpt is None:
            data = read_input_file(item.path)
            sha = hashlib.sha256(data).hexdigest()
            entry.update(source_sha256=sha, source_bytes=len(data))
            prev = ctx.previous.get(item.rel)
            if _can_skip(prev, sha, item, ctx):
                entry = _skipped(entry, prev)
                entry["seconds_this_run"] = round(time.perf_counter() - t0, 3)
                return entry
            ckpt = read_checkpoint(item.path, data, sha)
            data = None
        else:
            entry.update(source_sha256=ckpt.sha256, source_bytes=item.path.stat().st_size)
        entry[C.CKPT_GLOBAL_STEP] = ckpt.global_step
        res = convert_one(item.path, ctx.out / item.sub, ctx.options, checkpoint=ckpt, writer=ctx.writer, stem=item.stem,
                          profile=ctx.full if item.newest else ctx.light, notes=[_profile_note(item.newest, ctx)],
                          fsync=False, suggest_reference=False, check_tolerances=False)
        spec = res.conversion.policy.spec
        decision = divisor_record(res.conversion.policy)
        entry["spec"] = {"family": spec.family, "parameters": spec.parameter_count()}
        entry["reference"] = res.reference.name if res.reference else None
        entry["divisor"] = dict(decision, summary=describe_divisor(decision))
        entry["outputs"] = {k: dict(a, file=f"{item.sub}/{a['file']}" if item.sub else a["file"])
                            for k, a in res.outputs().items()}  # paths below OUT
        entry["status"] = OK
        rep = res.report
        if rep is not None:
            v = {"verdict": rep.verdict, "ok": rep.ok, "first_failure": rep.first_failure()}
            v.update(_key_figures(rep.to_dict()))
            entry["verify"] = v
            if not rep.ok:
                entry["status"] = VERIFY_FAILED
                entry["error"] = f"verification failed: {rep.first_failure()}"
        entry["run"] = CONVERTED if entry["status"] == OK else FAILED
    except Exception as exc:  # one bad checkpoint never stops the others
        entry.update(status=ERROR, run=FAILED, error=_one_line(exc, item.path))
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
        return check_alias(item, ctx, candidates), list(ctx.writer.notes)


def warm_up(items: List[Item], ctx: _Context) -> None:
    """In the parent, before the workers fork: every module the work imports, and the ``.pt2``
    template of the first checkpoint's architecture traced (``torch._dynamo``'s import and the trace
    are then paid once, not once per worker). A checkpoint that does not load is left to its task."""
    import onnxruntime  # noqa: F401
    import safetensors.torch  # noqa: F401

    from .. import verify  # noqa: F401
    from ..exporters import onnx_export, torch_module  # noqa: F401
    from ..pipeline import default_reference, prepare_conversion
    from ..runtime import ort  # noqa: F401
    from ..verify import engine  # noqa: F401

    if not ctx.options.program or not items:
        return
    try:
        it = items[0]
        ckpt = read_checkpoint(it.path, read_input_file(it.path), "")
        prep = prepare_conversion(ckpt, default_reference(it.path), ctx.options.obs_sizes, ctx.options.divisor)
        ctx.writer.program_bytes(prep.conversion.policy)
        import torch._dynamo  # noqa: F401  (what torch.export.load needs too)
    except Exception:  # noqa: BLE001 - its task reports it
        pass


def _profile_note(full: bool, ctx: _Context) -> str:
    if full:
        return "batch: newest checkpoint of its behavior, full verification profile"
    lv = ctx.light
    return (f"batch verification profile: checks 1-3 in full ({lv.rows} probe rows), module "
            f"{'/'.join(lv.dtypes)} on {', '.join(lv.devices) if lv.devices else 'every device present'}, "
            f"fingerprints of {'/'.join(map(str, lv.fingerprint_steps))} steps; float16/bfloat16 and 128-step "
            "fingerprints on the newest checkpoint only")


def check_alias(item: Item, ctx: _Context, candidates: List[Tuple[Item, dict]]) -> dict:
    """checkpoint.pt: recorded as ``same_as`` the step entry whose Policy it equals, else converted."""
    t0 = time.perf_counter()
    entry = _base_entry(item)
    try:
        data = read_input_file(item.path)
        sha = hashlib.sha256(data).hexdigest()
        entry.update(source_sha256=sha, source_bytes=len(data))
        prev = ctx.previous.get(item.rel)
        if (not ctx.force and prev and prev.get("status") == SAME_AS and prev.get("source_sha256") == sha
                and prev.get("tool_version") == __version__):
            for cand, cand_entry in candidates:
                if (cand.out_stem == prev.get("same_as") and cand_entry.get("status") == OK
                        and cand_entry.get("source_sha256") == prev.get("same_as_sha256")):
                    entry.update(status=SAME_AS, run=SKIPPED, stem=None, same_as=cand.out_stem, same_as_source=cand.rel,
                                 same_as_sha256=cand_entry["source_sha256"], step=cand.step, reward=cand.reward,
                                 seconds=round(time.perf_counter() - t0, 3))
                    return entry
        ckpt = read_checkpoint(item.path, data, sha)
        data = None
        entry[C.CKPT_GLOBAL_STEP] = ckpt.global_step
        # the step file of its own global step first, then the newest of the folder (candidates[0])
        order = [ce for ce in candidates if ckpt.global_step is not None and ce[0].step == ckpt.global_step]
        order += [ce for ce in candidates[:1] if ce not in order]
        for cand, cand_entry in order:
            if cand_entry.get("status") not in (OK, VERIFY_FAILED):
                continue
            if _same_policy(ckpt.policy, _policy_state(cand.path)):
                entry.update(status=SAME_AS, run=CHECKED, stem=None, same_as=cand.out_stem, same_as_source=cand.rel,
                             same_as_sha256=cand_entry.get("source_sha256"), step=cand.step,
                             reward=cand.reward if item.reward is None else item.reward,
                             seconds=round(time.perf_counter() - t0, 3))
                if cand_entry.get("status") != OK:
                    entry["error"] = f"same as {cand.out_stem}, which failed verification"
                return entry
        entry["profile"] = "batch"
        res = convert_item(item, ctx, ckpt=ckpt)
        res["note"] = f"{C.CHECKPOINT_FILE} matches no step checkpoint: converted as its own entry"
        res["seconds"] = round(time.perf_counter() - t0, 3)
        return res
    except Exception as exc:
        entry.update(status=ERROR, run=FAILED, error=_one_line(exc, item.path),
                     seconds=round(time.perf_counter() - t0, 3))
        return entry


def _same_policy(a: Optional[dict], b: Optional[dict]) -> bool:
    """Bitwise equality of two Policy state dicts (same keys, dtypes, shapes and bytes)."""
    import torch

    if a is None or b is None or sorted(a) != sorted(b):
        return False
    for k, x in a.items():
        y = b[k]
        if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
            return False
        bx = x.detach().contiguous().reshape(-1).view(torch.uint8)
        by = y.detach().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(bx, by):
            return False
    return True


# --- the manifest -------------------------------------------------------------------------------
CSV_COLUMNS = ("behavior", "step", "reward", f"{C.STATUS_CREATION_TIME}_utc", "source", "source_sha256", "stem", "status", "run",
               "same_as", "profile", "verdict", "module_max_abs_cpu_float32", "outputs_bitwise", "safetensors_sha256",
               "onnx_sha256", "pt2_sha256", "report_sha256", "golden_sha256", "seconds", "error")


def _csv_bytes(entries: List[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for e in entries:
        v = e.get("verify") or {}
        mx = (v.get("module_max_abs") or {}).get("cpu float32")
        ob = v.get("outputs_bitwise")
        row = {"verdict": v.get("verdict"), "module_max_abs_cpu_float32": "" if mx is None else f"{mx:.3g}",
               "outputs_bitwise": f"{ob[0]}/{ob[1]}" if ob else ""}
        for kind, _ in KINDS:
            row[f"{kind}_sha256"] = ((e.get("outputs") or {}).get(kind) or {}).get("sha256")
        w.writerow(["" if row.get(c, e.get(c)) is None else row.get(c, e.get(c)) for c in CSV_COLUMNS])
    return buf.getvalue().encode()


def _best(entries: List[dict]) -> Optional[dict]:
    """The converted entry with the highest reward (the later step on a tie)."""
    rewarded = [e for e in entries if e.get("status") == OK and isinstance(e.get("reward"), (int, float))]
    return max(rewarded, key=lambda e: (e["reward"], e.get("step") or -1), default=None)


def _summary(entries: List[dict], seconds: float, jobs: int, deployed: List[dict] = ()) -> dict:
    n = len(entries)
    converted = sum(1 for e in entries if e.get("run") == CONVERTED)
    skipped = sum(1 for e in entries if e.get("run") == SKIPPED)
    failed = [e for e in entries if e.get("status") in (ERROR, MISSING, VERIFY_FAILED)]
    same = sum(1 for e in entries if e.get("status") == SAME_AS)
    have = sum(1 for e in entries if e.get("status") in (OK, VERIFY_FAILED))
    best = _best(entries)
    deployed_failed = [d for d in deployed if d.get("status") in DEPLOYED_FAILING]
    if not failed and not deployed_failed:
        code = EXIT_OK
    elif have == 0:
        code = EXIT_BAD_INPUT
    else:
        code = EXIT_VERIFY_FAILED
    return {"checkpoints": n, "converted": converted, "skipped": skipped, "failed": len(failed), "same_as": same,
            "verification_failed": sum(1 for e in entries if e.get("status") == VERIFY_FAILED),
            "best_reward": best["reward"] if best else None, "best_step": best.get("step") if best else None,
            "best_stem": best["stem"] if best else None,
            "failures": [{"source": e["source"], "error": e.get("error")} for e in failed],
            "deployed": [{k: d.get(k) for k in ("source", "status", "same_as", "same_as_source", "equal_by", "error")}
                         for d in deployed],
            "seconds": round(seconds, 3), "ms_per_checkpoint": round(1000 * seconds / n, 1) if n else None,
            "jobs": jobs, "tool_version": __version__, "ok": code == EXIT_OK, "exit_code": code}


class Manifest:
    def __init__(self, out: Path, header: dict):
        self.out = out
        self.header = header
        self.entries: Dict[str, dict] = {}
        self.deployed: List[dict] = []  # the run-root <Behavior>.onnx files (huggy_convert.deployed)
        self.order: Dict[str, int] = {}
        self._last = 0.0

    def sorted_entries(self) -> List[dict]:
        return [self.entries[k] for k in sorted(self.entries, key=lambda k: self.order[k])]

    def document(self, summary: Optional[dict]) -> dict:
        doc = dict(self.header)
        doc["checkpoints"] = self.sorted_entries()
        doc["deployed"] = self.deployed
        doc["summary"] = summary
        return doc

    def write(self, summary: Optional[dict] = None, csv_too: bool = False, final: bool = True) -> None:
        """The manifest; the ones written along the way are compact (json's C encoder: an indented
        dump runs the pure-Python encoder, ~10x slower, holding the interpreter lock the workers
        need), the final one indented for people."""
        doc = self.document(summary)
        text = (json.dumps(doc, indent=2) if final else json.dumps(doc, separators=(",", ":"))) + "\n"
        if csv_too:
            write_atomic(self.out / MANIFEST_CSV, _csv_bytes(self.sorted_entries()), fsync=True)
        write_atomic(self.out / MANIFEST_JSON, text.encode(), fsync=True)
        _fsync_dir(self.out)
        self._last = time.monotonic()

    def maybe_write(self) -> None:
        if time.monotonic() - self._last >= MANIFEST_INTERVAL_S:
            self.write(final=False)


def _previous(out: Path, header: dict) -> Tuple[Dict[str, dict], Optional[str]]:
    p = out / MANIFEST_JSON
    if not p.is_file():
        return {}, None
    try:
        doc = json.loads(p.read_text())
        if doc.get("format") != MANIFEST_FORMAT or doc.get("format_version") != MANIFEST_FORMAT_VERSION:
            return {}, f"{p}: not a batch manifest of this version; redoing every checkpoint"
    except (OSError, ValueError) as exc:
        return {}, f"{p}: unreadable ({type(exc).__name__}); redoing every checkpoint"
    if doc.get("options") != header["options"]:
        return {}, f"{p}: made with other options; redoing every checkpoint"
    return {e["source"]: e for e in doc.get("checkpoints", []) if isinstance(e, dict) and "source" in e}, None


# --- the command --------------------------------------------------------------------------------
def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _options_record(o: ConvertOptions, light, full) -> dict:
    """Everything that changes the outputs; a manifest made with other options is not reused."""
    def vo(v):
        d = {k: (list(x) if isinstance(x, tuple) else x) for k, x in asdict(v).items()}
        d["devices"] = list(v.devices) if v.devices else None
        return json.loads(json.dumps(d, sort_keys=True))

    return {"opset": o.opset, "obs_sizes": list(o.obs_sizes) if o.obs_sizes else None, "program": o.program,
            "divisor": o.divisor,
            "verify": o.verify, "verify_batch": vo(light) if o.verify else None,
            "verify_newest": vo(full) if o.verify else None}


def batch_profiles(options: ConvertOptions):
    """(batch profile, full profile) of VerifyOptions for a run directory."""
    from ..verify import VerifyOptions

    full = options.verify_options or VerifyOptions()
    dts = ("float32",) if "float32" in full.dtypes else tuple(full.dtypes)[:1]
    light = replace(full, rows=min(full.rows, BATCH_ROWS), dtypes=dts, fingerprint_steps=BATCH_FINGERPRINT_STEPS,
                    program_load=False)
    return light, full


def run_batch(source, out, options: Optional[ConvertOptions] = None, jobs: Optional[int] = None, force: bool = False,
              as_json: bool = False, processes: bool = True) -> int:
    """Convert every checkpoint under ``source`` into ``out``; returns the exit code."""
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
        from ..verify.engine import check_devices

        check_devices(getattr(o.verify_options, "devices", None))
    found.warnings.extend(check_tolerances(items, o))
    make_dirs(out)
    with locked(out, MANIFEST_JSON):  # one batch at a time in OUT (it owns the manifest); proves OUT writable
        return _run_batch(source, out, o, found, jobs, force, as_json, t0, processes)


TOLERANCE_TRIES = 3  # checkpoints tried per folder for its spec (a broken one is its own task's error)


def check_tolerances(items: List[Item], o: ConvertOptions) -> List[str]:
    """A tolerance option (``--atol/--rtol/--cosine OUTPUT:VALUE``) naming an output of none of the
    batch's policies is refused before anything is written (``verify.engine.check_tolerance_outputs``):
    the spec of one checkpoint per behavior folder (the newest first; ML-Agents keeps one architecture
    per behavior within a run), read only when an option names an output. A name that is the output of
    some policies only applies to those (each other report notes it; returned: the warnings)."""
    from ..pipeline import default_reference, prepare_conversion
    from ..verify.engine import check_tolerance_outputs, named_tolerances

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
                    from ..converter import load_checkpoint

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


def _run_batch(source: Path, out: Path, o: ConvertOptions, found, jobs, force: bool, as_json: bool, t0: float,
               processes: bool = True) -> int:
    import torch

    root, status, items, warns = found.root, found.status, found.items, found.warnings
    several = len(found.runs) > 1
    for sub in sorted({""} | {it.sub for it in items}):
        make_dirs(out / sub)
        clean_stale_temporaries(out / sub, ([MANIFEST_JSON, MANIFEST_CSV] if not sub else []) +
                                [f"{it.stem}{suffix}" for it in items if it.stem and it.sub == sub
                                 for suffix in SUFFIXES.values()])
    jobs = max(1, int(jobs or _default_jobs()))
    light, full = batch_profiles(o)
    header = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION,
              "tool": {"name": "huggy-convert", "version": __version__, "torch": torch.__version__},
              "host": host_info(),
              "source": str(source), "run_dir": str(root), STATUS_KEY: str(status) if status else None,
              "found_by": ", ".join(sorted({r.found_by for r in found.runs})) if several else
              (C.STATUS_FILE if status else "file names"),
              "layout": f"out/{'<run>/' if several else ''}<stem>.{{safetensors,onnx,pt2,verify.json,golden.npz}}",
              "runs": _runs_record(found, out),
              "options": _options_record(o, light, full),
              "verification": {
                  "newest_of_each_behavior": "full profile (as a single conversion)",
                  "others": _profile_note(False, _Context(out, o, light, full, {}, force, None)) if o.verify else None}}
    previous, warn = _previous(out, header) if not force else ({}, None)
    warns += [warn] if warn else []
    for w in warns:
        click.echo(f"huggy-convert: warning: {w}", err=True)
    writer = ProgramWriter(fast=True)
    ctx = _Context(out=out, options=o, light=light, full=full, previous=previous, force=force, writer=writer)
    manifest = Manifest(out, header)
    for i, it in enumerate(items):
        manifest.order[it.rel] = i
    results: Dict[str, dict] = {}
    show_bar = not as_json and sys.stdout.isatty()
    bar = None

    def report(entry: dict) -> None:
        results[entry["source"]] = entry
        manifest.entries[entry["source"]] = entry
        if entry.get("status") in (ERROR, MISSING):
            click.echo(f"huggy-convert: error: {entry.get('error')}", err=True)
        elif entry.get("status") == VERIFY_FAILED:
            click.echo(f"huggy-convert: verification failed: {entry['stem']}: "
                       f"{(entry.get('verify') or {}).get('first_failure')}", err=True)
        if bar is not None:
            bar.update(1)
        manifest.maybe_write()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one torch thread per worker: the workers are the parallelism
    aliases = [it for it in items if it.kind == "checkpoint"]
    work = [it for it in items if it.kind != "checkpoint"]
    bar_ctx = click.progressbar(length=len(items), label=f"converting {len(items)} checkpoints", file=sys.stdout) \
        if show_bar else None
    bar = bar_ctx.__enter__() if bar_ctx else None
    quiet = warnings.catch_warnings()  # entered and left by this thread only; the workers see its filter
    quiet.__enter__()
    warnings.simplefilter("ignore")  # torch's warnings would break the one-line errors
    notes: List[str] = []
    pool = None
    try:
        for it in work:
            if it.missing:
                e = _base_entry(it)
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
                    entry = _base_entry(subjects[i])
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
        mode = pool.describe()
        for dep in (d for r in found.runs for d in r.deployed):  # the run-root <Behavior>.onnx files
            d = check_deployed(dep, items, results, out, o.verify, light)
            manifest.deployed.append(d)
            if d["status"] in DEPLOYED_FAILING:
                click.echo(f"huggy-convert: {'error' if d['status'] == ERROR else 'verification failed'}: "
                           f"{d['error']}", err=True)
    finally:
        if pool is not None:
            pool.close(interrupted=sys.exc_info()[0] is not None)
        quiet.__exit__(None, None, None)
        torch.set_num_threads(threads)
        if bar_ctx:
            bar_ctx.__exit__(None, None, None)
        entries = manifest.sorted_entries()
        summary = _summary(entries, time.perf_counter() - t0, jobs, manifest.deployed) \
            if len(entries) == len(items) else None
        if summary is not None:
            summary["warnings"] = warns + [n for n in writer.notes if n not in notes] + notes
            summary["workers"] = pool.describe() if pool is not None else None
            summary["runs"] = header["runs"]
            for r, rec in zip(found.runs, summary["runs"]):
                b = _best([results[it.rel] for it in items if it.sub == r.sub and it.rel in results])
                rec.update(best_reward=b["reward"] if b else None, best_step=b.get("step") if b else None,
                           best_stem=b["stem"] if b else None)
        manifest.write(summary, csv_too=summary is not None)
    if as_json:
        click.echo(json.dumps(dict(summary, manifest=str(out / MANIFEST_JSON)), indent=2))
    else:
        s = summary
        runs = f" in {len(found.runs)} runs" if several else ""
        click.echo(f"{source} -> {out}/: {s['checkpoints']} checkpoints{runs} ({header['found_by']}): {s['converted']} "
                   f"converted, {s['skipped']} skipped, {s['failed']} failed, {s['same_as']} same as another")
        for rec in s["runs"] if several else []:
            best = f", best reward {rec['best_reward']:.4g} at step {rec['best_step']}" \
                if rec["best_reward"] is not None else ""
            click.echo(f"  {rec['dir']}/ -> {out / rec['out']}/: {rec['checkpoints']} checkpoints ({rec['found_by']})"
                       f"{best}")
        if s["best_reward"] is not None and not several:
            click.echo(f"  best reward {s['best_reward']:.4g} at step {s['best_step']} ({s['best_stem']})")
        for d in manifest.deployed:
            click.echo(f"  {describe_deployed(d)}")
        click.echo(f"  manifest: {out / MANIFEST_JSON}, {out / MANIFEST_CSV}")
        click.echo(f"  {s['seconds']:.2f} s ({s['ms_per_checkpoint']} ms per checkpoint, {mode})")
    return summary["exit_code"]


# --- verify OUT/ over the worker pool -----------------------------------------------------------
RECORDED, FULL = "recorded", "full"


def recorded_profiles(out: Path) -> Dict[str, str]:
    """``<stem path below OUT>`` -> the profile its batch gave it (``batch`` / ``full``), from
    ``OUT/manifest.json`` when a batch wrote one (else empty: every set gets the full profile)."""
    p = out / MANIFEST_JSON
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return {}
    return {e["stem"]: e["profile"] for e in doc.get("checkpoints", [])
            if isinstance(e, dict) and isinstance(e.get("stem"), str) and e.get("profile") in ("batch", "full")}


def _error_record(exc: BaseException, subject) -> dict:
    from ..errors import from_foreign

    err = exc if isinstance(exc, HuggyError) else from_foreign(exc, getattr(exc, "filename", None) or subject)
    return {"error": {"type": type(err).__name__, "message": err.message, "path": err.path,
                      "exit_code": err.exit_code, "line": err.one_line()}}


def raise_error_record(rec: dict) -> None:
    """A worker's error raised here as the same type of the one taxonomy."""
    from .. import errors

    cls = getattr(errors, rec["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, HuggyError)):
        cls = HuggyError
    err = cls(rec["message"], rec["path"])
    err.exit_code = rec["exit_code"]
    raise err


def _verify_task(i: int) -> dict:
    """A worker's task: re-verify the i-th set; returns the report as data (its tree, verdict, the
    line to print) or the error as data."""
    from ..pipeline import verify_set

    st = shared()
    folder, stem = st["sets"][i]
    opts, note = st["profiles"][i]
    try:
        rep = verify_set(folder, stem, st["official"], st["ckpt"], st["reference"], opts, st["writer"],
                         notes=[note] if note else (), require_complete=st["require_complete"])
    except Exception as exc:  # noqa: BLE001 - back to the parent as the one taxonomy
        return _error_record(exc, folder / stem)
    return {"report": rep.to_dict(), "ok": rep.ok, "verdict": rep.verdict, "first_failure": rep.first_failure(),
            "subject": rep.subject, "render": rep.render() if st["render"] else None,
            "profile": "batch" if note else "full", "complete": rep.complete, "not_run": rep.not_run,
            "incomplete": rep.incomplete()}


def verify_out(out, reference=None, checkpoint=None, options=None, jobs: Optional[int] = None,
               profile: str = RECORDED, render: bool = False, progress: bool = True,
               processes: bool = True, require_complete: bool = False) -> Tuple[List[dict], str]:
    """``verify OUT/``: every set below ``out`` re-verified by ``jobs`` workers (the batch's pool:
    forked after the imports and the ``.pt2`` template's trace). ``profile``: ``recorded`` gives each
    set the profile its batch gave it (``OUT/manifest.json``: the batch profile, ``batch_profiles``,
    for all but the newest checkpoint of each behavior), ``full`` the full profile to every set.
    Each set re-runs checks 1-2 on the sources its report records (``pipeline.verify_set``);
    ``require_complete``: a set where some could not run fails.
    Returns one record per set, in order (``report``: the full tree as data, ``complete`` and
    ``not_run``: the checks not run and why; or ``error``), and the pool's description."""
    import torch

    from ..pipeline import ConvertOptions, verify_sets
    from ..verify import VerifyOptions

    sets, official, ckpt, warns = verify_sets(out, reference, checkpoint, options)
    for w in warns:  # (before the pool: the one line a tolerance option gives; the reports note it too)
        click.echo(f"huggy-convert: warning: {w}", err=True)
    out = Path(out)
    full = options or VerifyOptions()
    light, _ = batch_profiles(ConvertOptions(verify_options=full))
    recorded = recorded_profiles(out) if profile == RECORDED else {}
    lv = light
    light_note = (f"re-verified with the batch profile {MANIFEST_JSON} records for it: {lv.rows} probe rows, "
                  f"module {'/'.join(lv.dtypes)}, fingerprints of {'/'.join(map(str, lv.fingerprint_steps))} steps, "
                  "no torch.export.load (check 6 compares the .pt2's bytes); 'verify --profile full' for the full one")

    def rel(folder: Path, stem: str) -> str:
        try:
            return (folder.relative_to(out) / stem).as_posix()
        except ValueError:
            return stem

    profiles = [(light, light_note) if recorded.get(rel(f, s)) == "batch" else (full, None) for f, s in sets]
    jobs = max(1, min(int(jobs or _default_jobs()), len(sets)))
    writer = ProgramWriter(fast=True)
    state = {"sets": sets, "profiles": profiles, "official": official, "ckpt": ckpt, "reference": reference,
             "writer": writer, "render": render, "require_complete": require_complete}

    def warm():
        from ..converter import load_policy
        from ..verify import engine  # noqa: F401

        try:  # the .pt2 template of the first set's architecture, traced once here
            writer.program_bytes(load_policy(_safetensors_path(sets[0])))
            import torch._dynamo  # noqa: F401
        except Exception:  # noqa: BLE001 - its task reports it
            pass

    results: List[Optional[dict]] = [None] * len(sets)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.simplefilter("ignore")
    try:
        with Pool(jobs, state, warm=warm if jobs > 1 else None, processes=processes) as pool, \
                click.progressbar(length=len(sets), label=f"verifying {len(sets)} policies", file=sys.stderr) \
                if progress and len(sets) > 1 else _NoBar() as bar:
            for i, ok, res in pool.run([(_verify_task, (i,)) for i in range(len(sets))]):
                results[i] = res if ok else {"error": {"type": "InternalError", "message": res, "path": None,
                                                       "exit_code": 3, "line": res}}
                bar.update(1)
            workers = pool.describe()
    finally:
        quiet.__exit__(None, None, None)
        torch.set_num_threads(threads)
    return results, workers


def _safetensors_path(folder_stem) -> Path:
    from ..artifacts import SAFETENSORS, ArtifactSet

    folder, stem = folder_stem
    return ArtifactSet(folder, stem).path(SAFETENSORS)


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def update(self, n):
        pass
