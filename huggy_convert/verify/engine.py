"""Run the checks over a set of artifacts and build the report (plus the golden I/O file): :func:`verify`.

The checks live beside it: 1 and 3 in :mod:`.checks`, 2 in :mod:`.structure`, 4 in :mod:`.runtimes`, 5 in
:mod:`.fingerprints`, 6 and the record of a conversion in :mod:`.record`; what they share for one policy in
:mod:`.context`; the golden file in :mod:`.golden`; the options in :mod:`.options`."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import onnx

from ..converter.policy_file import loads
from ..converter.reference import describe as describe_divisor
from ..converter.reference import divisor_record
from ..core.artifacts import BUILT, GOLDEN, ONNX, PT2, SAFETENSORS, TARGET_OF, ArtifactSet, sha256_bytes
from ..core.files import atomic_write_bytes, read_input_file
from ..core.policy import Policy
from ..core.version import __version__
from ..errors import HuggyError
from ..exporters.devices import available_devices, device_name
from ..host import host_info
from ..runtime import INTRA_OP_THREADS, VERIFY_THREADS, torch_threads
from . import checks as K
from .context import Context, compare_with_official, golden_of
from .fingerprints import check_fingerprints
from .golden import load_golden
from .options import VerifyOptions, check_tolerance_outputs, named_tolerances
from .record import (CHECK_IDS, Record, Reference, Regenerate, Written, check_files, locate_source, read_record,
                     source_record)
from .report import FAIL, SKIP, Check, Report
from .runtimes import check_devices, check_runtimes
from .targets import not_installed

__all__ = ["verify", "environment", "report_bytes", "write_report", "VerifyOptions", "Reference", "Record",
           "Written", "Context", "compare_with_official", "load_golden", "check_tolerance_outputs",
           "named_tolerances", "check_devices", "check_files", "locate_source", "read_record", "source_record",
           "CHECK_IDS"]


def environment(devices: Sequence[str]) -> Dict[str, object]:
    import onnxruntime
    import safetensors
    import torch

    return {
        "huggy_convert": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__, "safetensors": safetensors.__version__,
        "execution_provider": "CPUExecutionProvider", "ort_intra_op_threads": INTRA_OP_THREADS,
        "ort_inter_op_threads": 1, "torch_threads": torch.get_num_threads(),
        "devices": {d: device_name(d) for d in devices}, "host": host_info(),
    }


def verify(artifacts: ArtifactSet, reference: Optional[Reference] = None, options: Optional[VerifyOptions] = None, *,
           subject: Optional[str] = None, written: Optional[Written] = None, writer=None,
           extra_modules: Sequence = (), record: Optional[Record] = None) -> Report:
    """Verify the files of ``artifacts`` as written: the ``.safetensors`` read back (check 1 against
    the checkpoint), the ``.onnx`` read back (2: against the official ONNX; 3: its outputs against the
    official's or the golden file's), every runtime (4: onnxruntime on the file, the torch module
    built from the ``.safetensors``, the ``.pt2`` through ``torch.export.load``) against the float64
    reference of the canonical tensors, fingerprints (5), and the files themselves (6).

    ``written``: what the caller just wrote (a conversion: ``record.Written``, the sha256 of each file,
    the bytes where it still has them, and whether the report carries the golden file's bytes,
    ``report.golden``); without it (a re-verification) the sha256 are taken from the record in the
    report beside the files (``record``, read here when not given: ``read_record``), every file it
    records must be there with that sha256 (the golden file too), and the ``.onnx``/``.pt2`` are
    regenerated from the ``.safetensors`` and compared byte for byte. ``writer``: the ``.pt2`` writer
    check 6 regenerates with. ``extra_modules``: (title, module) pairs checked like the built ones.
    ``reference.not_run``: checks 1-2 reported not run (``Report.not_run``) and why.

    torch runs on ``runtime.VERIFY_THREADS`` intra-op threads throughout (``runtime.threads``: small
    forwards, fastest on one thread and unslowed by shared cores); the report's environment records
    the process's own setting."""
    o = options or VerifyOptions()
    devices = list(o.devices) if o.devices else available_devices(o.include_npu)
    rep = Report(subject=subject or f"{artifacts.stem} ({artifacts.dir})", environment=environment(devices))
    ref = reference or Reference()
    if written is None and record is None:
        record = read_record(artifacts)
    for cid, why in ref.not_run.items():
        rep.not_run.append({"check": CHECK_IDS.index(cid) + 1, "id": cid, "reason": why["reason"],
                            "detail": why.get("detail", "")})
    rep.not_run.sort(key=lambda n: n["check"])
    job = _Job(rep, artifacts, ref, o, devices, written, writer, extra_modules, record)
    with torch_threads(VERIFY_THREADS):
        return _verify(job)


