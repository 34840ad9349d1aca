"""Hugging Face Hub clones built from the committed fixtures (tests/test_hub.py, and by hand).

``mlagents-push-to-hf --local-dir results/<run-id>`` uploads the whole run directory and adds a model
card and ``config.json``; ``mlagents-load-from-hf --local-dir downloads`` clones it into
``downloads/<repo-name>/`` with git-lfs (without git-lfs, every LFS-tracked file is left as a small
pointer text). ``hub_repo`` writes that layout from a committed run directory: the chosen step
checkpoints and their official ONNX (copies), ``checkpoint.pt``,
the run-root ``<Behavior>.onnx``, the tensorboard events, ``config.json``, ``configuration.yaml``,
``README.md``, ``run_logs/{training_status.json,timers.json,Player-0.log}`` and ``.gitattributes``;
the status file's paths rewritten as the training machine wrote them (Colab, Windows).

    python tests/hubkit.py DOWNLOADS  # downloads/ppo-Huggy (Colab paths) + downloads/ppo-Small (Windows)
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

# Where mlagents-learn ran, as its training_status.json then spells each file (the fixtures say
# results/<run-id>/...): a Colab notebook in /content/ml-agents, a Windows PC (backslashes).
MACHINES = {
    "relative": lambda rel: rel,
    "colab": lambda rel: f"/content/ml-agents/{rel}",
    "windows": lambda rel: "C:\\Users\\me\\ml-agents\\" + rel.replace("/", "\\"),
}

# What the Hub writes into a new model repo (huggingface_hub's default .gitattributes, in part)
GITATTRIBUTES = "".join(f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n" for ext in ("onnx", "pt", "bin", "safetensors"))
GITATTRIBUTES += "*tfevents* filter=lfs diff=lfs merge=lfs -text\n"


def lfs_pointer(data: bytes) -> bytes:
    """The pointer git-lfs leaves in place of ``data`` when the clone ran without it (spec v1)."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


def make_pointer(path: Path) -> None:
    """Replace ``path`` by its LFS pointer."""
    path.write_bytes(lfs_pointer(path.read_bytes()))


def _link(src: Path, dst: Path) -> None:
    """A copy (never a hard link: a test that writes into the clone must not write into fixtures/)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _rewrite(status: dict, machine: str) -> dict:
    spell = MACHINES[machine]
    out = {}
    for behavior, val in status.items():
        if behavior == "metadata" or not isinstance(val, dict):
            out[behavior] = val
            continue
        v = dict(val)
        fix = lambda e: dict(e, file_path=spell(e["file_path"]),  # noqa: E731
                             auxillary_file_paths=[spell(p) for p in e["auxillary_file_paths"]])
        v["checkpoints"] = [fix(e) for e in val.get("checkpoints", [])]
        if val.get("final_checkpoint"):
            v["final_checkpoint"] = fix(val["final_checkpoint"])
        out[behavior] = v
    return out


def hub_repo(dest: Path, run: Path, steps: Optional[Iterable[int]] = None, machine: str = "colab",
             lfs: Iterable[str] = ()) -> Path:
    """A Hub clone of the committed run directory ``run`` in ``dest`` (``downloads/<repo-name>``).

    ``steps``: the step checkpoints to keep (default: all); ``machine``: how the status file spells
    paths (``MACHINES``); ``lfs``: paths relative to ``dest`` left as Git-LFS pointers."""
    dest = Path(dest)
    status = json.loads((run / "run_logs" / "training_status.json").read_text())
    behaviors = [b for b in status if b != "metadata"]
    keep = None if steps is None else set(steps)
    for b in behaviors:
        for p in sorted((run / b).glob(f"{b}-*.pt")):
            step = int(p.stem.rsplit("-", 1)[1])
            if keep is not None and step not in keep:
                continue
            _link(p, dest / b / p.name)
            _link(p.with_suffix(".onnx"), dest / b / f"{p.stem}.onnx")
        _link(run / b / "checkpoint.pt", dest / b / "checkpoint.pt")
        _link(run / f"{b}.onnx", dest / f"{b}.onnx")
        (dest / b / "events.out.tfevents.1796030341.colab-vm.1234.0").write_bytes(b"\x18\x00\x00\x00\x00\x00\x00\x00"
                                                                                 b"brain.Event:2" * 8)
    if keep is not None:  # the status lists what the clone holds (keep_checkpoints removed the others)
        for b in behaviors:
            status[b]["checkpoints"] = [e for e in status[b]["checkpoints"] if e["steps"] in keep]
    shutil.copyfile(run / "configuration.yaml", dest / "configuration.yaml")
    (dest / "config.json").write_text(json.dumps({"behaviors": {b: {"trainer_type": "ppo"} for b in behaviors}}))
    (dest / "README.md").write_text(f"---\nlibrary_name: ml-agents\ntags:\n- {behaviors[0]}\n- deep-reinforcement-"
                                    f"learning\n- reinforcement-learning\n- ML-Agents-{behaviors[0]}\n---\n\n"
                                    f"# **ppo** Agent playing **{behaviors[0]}**\n")
    logs = dest / "run_logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "training_status.json").write_text(json.dumps(_rewrite(status, machine), indent=4))
    (logs / "timers.json").write_text(json.dumps({"name": "root", "gauges": {}, "total": 80.5, "count": 1}))
    (logs / "Player-0.log").write_text("Mono path[0] = '/content/ml-agents/trained-envs-executables/linux/Huggy'\n")
    (dest / ".gitattributes").write_text(GITATTRIBUTES)
    for rel in lfs:
        make_pointer(dest / PurePosixPath(rel))
    return dest


def downloads(dest: Path) -> Path:
    """``downloads/`` as ``mlagents-load-from-hf`` leaves it after two repos: ppo-Huggy (Colab) and
    ppo-Small (Windows)."""
    hub_repo(dest / "ppo-Huggy", FIXTURES / "huggy", machine="colab")
    hub_repo(dest / "ppo-Small", FIXTURES / "variants" / "small", machine="windows")
    return dest


if __name__ == "__main__":  # pragma: no cover - by hand
    print(downloads(Path(sys.argv[1])))
