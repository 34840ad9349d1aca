"""Wall time of one ``huggy-convert`` run on the Huggy-spec checkpoint next to a bare
``python -c "import torch"`` on the same machine, interleaved round by round.

    python benchmarks/startup.py [--rounds 3]

Prints the median of each and the ratios: how much of a conversion is just importing torch.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import huggy_checkpoint  # noqa: E402


def wall(cmd) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ckpt = huggy_checkpoint()
    exe = [sys.executable, "-m", "huggy_convert.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "huggy-convert --help": exe + ["--help"],
            "huggy-convert CKPT OUT --no-verify": exe + [str(ckpt), f"{tmp}/a", "--no-verify"],
            "huggy-convert CKPT OUT (full: convert, ONNX, .pt2, verify)": exe + [str(ckpt), f"{tmp}/b"],
        }
        times = {k: [] for k in cases}
        wall([sys.executable, "-c", "import torch, onnxruntime"])  # warm the page cache
        for _ in range(a.rounds):
            for k, cmd in cases.items():
                times[k].append(wall(cmd))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med['python -c "import torch"']
    print(f"checkpoint {ckpt} ({ckpt.stat().st_size / 1e6:.1f} MB), {a.rounds} rounds, median wall time:")
    for k, v in med.items():
        print(f"  {k:58s} {v:6.2f} s   {v / base:5.2f}x import torch")


if __name__ == "__main__":
    main()
