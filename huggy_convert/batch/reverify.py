"""``verify OUT/``: every artifact set below OUT re-verified (``verify.verify`` on the files), each with
the sources its report records and the profile its batch gave it, over the batch's worker pool; a
worker returns the report (or the error) as data."""
from __future__ import annotations

import json
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import contract as C
from .. import errors
from .. import verify as stage  # stage.verify: looked up where it is defined, when a set is verified
from ..converter import load_checkpoint, load_policy
from ..converter.reference import read_onnx
from ..core import torchcompat
from ..core.artifacts import GOLDEN, REPORT, SAFETENSORS, SUFFIXES, ArtifactSet
from ..core.spec import PolicySpec
from ..errors import HuggyError, InputError, PolicyFileError, as_error
from ..exporters.pt2 import ProgramWriter
from ..importers import checkpoint_from_sb3, is_onnx_source, is_sb3_zip, read_source
from ..importers.from_onnx import checkpoint_from_onnx
from ..importers.own import artifact_set, checkpoint_from_policy_file, is_policy_file
from ..pipeline import ConvertOptions, load_reference, read_reference
from ..verify import Reference, VerifyOptions, write_report
from ..verify.engine import (check_devices, check_tolerance_outputs, locate_source, named_tolerances,
                             read_record)
from .manifest import MANIFEST_JSON, PROFILE_BATCH, PROFILE_FULL, recorded_profiles
from .run import START, WARNING, batch_profiles, profile_note
from .workers import Pool, default_jobs, shared

VERIFIED = "verified"  # verify_out's event: data, one set's record (WARNING and START as run_batch's)
RECORDED = "recorded"  # the profile choice that gives each set the one its batch gave it (else PROFILE_FULL)


def _artifact_folders(out: Path) -> List[Path]:
    """``out`` and the folders below it (not hidden): a batch over several runs writes each run's
    artifacts into ``OUT/<run>/``."""
    folders = []
    for dirpath, dirnames, _ in os.walk(out):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        folders.append(Path(dirpath))
    return folders


def verify_dir(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None,
               require_complete: bool = False, profile: str = RECORDED) -> Tuple[list, List[str]]:
    """``verify OUT/`` in this process: the files already in ``out_dir`` and the folders below it
    re-verified (one report per ``<stem>.safetensors``), each set with the profile ``verify_plan``
    gives it (the one its batch recorded, as ``verify_out``), torch's warnings silenced as there.
    Returns the reports, in order, and the warnings (a tolerance option's; the reports note it too).
    (``verify_out``: the same over a worker pool.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's (recorded_sources loads with quiet_warnings=False)
        sets, profiles, official, ckpt, warns = verify_plan(out_dir, reference, checkpoint, options, stem, profile)
        writer = ProgramWriter(fast=True)
        reports = [verify_set(folder, s, Given(official, ckpt, reference), opts, writer,
                              notes=[note] if note else (), require_complete=require_complete)
                   for (folder, s), (opts, note, _) in zip(sets, profiles)]
    return reports, warns


def verify_plan(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None,
                profile: str = RECORDED):
    """What both drivers of ``verify OUT/`` run (``verify_dir``, ``verify_out``): ``verify_sets``' sets,
    official ONNX, checkpoint and warnings, and for each set (its options, the note its report gets,
    the profile's name): with ``profile`` ``RECORDED``, the batch profile where ``OUT/manifest.json``
    records it (``batch_profiles``, noted), else the full one (``options``)."""
    named = artifact_set(out_dir) if not Path(out_dir).is_dir() else None
    if named is not None:  # a file of a set (OUT/<stem>.onnx): that set
        out_dir, stem = named
    sets, official, ckpt, warns = verify_sets(out_dir, reference, checkpoint, options, stem)
    out = Path(out_dir)
    full = options or VerifyOptions()
    light, _ = batch_profiles(ConvertOptions(verify_options=full))
    recorded = recorded_profiles(out) if profile == RECORDED else {}
    note = (f"re-verified with the profile {MANIFEST_JSON} records for it, the {profile_note(light)}; "
            "'verify --profile full' for the full one")
    profiles = [(light, note, PROFILE_BATCH) if recorded.get(_subject(out, f, s)) == PROFILE_BATCH
                else (full, None, PROFILE_FULL) for f, s in sets]
    return sets, profiles, official, ckpt, warns


def verify_sets(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None):
    """What ``verify OUT/`` checks: the ``(folder, stem)`` sets, the official ONNX, the checkpoint, and
    warnings. A tolerance option naming an output of none of the sets is refused here, before any report
    is rewritten (``verify.engine.check_tolerance_outputs``; one naming an output of some: a warning)."""
    check_devices(getattr(options, "devices", None))
    out = Path(out_dir)
    if not out.is_dir():
        raise InputError("no such directory", out)
    sets = [(out, stem)] if stem else [(d, s) for d in _artifact_folders(out) for s in _stems(d)]
    if not sets:
        raise InputError(f"no {SUFFIXES[SAFETENSORS]} policy to verify (run 'huggy-convert CKPT {out}' first)", out)
    warns: List[str] = []
    if named_tolerances(options):
        specs = []
        for folder, s in sets:
            spec = _spec_of(ArtifactSet(folder, s).path(SAFETENSORS))
            if spec is not None:  # one that does not read is its own set's verdict
                specs.append((_subject(out, folder, s), spec))
        warns = check_tolerance_outputs(options, specs)
    official = load_reference(Path(reference)) if reference else None
    ckpt = read_source(checkpoint) if checkpoint else None
    return sets, official, ckpt, warns


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


def _metadata(path: Path) -> Dict[str, str]:
    """A canonical file's metadata from its header alone (the tensors are not read); a
    ``PolicyFileError`` where the header does not read."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(os.fstat(f.fileno()).st_size, 100 << 20):
                raise ValueError(f"header of {n} bytes")
            md = json.loads(f.read(n)).get("__metadata__") or {}
        if not isinstance(md, dict):
            raise ValueError("metadata is not a map")
        return md
    except (OSError, ValueError, AttributeError, struct.error, RecursionError) as exc:
        raise PolicyFileError(f"not a readable safetensors header ({type(exc).__name__})", path) from None


def _spec_of(path: Path):
    """The spec a canonical file's metadata states (its header only), or None where it does not read."""
    try:
        return PolicySpec.from_json(_metadata(path)["spec"])
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, HuggyError):
        return None


