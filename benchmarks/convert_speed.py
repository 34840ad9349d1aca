"""One conversion's time (``pipeline.convert_one``: read, map, export, write, verify) in this tree and in
other checkouts, side by side in one run: each tree in its own interpreter with its package on
``PYTHONPATH``, after one warm-up conversion, rounds alternating between the trees so a shared machine's
load falls on all of them alike. Prints each tree's median per conversion and its ratio to this tree's.

    git worktree add /tmp/prev <commit>
    python benchmarks/convert_speed.py --baseline /tmp/prev [--baseline DIR ...] [--rounds 5] [--program]

A refactor that is not meant to change the work should keep the ratio at 1 within the noise the rounds
show (their spread is printed too).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "fixtures" / "huggy" / "Huggy" / "Huggy-245828.pt"

CHILD = r"""
import json, shutil, sys, tempfile, time
from pathlib import Path
from huggy_convert.pipeline import ConvertOptions, convert_one
src, n, program = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
opts = ConvertOptions(program=program)
work = Path(tempfile.mkdtemp())
convert_one(src, work / "warm", opts)
times = []
for i in range(n):
    t0 = time.perf_counter()
    convert_one(src, work / str(i), opts)
    times.append(time.perf_counter() - t0)
shutil.rmtree(work, ignore_errors=True)
print(json.dumps(times))
"""


def run(tree: Path, n: int, program: bool) -> list:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", CHILD, str(CHECKPOINT), str(n), "1" if program else "0"],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", action="append", type=Path, required=True, help="another checkout (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each tree once per round (default 5)")
    ap.add_argument("--per-round", type=int, default=4, help="conversions per tree per round (default 4)")
    ap.add_argument("--program", action="store_true", help="write the .pt2 too (default --no-program)")
    a = ap.parse_args()
    trees = [ROOT] + [b.resolve() for b in a.baseline]
    times = {t: [] for t in trees}
    for _ in range(a.rounds):
        for t in trees:
            times[t] += run(t, a.per_round, a.program)
    ours = statistics.median(times[ROOT])
    print(f"Huggy-245828.pt, convert_one{' with the .pt2' if a.program else ' --no-program'}, "
          f"{a.rounds} rounds x {a.per_round}, median seconds per conversion (spread p10..p90), ratio to this tree")
    for t in trees:
        xs = sorted(times[t])
        p10, p90 = xs[len(xs) // 10], xs[(len(xs) * 9) // 10 - 1 if len(xs) > 1 else 0]
        med = statistics.median(xs)
        print(f"  {str(t):<40} {med:.3f} s ({p10:.3f}..{p90:.3f})  x{med / ours:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
