"""ML-Agents run directories: which checkpoints they hold, with their steps and rewards.

SOURCE is a run directory (``results/<run-id>/``), a behavior folder of one (its run is the folder
above), a folder of ``.pt`` files, or a folder holding several runs (``downloads/<repo>/``: Hugging
Face Hub clones made by ``mlagents-load-from-hf``). A *run directory* is a folder holding
``run_logs/training_status.json`` or ``configuration.yaml`` (what mlagents-learn writes at the root of
``results/<run-id>/``); each ``.pt`` belongs to the deepest run directory above it, and those in none
form one more group, found by their file names.

In each run, ``run_logs/training_status.json`` gives each checkpoint's behavior, step, reward and
creation time. Its paths are those of the machine that trained (``results/Huggy/Huggy/Huggy-99972.onnx``,
a Colab ``/content/...``, a Windows ``C:\\...\\Huggy-99972.pt``), so a listed file is found by its base
name among the run's ``.pt`` files (ML-Agents' own spelling ``auxillary_file_paths`` names the
``.pt``; ``file_path`` with ``.pt`` for ``.onnx`` is the fallback). Without that file, or for ``.pt``
files it does not list, ``<Behavior>-<step>.pt`` names give behavior and step. Hidden folders
(``.git``) and OUT (when inside SOURCE) are not searched. A listed checkpoint whose file is gone is an
item marked ``missing``. The run-root ``<Behavior>.onnx`` of each behavior is listed as ``Deployed``
(``batch.deployed`` says which checkpoint it is).

Output names (``Item.stem``, ``Item.sub``): the checkpoint's file stem (``Huggy-245828``;
``checkpoint.pt``: ``<Behavior>-checkpoint``; two files of one run with the same stem: their path below
the run directory, ``/`` as ``-``), in OUT itself when SOURCE holds one group, in ``OUT/<the run's path
below SOURCE>/`` when it holds several (``out/ppo-Huggy/Huggy-245828.onnx``). ``Item.rel`` is the
path below the run directory (one group) or below SOURCE (several).

Stable-Baselines3 model zips (``importers.sb3_files.is_sb3_zip``: a ``.zip`` whose central directory
lists ``data`` and ``policy.pth``) are found beside the ``.pt`` files, the way SB3 users keep them: a
folder of CheckpointCallback saves (``rl_model_<N>_steps.zip``), rl-baselines3-zoo's log folder
(``<EnvName>.zip``, ``best_model.zip``, ``rl_model_<N>_steps.zip``), any folder of zips. Each is an item
marked ``foreign`` (read by ``importers.read_source``, never ``load_checkpoint``): its step from the
``_<N>_steps`` name, else the ``data`` JSON's ``num_timesteps`` (``importers.sb3_files.zip_step``), its
behavior the name of its folder (the newest zip of each folder gets the full profile), its stem the
file's stem (clashes: the path below the run, as for ``.pt``). Its VecNormalize file is the importer's to
find (``find_vec_normalize``). The run modes (``step_checkpoints``, ``newest_checkpoint``) take
ML-Agents checkpoints only.

Used by the batch (every checkpoint) and the run modes (inventory, newest checkpoint).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Dict, List, NamedTuple, Optional, Tuple

from .. import contract as C
from ..core.files import check_regular, clip, read_input_file
from ..errors import InputError
from ..importers.sb3_files import is_sb3_zip, zip_step

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
    sub: str = ""  # the folder of its outputs below OUT: its run's path below SOURCE when there are several
    foreign: bool = False  # another trainer's file (an SB3 model zip): read by importers.read_source

    @property
    def out_stem(self) -> str:
        """Its outputs' path below OUT without the suffix (``ppo-Huggy/Huggy-245828``)."""
        return f"{self.sub}/{self.stem}" if self.sub else self.stem


STATUS_MAX_BYTES = 64 << 20  # a status file lists checkpoints: a few KB; this bounds what is read


class BrokenStatus(ValueError):
    """training_status.json is not what ML-Agents writes (the run goes on by file names)."""


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise BrokenStatus(f"the number {clip(text, 24)} is out of range")
    return v


def _no_constant(name: str):
    raise BrokenStatus(f"{name} is not a number")


def _field(e: dict, key: str, kinds, what: str):
    v = e.get(key)
    if v is not None and (not isinstance(v, kinds) or isinstance(v, bool)):
        raise BrokenStatus(f"'{key}' is {clip(repr(v), 40)}, not {what}")
    return v