def _vec_normalize_changed(arts: ArtifactSet, ckpt) -> Optional[str]:
    """Where the VecNormalize file an SB3 conversion read (its canonical file's ``trained_with``) is not the
    one beside the zip now: what changed (a second source, recorded by its sha256), else None."""
    try:
        was = json.loads(_metadata(arts.path(SAFETENSORS)).get(C.MD_ORIGIN) or "{}").get("vec_normalize")
    except (ValueError, AttributeError, HuggyError):
        return None
    now = (ckpt.origin or {}).get("vec_normalize")
    if (was or {}).get("sha256") == (now or {}).get("sha256"):
        return None
    if was is None:
        return f"appeared ({now.get('file')}): the conversion read none"
    if now is None:
        return f"is gone ({was.get('file')})"
    return f"changed ({now.get('file')}: sha256 {str(now.get('sha256'))[:12]}, recorded {str(was.get('sha256'))[:12]})"


def recorded_sources(arts: ArtifactSet, record, ckpt, official, reference=None) -> tuple:
    """For a re-verification without ``--checkpoint`` / ``--reference``: the checkpoint and the official
    ONNX its conversion read, where they still are with the sha256 the report records
    (``verify.engine.locate_source``: relative to the set's folder, then the absolute path), and for
    each of checks 1-2 that cannot run as the conversion ran it, why (``Reference.not_run``). Each file
    is read once: the bytes ``locate_source`` read and hashed are the ones loaded, and a policy
    recovered from its own official ONNX (both records one sha256) takes the model read for check 2.
    ``ckpt`` / ``official`` (``reference``: the official's path): given, they are used as they are.
    Returns (checkpoint, official model, official path, not_run)."""
    not_run: Dict[str, Dict[str, str]] = {}
    official_path = Path(reference) if official is not None and reference else None
    read: Dict[str, tuple] = {}  # sha256 -> the official (model, bytes) read here
    roles = (("official", "official", "official ONNX"), ("checkpoint", "safetensors", "checkpoint"))
    for role, cid, what in roles:  # the official first: a policy recovered from it reuses its model
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
            if role == "official":  # the bytes already read and hashed, validated as the file would be
                official, official_path = read_reference(path, data=data)[0], path
                read[rec["sha256"]] = (official, data)
            elif is_onnx_source(path):  # a policy recovered from an ONNX (importers.from_onnx)
                model, data = read.get(rec["sha256"]) or read_onnx(path, "ONNX model", data=data)
                ckpt = checkpoint_from_onnx(path, model, data)
            elif is_policy_file(path):  # a set converted from a canonical file (importers.own)
                ckpt = checkpoint_from_policy_file(path, data)
            elif is_sb3_zip(path):  # another trainer's file (importers.sb3), with its VecNormalize file
                ckpt = checkpoint_from_sb3(path, data)
                changed = _vec_normalize_changed(arts, ckpt)
                if changed:
                    not_run[cid] = {"reason": f"{what}'s VecNormalize file {changed}", "detail": changed}
                    ckpt = None
            else:  # the bytes already read and hashed: the file is read once
                ckpt = load_checkpoint(path, data=data, sha256=rec["sha256"], quiet_warnings=False)  # (both
                # drivers silence torch's warnings around the whole run: catch_warnings is not thread-safe)
        except InputError as exc:
            not_run[cid] = {"reason": f"{what} does not load", "detail": exc.one_line()}
    not_run = {cid: not_run[cid] for cid in ("safetensors", "official") if cid in not_run}  # checks 1-2 in order
    return ckpt, official, official_path, not_run


@dataclass(frozen=True)
class Given:
    """The sources given for every set (``--reference``, ``--checkpoint``), as ``verify_sets`` loads them:
    the official ONNX model, the checkpoint, and the reference's path."""

    official: Any = None
    ckpt: Any = None
    reference: Any = None


