"""Latency of the four ways to run the Huggy policy, measured side by side in one run.

    python benchmarks/latency.py [--iters 2000] [--threads 1]

onnxruntime on the official ML-Agents ONNX, onnxruntime on the rebuilt ONNX, the torch module
(eager) and the saved torch.export program, at batch 1 and batch 1024: median / p95 / p99
after warm-up, interleaved in blocks of 50 consecutive calls per runtime and round, so machine noise
hits all four alike while each runtime runs with its own weights warm in cache (one call each in
turn would make every runtime pay for the cache the previous one evicted). Prints the
module/onnxruntime ratios the issue sets targets on (batch 1 within 1.5x of onnxruntime; at
batch 1024 at least its throughput). Both runtimes get the same thread count.
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import huggy_checkpoint, percentiles  # noqa: E402

import torch  # noqa: E402

from huggy_convert.converter import convert_checkpoint  # noqa: E402
from huggy_convert.exporters.onnx_export import build_onnx, model_bytes  # noqa: E402
from huggy_convert.exporters.torch_module import build_module, export_program  # noqa: E402
from huggy_convert.verify.probes import make_probes  # noqa: E402
from huggy_convert.verify.runtime import ort_session  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000, help="timed calls per runtime at batch 1 (batch 1024: /20)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ckpt = huggy_checkpoint()
    pol = convert_checkpoint(ckpt).policy
    official = ort_session(ckpt.with_suffix(".onnx").read_bytes(), threads=a.threads)
    rebuilt = ort_session(model_bytes(build_onnx(pol)), threads=a.threads)
    module = build_module(pol)
    buf = io.BytesIO()
    torch.export.save(export_program(module), buf)
    buf.seek(0)
    program = torch.export.load(buf).module()
    print(f"checkpoint {ckpt.name}; torch {torch.__version__} threads={a.threads}; onnxruntime intra-op threads={a.threads}")
    results = {}
    for batch in (1, 1024):
        x = make_probes(pol, batch, seed=0)["obs_0"]
        xt = torch.from_numpy(x)
        runners = {
            "onnxruntime official": lambda: official.run(["deterministic_continuous_actions"], {"obs_0": x}),
            "onnxruntime rebuilt": lambda: rebuilt.run(["deterministic_continuous_actions"], {"obs_0": x}),
            "torch module (eager)": lambda: module(xt),
            "torch.export program": lambda: program(xt),
        }
        iters = a.iters if batch == 1 else max(a.iters // 20, 50)
        samples = {k: [] for k in runners}
        import time
        with torch.inference_mode():
            for f in runners.values():
                for _ in range(max(iters // 10, 10)):
                    f()
            block = 50 if batch == 1 else 5
            for _ in range(max(iters // block, 1)):  # interleaved in blocks: warm caches, shared noise
                for k, f in runners.items():
                    for _ in range(block):
                        t = time.perf_counter()
                        f()
                        samples[k].append(time.perf_counter() - t)
        print(f"\nbatch {batch} ({iters} calls each, after warm-up)")
        print(f"  {'runtime':24s} {'median ms':>10s} {'p95 ms':>9s} {'p99 ms':>9s} {'rows/s':>12s}")
        for k, s in samples.items():
            p = percentiles(s)
            results[(batch, k)] = p
            print(f"  {k:24s} {p['median_ms']:10.4f} {p['p95_ms']:9.4f} {p['p99_ms']:9.4f} {batch / (p['median_ms'] / 1e3):12,.0f}")
    r1 = results[(1, "torch module (eager)")]["median_ms"] / results[(1, "onnxruntime official")]["median_ms"]
    r2 = results[(1024, "onnxruntime official")]["median_ms"] / results[(1024, "torch module (eager)")]["median_ms"]
    print(f"\nbatch 1: module latency / onnxruntime latency = {r1:.2f}x (target <= 1.5x)")
    print(f"batch 1024: module throughput / onnxruntime throughput = {r2:.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