def _folder_name(name: str) -> bool:
    """A behavior key names a folder of the run: one plain name, on POSIX and on Windows alike
    (not ``/etc``, ``..``, ``a/b``, ``C:x``)."""
    return (name not in ("", ".", "..") and "\x00" not in name and PurePosixPath(name).name == name
            and PureWindowsPath(name).name == name)


def _outside(p: str) -> bool:
    """A listed file whose path climbs out of its folders (``../../etc/x.pt``): not a file of this run.
    (An absolute path is ML-Agents' own on another machine, a Colab ``/content/...``: its base name.)"""
    return ".." in PurePosixPath(p.replace("\\", "/")).parts


def _status_records(doc, ignored: Optional[List[str]] = None) -> List[dict]:
    """Records ``{behavior, name, parent, step, reward, creation_time}`` of a parsed status file;
    anything of the wrong type is a ``BrokenStatus``. A behavior key that is not a folder name of the
    run, or a listed path that climbs out of the run's folders, names nothing of this run: its entries
    are left out, each said in ``ignored``."""
    if not isinstance(doc, dict):
        raise BrokenStatus(f"a JSON {type(doc).__name__}, not an object")
    ignored = [] if ignored is None else ignored
    records = []
    for behavior, val in doc.items():
        if behavior == C.STATUS_METADATA or not isinstance(val, dict):
            continue
        if not _folder_name(str(behavior)):
            ignored.append(f"behavior {clip(repr(behavior), 40)} (not a folder name of the run)")
            continue
        entries = _field(val, C.STATUS_CHECKPOINTS, list, "a list") or []
        final = _field(val, C.STATUS_FINAL, dict, "an object")
        entries = [(e, False) for e in entries] + ([(final, True)] if final is not None else [])
        for e, is_final in entries:
            if not isinstance(e, dict):
                raise BrokenStatus(f"a checkpoint entry is {clip(repr(e), 40)}, not an object")
            aux = _field(e, C.STATUS_AUX_FILES, list, "a list") or _field(e, C.STATUS_AUX_FILES_FIXED, list, "a list") or []
            if not all(isinstance(a, str) for a in aux):
                raise BrokenStatus(f"'{C.STATUS_AUX_FILES}' holds {clip(repr(aux), 40)}, not file names")
            step = _field(e, C.STATUS_STEPS, int, "an integer")
            if step is not None and not 0 <= step < 2 ** 63:
                raise BrokenStatus(f"'{C.STATUS_STEPS}' is {clip(str(step), 24)}, not a step")
            reward = _field(e, C.STATUS_REWARD, (int, float), "a number")
            created = _field(e, C.STATUS_CREATION_TIME, (int, float), "a number")
            file_path = _field(e, C.STATUS_FILE_PATH, str, "a file name")
            escaping = [p for p in aux + [file_path or ""] if _outside(p)]
            if escaping:
                ignored.append(f"{clip(repr(escaping[0]), 60)} (outside the run)")
                continue
            pts = [p for p in aux if p.endswith(C.CHECKPOINT_SUFFIX)]
            if not pts and file_path:
                pts = [str(PurePosixPath(file_path.replace("\\", "/")).with_suffix(C.CHECKPOINT_SUFFIX))]
            for p in pts:
                pp = PurePosixPath(p.replace("\\", "/"))  # a Colab /content/... or Windows C:\\... path: its base name
                records.append({"behavior": str(behavior), "name": pp.name, "parent": pp.parent.name, "step": step,
                                "final": is_final,
                                "reward": None if reward is None else float(reward),
                                C.STATUS_CREATION_TIME: None if created is None else float(created)})
    return records


def _read_status(path: Path) -> Tuple[List[dict], Optional[str]]:
    """Records of training_status.json, or none and one warning when the file is broken (unreadable,
    not UTF-8, not JSON, nested too deeply, the wrong types, numbers out of range): the checkpoints
    are then found by their file names. Entries naming paths outside the run are left out with one
    warning; the rest of the file is used."""
    ignored: List[str] = []
    try:
        text = read_input_file(path, STATUS_FILE.name, STATUS_MAX_BYTES).decode("utf-8")
        records = _status_records(json.loads(text, parse_float=_finite, parse_constant=_no_constant), ignored)
    except InputError as exc:
        reason = exc.message
    except UnicodeDecodeError:
        reason = "not UTF-8"
    except json.JSONDecodeError as exc:
        reason = f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        reason = "nested too deeply"
    except ValueError as exc:  # BrokenStatus, or an integer too long to parse
        reason = clip(" ".join(str(exc).split()), 120)
    else:
        if ignored:
            more = f" and {len(ignored) - 1} more" if len(ignored) > 1 else ""
            return records, (f"{path}: names paths outside the run: ignored {ignored[0]}{more}; "
                             "the rest of the file is used")
        return records, None
    return [], f"{path}: broken {STATUS_FILE.name} ({reason}); using the file names"


