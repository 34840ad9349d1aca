"""``benchmark``: load time, warm-up, then mean / p50 / p95 / p99 latency and memory, per device
and runtime (torch eager, onnxruntime), both runtimes on the same number of CPU threads.

``threads`` defaults to 1: the setting the verifier and ``benchmarks/latency.py`` use, the one whose
figures repeat on a shared machine (torch's spinning intra-op threads collapse when the cores are
busy), and the one that compares like with like (onnxruntime's CPU sessions here run one intra-op
thread). More threads measure both runtimes with that many intra-op threads each.

The deploy targets (issue 27: ``openvino``, ``litert``, ``executorch``; ``benchmark --targets``) are timed as
runtimes beside them, on the CPU, in float32, on the same threads: the policy exported for the target
(``runtime.targets.build_target``), its runtime timed the same way; a target whose extra is missing is a row
skipped with the line saying what to install."""
from __future__ import annotations

import contextlib
import gc
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..contract.targets import TARGETS
from ..errors import HuggyError, InputError
from ..exporters.devices import resolve_device
from ..runtime import INTRA_OP_THREADS, ort_session, torch_threads
from ..runtime.targets import build_target
from .common import ModeResult, percentiles, rss_bytes, time_calls
from .sources import (RUNTIME_ORT, RUNTIME_TORCH, Source, devices_present, load_source, make_feed,
                      make_runner)

RUNTIMES = (RUNTIME_TORCH, RUNTIME_ORT)


def _cuda_reset(dev: str) -> None:
    if dev.startswith("cuda"):
        import torch

        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def _cuda_peak(dev: str) -> Optional[float]:
    if dev.startswith("cuda"):
        import torch

        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) / 2 ** 20
    return None


@dataclass(frozen=True)
class Timing:
    """How a benchmark times: the dtype, ``warmup`` untimed calls then ``iters`` timed ones per batch size,
    the observations' seed, and the intra-op threads of torch and onnxruntime alike."""

    dtype: str = "float32"
    warmup: int = 10
    iters: int = 100
    seed: int = 0
    threads: int = 1


def benchmark(path, devices: Optional[Sequence[str]] = None, runtimes: Sequence[str] = RUNTIMES,
              batches: Sequence[int] = (1, 64), timing: Timing = Timing(), src: Optional[Source] = None) -> ModeResult:
    """For each device x runtime: load time (file -> ready runner: read + build module / session),
    ``warmup`` untimed calls, then ``iters`` timed calls per batch size (host-side wall time, outputs
    copied back to the host); peak memory as the RSS delta over load + runs and, on CUDA,
    torch.cuda.max_memory_allocated. Every figure here is a timing (``timings`` in JSON). On the CPU
    torch and onnxruntime both run ``timing.threads`` intra-op threads (torch's setting is restored after)."""
    if timing.threads < 1:
        raise InputError(f"--threads must be at least 1, got {timing.threads}")
    if RUNTIME_TORCH not in runtimes:
        return _benchmark(path, devices, runtimes, batches, timing, src)

    with torch_threads(timing.threads):
        return _benchmark(path, devices, runtimes, batches, timing, src)


def _run_one(path: Path, src: Optional[Source], dev: str, rt: str, batches, timing: Timing) -> Dict:
    """One device x runtime: its row of figures (``skipped`` with the reason where it cannot run)."""
    row: Dict = {"device": dev, "runtime": rt, "dtype": timing.dtype}
    gc.collect()
    rss0 = rss_bytes()
    try:
        if dev.startswith("cuda") and rt == RUNTIME_TORCH:
            _cuda_reset(resolve_device(dev))
        t0 = time.perf_counter()
        s = load_source(path) if src is None else src
        runner = _target(s, dev, rt, timing) if rt in TARGETS else make_runner(s, dev, timing.dtype, rt)
        if rt == RUNTIME_ORT and runner.device == "cpu" and timing.threads != INTRA_OP_THREADS:
            runner.session = ort_session(runner.model, threads=timing.threads)  # torch's thread count
        load_s = (time.perf_counter() - t0) if src is None else s.load_seconds + runner.build_seconds
    except HuggyError as exc:
        row["skipped"] = exc.message
        return row
    row.update(resolved=runner.device, load_s=load_s, batches={})
    finite = True
    for n in batches:
        feed = make_feed(s, "random", int(n), timing.seed)
        out = runner.deterministic(feed)
        finite = finite and all(np.all(np.isfinite(v)) for v in out.values() if v.dtype.kind == "f")
        ts = time_calls(lambda r=runner, f=feed: r.deterministic(f), timing.warmup, timing.iters)
        row["batches"][str(n)] = percentiles(ts)
    row["rss_delta_mb"] = (rss_bytes() - rss0) / 2 ** 20
    peak = _cuda_peak(runner.device) if rt == RUNTIME_TORCH else None
    if peak is not None:
        row["cuda_max_memory_allocated_mb"] = peak
    row["outputs_finite"] = finite
    return row


