"""Latency of the four ways to run the Huggy policy, measured side by side in one run.

    python benchmarks/latency.py [--iters 2000] [--threads 1] [--ops]

onnxruntime on the official ML-Agents ONNX, onnxruntime on the rebuilt ONNX, the torch module
(eager) and the saved torch.export program, at batch 1 and batch 1024: median / p95 / p99
after warm-up, interleaved in blocks of 50 consecutive calls per runtime and round, so machine noise
hits all four alike while each runtime runs with its own weights warm in cache (one call each in
turn would make every runtime pay for the cache the previous one evicted). Prints the
module/onnxruntime ratios of target P4 (issue 15: batch 1 within 1.2x of onnxruntime's latency, at
batch 1024 at least its throughput; eager and the ``.pt2`` loaded with ``torch.export.load``),
each next to its floor measured in the same rounds: at batch 1 the module's GEMVs alone (a bare
``addmv`` chain over its weights) and one read of its weights (memory streaming), plus the
``.pt2``'s graph called without torch's call hooks (guards, pytree), and what those hooks cost on
any loaded ``.pt2`` (a program of one clamp, saved and loaded the same way, against that clamp
eager); at batch 1024 the module's GEMMs alone (a bare ``addmm`` chain). Both runtimes get the same thread count.

``--ops`` adds where the time goes, side by side in the same run: onnxruntime's own per-node
profile of the official file at batch 1024 (its GEMMs and its fused Swish) against the same
torch ops timed alone, and at batch 1 one 512x512 Gemm in onnxruntime against torch's forms of it
and against the module's whole forward.
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import huggy_checkpoint, percentiles, time_calls  # noqa: E402

import torch  # noqa: E402

from huggy_convert.converter import convert_checkpoint  # noqa: E402
from huggy_convert.exporters.onnx_export import build_onnx, model_bytes  # noqa: E402
from huggy_convert.exporters.torch_module import build_module, export_program  # noqa: E402
from huggy_convert.runtime.feeds import make_probes  # noqa: E402
from huggy_convert.runtime import ort_session  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000, help="timed calls per runtime at batch 1 (batch 1024: /20)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ops", action="store_true", help="also print the per-op breakdown (onnxruntime profile vs torch ops)")
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
    buf.seek(0)
    bare_program = torch.export.load(buf).module(check_guards=False)
    graph_alone = type(bare_program).forward  # the .pt2's own graph without torch's call hooks
    one_op = _one_op_program()  # the floor of any .pt2 called as torch.export.load(...).module()
    print(f"checkpoint {ckpt.name}; torch {torch.__version__} threads={a.threads}; onnxruntime intra-op threads={a.threads}")
    layers = [(lin.weight, lin.bias) for lin in module.body] + [(module.mu.weight, module.mu.bias)]
    flat = torch.cat([t.reshape(-1) for pair in layers for t in pair])  # a copy of every weight and bias
    results = {}
    for batch in (1, 1024):
        x = make_probes(pol, batch, seed=0)["obs_0"]
        xt = torch.from_numpy(x)
        runners = {
            "onnxruntime official": lambda: official.run(["deterministic_continuous_actions"], {"obs_0": x}),
            "onnxruntime rebuilt": lambda: rebuilt.run(["deterministic_continuous_actions"], {"obs_0": x}),
            "torch module (eager)": lambda: module(xt),
            "torch.export program": lambda: program(xt),
            "  .pt2 graph, no hooks": lambda: graph_alone(bare_program, xt),
        }
        if batch == 1:  # the floors: the module's GEMVs alone, and reading its weights once
            flat_forward = _flat_forward(module, layers)
            runners["  floor: flat forward"] = lambda: flat_forward(xt)
            runners["  floor: addmv chain"] = lambda: _gemv_chain(layers, xt[0])
            runners["  floor: weight stream"] = flat.sum
            runners["  floor: .pt2 of one op"] = lambda: one_op(xt)
            runners["  that op, eager"] = lambda: torch.clamp(xt, -5.0, 5.0)
        else:  # the ceiling: the module's GEMMs alone
            runners["  floor: addmm chain"] = lambda: _gemm_chain(layers, xt)
        iters = a.iters if batch == 1 else max(a.iters // 20, 50)
        samples = {k: [] for k in runners}
        with torch.inference_mode():
            if batch == 1:  # the written-out forward is the module's, bit for bit
                assert torch.equal(runners["  floor: flat forward"](), runners["torch module (eager)"]()[0])
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
            results[(batch, k)] = p["median_ms"]
            print(f"  {k:24s} {p['median_ms']:10.4f} {p['p95_ms']:9.4f} {p['p99_ms']:9.4f} {batch / (p['median_ms'] / 1e3):12,.0f}")
    print_targets(results, flat.numel() * flat.element_size(), len(layers))
    if a.ops:
        op_breakdown(ckpt, pol, module, a.threads)


class _OneOp(torch.nn.Module):
    def forward(self, x):
        return (torch.clamp(x, -5.0, 5.0),)


def _one_op_program():
    """A ``.pt2`` of one clamp on a dynamic batch, saved and loaded as the policy's is: what calling a
    loaded program costs whatever its graph holds (torch's call hooks: guards, pytree in and out)."""
    buf = io.BytesIO()
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(_OneOp(), (torch.zeros(2, 59),), dynamic_shapes=({0: batch},)), buf)
    buf.seek(0)
    return torch.export.load(buf).module()


