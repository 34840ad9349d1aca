"""The device path, measured (issue 27): on a CUDA device (our stand-in for an NPU, through the same device
path), convert each fixture with ``--verify-device cuda``, then run the torch module and the ``.pt2`` in
float32 / float16 / bfloat16 on it against the float64 reference (each format's derived bound),
onnxruntime's CUDA provider where installed and TensorRT (onnxruntime's TensorRT provider, or ``tensorrt``
itself) where installed; write one JSON of figures: max error / bound per output, latency at batch 1 and
1024. Its schema: ``benchmarks/device.schema.json`` (benchmarks/README.md).

    python benchmarks/device.py                    # every fixture on the CUDA device: benchmarks/results/
    python benchmarks/device.py --dry-run --out X  # the same code on the CPU, one small fixture (CI: seconds)

Without a device it says so, runs the dry run and exits 0.
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import fixtures, load_policy  # noqa: E402  (benchmarks/targets.py)

SCHEMA_ID = "huggy-convert/device-benchmark/1"
DTYPES = ("float32", "float16", "bfloat16")
BATCHES = (1, 1024)
DRY_FIXTURE = "small"
RESULTS = ROOT / "benchmarks" / "results"


def cuda_device():
    """The CUDA device's name, or None."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def host(device: str) -> dict:
    import torch

    d = {"kind": "cuda" if device.startswith("cuda") else "cpu", "name": cuda_device() if device.startswith("cuda")
         else (platform.processor() or platform.machine()), "torch": torch.__version__,
         "cuda": torch.version.cuda, "python": platform.python_version(), "onnxruntime": None, "providers": [],
         "tensorrt": None}
    try:
        import onnxruntime as ort

        d["onnxruntime"], d["providers"] = ort.__version__, list(ort.get_available_providers())
    except ImportError:
        pass
    try:
        import tensorrt

        d["tensorrt"] = tensorrt.__version__
    except ImportError:
        pass
    return d


def latency_ms(fn, feed, iters: int, sync) -> float:
    for _ in range(3):
        fn(feed)
    sync()
    xs = []
    for _ in range(iters):
        t = time.perf_counter()
        fn(feed)
        sync()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3


def _finite(x):
    """A float for JSON: inf / NaN (no bound, a NaN output) as null."""
    return x if x is None or not isinstance(x, float) or x == x and abs(x) != float("inf") else None


def judged(ref, outs) -> dict:
    from huggy_convert.runtime.base import STOCHASTIC
    from huggy_convert.verify.bounds import judge

    res = {}
    for n in ref.values:
        if n in STOCHASTIC or n not in outs:
            continue
        f = judge(ref, n, outs[n])
        res[n] = {"ok": bool(f["ok"]), "max_abs": _finite(f.get("max_abs")), "max_bound": _finite(f.get("max_bound")),
                  "ratio": _finite(f.get("ratio")), "equal": f.get("equal"), "count": f.get("count")}
    return res