def _scan(scope: Path, exclude: Optional[Path], warns: List[str]) -> Tuple[List[Path], List[Path]]:
    """The ``.pt`` files and SB3 model zips under ``scope`` (regular files within the input size bound: a
    FIFO, device, socket or huge sparse file named ``*.pt`` is skipped with a warning, never opened; a
    ``.zip`` counts when ``is_sb3_zip``, which reads its central directory only), and the run directories
    there (folders holding ``run_logs/training_status.json`` or ``configuration.yaml``)."""
    found, runs = [], []
    for dirpath, dirnames, filenames in os.walk(scope):
        keep = []
        for d in sorted(dirnames):
            if d.startswith(".") or (exclude is not None and Path(dirpath, d).resolve() == exclude):
                continue
            keep.append(d)
        dirnames[:] = keep
        if C.RUN_CONFIGURATION in filenames or (Path(dirpath) / STATUS_FILE).is_file():
            runs.append(Path(dirpath))
        for f in sorted(filenames):
            if f.startswith("."):
                continue
            p = Path(dirpath, f)
            if p.suffix.lower() == C.SB3_ZIP_SUFFIX:
                if is_sb3_zip(p):  # (another zip is not a policy: not a word about it)
                    found.append(p)
                continue
            if not f.endswith(C.CHECKPOINT_SUFFIX):
                continue
            try:
                check_regular(p, "checkpoint")
            except InputError as exc:
                warns.append(f"skipped {exc.one_line()}")
                continue
            found.append(p)
    return found, runs


@dataclass
class Deployed:
    """A run-root ``<Behavior>.onnx``: ML-Agents' final export of the behavior, the file people deploy."""

    path: Path
    rel: str  # as Item.rel
    behavior: str
    sub: str  # the run's folder below OUT
    final_step: Optional[int] = None  # the step training_status.json names as the final checkpoint


@dataclass
class Run:
    """One run directory found under SOURCE (or the folder of loose checkpoints)."""

    root: Path
    status: Optional[Path]  # the training_status.json its checkpoints were found by (None: file names)
    sub: str  # its outputs' folder below OUT ("" = OUT itself)
    deployed: List[Deployed]
    checkpoints: int = 0

    @property
    def found_by(self) -> str:
        return STATUS_FILE.as_posix() if self.status else "file names"


class Discovery(NamedTuple):
    root: Path  # the run directory (SOURCE itself when there are several runs)
    status: Optional[Path]  # its training_status.json (None: file names, or several runs)
    items: List[Item]
    warnings: List[str]
    runs: List[Run]


def _run_items(root: Path, status: Optional[Path], files: List[Path], source: Path, behavior_folder: bool,
               warns: List[str]) -> Tuple[List[Item], Optional[Path], Dict[str, Optional[int]]]:
    """The items of one run (its status file, else the file names), with stems unique within the run
    and the newest of each behavior marked; and each behavior's final step from the status file."""
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
            if not records:  # broken: the checkpoints are found by their file names
                status = None
    finals: Dict[str, Optional[int]] = {r["behavior"]: r["step"] for r in records if r["final"]}
    for b in {r["behavior"] for r in records}:
        finals.setdefault(b, None)
    seen_names = set()
    for r in records:
        if (r["behavior"], r["name"]) in seen_names:  # final_checkpoint repeats the newest
            continue
        seen_names.add((r["behavior"], r["name"]))
        if behavior_folder and r["behavior"] != source.name and r["parent"] != source.name:
            continue  # another behavior of the run than the folder asked for
        cands = [c for c in by_name.get(r["name"], []) if c not in claimed]
        if len(cands) > 1:
            cands.sort(key=lambda c: (c.parent.name != r["parent"], c.parent.name != r["behavior"], str(c)))
        if not cands:
            guess = (source if behavior_folder else root / r["behavior"]) / r["name"]
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
        if f.suffix.lower() == C.SB3_ZIP_SUFFIX:  # _scan took it: an SB3 model zip
            step = zip_step(f)
            items.append(Item(path=f, rel=rel(f), behavior=f.parent.name, step=step,
                              kind="other" if step is None else "step", foreign=True))
        elif f.name == CHECKPOINT_NAME:
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
            it.stem = it.rel[:-len(it.path.suffix)].replace("/", "-")
    counts = {}
    for it in items:
        counts[it.stem] = counts.get(it.stem, 0) + 1
    for it in items:  # still the same: a .pt and a .zip of one name in one folder
        if counts[it.stem] > 1 and it.foreign:
            it.stem = f"{it.stem}-{it.path.suffix[1:].lower()}"
    # the newest of each behavior gets the full verification profile
    newest: Dict[tuple, Item] = {}  # (behavior, the folder of a foreign file)
    for it in items:
        if it.kind == "checkpoint" or it.missing:
            continue
        key = (it.step if it.step is not None else -1, it.rel)
        group = (it.behavior, it.path.parent if it.foreign else None)
        cur = newest.get(group)
        if cur is None or key > (cur.step if cur.step is not None else -1, cur.rel):
            newest[group] = it
    for it in newest.values():
        it.newest = True
    return items, status, finals


