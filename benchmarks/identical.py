"""Every artifact of every fixture, written by this tree and by another checkout, compared byte for byte.

A change that is not meant to change what the tool writes (a refactor, a new check, a verdict rule)
must leave every ``.safetensors``, ``.onnx`` and ``.pt2`` as it was. This script converts each step
checkpoint listed in ``fixtures/manifest.json`` and ``fixtures/families/manifest.json`` (the newest
one of each run, or all with ``--all``) with both trees, each in its own interpreter with its package
on ``PYTHONPATH``, at each ``--opset``, and prints one row per artifact: ``same`` or ``DIFFERS``.

The ``.pt2`` holds no source path or stack trace (``exporters.pt2`` drops them), so it compares as it
is. The ``.golden.npz`` and ``.verify.json`` are the verification's record (figures, wording, sampled
outputs); they are reported as ``same``/``changed`` but do not count as artifacts.

    git worktree add /tmp/base <commit>
    python benchmarks/identical.py --baseline /tmp/base [--opset 9 --opset 13] [--all]

Exits 1 when any artifact differs (or a conversion that one tree wrote the other did not).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
ARTIFACTS = (".safetensors", ".onnx", ".pt2")
RECORDS = (".golden.npz", ".verify.json")


def checkpoints(all_steps: bool):
    for manifest in (FIXTURES / "manifest.json", FIXTURES / "families" / "manifest.json"):
        if not manifest.is_file():
            continue
        for run in json.loads(manifest.read_text())["runs"]:
            steps = run["checkpoints"] if all_steps else run["checkpoints"][-1:]
            for c in steps:
                yield run["name"], FIXTURES / c["pt"]


def convert(tree: Path, pt: Path, out: Path, opset: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-c", "import sys, huggy_convert; from huggy_convert.cli import entry; "
           "sys.stderr.write(huggy_convert.__file__ + '\\n'); sys.argv[0] = 'huggy-convert'; entry()",
           str(pt), str(out), "--opset", str(opset)]
    # cwd: the output's folder, not a checkout (``python -c`` puts the working directory first on sys.path,
    # before PYTHONPATH: run from a checkout, that checkout's package would be imported for both trees)
    out.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(cmd, env=env, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    imported = (r.stderr.splitlines() or [""])[0]
    if not imported.startswith(str(tree) + os.sep):  # the comparison would be of one tree with itself
        sys.exit(f"{tree}: the conversion imported {imported or 'nothing'} instead")
    return r.returncode


def digests(out: Path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*")) if p.is_file()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of huggy-convert")
    ap.add_argument("--opset", type=int, action="append", help="opsets to write (default: 9)")
    ap.add_argument("--all", action="store_true", help="every step checkpoint, not only each run's newest")
    ap.add_argument("--only", action="append", help="runs to compare, by manifest name (default: every run)")
    a = ap.parse_args()
    base = a.baseline.resolve()
    if not (base / "huggy_convert").is_dir():
        sys.exit(f"{base}: no huggy_convert package there")
    opsets = a.opset or [9]
    differ = compared = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, pt) in enumerate(checkpoints(a.all)):
            if a.only and name not in a.only:
                continue
            for opset in opsets:
                outs = {}
                for label, tree in (("this", ROOT), ("baseline", base)):
                    out = Path(tmp) / f"{i}-{opset}-{label}"
                    rc = convert(tree, pt, out, opset)
                    outs[label] = (rc, digests(out) if out.is_dir() else {})
                (rc_a, a_files), (rc_b, b_files) = outs["this"], outs["baseline"]
                rel = pt.relative_to(FIXTURES)
                print(f"{rel} (opset {opset}): exit {rc_a} here, {rc_b} baseline")
                for fname in sorted(set(a_files) | set(b_files)):
                    art = fname.endswith(ARTIFACTS)
                    if not art and not fname.endswith(RECORDS):
                        continue
                    same = a_files.get(fname) == b_files.get(fname)
                    if art:
                        compared += 1
                        differ += not same
                        word = "same" if same else "DIFFERS"
                    else:
                        word = "same" if same else "changed (record, not an artifact)"
                    print(f"  {fname:<48} {word}")
    print(f"artifacts compared: {compared}, differing: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
