"""Batch benchmark: one ``huggy-convert RUN_DIR OUT/`` over a 201-checkpoint Huggy-size run vs separate invocations.

The run is built from the committed fixture (fixtures/huggy): its real step checkpoints, copied with
their official ``.onnx`` (and ML-Agents' golden inputs), plus perturbed copies of the newest one saved
with ``torch.save`` in ML-Agents' dict layout (the real file loaded with ``weights_only=True``, the
Policy weights scaled by ``1 + 1e-3 * N(0, 1)`` per copy, every other top-level entry kept,
``global_step`` updated), ``checkpoint.pt`` (same tensors as the newest step) and a
``run_logs/training_status.json`` listing them all. There is no official ONNX for a perturbed copy
(ML-Agents never exported one): those are verified without check 2/3's official comparison; the
real fixture checkpoints are verified against their own official ONNX.

Prints, measured side by side in one run (issue 15, P1 and P2), each ratio beside its target: the
batch's wall time against ``python -c "import torch"`` (median of 3 here) and against its floor;
separate invocations (the mean of ``--singles``, extrapolated) against the batch; the PSS summed over
the batch's processes (parent and workers, ``/proc/<pid>/smaps_rollup`` sampled every 20 ms; peak),
at ``--small`` (50) and at ``--count`` (201) checkpoints; and ``verify DIR`` over the batch's output
against the batch. No thresholds are asserted here.

The floor is measured in a fresh interpreter with one torch thread (``floor_child``): the imports,
one ``torch._dynamo`` import and trace (paid once, in the pool's parent), and per checkpoint, on a
sample: reading and hashing the source, reading its ``Policy``, writing and hashing the artifacts,
two fresh onnxruntime sessions (one session reused for new weights is not bitwise: ruled out) and
the verification forwards; the per-checkpoint part divided by the workers. Beside it, the same floor
with what the project's rules add, each by the library call alone (the artifacts' bytes,
``onnx.checker`` with ``full_check``, the files read back, check 5's second run of each fingerprint),
and the project's own ``convert_item`` timed on the same checkpoints in that process: its cost per
checkpoint against that floor's.

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


def _children(pid: int):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def _pss_mb(pid: int) -> float:
    """PSS (proportional set size: shared pages divided among the processes sharing them) of ``pid``
    and every process below it, from ``/proc/<pid>/smaps_rollup``."""
    total = 0
    for q in [pid] + _children(pid):
        try:
            with open(f"/proc/{q}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total / 1024


def measure(args, package: Path = None, pss: bool = False) -> dict:
    """wall seconds, peak RSS (MB, ``ru_maxrss`` of that child from ``os.wait4``: the largest single
    process), with ``pss`` the peak of the PSS summed over the process and its workers (sampled every
    20 ms while it runs), exit code and output.
    ``package``: a checkout whose huggy_convert the child imports (PYTHONPATH) instead of this one."""
    import threading

    head, tail = _cli(*args)
    env = dict(os.environ, PYTHONPATH=str(package)) if package else None
    peak = [0.0]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t = time.perf_counter()
        p = subprocess.Popen(head + tail, stdout=fo, stderr=fe, env=env)
        stop = threading.Event()

        def sample():
            while not stop.wait(0.02):
                peak[0] = max(peak[0], _pss_mb(p.pid))

        th = threading.Thread(target=sample, daemon=True)
        if pss:
            th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        stop.set()
        if pss:
            th.join()
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return {"wall": wall, "rss": ru.ru_maxrss / 1024, "cpu": ru.ru_utime + ru.ru_stime, "rc": p.returncode,
                "pss": peak[0], "out": fo.read().decode(),
                "err": fe.read().decode()[-3000:]}


def import_torch_wall(reps: int = 3) -> float:
    """Median wall of ``python -c "import torch"`` (fresh interpreters, this run)."""
    import statistics

    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def floor_child(run: Path, jobs: int, sample: int = 20) -> None:
    """(fresh interpreter, one torch thread) print JSON: the work no batch can skip, measured, and the
    project's own cost per checkpoint on the same sample, serially.

    ``imports``: onnx, onnxruntime, safetensors, click and the package after torch (torch's own import
    is the ``python -c "import torch"`` wall measured beside it); ``dynamo``: the first
    ``torch.export`` of the policy (importing ``torch._dynamo`` and the trace, paid once in the
    pool's parent); per checkpoint, on ``sample`` of them: reading the source and its sha256, the
    ``Policy`` tensors read (the allow-listed reader), writing the four artifacts and their sha256,
    two onnxruntime sessions (the file written and the official / regenerated one: a fresh session
    each, not reusable bitwise), and the verification forwards (16 probe rows and a 16-step
    fingerprint through onnxruntime and the torch module, the float64 reference on the rows).

    ``rules``: what the project's rules add to that, each by the library call alone: the artifacts'
    bytes (``safetensors.numpy.save``, the ONNX graph built and serialized, the ``.pt2`` with its
    graph serialized once), ``onnx.checker`` with ``full_check``, the three artifacts read back and
    the ``.safetensors`` parsed (verification reads the files written), and check 5's second run of
    each fingerprint (determinism). ``ours``: ``batch.convert_item`` (the batch profile) on the same
    checkpoints, one after another in this process, ms each."""
    import hashlib

    t = time.perf_counter()
    import torch
    t_torch = time.perf_counter() - t
    torch.set_num_threads(1)
    t = time.perf_counter()
    import click  # noqa: F401
    import onnx
    import onnxruntime  # noqa: F401
    import safetensors.numpy
    import safetensors.torch  # noqa: F401  (the package imports it: part of the imports measured)

    from huggy_convert.converter import load_checkpoint, save_policy  # noqa: F401
    from huggy_convert.exporters.onnx_export import build_onnx, model_bytes
    from huggy_convert.exporters.pt2 import ProgramWriter
    from huggy_convert.exporters.torch_module import build_module, export_program
    from huggy_convert.pipeline import prepare_conversion
    from huggy_convert.runtime import ort_session
    from huggy_convert.runtime.feeds import make_probes
    from huggy_convert.verify.bounds import Float64Policy
    t_imports = time.perf_counter() - t
    files = _step_files(run)
    conv = prepare_conversion(load_checkpoint(files[-1]), None).conversion
    t = time.perf_counter()
    export_program(build_module(conv.policy))
    t_dynamo = time.perf_counter() - t
    writer = ProgramWriter(fast=True)
    writer.program_bytes(conv.policy)  # its trace (the parent's, in a batch)
    picks = files[:: max(1, len(files) // sample)][:sample]
    parts = {"read_sha256": 0.0, "load": 0.0, "write_sha256": 0.0, "sessions": 0.0, "forwards": 0.0}
    rules = {"artifact_bytes": 0.0, "checker": 0.0, "read_back": 0.0, "determinism": 0.0}
    tmp = Path(tempfile.mkdtemp(prefix="huggy-floor-"))

    def rows(sess, module, probes, names):
        for i in range(16):
            row = {k: v[i:i + 1] for k, v in probes.items()}
            sess.run(None, row)
            module(*[torch.from_numpy(row[k]) for k in names])

    try:
        for p in picks:
            t = time.perf_counter()
            data = p.read_bytes()
            hashlib.sha256(data).hexdigest()
            parts["read_sha256"] += time.perf_counter() - t
            t = time.perf_counter()
            ck = load_checkpoint(p, data=data, sha256="-")
            parts["load"] += time.perf_counter() - t
            policy = prepare_conversion(ck, None).conversion.policy
            t = time.perf_counter()
            st_b = safetensors.numpy.save(policy.tensors)  # as converter.policy_file writes it
            model = build_onnx(policy)
            onnx_b = model_bytes(model)
            pt2_b = writer.program_bytes(policy)
            rules["artifact_bytes"] += time.perf_counter() - t
            t = time.perf_counter()
            onnx.checker.check_model(model, full_check=True)
            rules["checker"] += time.perf_counter() - t
            blobs = [st_b, onnx_b, pt2_b, b"x" * 4096]  # .safetensors, .onnx, .pt2, golden
            t = time.perf_counter()
            for k, b in enumerate(blobs):
                (tmp / f"{k}.bin").write_bytes(b)
                hashlib.sha256(b).hexdigest()
            parts["write_sha256"] += time.perf_counter() - t
            t = time.perf_counter()
            back = [(tmp / f"{k}.bin").read_bytes() for k in range(3)]
            safetensors.numpy.load(back[0])  # as converter.policy_file reads it
            rules["read_back"] += time.perf_counter() - t
            t = time.perf_counter()
            sessions = [ort_session(back[1]), ort_session(back[1])]
            parts["sessions"] += time.perf_counter() - t
            module = build_module(policy)
            probes = make_probes(policy, 16)
            names = module.input_names
            t = time.perf_counter()
            sessions[0].run(None, probes)
            with torch.no_grad():
                module(*[torch.from_numpy(probes[k]) for k in names])
                rows(sessions[1], module, probes, names)
            Float64Policy(policy).forward(probes)
            parts["forwards"] += time.perf_counter() - t
            t = time.perf_counter()
            with torch.no_grad():
                rows(sessions[1], module, probes, names)
            rules["determinism"] += time.perf_counter() - t
        ours = _ours_per_checkpoint(run, picks, tmp / "ours")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    per = {k: v / len(picks) for k, v in parts.items()}
    print(json.dumps({"import_torch_in_process": t_torch, "imports": t_imports, "dynamo": t_dynamo, "per": per,
                      "rules": {k: v / len(picks) for k, v in rules.items()}, "ours": ours,
                      "files": len(files), "jobs": jobs, "sample": len(picks)}))


def _ours_per_checkpoint(run: Path, picks, out: Path) -> float:
    """Seconds per checkpoint of ``batch.convert_item`` (the batch profile: none of ``picks`` is the
    newest) in this process, after one warm-up conversion."""
    from huggy_convert.batch import run as HB
    from huggy_convert.exporters.pt2 import ProgramWriter
    from huggy_convert.pipeline import ConvertOptions
    from huggy_convert.batch.rundir import discover

    out.mkdir(parents=True)
    o = ConvertOptions()
    found = discover(run, out)
    light, full = HB.batch_profiles(o)
    ctx = HB._Context(out=out, options=o, light=light, full=full, previous={}, force=False,
                      writer=ProgramWriter(fast=True))
    names = {p.name for p in picks}
    items = [it for it in found.items if it.kind == "step" and not it.newest and it.path.name in names]
    HB.warm_up(items, ctx)
    HB.convert_item(items[0], ctx)
    t = time.perf_counter()
    for it in items:
        e = HB.convert_item(it, ctx)
        if e.get("status") != "ok":
            raise SystemExit(f"{it.path.name}: {e.get('status')}: {e.get('error')}")
    return (time.perf_counter() - t) / len(items)


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


def compare_outputs(a: Path, b: Path) -> str:
    """Every file but the manifests byte for byte, and each manifest entry's outputs (sha256),
    verdict, key figures and fingerprints."""
    import hashlib

    def files(d):
        return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(d.rglob("*")) if p.is_file() and not p.name.startswith("manifest.")}

    fa, fb = files(a), files(b)
    diff = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))

    def entries(d):
        doc = json.loads((d / "manifest.json").read_text())
        return {e["source"]: (e.get("status"), e.get("outputs"), e.get("verify"), e.get("same_as"), e.get("profile"))
                for e in doc["checkpoints"]}

    ea, eb = entries(a), entries(b)
    ediff = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k))
    return (f"outputs vs the baseline: {len(fa)} files, {len(diff)} differ"
            + (f" ({', '.join(diff[:5])})" if diff else " (byte-identical)")
            + f"; manifest entries (status, outputs, verdicts, key figures, fingerprints): {len(ea)}, "
            f"{len(ediff)} differ" + (f" ({', '.join(ediff[:5])})" if ediff else ""))


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
            if r > 0:
                shutil.rmtree(out, ignore_errors=True)
    print(compare_outputs(tmp / "out-this-tree-0", tmp / "out-baseline-0"))
    for name in ("this-tree", "baseline"):
        shutil.rmtree(tmp / f"out-{name}-0", ignore_errors=True)
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
    ap.add_argument("--small", type=int, default=50, help="checkpoints of the second run (PSS flat in the count)")
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
        t_import = import_torch_wall()
        b = measure([run, tmp / "out", "--json", *jobs], pss=True)
        if b["rc"] != 0:
            print(b["out"][-3000:], b["err"], file=sys.stderr)
        s = json.loads(b["out"])
        n = s["checkpoints"] - s["same_as"]  # step checkpoints (checkpoint.pt is recognised, not converted)
        print(f"batch: {s['checkpoints']} files: {s['converted']} converted and verified, {s['same_as']} same as "
              f"another (checkpoint.pt), {s['failed']} failed; exit {b['rc']}; {s.get('workers')} on {cores} cores")
        print(f"  wall {b['wall']:.2f} s for {n} checkpoints = {1000 * b['wall'] / n:.1f} ms per checkpoint "
              f"(in-process {s['seconds']:.2f} s; the rest is importing torch and exiting); "
              f"python -c 'import torch' {t_import:.2f} s")
        print(f"  PSS summed over the pool's processes (peak) {b['pss']:.0f} MB; peak RSS of one process "
              f"{b['rss']:.0f} MB")
        # fewer checkpoints: the fixed cost, the cost per checkpoint, and memory that does not grow
        small = tmp / "results" / "bench-small"
        build_run(small, a.small)
        m = measure([small, tmp / "out-small", "--json", *jobs], pss=True)
        ms = json.loads(m["out"])
        k = ms["checkpoints"] - ms["same_as"]
        per = (b["wall"] - m["wall"]) / (n - k)
        print(f"  {k} checkpoints: wall {m['wall']:.2f} s, PSS {m['pss']:.0f} MB, peak RSS {m['rss']:.0f} MB -> "
              f"marginal {1000 * per:.1f} ms per checkpoint, fixed {m['wall'] - k * per:.2f} s")
        fl = json.loads(subprocess.run([sys.executable, __file__, "--floor-child", str(run), str(s["jobs"])],
                                       check=True, capture_output=True, text=True).stdout)
        pc, rl = fl["per"], fl["rules"]
        each, extra = sum(pc.values()), sum(rl.values())
        fixed = t_import + fl["imports"] + fl["dynamo"]
        floor_s = fixed + n * each / fl["jobs"]
        rules_s = fixed + n * (each + extra) / fl["jobs"]
        print(f"floor (measured in a fresh interpreter, one torch thread, {fl['sample']} checkpoints sampled): "
              f"import torch {t_import:.2f} s + onnx/onnxruntime/safetensors/click/package {fl['imports']:.2f} s + "
              f"one torch._dynamo import and trace {fl['dynamo']:.2f} s + {n} x ("
              + " + ".join(f"{k} {1000 * v:.1f}" for k, v in pc.items())
              + f" = {1000 * each:.1f} ms) / {fl['jobs']} workers = {floor_s:.2f} s")
        print("  + what the rules add, per checkpoint (" + " + ".join(f"{k} {1000 * v:.1f}" for k, v in rl.items())
              + f" = {1000 * extra:.1f} ms): {rules_s:.2f} s")
        print(f"  the project's own convert_item on the same {fl['sample']}, one after another in that process: "
              f"{1000 * fl['ours']:.1f} ms per checkpoint = {fl['ours'] / (each + extra):.2f}x the floor's "
              f"{1000 * (each + extra):.1f} ms with the rules' work")
        r = measure([run, tmp / "out", "--json", *jobs])
        rs = json.loads(r["out"])
        print(f"rerun (all {rs['skipped']} skipped, every source and output re-hashed): wall {r['wall']:.2f} s, "
              f"peak RSS {r['rss']:.0f} MB")
        v = measure(["verify", tmp / "out", *jobs])
        print(f"verify DIR over the batch's output (after the rerun: it rewrites the reports): "
              f"wall {v['wall']:.2f} s, exit {v['rc']}: {(v['out'].strip().splitlines() or ['?'])[-1]}")
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
        print("side by side (target):")
        print(f"  batch / import torch      {b['wall'] / t_import:6.2f}x  (<= 5x)   floor / import torch "
              f"{floor_s / t_import:.2f}x, with the rules' work {rules_s / t_import:.2f}x")
        print(f"  separate / batch          {est / b['wall']:6.1f}x  (>= 25x)")
        print(f"  PSS at {k} / {n} checkpoints  {m['pss']:.0f} / {b['pss']:.0f} MB  (<= 600 MB, flat)")
        print(f"  verify DIR / batch        {v['wall'] / b['wall']:6.2f}x  (<= 1x)")
        print(f"SUMMARY checkpoints={n} wall_s={b['wall']:.2f} import_torch_s={t_import:.2f} "
              f"batch_over_import={b['wall'] / t_import:.2f} floor_s={floor_s:.2f} "
              f"floor_over_import={floor_s / t_import:.2f} rules_floor_over_import={rules_s / t_import:.2f} "
              f"ours_ms={1000 * fl['ours']:.1f} rules_floor_ms={1000 * (each + extra):.1f} separate_over_batch={est / b['wall']:.1f} "
              f"pss_small_mb={m['pss']:.0f} pss_mb={b['pss']:.0f} verify_over_batch={v['wall'] / b['wall']:.2f} "
              f"marginal_ms={1000 * per:.1f} jobs={s['jobs']} cores={cores}")
        return 0
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