def _owner(f: Path, roots: List[Path]) -> Optional[Path]:
    """The deepest run directory holding ``f`` (None: a loose file)."""
    owners = [r for r in roots if r in f.parents]
    return max(owners, key=lambda r: len(r.parts)) if owners else None


def discover(source: Path, out: Optional[Path] = None) -> Discovery:
    """The runs and checkpoints under SOURCE: a run directory, a behavior folder of one, a folder of
    ``.pt`` files, or a folder holding several run directories (``downloads/<repo>/``, Hub clones):
    each one is a run of its own, with its own status file, its outputs in ``OUT/<its path below
    SOURCE>/`` when there are several (``Item.sub``), in OUT itself for one."""
    source = Path(source)
    if not source.is_dir():
        raise InputError("no such directory", source)
    warns: List[str] = []
    exclude = Path(out).resolve() if out is not None else None
    files, roots = _scan(source, exclude, warns)
    behavior_folder = not (source / STATUS_FILE).is_file() and (source.parent / STATUS_FILE).is_file()
    if behavior_folder:  # a behavior folder of a run: the run above it
        roots = [source.parent]
    groups: Dict[Path, List[Path]] = {}
    for r in roots:
        groups.setdefault(r, [])
    for f in files:
        groups.setdefault(_owner(f, roots) or source, []).append(f)
    groups = {r: fs for r, fs in groups.items() if fs}
    several = len(groups) > 1

    runs: List[Run] = []
    items: List[Item] = []
    for root in sorted(groups, key=lambda r: r.relative_to(source).as_posix() if r != source.parent else ""):
        status = root / STATUS_FILE if (root / STATUS_FILE).is_file() else None
        its, status, finals = _run_items(root, status, groups[root], source, behavior_folder, warns)
        sub = root.relative_to(source).as_posix() if several and root != source else ""
        for it in its:
            it.sub = sub
            if sub:
                it.rel = f"{sub}/{it.rel}"
        behaviors = sorted({it.behavior for it in its if it.behavior and not it.foreign} | set(finals))
        if behavior_folder:
            behaviors = [b for b in behaviors if b == source.name]
        deployed = []
        for b in behaviors:
            p = root / C.DEPLOYED_ONNX.format(behavior=b)
            if p.is_file() or p.is_symlink():
                rel = f"{sub}/{p.name}" if sub else p.name
                deployed.append(Deployed(path=p, rel=rel, behavior=b, sub=sub, final_step=finals.get(b)))
        runs.append(Run(root=root, status=status, sub=sub, deployed=deployed,
                        checkpoints=sum(1 for it in its if not it.missing)))
        items += its
    items.sort(key=lambda it: (it.sub, it.behavior or "", it.kind == "checkpoint",
                               it.step if it.step is not None else -1, it.rel))
    if several:
        return Discovery(source, None, items, warns, runs)
    return Discovery(runs[0].root if runs else source, runs[0].status if runs else None, items, warns, runs)


def step_checkpoints(run_dir) -> List[Path]:
    """The ``<Behavior>-<step>.pt`` files present under ``run_dir``, oldest first."""
    items = [it for it in discover(Path(run_dir))[2]
             if it.kind == "step" and not it.missing and it.step is not None and not it.foreign]
    return [it.path for it in sorted(items, key=lambda it: (it.step, it.rel))]


def newest_checkpoint(run_dir) -> Path:
    """The newest step checkpoint (``checkpoint.pt`` when there is no step file)."""
    items = [it for it in discover(Path(run_dir))[2] if not it.foreign]  # ML-Agents checkpoints only
    newest = [it for it in items if it.newest]
    if newest:
        return max(newest, key=lambda it: (it.step if it.step is not None else -1, it.rel)).path
    fallback = [it for it in items if it.kind == "checkpoint" and not it.missing]
    if fallback:
        return fallback[0].path
    raise InputError("no checkpoint in this directory (expected <Behavior>/<Behavior>-<step>.pt)", run_dir)
