"""Batch benchmark: one ``huggy-convert RUN_DIR OUT/`` over a 201-checkpoint Huggy-size run vs separate invocations.

The run is built from the committed fixture (fixtures/huggy): its real step checkpoints, copied with
their official ``.onnx`` (and ML-Agents' golden inputs), plus perturbed copies of the newest one saved
with ``torch.save`` in ML-Agents' dict layout (the real file loaded with ``weights_only=True``, the
Policy weights scaled by ``1 + 1e-3 * N(0, 1)`` per copy, every other top-level entry kept,
``global_step`` updated), ``checkpoint.pt`` (same tensors as the newest step) and a
``run_logs/training_status.json`` listing them all. There is no official ONNX for a perturbed copy
(ML-Agents never exported one): those are verified without check 2/3's official comparison; the
real fixture checkpoints are verified against their own official ONNX.

Prints, measured side by side in one run: the batch's wall time, ms per checkpoint, peak RSS of the
batch process (``ru_maxrss`` from ``os.wait4``), the mean of a few separate invocations and its
extrapolation to the whole run, and the ratio. No thresholds are asserted here.

It also prints the floor under any single-process batch on this machine, measured in a fresh
interpreter the same way: importing torch, reading + sha256 + ``torch.load(weights_only=True)`` of
every step checkpoint with the batch's worker count (the loader's unpickler is pure Python and holds
the interpreter lock), the process's first ``torch.export`` of the policy (dynamo's imports and
trace), and per checkpoint its ONNX built (Python) plus one onnxruntime session (which runs in
parallel); what the batch does beyond that (verification, .pt2, writing) comes on top.

    python benchmarks/batch.py [--count 201] [--jobs N] [--singles 3] [--keep DIR]
    python benchmarks/batch.py --baseline DIR [--rounds 3]   # this tree vs another checkout, interleaved
    python benchmarks/batch.py --pt2 [--count 201] [--baseline DIR]  # the .pt2 writer's ways side by side

``--baseline DIR`` runs the same batch with another checkout of huggy-convert (``git worktree add
DIR <commit>``; its package is imported through ``PYTHONPATH``) and this one in alternating rounds,
and prints each round's wall time, peak RSS and the ratio. ``--pt2`` times, in one process, writing
``--count`` programs of the newest fixture policy with torch.export.save (weights swapped into the
traced program) and with ``ProgramWriter(fast=True)`` (graph serialized once), checks that both
give the same bytes, and with ``--baseline`` times that checkout's hand-written archive patcher
(removed in issue 11) in a child process.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HUGGY_RUN = ROOT / "fixtures" / "huggy"
PERTURBED_KEYS = ("seq_layers", "mu.", "log_sigma", "branches.", "lstm.")


def _step_files(run: Path):
    files = [p for p in run.glob("*/*-*.pt") if p.stem.rsplit("-", 1)[1].isdigit()]
    return sorted(files, key=lambda p: int(p.stem.rsplit("-", 1)[1]))


def build_run(dest: Path, count: int = 201, source: Path = HUGGY_RUN, seed: int = 0, real: bool = True) -> dict:
    """Write a run directory with ``count`` step checkpoints into ``dest``; returns a description.

    ``real``: include the source run's own step checkpoints (with their official ONNX) as they are."""
    import numpy as np
    import torch

    steps_real = _step_files(source)
    if not steps_real:
        raise SystemExit(f"no <Behavior>-<step>.pt in {source}")
    behavior = steps_real[-1].parent.name
    bdir = dest / behavior
    bdir.mkdir(parents=True, exist_ok=True)
    (dest / "run_logs").mkdir(exist_ok=True)
    base = torch.load(steps_real[-1], map_location="cpu", weights_only=True)
    last_real = int(steps_real[-1].stem.rsplit("-", 1)[1])
    rng = np.random.default_rng(seed)
    entries = []
    real_files = steps_real if real else []
    n_pert = count - len(real_files)
    real_steps = {int(p.stem.rsplit("-", 1)[1]) for p in real_files}
    t0 = 1796000000.0
    for k in range(n_pert):
        step = 1000 * (k + 1) + 7
        while step in real_steps:
            step += 1
        ckpt = dict(base)
        pol = {}
        g = torch.Generator().manual_seed(seed * 100003 + k)
        for name, t in base["Policy"].items():
            if t.is_floating_point() and any(s in name for s in PERTURBED_KEYS):
                t = t * (1 + 1e-3 * torch.randn(t.shape, generator=g, dtype=t.dtype))
            pol[name] = t
        ckpt["Policy"] = pol
        gs = dict(base["global_step"])
        key = next(iter(gs))
        gs[key] = torch.tensor([step], dtype=gs[key].dtype).reshape(gs[key].shape)
        ckpt["global_step"] = gs
        path = bdir / f"{behavior}-{step}.pt"
        torch.save(ckpt, path)
        entries.append({"steps": step, "file_path": f"results/bench/{behavior}/{behavior}-{step}.onnx",
                        "reward": round(float(10 + 0.2 * k + rng.normal(0, 2)), 6), "creation_time": t0 + 30 * k,
                        "auxillary_file_paths": [f"results/bench/{behavior}/{behavior}-{step}.pt"]})
    for p in real_files:
        step = int(p.stem.rsplit("-", 1)[1])
        for suffix in (".pt", ".onnx", ".golden.npz"):
            q = p.with_name(p.stem + suffix)
            if q.is_file():
                shutil.copyfile(q, bdir / q.name)
        entries.append({"steps": step, "file_path": f"results/bench/{behavior}/{p.stem}.onnx",
                        "reward": round(float(50 + rng.normal(0, 2)), 6), "creation_time": t0 + 30 * count + step / 1000,
                        "auxillary_file_paths": [f"results/bench/{behavior}/{p.name}"]})
    entries.sort(key=lambda e: e["steps"])
    newest = entries[-1]
    cp = source / behavior / "checkpoint.pt"
    if real and cp.is_file() and newest["steps"] == last_real:
        shutil.copyfile(cp, bdir / "checkpoint.pt")
    else:
        shutil.copyfile(bdir / f"{behavior}-{newest['steps']}.pt", bdir / "checkpoint.pt")
    status = {behavior: {"checkpoints": entries, "final_checkpoint": dict(newest, file_path=f"results/bench/{behavior}.onnx")},
              "metadata": {"stats_format_version": "0.3.0", "mlagents_version": "1.1.0", "torch_version": torch.__version__}}
    (dest / "run_logs" / "training_status.json").write_text(json.dumps(status, indent=4))
    return {"dir": dest, "behavior": behavior, "count": len(entries), "entries": entries,
            "real": [p.name for p in real_files]}