def _gemv_chain(layers, h):
    for w, b in layers:
        h = torch.addmv(b, w, h)
    return h


def _flat_forward(module, layers):
    """Huggy's eager forward at one row written out flat: the module's 14 torch calls (normalizer, 4 addmv,
    3 in-place silu, clip) on tensors bound in one closure, none of the module's Python (module call,
    flow, the loop over the blocks' hooks). The floor of any forward that runs these ops from Python."""
    addmv, silu_ = torch.addmv, torch._C._nn.silu_
    mean, div, three = module.norm0_mean, module.norm0_div, torch.tensor(3.0)
    hidden, (w_out, b_out) = layers[:-1], layers[-1]

    def forward(x):
        h = (x - mean).div_(div).clamp_(-5.0, 5.0)[0]
        for w, b in hidden:
            h = silu_(addmv(b, w, h))
        return addmv(b_out, w_out, h)[None].clamp_(-3.0, 3.0).div_(three)
    return forward


def _gemm_chain(layers, h):
    for w, b in layers:
        h = torch.addmm(b, h, w.t())
    return h


def print_targets(t, weight_bytes: int, n: int) -> None:
    """Each P4 ratio next to its floor, all medians of this run (onnxruntime: the official file)."""
    ort1, ort2 = t[(1, "onnxruntime official")], t[(1024, "onnxruntime official")]
    stream_gbs = weight_bytes / (t[(1, "  floor: weight stream")] * 1e-3) / 1e9
    print("\nP4, one thread each (ratios of the medians above; the floors measured beside them):")
    for k in ("torch module (eager)", "torch.export program"):
        print(f"  batch 1    {k:22s} latency / onnxruntime's {t[(1, k)] / ort1:5.2f}x (target <= 1.2x)")
    print(f"    floors: the same torch calls written flat, without the module's Python {t[(1, '  floor: flat forward')] / ort1:.2f}x; "
          f"the module's {n} GEMVs alone (addmv chain) {t[(1, '  floor: addmv chain')] / ort1:.2f}x; "
          f"reading its {weight_bytes / 1e6:.2f} MB of weights once {t[(1, '  floor: weight stream')] / ort1:.2f}x "
          f"({stream_gbs:.1f} GB/s); the .pt2's graph without torch's call hooks {t[(1, '  .pt2 graph, no hooks')] / ort1:.2f}x")
    hooks = t[(1, "  floor: .pt2 of one op")] - t[(1, "  that op, eager")]
    print(f"    .pt2 floor: calling a loaded .pt2 of one op costs {hooks * 1e3:.0f} us over the op = {hooks / ort1:.2f}x of "
          f"onnxruntime's whole forward; with the flat forward {(t[(1, '  floor: flat forward')] + hooks) / ort1:.2f}x")
    for k in ("torch module (eager)", "torch.export program"):
        print(f"  batch 1024 {k:22s} throughput / onnxruntime's {ort2 / t[(1024, k)]:5.2f}x (target >= 1.0x)")
    print(f"    ceiling: the module's {n} GEMMs alone (addmm chain) {ort2 / t[(1024, '  floor: addmm chain')]:.2f}x; "
          f"the .pt2's graph without torch's call hooks {ort2 / t[(1024, '  .pt2 graph, no hooks')]:.2f}x "
          "(torch.export's graph is functional: no in-place Swish)")