def _target(s: Source, dev: str, target: str, timing: Timing):
    """A deploy target's runner for ``s``'s policy (its files made in memory by its exporter): CPU, float32."""
    if dev.split(":")[0] != "cpu" or timing.dtype != "float32":
        raise InputError(f"the {target} target runs float32 on the CPU (not {dev} {timing.dtype})")
    if not s.has_tensors:
        raise InputError(f"the {target} target is exported from canonical tensors: none recovered from this ONNX "
                         f"({s.unrecovered})")
    with contextlib.redirect_stdout(io.StringIO()):  # a converter's progress lines: stdout is ours (--json)
        return build_target(target, s.policy, timing.threads)[1]


def _benchmark(path, devices, runtimes, batches, timing: Timing, src) -> ModeResult:
    path = Path(path)
    devices = list(devices) if devices else devices_present()
    first = src or load_source(path)
    r = ModeResult("benchmark")
    rows: List[Dict] = []
    for dev in devices:
        for rt in runtimes:
            if rt == RUNTIME_TORCH and not first.has_tensors:
                rows.append({"device": dev, "runtime": rt, "dtype": timing.dtype, "skipped":
                             f"torch eager needs canonical tensors: none recovered from this ONNX ({first.unrecovered})"})
                continue
            rows.append(_run_one(path, src, dev, rt, batches, timing))
            r.ok = r.ok and rows[-1].get("outputs_finite", True)
    r.data = {"source": first.label, "kind": first.kind, "devices": devices, "runtimes": list(runtimes),
              "batches": [int(b) for b in batches], "dtype": timing.dtype, "warmup": timing.warmup,
              "iters": timing.iters, "threads": timing.threads,
              "ran": [{"device": x["device"], "runtime": x["runtime"], "ok": x.get("outputs_finite"),
                       "skipped": x.get("skipped")} for x in rows]}
    r.timings = {"rows": rows}
    _render(r, first, rows, timing)
    return r


def _render(r: ModeResult, first: Source, rows: List[Dict], timing: Timing) -> None:
    t = timing
    r.lines.append(f"benchmark {first.label}: {t.dtype}, warm-up {t.warmup}, {t.iters} timed calls per batch size, "
                   f"{t.threads} CPU thread{'s' if t.threads > 1 else ''} for torch and onnxruntime alike"
                   + (" and the deploy targets" if any(x["runtime"] in TARGETS for x in rows) else ""))
    r.lines.append(f"  {'device':<8} {'runtime':<12} {'batch':>5} {'mean':>9} {'p50':>9} {'p95':>9} {'p99':>9}  load, RSS")
    for x in rows:
        if "skipped" in x:
            r.lines.append(f"  {x['device']:<8} {x['runtime']:<12} skipped: {x['skipped']}")
            continue
        for n, p in x["batches"].items():
            mem = f"load {x['load_s'] * 1e3:.1f} ms, RSS +{x['rss_delta_mb']:.1f} MiB"
            if "cuda_max_memory_allocated_mb" in x:
                mem += f", cuda peak {x['cuda_max_memory_allocated_mb']:.1f} MiB"
            r.lines.append(f"  {x['device']:<8} {x['runtime']:<12} {n:>5} {p['mean_ms']:8.3f}ms {p['p50_ms']:8.3f}ms "
                           f"{p['p95_ms']:8.3f}ms {p['p99_ms']:8.3f}ms  {mem}")