def _cli(*args):
    exe = Path(sys.executable).with_name("huggy-convert")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "huggy_convert.cli"], [str(a) for a in args]


def measure(args, package: Path = None) -> dict:
    """wall seconds, peak RSS (MB, ``ru_maxrss`` of that child from ``os.wait4``), exit code and output.
    ``package``: a checkout whose huggy_convert the child imports (PYTHONPATH) instead of this one."""
    head, tail = _cli(*args)
    env = dict(os.environ, PYTHONPATH=str(package)) if package else None
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t = time.perf_counter()
        p = subprocess.Popen(head + tail, stdout=fo, stderr=fe, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return {"wall": wall, "rss": ru.ru_maxrss / 1024, "cpu": ru.ru_utime + ru.ru_stime, "rc": p.returncode,
                "out": fo.read().decode(),
                "err": fe.read().decode()[-3000:]}


def floor_child(run: Path, jobs: int) -> None:
    """(fresh interpreter) print JSON: seconds to import torch, to read + hash + load every step
    checkpoint with ``jobs`` threads, and for the first torch.export of the newest one's policy."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    t = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t
    files = _step_files(run)

    def one(p: Path) -> int:
        data = p.read_bytes()
        hashlib.sha256(data).hexdigest()
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return len(data)

    torch.set_num_threads(1)
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        size = sum(ex.map(one, files))
    t_load = time.perf_counter() - t
    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.exporters.torch_module import build_module, export_program

    policy = convert_checkpoint(files[-1]).policy
    module = build_module(policy)
    t = time.perf_counter()
    export_program(module)
    t_export = time.perf_counter() - t
    # two things every checkpoint needs whatever else is skipped: its ONNX built and serialised, and
    # one onnxruntime session on it (verification runs the rebuilt graph); both timed warm
    from huggy_convert.exporters.onnx_export import build_onnx, model_bytes
    from huggy_convert.runtime import ort_session

    reps = 20
    for _ in range(3):
        ort_session(model_bytes(build_onnx(policy)))
    t = time.perf_counter()
    for _ in range(reps):
        data = model_bytes(build_onnx(policy))
    t_onnx = (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        ort_session(data)
    t_session = (time.perf_counter() - t) / reps
    print(json.dumps({"import_torch": t_import, "load": t_load, "files": len(files), "bytes": size,
                      "first_export": t_export, "onnx_each": t_onnx, "session_each": t_session, "jobs": jobs}))


def patch_child(count: int) -> None:
    """(fresh interpreter, PYTHONPATH = a checkout that still has the hand-written archive patcher)
    print JSON: seconds for ``count`` programs through ``batch.Programs`` (weight records patched in
    a traced archive), or null when that checkout has no patcher."""
    import torch

    torch.set_num_threads(1)
    try:
        from huggy_convert.batch import Programs
    except ImportError:
        print(json.dumps({"patch_s": None}))
        return
    from huggy_convert.converter import convert_checkpoint

    policy = convert_checkpoint(_step_files(HUGGY_RUN)[-1]).policy
    progs = Programs()
    progs.program(policy)
    progs.program(policy)  # trace, then the check against torch.export.save
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(count):
            progs.program(policy)
        times.append(time.perf_counter() - t)
    print(json.dumps({"patch_s": times}))


def pt2_ways(count: int, baseline: Path = None) -> None:
    """torch.export.save with swapped weights vs the writer with the graph serialized once (and, with
    ``baseline``, that checkout's hand-written archive patcher, timed in a child)."""
    import torch

    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.exporters.pt2 import ProgramWriter

    torch.set_num_threads(1)
    policy = convert_checkpoint(_step_files(HUGGY_RUN)[-1]).policy
    ways = {"torch.export.save, weights swapped": ProgramWriter(fast=False),
            "graph serialized once, torch's archive writer": ProgramWriter(fast=True)}
    first = {name: w.program_bytes(policy) for name, w in ways.items()}  # the traces
    times = {name: [] for name in ways}
    for _ in range(3):  # interleaved rounds
        for name, w in ways.items():
            t = time.perf_counter()
            for _ in range(count):
                data = w.program_bytes(policy)
            times[name].append(time.perf_counter() - t)
    same = len(set(first.values())) == 1 and data == first[name]
    for name, ts in times.items():
        print(f"pt2 {name}: {min(ts):.2f}-{max(ts):.2f} s for {count} ({1000 * min(ts) / count:.1f} ms each)")
    a, b = (min(ts) for ts in times.values())
    patch = None
    if baseline is not None:
        child = subprocess.run([sys.executable, __file__, "--patch-child", str(count)], capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(baseline)), check=True)
        patch = json.loads(child.stdout.strip().splitlines()[-1])["patch_s"]
        if patch:
            print(f"pt2 the baseline's archive patcher ({baseline}): {min(patch):.2f}-{max(patch):.2f} s for {count} "
                  f"({1000 * min(patch) / count:.1f} ms each)")
        else:
            print(f"pt2 the baseline ({baseline}) has no archive patcher")
    extra = f" save/patch={a / min(patch):.1f}x fast/patch={b / min(patch):.2f}x" if patch else ""
    print(f"pt2 SUMMARY save/fast={a / b:.1f}x{extra} identical_bytes={same} notes={ways[name].notes}")


def against_baseline(run: Path, tmp: Path, baseline: Path, rounds: int, jobs) -> None:
    import statistics

    walls = {"this tree": [], "baseline": []}
    cpus = {"this tree": [], "baseline": []}
    for r in range(rounds):
        for name, pkg in (("this tree", None), ("baseline", baseline)) if r % 2 == 0 else \
                (("baseline", baseline), ("this tree", None)):
            out = tmp / f"out-{name.replace(' ', '-')}-{r}"
            m = measure([run, out, "--json", *jobs], package=pkg)
            s = json.loads(m["out"]) if m["rc"] in (0, 1) else {}
            walls[name].append(m["wall"])
            cpus[name].append(m["cpu"])
            print(f"round {r}: {name:9s} wall {m['wall']:.2f} s, cpu {m['cpu']:.2f} s, peak RSS {m['rss']:.0f} MB, "
                  f"exit {m['rc']}, "
                  f"{s.get('converted')} converted, {s.get('failed')} failed")
            shutil.rmtree(out, ignore_errors=True)
    ratios = [a / b for a, b in zip(walls["this tree"], walls["baseline"])]
    cpu_ratios = [a / b for a, b in zip(cpus["this tree"], cpus["baseline"])]
    print(f"baseline SUMMARY cpu_ratio_median={statistics.median(cpu_ratios):.3f} "
          f"cpu_ratios={','.join(f'{x:.3f}' for x in cpu_ratios)} "
          f"this_median_s={statistics.median(walls['this tree']):.2f} "
          f"baseline_median_s={statistics.median(walls['baseline']):.2f} "
          f"ratio_median={statistics.median(ratios):.3f} ratios={','.join(f'{x:.3f}' for x in ratios)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=201)
    ap.add_argument("--jobs", type=int, default=0, help="batch workers (default: the command's default, the cores)")
    ap.add_argument("--singles", type=int, default=3, help="separate invocations to time and extrapolate")
    ap.add_argument("--keep", type=Path, help="build the run and outputs here and keep them")
    ap.add_argument("--baseline", type=Path, help="another checkout to run the same batch with, interleaved")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --baseline")
    ap.add_argument("--pt2", action="store_true", help="time the .pt2 writer's two ways")
    ap.add_argument("--floor-child", nargs=2, metavar=("RUN", "JOBS"), help=argparse.SUPPRESS)
    ap.add_argument("--patch-child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.patch_child:
        patch_child(a.patch_child)
        return 0
    if a.floor_child:
        floor_child(Path(a.floor_child[0]), int(a.floor_child[1]))
        return 0
    if a.pt2:
        pt2_ways(a.count, a.baseline.resolve() if a.baseline else None)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="huggy-batch-bench-")) if a.keep is None else a.keep
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        run = tmp / "results" / "bench"
        t = time.perf_counter()
        desc = build_run(run, a.count)
        print(f"built {desc['count']} checkpoints (+ checkpoint.pt) in {time.perf_counter() - t:.1f} s: {run}")
        print(f"  real fixture checkpoints with their official ONNX: {', '.join(desc['real'])}; the "
              f"{desc['count'] - len(desc['real'])} perturbed copies have none (ML-Agents never exported them)")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        jobs = ["--jobs", str(a.jobs)] if a.jobs else []
        if a.baseline:
            against_baseline(run, tmp, a.baseline.resolve(), a.rounds, jobs)
            return 0
        b = measure([run, tmp / "out", "--json", *jobs])
        if b["rc"] != 0:
            print(b["out"][-3000:], b["err"], file=sys.stderr)
        s = json.loads(b["out"])
        n = s["checkpoints"] - s["same_as"]  # step checkpoints (checkpoint.pt is recognised, not converted)
        print(f"batch: {s['checkpoints']} files: {s['converted']} converted and verified, {s['same_as']} same as "
              f"another (checkpoint.pt), {s['failed']} failed; exit {b['rc']}; {s['jobs']} workers on {cores} cores")
        print(f"  wall {b['wall']:.2f} s for {n} checkpoints = {1000 * b['wall'] / n:.1f} ms per checkpoint "
              f"(in-process {s['seconds']:.2f} s; the rest is importing torch and exiting)")
        print(f"  peak RSS {b['rss']:.0f} MB")
        # a tenth of the run: the fixed cost, the cost per checkpoint, and memory that does not grow
        small = tmp / "results" / "bench-small"
        build_run(small, max(2, a.count // 10))
        m = measure([small, tmp / "out-small", "--json", *jobs])
        ms = json.loads(m["out"])
        k = ms["checkpoints"] - ms["same_as"]
        per = (b["wall"] - m["wall"]) / (n - k)
        print(f"  {k} checkpoints: wall {m['wall']:.2f} s, peak RSS {m['rss']:.0f} MB -> marginal {1000 * per:.1f} ms "
              f"per checkpoint, fixed {m['wall'] - k * per:.2f} s (import, first torch.export trace, exit)")
        fl = json.loads(subprocess.run([sys.executable, __file__, "--floor-child", str(run), str(s["jobs"])],
                                       check=True, capture_output=True, text=True).stdout)
        each = fl["onnx_each"] + fl["session_each"] / fl["jobs"]  # onnxruntime builds sessions without the lock
        floor_s = fl["import_torch"] + fl["load"] + fl["first_export"] + fl["files"] * each
        print(f"floor (a fresh interpreter doing only what no batch can skip): import torch {fl['import_torch']:.2f} s"
              f" + read, sha256 and torch.load(weights_only=True) of the {fl['files']} checkpoints "
              f"({fl['bytes'] / 1e9:.2f} GB, {fl['jobs']} threads) {fl['load']:.2f} s + the first torch.export "
              f"{fl['first_export']:.2f} s + per checkpoint its ONNX built {1000 * fl['onnx_each']:.1f} ms (Python, under "
              f"the interpreter lock) and one onnxruntime session {1000 * fl['session_each']:.1f} ms / {fl['jobs']} "
              f"threads (x{fl['files']}) = {floor_s:.2f} s, before any verification, .pt2 or write "
              f"({100 * floor_s / b['wall']:.0f}% of the batch's wall time)")
        r = measure([run, tmp / "out", "--json", *jobs])
        rs = json.loads(r["out"])
        print(f"rerun (all {rs['skipped']} skipped, every source and output re-hashed): wall {r['wall']:.2f} s, "
              f"peak RSS {r['rss']:.0f} MB")
        singles = []
        picks = sorted(run.glob("*/*-*.pt"))[: a.singles]
        for p in picks:
            x = measure([p, tmp / "single"])
            singles.append(x["wall"])
            print(f"separate: huggy-convert {p.name} single/: {x['wall']:.2f} s (exit {x['rc']}), "
                  f"peak RSS {x['rss']:.0f} MB")
        mean = sum(singles) / len(singles)
        est = mean * n
        print(f"separate invocations: mean {mean:.2f} s -> {est:.0f} s for {n} (extrapolated)")
        print(f"ratio: the batch is {est / b['wall']:.1f}x faster than separate invocations")
        print(f"SUMMARY checkpoints={n} wall_s={b['wall']:.2f} ms_per_ckpt={1000 * b['wall'] / n:.1f} "
              f"marginal_ms={1000 * per:.1f} ratio={est / b['wall']:.1f} peak_rss_mb={b['rss']:.0f} "
              f"jobs={s['jobs']} cores={cores} floor_s={floor_s:.2f}")
        return 0
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