@dataclass(frozen=True)
class Asked:
    """What ``verify OUT/`` is asked: the sources given (``reference``: an official ONNX, ``checkpoint``: a
    ``.pt``, paths), the ``options`` (``VerifyOptions``), the ``profile`` (``RECORDED``: each set the one its
    batch gave it; ``PROFILE_FULL``) and ``require_complete`` (a set where a check could not run fails)."""

    reference: Any = None
    checkpoint: Any = None
    options: Any = None
    profile: str = RECORDED
    require_complete: bool = False


def verify_set(folder: Path, s: str, given: Given, options, writer, notes: Sequence[str] = (),
               require_complete: bool = False):
    """Re-verify one set ``folder/<s>.*`` and rewrite its report; returns the report. Without
    ``given.ckpt`` / ``given.official`` (``--checkpoint`` / ``--reference``), checks 1-2 run on the sources its
    report records where they are still there, unchanged; otherwise the report says which checks were
    not run and why (``Report.not_run``: exit 4, or a failure with ``require_complete``). A ``ckpt``
    whose sha256 is not the one the ``.safetensors`` header records is refused. The rewritten
    report keeps the record of the conversion."""
    arts, ckpt = ArtifactSet(folder, s), given.ckpt
    if ckpt is not None and arts.exists(SAFETENSORS):  # (a missing one fails check 1 below)
        source_sha = _metadata(arts.path(SAFETENSORS)).get("source_sha256", "")
        if ckpt.sha256 != source_sha:
            raise InputError(f"checkpoint sha256 {ckpt.sha256[:12]}… is not the source of "
                             f"{arts.name(SAFETENSORS)} ({str(source_sha)[:12]}…)", ckpt.path)
    record = read_record(arts)
    ckpt, official_model, official_path, not_run = recorded_sources(arts, record, ckpt, given.official,
                                                                    given.reference)
    rep = stage.verify(arts, Reference(ckpt, official_model, official_path, arts.path(GOLDEN), not_run),
                       options, subject=f"{s} ({folder})", writer=writer, record=record)
    rep.notes.extend(notes)
    rep.recorded = record.raw
    rep.require_complete = require_complete
    write_report(rep, arts.path(REPORT))
    return rep


def _error_record(exc: BaseException, subject) -> dict:
    err = as_error(exc, subject)
    return {"error": {"type": type(err).__name__, "message": err.message, "path": err.path,
                      "exit_code": err.exit_code, "line": err.one_line()}}


def raise_error_record(rec: dict) -> None:
    """A worker's error raised here as the same type of the one taxonomy."""
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
    opts, note, profile = st["profiles"][i]
    try:
        rep = verify_set(folder, stem, st["given"], opts, st["writer"], notes=[note] if note else (),
                         require_complete=st["require_complete"])
    except Exception as exc:  # noqa: BLE001 - back to the parent as the one taxonomy
        return _error_record(exc, folder / stem)
    return {"report": rep.to_dict(), "ok": rep.ok, "verdict": rep.verdict, "first_failure": rep.first_failure(),
            "subject": rep.subject, "render": rep.render() if st["render"] else None,
            "profile": profile, "complete": rep.complete, "not_run": rep.not_run,
            "incomplete": rep.incomplete()}


def verify_out(out, asked: Asked = Asked(), jobs: Optional[int] = None, render: bool = False,
               processes: bool = True, events: Callable[[str, object], None] = lambda kind, data: None
               ) -> Tuple[List[dict], str]:
    """``verify OUT/``: every set below ``out`` re-verified by ``jobs`` workers (the batch's pool:
    forked after the imports and the ``.pt2`` template's trace; ``processes`` False: threads), each with
    what ``verify_plan`` gives it for what is ``asked`` (``Asked``): its ``profile`` ``RECORDED`` gives each
    set the profile its batch gave it (``OUT/manifest.json``: the batch profile, ``batch_profiles``, for
    all but the newest checkpoint of each behavior), ``PROFILE_FULL`` the full profile to every set.
    Each set re-runs checks 1-2 on the sources its report records (``verify_set``);
    ``asked.require_complete``: a set where some could not run fails. torch's warnings are silenced for the
    whole pool (``verify_dir``: the same in this process). ``render``: each record carries its report's text.
    Returns one record per set, in order (``report``: the full tree as data, ``complete`` and
    ``not_run``: the checks not run and why; or ``error``), and the pool's description; ``events``:
    the warnings first (a tolerance option's; the reports note it too), then ``START`` (the count) and
    each set's record as it is done."""
    import torch

    sets, profiles, official, ckpt, warns = verify_plan(out, asked.reference, asked.checkpoint, asked.options,
                                                        profile=asked.profile)
    for w in warns:
        events(WARNING, w)
    jobs = max(1, min(int(jobs or default_jobs()), len(sets)))
    writer = ProgramWriter(fast=True)
    state = {"sets": sets, "profiles": profiles, "given": Given(official, ckpt, asked.reference),
             "writer": writer, "render": render, "require_complete": asked.require_complete}

    def warm():
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