def run_entry(runtime, device, dtype, make, refs, feeds, iters, sync) -> dict:
    """One runtime on one device and format: built by ``make()`` (a runner with ``infer``), judged on the
    probes against the float64 reference of its format, timed at each batch."""
    e = {"runtime": runtime, "device": device, "dtype": dtype}
    try:
        r = make()
        if r is None:
            return dict(e, status="skipped", reason="not installed")
        outs = r.infer(feeds["probes"])
        e["outputs"] = judged(refs[dtype], outs)
        e["ok"] = all(o["ok"] for o in e["outputs"].values())
        e["latency_ms"] = {str(b): latency_ms(r.infer, feeds[b], iters, sync) for b in BATCHES}
        e["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a runtime that fails on the device is a figure too
        e.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    return e


class _ProgramOn:
    """The module of ``dtype`` on ``device`` exported (``torch.export``, dynamic batch), saved and loaded back."""

    def __init__(self, policy, device: str, dtype: str):
        import torch

        from huggy_convert.exporters.torch_module import build_module, export_program

        module = build_module(policy, device=device, dtype=dtype)
        buf = io.BytesIO()
        torch.export.save(export_program(module), buf)
        buf.seek(0)
        self.program = torch.export.load(buf).module()
        self.names, self.outs, self.dev = module.input_names, module.output_names, device

    def infer(self, feed):
        import torch

        xs = [torch.from_numpy(feed[n]).to(self.dev) for n in self.names]
        with torch.no_grad():
            out = self.program(*xs)
        return {n: (o.float() if o.dtype.is_floating_point else o).cpu().numpy() for n, o in zip(self.outs, out)}


class _TensorRT:
    """The rebuilt ONNX as a TensorRT engine (``tensorrt``'s ONNX parser, fp32, batch profile 1..1024), run
    on torch CUDA tensors."""

    def __init__(self, model_bytes: bytes, spec, dtype: str):
        import tensorrt as trt
        import torch

        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        net = builder.create_network(0)
        parser = trt.OnnxParser(net, logger)
        if not parser.parse(model_bytes):
            raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
        cfg = builder.create_builder_config()
        if dtype == "float16":
            cfg.set_flag(trt.BuilderFlag.FP16)
        elif dtype == "bfloat16":
            cfg.set_flag(trt.BuilderFlag.BF16)
        prof = builder.create_optimization_profile()
        for i in range(net.num_inputs):
            t = net.get_input(i)
            rest = tuple(t.shape)[1:]
            prof.set_shape(t.name, (1,) + rest, (1,) + rest, (max(BATCHES),) + rest)
        cfg.add_optimization_profile(prof)
        engine = trt.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(net, cfg))
        self.ctx, self.engine, self.torch, self.trt = engine.create_execution_context(), engine, torch, trt
        self.names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]

    def infer(self, feed):
        torch, trt, e = self.torch, self.trt, self.engine
        keep, outs = [], {}
        for n in self.names:
            if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT:
                x = torch.from_numpy(feed[n]).cuda()
                keep.append(x)
                self.ctx.set_input_shape(n, tuple(x.shape))
                self.ctx.set_tensor_address(n, x.data_ptr())
        for n in self.names:
            if e.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT:
                shape = tuple(self.ctx.get_tensor_shape(n))
                dt = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32,
                      trt.int64: torch.int64}[e.get_tensor_dtype(n)]
                y = torch.empty(shape, dtype=dt, device="cuda")
                outs[n] = y
                self.ctx.set_tensor_address(n, y.data_ptr())
        self.ctx.execute_async_v3(torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return {n: (y.float() if y.dtype.is_floating_point else y).cpu().numpy() for n, y in outs.items()}


def measure_fixture(name, pt, onnx_path, device, iters, verify_cli) -> dict:
    import torch

    from huggy_convert.core.bounds import PRECISIONS
    from huggy_convert.exporters.onnx_export import build_onnx, model_bytes
    from huggy_convert.runtime import ModuleRunner, OrtRunner, make_probes
    from huggy_convert.verify.bounds import Float64Policy

    policy = load_policy(pt, onnx_path)
    probes = make_probes(policy, 64, 0)
    feeds = {"probes": probes}
    big = make_probes(policy, max(BATCHES), 1)
    for b in BATCHES:
        feeds[b] = {k: v[:b] for k, v in big.items()}
    f64 = Float64Policy(policy)
    refs = {d: f64.forward(probes, precision=PRECISIONS[d]) for d in DTYPES}
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = {"fixture": name, "checkpoint": str(pt.relative_to(ROOT)), "runs": []}
    if verify_cli:
        res["convert"] = convert_cli(pt, device)
    providers = []
    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
    except ImportError:
        pass
    onnx_bytes = model_bytes(build_onnx(policy))
    runs = res["runs"]
    for dt in DTYPES:
        runs.append(run_entry("torch", device, dt, lambda: ModuleRunner.build(policy, device, dt), refs, feeds, iters,
                              sync))
        runs.append(run_entry("torch.export", device, dt, lambda: _ProgramOn(policy, device, dt), refs, feeds, iters,
                              sync))
    ort_dev = "cuda" if cuda else "cpu"
    runs.append(run_entry("onnxruntime", ort_dev, "float32",
                          lambda: OrtRunner(onnx_bytes, device=ort_dev, spec=policy.spec)
                          if (not cuda or "CUDAExecutionProvider" in providers) else None, refs, feeds, iters, sync))
    if cuda:
        for dt in ("float32", "float16"):
            runs.append(run_entry("tensorrt", device, dt, lambda: _TensorRT(onnx_bytes, policy.spec, dt)
                                  if _has("tensorrt") else None, refs, feeds, iters, sync))
    return res


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def convert_cli(pt: Path, device: str) -> dict:
    """``huggy-convert CKPT OUT --verify-device DEVICE``: its exit code and verdict line."""
    with tempfile.TemporaryDirectory(prefix="huggy-device-") as out:
        cmd = [sys.executable, "-m", "huggy_convert.cli", str(pt), out, "--verify-device", device]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if re.search(r"\b(PASS|FAIL)\b|rror", ln)]
        return {"command": f"huggy-convert {pt.relative_to(ROOT)} OUT --verify-device {device}",
                "rc": p.returncode, "verdict": lines[0].strip()[:300] if lines else "", "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU, one small fixture (what CI runs)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON's path (default: benchmarks/results/)")
    ap.add_argument("--fixtures", default="", help="comma-separated fixture names (default: every fixture)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--no-convert", action="store_true", help="skip the CLI conversion with --verify-device")
    a = ap.parse_args(argv)
    name = cuda_device()
    dry = a.dry_run or name is None
    if name is None:
        print("no CUDA device here: running the dry run on the CPU (one small fixture)")
    device = "cpu" if dry else "cuda"
    fx = fixtures()
    chosen = [DRY_FIXTURE] if dry and not a.fixtures else ([f for f in a.fixtures.split(",") if f] or list(fx))
    iters = a.iters or (3 if dry else 50)
    from huggy_convert.runtime import torch_threads

    doc = {"schema": SCHEMA_ID, "dry_run": dry, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "python benchmarks/device.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
           "host": host(device), "batches": list(BATCHES), "fixtures": []}
    with torch_threads(1):
        for f in chosen:
            doc["fixtures"].append(measure_fixture(f, *fx[f], device, iters, not a.no_convert))
            print(f"{f}: " + ", ".join(f"{r['runtime']} {r['dtype']} {r['status']}"
                                        + (f" ratio {max((o['ratio'] or 0) for o in r['outputs'].values()):.3g}"
                                           if r["status"] == "ok" and r["outputs"] else "")
                                        for r in doc["fixtures"][-1]["runs"]), flush=True)
    out = a.out or (RESULTS / f"device-{re.sub(r'[^A-Za-z0-9]+', '-', doc['host']['name'] or device).strip('-')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
