"""``verify OUT/``: every artifact set below OUT re-verified (``verify.verify`` on the files), each with
the sources its report records and the profile its batch gave it, over the batch's worker pool; a
worker returns the report (or the error) as data."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..converter import load_checkpoint
from ..core import torchcompat
from ..core.artifacts import GOLDEN, REPORT, SAFETENSORS, SUFFIXES, ArtifactSet
from ..errors import HuggyError, InputError, from_foreign
from ..exporters.pt2 import ProgramWriter
from ..importers import is_onnx_source, read_source
from ..pipeline import ConvertOptions, load_reference, read_reference
from .manifest import MANIFEST_JSON, recorded_profiles
from .run import START, WARNING, batch_profiles
from .workers import Pool, default_jobs, shared

VERIFIED = "verified"  # verify_out's event: data, one set's record (WARNING and START as run_batch's)


def _artifact_folders(out: Path) -> List[Path]:
    """``out`` and the folders below it (not hidden): a batch over several runs writes each run's
    artifacts into ``OUT/<run>/``."""
    folders = []
    for dirpath, dirnames, _ in os.walk(out):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        folders.append(Path(dirpath))
    return folders


def verify_dir(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None,
               require_complete: bool = False):
    """Re-verify the files already in ``out_dir`` and the folders below it (one report per
    ``<stem>.safetensors``), in this process. (``verify_out``: the same over a worker pool.)"""
    sets, official, ckpt, _ = verify_sets(out_dir, reference, checkpoint, options, stem)
    writer = ProgramWriter(fast=True)
    return [verify_set(folder, s, official, ckpt, reference, options, writer, require_complete=require_complete)
            for folder, s in sets]


def verify_sets(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None):
    """What ``verify OUT/`` checks: the ``(folder, stem)`` sets, the official ONNX, the checkpoint, and
    warnings. A tolerance option naming an output of none of the sets is refused here, before any report
    is rewritten (``verify.engine.check_tolerance_outputs``; one naming an output of some: a warning)."""
    from ..verify.engine import check_devices, check_tolerance_outputs, named_tolerances

    check_devices(getattr(options, "devices", None))
    out = Path(out_dir)
    if not out.is_dir():
        raise InputError("no such directory", out)
    sets = [(out, stem)] if stem else [(d, s) for d in _artifact_folders(out) for s in _stems(d)]
    if not sets:
        raise InputError(f"no {SUFFIXES[SAFETENSORS]} policy to verify (run 'huggy-convert CKPT {out}' first)", out)
    warnings: List[str] = []
    if named_tolerances(options):
        specs = []
        for folder, s in sets:
            spec = _spec_of(ArtifactSet(folder, s).path(SAFETENSORS))
            if spec is not None:  # one that does not read is its own set's verdict
                specs.append((_subject(out, folder, s), spec))
        warnings = check_tolerance_outputs(options, specs)
    official = load_reference(Path(reference)) if reference else None
    ckpt = read_source(checkpoint) if checkpoint else None
    return sets, official, ckpt, warnings


def _stems(folder: Path) -> List[str]:
    """The sets in ``folder``: each ``<stem>.safetensors``, and each ``<stem>.verify.json`` whose
    ``.safetensors`` is gone (its report says a conversion wrote one: that set fails check 1)."""
    report = SUFFIXES[REPORT]
    try:
        reports = [p.name[:-len(report)] for p in Path(folder).glob(f"*{report}") if not p.name.startswith(".")]
    except OSError:
        reports = []
    return sorted(set(ArtifactSet.stems(folder)) | set(reports))


def _subject(out: Path, folder: Path, stem: str) -> str:
    try:
        return (Path(folder).relative_to(out) / stem).as_posix()
    except ValueError:
        return stem


def _spec_of(path: Path):
    """The spec a canonical file's metadata states (its header only), or None where it does not read."""
    import json
    import struct

    from ..core.spec import PolicySpec

    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(os.fstat(f.fileno()).st_size, 100 << 20):
                return None
            md = json.loads(f.read(n)).get("__metadata__") or {}
        return PolicySpec.from_json(md["spec"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error, RecursionError, HuggyError):
        return None


def recorded_sources(arts: ArtifactSet, record, ckpt, official) -> tuple:
    """For a re-verification without ``--checkpoint`` / ``--reference``: the checkpoint and the official
    ONNX its conversion read, where they still are with the sha256 the report records
    (``verify.engine.locate_source``: relative to the set's folder, then the absolute path), and for
    each of checks 1-2 that cannot run as the conversion ran it, why (``Reference.not_run``).
    Returns (checkpoint, official model, official path, not_run)."""
    from ..verify.engine import locate_source

    not_run: Dict[str, Dict[str, str]] = {}
    official_path = None
    roles = (("checkpoint", "safetensors", "checkpoint"), ("official", "official", "official ONNX"))
    for role, cid, what in roles:
        if (ckpt if role == "checkpoint" else official) is not None:
            continue
        if role not in record.sources:  # no record: what the conversion read is unknown
            not_run[cid] = {"reason": "no record of its sources", "detail": record.missing}
            continue
        rec = record.sources[role]
        if rec is None:  # the conversion had none (no official ONNX): the check is skipped as it was then
            continue
        path, data, reason, detail = locate_source(rec, arts.dir)
        if path is None:
            not_run[cid] = {"reason": f"{what} {reason}", "detail": detail}
            continue
        try:
            if role == "official":
                official, official_path = read_reference(path)[0], path
            elif is_onnx_source(path):  # a policy recovered from an ONNX (importers.from_onnx)
                ckpt = read_source(path)
            else:  # the bytes already read and hashed: the file is read once
                ckpt = load_checkpoint(path, data=data, sha256=rec["sha256"], quiet_warnings=False)  # (verify_out
                # silences them for the whole pool: catch_warnings is not thread-safe)
        except InputError as exc:
            not_run[cid] = {"reason": f"{what} does not load", "detail": exc.one_line()}
    return ckpt, official, official_path, not_run


def verify_set(folder: Path, s: str, official, ckpt, reference, options, writer, notes: Sequence[str] = (),
               require_complete: bool = False):
    """Re-verify one set ``folder/<s>.*`` and rewrite its report; returns the report. Without
    ``ckpt`` / ``official`` (``--checkpoint`` / ``--reference``), checks 1-2 run on the sources its
    report records where they are still there, unchanged; otherwise the report says which checks were
    not run and why (``Report.not_run``: exit 4, or a failure with ``require_complete``). The rewritten
    report keeps the record of the conversion."""
    from ..verify import Reference, verify, write_report
    from ..verify.engine import read_record

    arts = ArtifactSet(folder, s)
    if ckpt is not None and arts.exists(SAFETENSORS):  # (a missing one fails check 1 below)
        from ..converter import load_policy

        source_sha = load_policy(arts.path(SAFETENSORS)).metadata.get("source_sha256", "")
        if ckpt.sha256 != source_sha:
            raise InputError(f"checkpoint sha256 {ckpt.sha256[:12]}… is not the source of "
                             f"{arts.name(SAFETENSORS)} ({source_sha[:12]}…)", ckpt.path)
    record = read_record(arts)
    ckpt, official_model, official_path, not_run = recorded_sources(arts, record, ckpt, official)
    if official is not None:
        official_model, official_path = official, Path(reference) if reference else None
    rep = verify(arts, Reference(ckpt, official_model, official_path, arts.path(GOLDEN), not_run),
                 options, subject=f"{s} ({folder})", writer=writer, record=record)
    rep.notes.extend(notes)
    rep.recorded = record.raw
    rep.require_complete = require_complete
    write_report(rep, arts.path(REPORT))
    return rep


RECORDED, FULL = "recorded", "full"


def _error_record(exc: BaseException, subject) -> dict:
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
               profile: str = RECORDED, render: bool = False, processes: bool = True, require_complete: bool = False,
               events: Callable[[str, object], None] = lambda kind, data: None) -> Tuple[List[dict], str]:
    """``verify OUT/``: every set below ``out`` re-verified by ``jobs`` workers (the batch's pool:
    forked after the imports and the ``.pt2`` template's trace). ``profile``: ``recorded`` gives each
    set the profile its batch gave it (``OUT/manifest.json``: the batch profile, ``batch_profiles``,
    for all but the newest checkpoint of each behavior), ``full`` the full profile to every set.
    Each set re-runs checks 1-2 on the sources its report records (``verify_set``);
    ``require_complete``: a set where some could not run fails.
    Returns one record per set, in order (``report``: the full tree as data, ``complete`` and
    ``not_run``: the checks not run and why; or ``error``), and the pool's description; ``events``:
    the warnings first (a tolerance option's; the reports note it too), then ``START`` (the count) and
    each set's record as it is done."""
    import torch

    from ..verify import VerifyOptions

    sets, official, ckpt, warns = verify_sets(out, reference, checkpoint, options)
    for w in warns:
        events(WARNING, w)
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
    jobs = max(1, min(int(jobs or default_jobs()), len(sets)))
    writer = ProgramWriter(fast=True)
    state = {"sets": sets, "profiles": profiles, "official": official, "ckpt": ckpt, "reference": reference,
             "writer": writer, "render": render, "require_complete": require_complete}

    def warm():
        from ..converter import load_policy
        from ..verify import engine  # noqa: F401

        try:  # the .pt2 template of the first set's architecture, traced once here
            writer.program_bytes(load_policy(_safetensors_path(sets[0])))
            torchcompat.preload_export()
        except Exception:  # noqa: BLE001 - its task reports it
            pass

    results: List[Optional[dict]] = [None] * len(sets)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.simplefilter("ignore")
    try:
        with Pool(jobs, state, warm=warm if jobs > 1 else None, processes=processes) as pool:
            events(START, len(sets))
            for i, ok, res in pool.run([(_verify_task, (i,)) for i in range(len(sets))]):
                results[i] = res if ok else {"error": {"type": "InternalError", "message": res, "path": None,
                                                       "exit_code": 3, "line": res}}
                events(VERIFIED, results[i])
            workers = pool.describe()
    finally:
        quiet.__exit__(None, None, None)
        torch.set_num_threads(threads)
    return results, workers


def _safetensors_path(folder_stem) -> Path:
    folder, stem = folder_stem
    return ArtifactSet(folder, stem).path(SAFETENSORS)