@dataclass
class _Job:
    """One verification: its report, its files, what they are verified against, how, and what the
    conversion wrote (``written``; None: a re-verification, against ``record``)."""

    rep: Report
    artifacts: ArtifactSet
    ref: Reference
    o: VerifyOptions
    devices: List[str]
    written: Optional[Written]
    writer: Any
    extra_modules: Sequence
    record: Optional[Record]

    @property
    def again(self) -> bool:
        """A re-verification: what its conversion recorded must all be there."""
        return self.written is None

    def fail_1(self, why: str) -> Report:
        self.rep.checks.append(Check("1 safetensors vs checkpoint", FAIL, why, id="safetensors"))
        return self.rep


def _not_run(ref: Reference, cid: str) -> Optional[str]:
    """The summary of a check 1-2 that a re-verification could not run (``Reference.not_run``)."""
    why = ref.not_run.get(cid)
    if why is None:
        return None
    return f"not run: {why['reason']}" + (f" ({why['detail']})" if why.get("detail") else "")


def _read_files(job: _Job, written: Optional[Written]):
    """Each file read once (what the checks run and compare is these bytes): (kind -> bytes, kind -> why
    it cannot be read), or a report whose check 1 fails on a ``.safetensors`` missing or unreadable."""
    artifacts, files, unreadable = job.artifacts, {}, {}
    sums = written.sha256 if written is not None else None
    targets = [k for k in TARGET_OF if sums and k in sums]  # the deploy targets' files its conversion wrote
    for kind in list(BUILT) + targets + ([GOLDEN] if job.again and sums and GOLDEN in sums else []):
        if not os.path.lexists(artifacts.path(kind)):
            if kind == SAFETENSORS:
                return job.fail_1(f"{artifacts.name(kind)} is missing"
                                  + (" (its conversion wrote it)" if sums and kind in sums else ""))
            continue
        try:
            files[kind] = read_input_file(artifacts.path(kind), artifacts.name(kind))
        except HuggyError as exc:
            if kind == SAFETENSORS:
                return job.fail_1(f"does not load: {exc.one_line()}")
            unreadable[kind] = exc.message
    return files, unreadable


