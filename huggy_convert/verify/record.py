"""What a conversion recorded in ``<stem>.verify.json`` (the files written, the sources read), read back
by a re-verification, and check 6: the files against those records."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import onnx

from ..converter import Checkpoint
from ..contract.targets import REPRODUCIBLE
from ..core.artifacts import GOLDEN, ONNX, PT2, REPORT, SAFETENSORS, TARGET_OF, ArtifactSet, sha256_bytes
from ..core.files import read_input_file
from ..core.policy import Policy
from ..errors import HuggyError
from ..exporters.onnx_export import build_onnx, model_bytes
from ..exporters.pt2 import program_bytes
from ..exporters.registry import TARGETS
from ..exporters.targets import missing
from .report import FAIL, PASS, SKIP, Check


CHECK_IDS = ("safetensors", "official", "outputs", "runtimes", "fingerprints", "files")  # checks 1-6
RECORDED_KINDS = (SAFETENSORS, ONNX, PT2, GOLDEN) + tuple(TARGET_OF)  # the kinds a record can name (the report
# is the record; the deploy targets' files where its conversion wrote them)


@dataclass
class Reference:
    """What a policy's written files are verified against (each part optional)."""

    checkpoint: Optional[Checkpoint] = None
    official: Optional[onnx.ModelProto] = None  # the official ONNX ML-Agents wrote
    official_path: Optional[Path] = None
    golden_path: Optional[Path] = None  # golden outputs of an earlier verification (used without an official)
    # check id ("safetensors", "official") -> {"reason", "detail"}: a source the conversion used that a
    # re-verification could not use (not found, or its sha256 differs): that check is reported not run
    not_run: Dict[str, Dict[str, str]] = field(default_factory=dict)


@dataclass
class Record:
    """What ``<stem>.verify.json`` says its conversion wrote and read (``Report.recorded``), as read back by a
    re-verification. ``artifacts``: kind -> sha256 of each file written (the golden file included; from an
    older report, check 6's figures); ``sources``: "checkpoint"/"official" -> {path, relative, sha256} or None
    (an empty dict: not recorded); ``missing``: why there is no record ('' when there is one)."""

    artifacts: Dict[str, str] = field(default_factory=dict)
    sources: Dict[str, Optional[Dict[str, str]]] = field(default_factory=dict)
    raw: Dict = field(default_factory=dict)  # the report's "recorded" object, kept in the rewritten report
    missing: str = ""
    damaged: str = ""  # the report is there but does not read


def source_record(path, sha256: str, folder) -> Dict[str, Optional[str]]:
    """A source as ``verify.json`` records it: its absolute path, its path relative to ``folder`` (the
    artifacts': found again when both trees moved together) and its sha256."""
    p = Path(os.path.abspath(path))
    try:
        rel = os.path.relpath(p, os.path.abspath(folder))
    except ValueError:  # another drive (Windows)
        rel = None
    return {"path": str(p), "relative": rel, "sha256": sha256}


def _source_entry(src) -> bool:
    """A well-formed record of a source (``source_record``): its sha256, and where it was (a path, a
    relative path or both, each a string or null)."""
    where = [src.get(k) for k in ("path", "relative")] if isinstance(src, dict) else []
    return (isinstance(src, dict) and isinstance(src.get("sha256"), str)
            and all(w is None or isinstance(w, str) for w in where) and any(isinstance(w, str) for w in where))