def _median_us(fn, iters):
    return percentiles(time_calls(fn, max(iters // 10, 5), iters))["median_ms"] * 1e3


def _ort_profile(onnx_path: Path, feed, threads: int, runs: int):
    """{node name: (op kind, median microseconds)} from onnxruntime's own profiler."""
    with tempfile.TemporaryDirectory() as d:
        sess = ort_session(onnx_path.read_bytes(), threads=threads, profile_prefix=Path(d) / "ort")
        for _ in range(runs):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_node = collections.defaultdict(list)
    kinds = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[e["name"]].append(e["dur"])
            kinds[e["name"]] = e.get("args", {}).get("op_name", "?")
    out = {}
    for name, durs in per_node.items():
        durs = sorted(durs[runs // 5:])  # the first runs warm up
        out[name] = (kinds[name], durs[len(durs) // 2])
    return out


def op_breakdown(ckpt: Path, pol, module, threads: int) -> None:
    """Where the time goes, onnxruntime and torch side by side (microseconds, medians)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    spec = pol.spec
    layers, mu = module.body, module.mu
    hid = spec.hidden_units
    print("\nwhere the time goes (--ops; microseconds, medians of calls timed alone)")
    # batch 1024: onnxruntime's profile of the official file against the same torch ops
    x = make_probes(pol, 1024, seed=0)["obs_0"]
    prof = _ort_profile(ckpt.with_suffix(".onnx"), {"obs_0": x}, threads, 60)
    with torch.inference_mode():
        xt = torch.from_numpy(x)
        z = torch.randn(1024, hid)
        first = _median_us(lambda: torch.addmm(layers[0].bias, xt, layers[0].weight.t()), 40)
        gemm = _median_us(lambda: torch.addmm(layers[1].bias, z, layers[1].weight.t()), 40)
        head = _median_us(lambda: torch.addmm(mu.bias, z, mu.weight.t()), 40)
        swish = _median_us(lambda: torch.nn.functional.silu(z), 40)  # the module's Swish kernel
        pair = _median_us(lambda: z * torch.sigmoid(z), 40)  # ML-Agents' own Sigmoid + Mul
    ort_gemm = sum(us for kind, us in prof.values() if kind == "Gemm")
    body = {name: (kind, us) for name, (kind, us) in prof.items() if "seq_layers" in name and kind != "Gemm"}
    ort_swish = sum(us for _, us in body.values())
    ort_rest = sum(us for _, us in prof.values()) - ort_gemm - ort_swish
    torch_gemm = first + (spec.num_layers - 1) * gemm + head
    torch_swish = spec.num_layers * swish
    print("  batch 1024                 onnxruntime (its profiler)   torch (the same ops alone)   torch/ort")
    print(f"    {spec.num_layers + 1} GEMMs                  {ort_gemm:9.0f}                 {torch_gemm:9.0f} (addmm)"
          f"              {torch_gemm / ort_gemm:5.2f}")
    print(f"    {spec.num_layers} Swish                  {ort_swish:9.0f} ({'/'.join(sorted({k for k, _ in body.values()}))})"
          f"{'':6s}{torch_swish:9.0f} (silu; sigmoid + mul {spec.num_layers * pair:.0f})  {torch_swish / ort_swish:5.2f}")
    print(f"    everything else          {ort_rest:9.0f} (normalizer, clips and the stochastic head, which it runs too)")
    # batch 1: one hidden x hidden Gemm in onnxruntime against torch's forms of it
    w = layers[1].weight.contiguous().numpy()
    b = layers[1].bias.numpy()
    g = helper.make_graph([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)], "gemm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hid])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hid])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    e = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hid])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hid])])
    sess = {k: ort_session(helper.make_model(gr, opset_imports=[helper.make_opsetid("", 13)]), threads=threads)
            for k, gr in (("gemm", g), ("empty", e))}
    v = np.random.default_rng(0).standard_normal((1, hid)).astype(np.float32)
    n = 3000
    ort_g = _median_us(lambda: sess["gemm"].run(None, {"x": v}), n)
    ort_e = _median_us(lambda: sess["empty"].run(None, {"x": v}), n)
    with torch.inference_mode():
        vt = torch.from_numpy(v)
        vT = vt.t().contiguous()
        W, b1 = layers[1].weight, layers[1].bias
        wt, bc, v1 = W.t().contiguous(), b1.reshape(-1, 1).contiguous(), vt[0]
        t_mv = _median_us(lambda: torch.addmv(b1, W, v1), n)
        t_cols = _median_us(lambda: torch.addmm(bc, W, vT), n)
        t_rows = _median_us(lambda: torch.addmm(b1, vt, wt), n)
        t_lin = _median_us(lambda: torch.nn.functional.linear(vt, W, b1), n)
        t_sig = _median_us(lambda: torch.sigmoid(vt), n)
        x1 = torch.from_numpy(make_probes(pol, 1, seed=0)["obs_0"])
        t_fwd = _median_us(lambda: module(x1), n)
    print("  batch 1")
    print(f"    one {hid}x{hid} Gemm: onnxruntime {ort_g - ort_e:.1f} (a Gemm-only graph {ort_g:.1f} minus an Identity "
          f"graph {ort_e:.1f}); torch addmv(b, W, x) {t_mv:.1f} (the module's form for one row), F.linear "
          f"{t_lin:.1f} (its form for a batch), addmm on a contiguous copy of W.T {t_rows:.1f}, transposed "
          f"addmm(b, W, x.T) {t_cols:.1f}")
    # one row: sub/div/clamp and a view in, silu per layer, a view and clamp/div out
    small_ops = spec.num_layers + 7
    print(f"    one elementwise op on {hid} floats: torch.sigmoid {t_sig:.1f}; the module's whole forward "
          f"{t_fwd:.1f} ({spec.num_layers + 1} GEMVs and {small_ops} small ops)")


if __name__ == "__main__":
    main()