def _verify(job: _Job) -> Report:
    rep, artifacts, ref, o = job.rep, job.artifacts, job.ref, job.o
    written = job.written
    if job.again:  # the record of its conversion
        record = job.record
        written = Written(dict(record.artifacts)) if record is not None and record.artifacts else None
    read = _read_files(job, written)
    if isinstance(read, Report):
        return read
    files, unreadable = read
    try:
        policy = loads(files[SAFETENSORS], artifacts.path(SAFETENSORS))
    except HuggyError as exc:
        return job.fail_1(f"does not load: {exc.one_line()}")
    outputs = set(policy.spec.output_names())
    for opt, name, _ in named_tolerances(o):  # a batch's option may name another policy's output
        if name not in outputs:
            rep.notes.append(f"{opt} {name}: not an output of this policy (another policy's): not applied here")
    skipped = _not_run(ref, "safetensors") if ref.checkpoint is None else None
    rep.checks.append(Check("1 safetensors vs checkpoint", SKIP, skipped, id="safetensors") if skipped else
                      K.check_safetensors(policy, ref.checkpoint, artifacts.name(SAFETENSORS)))  # 1
    if ONNX not in files:
        sums = written.sha256 if written is not None else None
        why = f"cannot be read: {unreadable[ONNX]}" if ONNX in unreadable else \
            "is missing" + (" (its conversion wrote it)" if sums and ONNX in sums else "")
        rep.checks.append(Check("2 rebuilt ONNX vs official", FAIL, f"{artifacts.name(ONNX)} {why}", id="official"))
        return rep
    try:
        rebuilt = onnx.load_model_from_string(files[ONNX])
    except Exception as exc:
        rep.checks.append(Check("2 rebuilt ONNX vs official", FAIL, f"{artifacts.name(ONNX)} does not load: "
                                f"{type(exc).__name__}", id="official"))
        return rep
    decision = divisor_record(policy)
    if policy.spec.normalize and decision:
        rep.notes.append(f"divisor: {describe_divisor(decision)}")
    ctx = _check_2_3(job, policy, rebuilt, files)
    targets = {k: v for k, v in files.items() if k in TARGET_OF}
    c4, cpu32 = check_runtimes(ctx, artifacts, job.devices, job.extra_modules, files.get(PT2), targets)  # 4
    rep.checks.append(c4)
    rep.not_run.extend(not_installed(targets))  # a deploy target's runs that its extra's absence here leaves out
    rep.checks.append(check_fingerprints(ctx, job.devices, cpu32))  # 5
    # 6: the files themselves (a .pt2 that check 4 did not run: its bytes regenerated from the policy read back)
    kinds = (ONNX, PT2) + tuple(targets) if job.again else () if o.program_load else (PT2,)
    damaged = job.record.damaged if job.again and job.record is not None else ""
    rep.checks.append(check_files(artifacts, files, written, Regenerate(kinds, policy, rebuilt, job.writer),
                                  unreadable, damaged))
    if job.written is not None and job.written.golden:
        rep.golden = golden_of(ctx)
    return rep


def _check_2_3(job: _Job, policy: Policy, rebuilt: onnx.ModelProto, files: Dict[str, bytes]) -> Context:
    """Checks 2 and 3: against the official ONNX, else (3) the golden file; returns the context the
    later checks share."""
    rep, ref, artifacts = job.rep, job.ref, job.artifacts
    ctx = Context(policy, rebuilt, job.o, files[ONNX])  # 2 and the reference of 3
    if ref.official is not None:
        rep.checks.extend(ctx.use_official(ref.official, ref.official_path, rep.subject))
    else:
        golden_in = damaged = None
        if ref.golden_path and Path(ref.golden_path).is_file():
            try:
                read = files.get(GOLDEN) if Path(ref.golden_path) == artifacts.path(GOLDEN) else None
                golden_in = load_golden(ref.golden_path, policy.spec, data=read)  # the bytes check 6 vouches for
            except HuggyError as exc:  # a damaged golden file in OUT: the verdict, not bad input
                damaged = Check("3 outputs vs the reference", FAIL, f"does not load: {exc.one_line()}", id="outputs")
        if golden_in is not None:
            ctx.use_golden(golden_in, ref.golden_path, rep.environment["host"], rep.notes)
        elif damaged is None:
            rep.notes.append("no official ONNX found: verified what can be verified without one")
        skipped = _not_run(ref, "official")
        rep.checks.append(Check("2 rebuilt ONNX vs official", SKIP, skipped or "no official ONNX to compare with",
                                id="official"))
        if damaged is not None:
            rep.checks.append(damaged)
    if rep.check("outputs") is None:  # 3
        rep.checks.append(ctx.check_outputs())
    return ctx


def report_bytes(rep: Report) -> bytes:
    """The bytes of ``<stem>.verify.json``."""
    return (rep.to_json() + "\n").encode()


def write_report(rep: Report, path, fsync: bool = True) -> Dict[str, str]:
    """Write the report's JSON (atomically; an ``OSError`` becomes an ``OutputError`` naming ``path``,
    as ``atomic_write_bytes`` does); returns ``{path, file, sha256}``."""
    data = report_bytes(rep)
    atomic_write_bytes(path, data, fsync=fsync)
    return {"path": str(path), "file": Path(path).name, "sha256": sha256_bytes(data)}
