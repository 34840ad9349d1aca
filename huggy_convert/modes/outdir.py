"""``info OUT/``: the artifact sets a conversion or a batch wrote there, one line each (what each policy
is, the step and file it came from, its report's verdict, the files present). ``verify OUT/`` re-checks
them; ``info OUT/<stem>.safetensors`` describes one in full."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from ..batch.manifest import MANIFEST_JSON
from ..batch.rundir import discover
from ..converter import load_policy
from ..core.artifacts import REPORT, SAFETENSORS, SUFFIXES, ArtifactSet
from ..errors import HuggyError
from ..importers.own import artifact_sets
from .common import ModeResult
from .sources import display_path


def is_output_dir(p: Path) -> bool:
    """A folder that holds artifact sets and no checkpoint (an ML-Agents run directory is a run first)."""
    if not p.is_dir() or not artifact_sets(p):
        return False
    return not any(not it.missing for it in discover(p).items)


def _verdict(folder: Path, stem: str) -> str:
    """The verdict its ``<stem>.verify.json`` records, or why there is none."""
    path = ArtifactSet(folder, stem).path(REPORT)
    if not path.is_file():
        return "no report (converted with --no-verify?)"
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("verdict", "no verdict recorded"))
    except (OSError, ValueError, AttributeError) as exc:
        return f"report does not read ({type(exc).__name__})"


def _describe(out: Path, folder: Path, stem: str) -> Dict[str, object]:
    arts = ArtifactSet(folder, stem)
    entry: Dict[str, object] = {"set": (folder.relative_to(out) / stem).as_posix(),
                                "files": [arts.path(k).name for k in SUFFIXES if arts.path(k).is_file()],
                                "verdict": _verdict(folder, stem)}
    try:
        policy = load_policy(arts.path(SAFETENSORS))
    except HuggyError as exc:  # one set that does not read is its own line
        entry["error"] = exc.one_line()
        return entry
    md = policy.metadata
    entry.update({"spec": policy.spec.summary(), "training_step": md.get("training_step"), "source_file": md.get("source_file")})
    return entry


def out_info(path) -> ModeResult:
    """Each set in OUT/ (and its folders): what ``info`` says of an output directory."""
    out = Path(path)
    sets: List[Dict[str, object]] = [_describe(out, f, s) for f, s in artifact_sets(out)]
    r = ModeResult("info")
    r.data = {"source": display_path(out), "kind": "output directory", "sets": sets,
              "manifest": display_path(out / MANIFEST_JSON) if (out / MANIFEST_JSON).is_file() else None}
    L = r.lines
    L.append(f"{display_path(out)}  (output directory: {len(sets)} artifact set{'s' if len(sets) != 1 else ''}; "
             f"'huggy-convert verify {display_path(out)}' re-checks them)")
    for e in sets:
        if "error" in e:
            L.append(f"  {e['set']}: {e['error']}")
            continue
        step = f", step {e['training_step']}" if e.get("training_step") else ""
        L.append(f"  {e['set']}: {e['spec']['family']}{step}, from {e['source_file']}")
        L.append(f"    verdict: {e['verdict']}; files: {', '.join(e['files'])}")
    return r