def read_record(artifacts: ArtifactSet) -> Record:
    """The record in the report beside the files (``<stem>.verify.json``), if any."""
    name = artifacts.name(REPORT)
    if not os.path.lexists(artifacts.path(REPORT)):
        return Record(missing=f"no {name}")
    try:
        rep = json.loads(artifacts.read(REPORT))
        if not isinstance(rep, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Record(missing=f"{name} does not read", damaged=f"{name} does not read ({why})")
    raw = rep.get("recorded")
    arts, sources, malformed = {}, {}, []
    if isinstance(raw, dict):
        recorded_arts = raw.get("artifacts") or {}
        for kind, a in (recorded_arts.items() if isinstance(recorded_arts, dict) else ()):
            if isinstance(a, dict) and isinstance(a.get("sha256"), str):
                arts[str(kind)] = a["sha256"]
        recorded_sources = raw.get("sources") or {}
        if not isinstance(recorded_sources, dict):
            malformed.append("sources")
            recorded_sources = {}
        for role, src in recorded_sources.items():
            if src is None:  # a real null: the conversion had no such source
                sources[str(role)] = None
            elif _source_entry(src):
                sources[str(role)] = src
            else:  # not a record of what it read: that check is not run (never taken for "none")
                malformed.append(str(role))
    else:
        raw = {}
        arts = _recorded_written(rep) or {}
    if malformed:
        missing = f"{name}'s record of its {', '.join(malformed)} is malformed"
    else:
        missing = "" if sources else f"{name} records no sources (written before huggy-convert recorded them)"
    return Record(arts, sources, raw, missing)


def locate_source(rec: Dict[str, str], folder) -> tuple:
    """(the path of the recorded source, its bytes, '', '') where a file with its recorded sha256 is there,
    else (None, None, what happened: 'not found' / 'changed since the conversion' / 'cannot be read', the
    detail): its path relative to ``folder`` first (both trees moved together), then its absolute path.
    A file there with another sha256 is never used. (Read once, by ``read_input_file``: a regular file
    within the size bound.)"""
    candidates = []
    if rec.get("relative"):
        candidates.append(Path(folder) / rec["relative"])
    if rec.get("path"):
        candidates.append(Path(rec["path"]))
    other = None
    for c in candidates:
        try:
            if not os.path.lexists(c):
                continue
            data = read_input_file(c, "source")
        except (OSError, HuggyError) as exc:
            why = exc.message if isinstance(exc, HuggyError) else exc.strerror or type(exc).__name__
            other = other or ("cannot be read", f"{c}: {why}")
            continue
        sha = sha256_bytes(data)
        if sha == rec["sha256"]:
            return c, data, "", ""
        other = other or ("changed since the conversion", f"{c}: sha256 {sha[:12]}…, recorded {rec['sha256'][:12]}…")
    if other is not None:
        return (None, None) + other
    return None, None, "not found", f"recorded at {rec.get('path') or rec.get('relative')}, sha256 {rec['sha256'][:12]}…"


def _recorded_written(rep: Dict) -> Optional[Dict[str, str]]:
    """The sha256 of each file as its conversion wrote it, from an older report (``rep``, parsed) that
    records them in check 6's figures only."""
    try:
        c = next(c for c in rep.get("checks", []) if c.get("id") == "files")
        w = (c.get("figures") or {}).get("written")
        return {str(k): str(v) for k, v in w.items()} if isinstance(w, dict) else None
    except (OSError, ValueError, StopIteration, AttributeError, TypeError):
        return None


@dataclass(frozen=True)
class Written:
    """What a conversion just wrote, for its verification: ``sha256`` (kind -> the sha256 of each file),
    ``data`` (kind -> the bytes, where the conversion still has them: a file read back equal to them,
    byte for byte, has their sha256 without hashing it again), and ``golden``: put the golden file's
    bytes in the report (``Report.golden``)."""

    sha256: Dict[str, str]
    data: Optional[Dict[str, bytes]] = None
    golden: bool = False


@dataclass(frozen=True)
class Regenerate:
    """What check 6 regenerates from the policy read back from the ``.safetensors``: ``kinds`` (``.onnx``
    at the opset of ``rebuilt``, the ONNX read back; ``.pt2`` with ``writer``, an ``exporters.pt2``
    ``ProgramWriter`` or None; a deploy target's files with its converter, ``exporters.registry.TARGETS``)."""

    kinds: Sequence[str] = ()
    policy: Optional[Policy] = None
    rebuilt: Optional[onnx.ModelProto] = None
    writer: Any = None
    made: Dict[str, bytes] = field(default_factory=dict, compare=False)  # a target's files, built once

    def again(self, kind: str) -> tuple:
        """(the bytes regenerated for ``kind``, how they were made); (None, why not) where they cannot be."""
        opset = next((o.version for o in self.rebuilt.opset_import if o.domain in ("", "ai.onnx")), None) \
            if self.rebuilt is not None else None
        if kind == ONNX:
            return model_bytes(build_onnx(self.policy, opset=opset)), f"build_onnx(opset {opset})"
        if kind in TARGET_OF:
            target = TARGET_OF[kind]
            if target not in REPRODUCIBLE:
                return None, f"not regenerated: {target}'s converter is not byte-reproducible (its outputs: check 4)"
            line = missing(target)
            if line:
                return None, f"not regenerated: {line}"
            if kind not in self.made:
                self.made.update(TARGETS[target](self.policy, opset, self.writer))
            return self.made[kind], f"the {target} converter"
        return program_bytes(self.policy, self.writer), "torch.export.save"


def check_files(artifacts: ArtifactSet, files: Dict[str, bytes], written: Optional[Written],
                regenerate: Regenerate = Regenerate(), unreadable: Optional[Dict[str, str]] = None,
                damaged_record: str = "") -> Check:
    """Check 6: the written files (``files``: kind -> the bytes read back) are the bytes their
    conversion wrote (``written``: given by the conversion, or the sha256 recorded in the earlier
    report) and the kinds ``regenerate`` names (``.onnx``, ``.pt2``) are exactly what the policy read back
    from the ``.safetensors`` gives. A kind in ``written`` that is not in ``files`` fails: missing, or
    (``unreadable``: kind -> why) there but not readable; ``damaged_record``: the report that should hold
    the record does not read (a failure too)."""
    sums = dict(written.sha256) if written is not None and written.sha256 else None
    data_written = (written.data if written is not None else None) or {}
    c = Check("6 files", id="files")
    found: Dict[str, str] = {}
    if damaged_record:
        c.add(Check(artifacts.name(REPORT), FAIL, f"{damaged_record}: its record of the files written is lost"))
    for kind, why in (unreadable or {}).items():
        if kind not in files:
            c.add(Check(artifacts.name(kind), FAIL, f"cannot be read: {why}"))
    for kind, want in (sums or {}).items():
        if kind not in files and kind not in (unreadable or {}) and kind in RECORDED_KINDS:
            c.add(Check(artifacts.name(kind), FAIL, f"missing: its conversion wrote it (sha256 {want[:12]}…)"))
    for kind, data in files.items():
        name = artifacts.name(kind)
        want = (sums or {}).get(kind)
        mine = data_written.get(kind)
        found[kind] = want if want is not None and mine is not None and mine == data else sha256_bytes(data)
        if want is not None:
            same = found[kind] == want
            c.add(Check(name, PASS if same else FAIL,
                        "bitwise the bytes its conversion wrote" if same else
                        f"changed since its conversion wrote it (sha256 {found[kind][:12]}…, written {want[:12]}…)"))
        if kind in regenerate.kinds:
            again, what = regenerate.again(kind)
            if again is None:
                c.add(Check(f"{name} from {artifacts.name(SAFETENSORS)}", SKIP, what))
                continue
            same = again == data
            c.add(Check(f"{name} from {artifacts.name(SAFETENSORS)}", PASS if same else FAIL,
                        f"bitwise what {what} gives for the policy in {artifacts.name(SAFETENSORS)}" if same else
                        f"NOT what {what} gives for the policy in {artifacts.name(SAFETENSORS)} "
                        f"({len(data)} bytes vs {len(again)}; first difference at byte "
                        f"{next((i for i, (x, y) in enumerate(zip(data, again)) if x != y), min(len(data), len(again)))})"))
    c.figures = {"found": found, "written": sums if sums else dict(found)}
    n = len(c.children)
    c.summary = (f"{sum(ch.status == PASS for ch in c.children)}/{n} file checks pass" if n else
                 "no record of the bytes written and nothing to regenerate")
    return c
