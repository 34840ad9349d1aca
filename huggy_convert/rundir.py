"""An ML-Agents run directory: which checkpoints it holds, with their steps and rewards.

``run_logs/training_status.json`` (in SOURCE, or in its parent when SOURCE is a behavior folder)
gives each checkpoint's behavior, step, reward and creation time. Its paths are relative to
wherever mlagents-learn ran (``results/Huggy/Huggy/Huggy-99972.onnx``), so a listed file is found
by its base name among the ``.pt`` files under SOURCE (ML-Agents' own spelling
``auxillary_file_paths`` names the ``.pt``; ``file_path`` with ``.pt`` for ``.onnx`` is the
fallback). Without that file, or for ``.pt`` files it does not list, ``<Behavior>-<step>.pt``
names give behavior and step. Hidden folders and OUT (when inside SOURCE) are not searched. A
listed checkpoint whose file is gone is an item marked ``missing``.

Used by the batch (every checkpoint) and the run modes (inventory, newest checkpoint).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Tuple

from . import contract as C
from .errors import InputError

STATUS_FILE = Path(C.STATUS_FILE)
STATUS_KEY = STATUS_FILE.stem  # how our JSON names the status file it read
CHECKPOINT_NAME = C.CHECKPOINT_FILE
STEP_NAME = C.STEP_CHECKPOINT_RE


@dataclass
class Item:
    """One checkpoint to process (or a listed one that is missing)."""

    path: Path
    rel: str  # relative to the run directory, posix
    behavior: Optional[str]
    step: Optional[int]
    kind: str = "step"  # step | checkpoint | other
    reward: Optional[float] = None
    creation_time: Optional[float] = None
    listed: bool = False
    missing: bool = False
    stem: str = ""
    newest: bool = False


def _num(v, cast):
    try:
        return None if v is None else cast(v)
    except (TypeError, ValueError):
        return None


def _read_status(path: Path) -> Tuple[List[dict], Optional[str]]:
    """Records ``{behavior, name, parent, step, reward, creation_time}`` from training_status.json."""
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return [], f"{path}: unreadable ({' '.join(str(exc).split())[:120]}); using the file names"
    records = []
    for behavior, val in doc.items():
        if behavior == C.STATUS_METADATA or not isinstance(val, dict):
            continue
        entries = [e for e in (val.get(C.STATUS_CHECKPOINTS) or []) if isinstance(e, dict)]
        if isinstance(val.get(C.STATUS_FINAL), dict):
            entries.append(val[C.STATUS_FINAL])
        for e in entries:
            aux = e.get(C.STATUS_AUX_FILES) or e.get(C.STATUS_AUX_FILES_FIXED) or []
            pts = [str(p) for p in aux if str(p).endswith(C.CHECKPOINT_SUFFIX)]
            if not pts and e.get(C.STATUS_FILE_PATH):
                fp = PurePosixPath(str(e[C.STATUS_FILE_PATH]).replace("\\", "/"))
                pts = [str(fp.with_suffix(C.CHECKPOINT_SUFFIX))]
            for p in pts:
                pp = PurePosixPath(p.replace("\\", "/"))
                records.append({"behavior": str(behavior), "name": pp.name, "parent": pp.parent.name,
                                "step": _num(e.get(C.STATUS_STEPS), int), "reward": _num(e.get(C.STATUS_REWARD), float),
                                C.STATUS_CREATION_TIME: _num(e.get(C.STATUS_CREATION_TIME), float)})
    return records, None


def _scan(scope: Path, exclude: Optional[Path]) -> List[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(scope):
        keep = []
        for d in sorted(dirnames):
            if d.startswith(".") or (exclude is not None and Path(dirpath, d).resolve() == exclude):
                continue
            keep.append(d)
        dirnames[:] = keep
        found += [Path(dirpath, f) for f in sorted(filenames) if f.endswith(C.CHECKPOINT_SUFFIX) and not f.startswith(".")]
    return found


def discover(source: Path, out: Optional[Path] = None) -> Tuple[Path, Optional[Path], List[Item], List[str]]:
    """(run root, training_status.json or None, items, warnings) for SOURCE."""
    source = Path(source)
    if not source.is_dir():
        raise InputError("no such directory", source)
    warns: List[str] = []
    if (source / STATUS_FILE).is_file():
        root, status = source, source / STATUS_FILE
    elif (source.parent / STATUS_FILE).is_file():  # a behavior folder of a run
        root, status = source.parent, source.parent / STATUS_FILE
    else:
        root, status = source, None
    exclude = Path(out).resolve() if out is not None else None
    files = _scan(source, exclude)
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    by_name: Dict[str, List[Path]] = {}
    for f in files:
        by_name.setdefault(f.name, []).append(f)

    items: List[Item] = []
    claimed = set()
    records: List[dict] = []
    if status is not None:
        records, warn = _read_status(status)
        if warn:
            warns.append(warn)
    seen_names = set()
    for r in records:
        if (r["behavior"], r["name"]) in seen_names:  # final_checkpoint repeats the newest
            continue
        seen_names.add((r["behavior"], r["name"]))
        if source != root and r["behavior"] != source.name and r["parent"] != source.name:
            continue  # another behavior of the run than the folder asked for
        cands = [c for c in by_name.get(r["name"], []) if c not in claimed]
        if len(cands) > 1:
            cands.sort(key=lambda c: (c.parent.name != r["parent"], c.parent.name != r["behavior"], str(c)))
        if not cands:
            guess = (source if source != root else root / r["behavior"]) / r["name"]
            items.append(Item(path=guess, rel=rel(guess), behavior=r["behavior"], step=r["step"], reward=r["reward"],
                              creation_time=r[C.STATUS_CREATION_TIME], listed=True, missing=True))
            continue
        f = cands[0]
        claimed.add(f)
        kind = "checkpoint" if f.name == CHECKPOINT_NAME else "step"
        items.append(Item(path=f, rel=rel(f), behavior=r["behavior"], step=r["step"], kind=kind, reward=r["reward"],
                          creation_time=r[C.STATUS_CREATION_TIME], listed=True))
    for f in files:
        if f in claimed:
            continue
        m = STEP_NAME.match(f.name)
        if f.name == CHECKPOINT_NAME:
            items.append(Item(path=f, rel=rel(f), behavior=f.parent.name, step=None, kind="checkpoint"))
        elif m:
            items.append(Item(path=f, rel=rel(f), behavior=m["behavior"], step=int(m["step"])))
        else:
            items.append(Item(path=f, rel=rel(f), behavior=None, step=None, kind="other"))

    # stems: the file stem; checkpoint.pt -> <Behavior>-checkpoint; clashes -> the relative path
    for it in items:
        it.stem = f"{it.behavior or it.path.parent.name}-checkpoint" if it.kind == "checkpoint" else it.path.stem
    counts: Dict[str, int] = {}
    for it in items:
        counts[it.stem] = counts.get(it.stem, 0) + 1
    for it in items:
        if counts[it.stem] > 1:
            it.stem = it.rel[:-len(C.CHECKPOINT_SUFFIX)].replace("/", "-")
    # the newest of each behavior gets the full verification profile
    newest: Dict[Optional[str], Item] = {}
    for it in items:
        if it.kind == "checkpoint" or it.missing:
            continue
        key = (it.step if it.step is not None else -1, it.rel)
        cur = newest.get(it.behavior)
        if cur is None or key > (cur.step if cur.step is not None else -1, cur.rel):
            newest[it.behavior] = it
    for it in newest.values():
        it.newest = True
    items.sort(key=lambda it: (it.behavior or "", it.kind == "checkpoint", it.step if it.step is not None else -1, it.rel))
    return root, status, items, warns


def step_checkpoints(run_dir) -> List[Path]:
    """The ``<Behavior>-<step>.pt`` files present under ``run_dir``, oldest first."""
    items = [it for it in discover(Path(run_dir))[2] if it.kind == "step" and not it.missing and it.step is not None]
    return [it.path for it in sorted(items, key=lambda it: (it.step, it.rel))]


def newest_checkpoint(run_dir) -> Path:
    """The newest step checkpoint (``checkpoint.pt`` when there is no step file)."""
    items = discover(Path(run_dir))[2]
    newest = [it for it in items if it.newest]
    if newest:
        return max(newest, key=lambda it: (it.step if it.step is not None else -1, it.rel)).path
    fallback = [it for it in items if it.kind == "checkpoint" and not it.missing]
    if fallback:
        return fallback[0].path
    raise InputError("no checkpoint in this directory (expected <Behavior>/<Behavior>-<step>.pt)", run_dir)
