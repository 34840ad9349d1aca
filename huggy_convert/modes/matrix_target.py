"""What the matrix runs on: the user's checkpoint or run directory, what lies beside it (its official
ONNX, an older checkpoint, the run directory), or a fixtures folder laid out as the bundled one (huggy/
and variants/, with their manifest)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

from .. import contract as C
from ..batch.rundir import newest_checkpoint, step_checkpoints
from ..errors import InputError
from .sources import CKPT_SUFFIXES, display_path

HUGGY_PARAMS = (566_805, 566_826)  # REFERENCE.md: Huggy's actor, linear layers / with log_sigma


# --- the input -------------------------------------------------------------------------------------
def bundled_fixtures() -> Optional[Path]:
    """The fixtures folder of a source checkout (None from an installed package)."""
    p = Path(__file__).resolve().parents[2] / "fixtures"
    return p if (p / "huggy").is_dir() else None


@dataclass
class Target:
    """What the matrix runs on: the main checkpoint, what lies beside it, and the variant fixtures."""

    ck: Path
    label: str
    run_dir: Optional[Path] = None
    older: Optional[Path] = None
    newest_step: Optional[int] = None
    variants: Dict[str, Optional[Path]] = field(default_factory=dict)
    variants_dir: Optional[Path] = None
    manifest: Dict[str, dict] = field(default_factory=dict)
    expect_params: Optional[Tuple[int, int]] = None  # the bundled Huggy's known counts

    @property
    def official(self) -> Optional[Path]:
        p = self.ck.with_suffix(".onnx")
        return p if p.is_file() else None


def _run_dir_of(ck: Path) -> Optional[Path]:
    """The run directory ``<run>/<Behavior>/<Behavior>-<step>.pt`` lies in (it has the status file)."""
    root = ck.parent.parent
    return root if (root / C.STATUS_FILE).is_file() else None


def _target_from(path: Path, label: str) -> Target:
    if not path.exists():
        raise InputError("no such file or directory", path)
    if path.is_dir():
        run_dir, ck = path, newest_checkpoint(path)
    elif path.suffix.lower() in CKPT_SUFFIXES:
        run_dir, ck = _run_dir_of(path), path
    else:
        raise InputError(f"the matrix runs on a checkpoint (.pt) or a run directory, not '{path.suffix or path.name}'",
                         path)
    t = Target(ck, label, run_dir)
    if run_dir is not None:
        same = [p for p in step_checkpoints(run_dir) if p.parent == ck.parent]
        t.older = next((p for p in same if p != ck), None)
        t.newest_step = int(same[-1].stem.rsplit("-", 1)[1]) if same else None
    return t


def _fixtures_target(fx: Path) -> Target:
    huggy = fx / "huggy"
    if not fx.is_dir():
        raise InputError("no fixtures folder", fx)
    if not (huggy.is_dir() and step_checkpoints(huggy)):
        raise InputError("no Huggy fixture (expected huggy/Huggy/Huggy-<step>.pt)", huggy)
    t = _target_from(huggy, f"fixtures {display_path(fx)}")
    t.expect_params = HUGGY_PARAMS
    t.variants_dir = fx / "variants"
    if t.variants_dir.is_dir():
        for d in sorted(p for p in t.variants_dir.iterdir() if p.is_dir()):
            ck = step_checkpoints(d)
            t.variants[d.name] = ck[-1] if ck else None
    mf = fx / "manifest.json"
    if mf.is_file():
        try:
            t.manifest = {run.get("name"): run for run in json.loads(mf.read_text()).get("runs", [])}
        except (OSError, ValueError):
            t.manifest = {}
    return t


def resolve_target(source: Optional[Path] = None, fixtures: Optional[Path] = None) -> Target:
    """``source`` (a checkpoint or run directory), or a ``fixtures`` folder laid out as the bundled one
    (huggy/ and variants/), or, with neither, the bundled fixtures of a source checkout."""
    if source is not None and fixtures is not None:
        raise InputError("give a checkpoint / run directory or --fixtures, not both", source)
    if source is not None:
        return _target_from(Path(source), display_path(source))
    fx = Path(fixtures) if fixtures is not None else bundled_fixtures()
    if fx is None:
        raise InputError("no checkpoint or run directory given (the bundled fixtures exist only in a source "
                         "checkout): huggy-convert matrix CKPT|RUN_DIR")
    return _fixtures_target(fx)
