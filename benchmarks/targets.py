"""The deploy targets (issue 27) measured on every fixture: each deterministic output's max |error| over its
derived float32 bound against the float64 reference on verification's probes, whether two runs agree bit for
bit, and the latency at batch 1 (one thread) beside onnxruntime's (the rebuilt ONNX, one thread).

Run in an environment with the targets' extras installed (each its own venv: docs/targets.md), from the
repository root::

    python benchmarks/targets.py --targets openvino [--fixtures huggy,small] [--json OUT.json]

A target whose extra is not installed is reported as such; one that refuses a policy prints its one line.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "fixtures"
MANIFESTS = (FIXTURES / "manifest.json", FIXTURES / "families" / "manifest.json")


def fixtures():
    """name -> (newest checkpoint, its official ONNX), from both fixture manifests (paths relative to fixtures/)."""
    out = {}
    for m in MANIFESTS:
        for run in json.loads(m.read_text())["runs"]:
            c = run["checkpoints"][-1]
            out[run["name"]] = (FIXTURES / c["pt"], FIXTURES / c["onnx"])
    return out


def load_policy(pt: Path, onnx_path: Path):
    """The canonical policy of a fixture checkpoint (the pipeline's own preparation)."""
    from huggy_convert.converter import load_checkpoint
    from huggy_convert.pipeline import prepare_conversion

    return prepare_conversion(load_checkpoint(pt), onnx_path).conversion.policy


def median_us(fn, iters: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    xs = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e6


def rows(feed, n: int):
    return {k: v[:n] for k, v in feed.items()}


def judged(ref, outs, names):
    """name -> judge's figures, for the deterministic outputs the reference has."""
    from huggy_convert.verify.bounds import judge

    return {n: judge(ref, n, outs[n]) for n in names if n in outs}


def summary(figures):
    """max ratio over the float outputs, argmax outputs' equal/ties, ok."""
    ratios = {n: f["ratio"] for n, f in figures.items() if "ratio" in f}
    worst = max(ratios, key=ratios.get) if ratios else None
    return {"ok": all(f["ok"] for f in figures.values()), "worst": worst,
            "ratio": ratios.get(worst, 0.0) if worst else 0.0,
            "max_abs": figures[worst]["max_abs"] if worst else 0.0,
            "argmax": {n: {k: f.get(k) for k in ("equal", "count", "ties", "mismatches")}
                       for n, f in figures.items() if "equal" in f}}


def measure(name, pt, onnx_path, targets, probes_rows, seed, iters):
    from huggy_convert.exporters.onnx_export import build_onnx
    from huggy_convert.exporters.targets import missing
    from huggy_convert.errors import HuggyError
    from huggy_convert.runtime import OrtRunner, make_probes
    from huggy_convert.runtime.base import STOCHASTIC
    from huggy_convert.runtime.targets import build_target
    from huggy_convert.verify.bounds import reference_forward

    policy = load_policy(pt, onnx_path)
    probes = make_probes(policy, probes_rows, seed)
    ref = reference_forward(policy, probes)
    names = [n for n in ref.values if n not in STOCHASTIC]
    ort = OrtRunner(build_onnx(policy), spec=policy.spec)
    one = rows(probes, 1)
    res = {"fixture": name, "onnxruntime": {"figures": summary(judged(ref, ort.infer(probes), names)),
                                            "latency_b1_us": median_us(lambda: ort.infer(one), iters)}}
    for t in targets:
        line = missing(t)
        if line:
            res[t] = {"status": "missing", "line": line}
            continue
        t0 = time.perf_counter()
        try:
            files, runner = build_target(t, policy)
        except HuggyError as exc:
            res[t] = {"status": "refused", "line": exc.one_line()}
            continue
        except Exception as exc:  # noqa: BLE001 - a converter's crash, recorded as is
            res[t] = {"status": "error", "line": f"{type(exc).__name__}: {str(exc)[:400]}"}
            continue
        convert_s = time.perf_counter() - t0
        try:
            a, b = runner.infer(probes), runner.infer(probes)
        except Exception as exc:  # noqa: BLE001 - a runtime's crash, recorded as is
            res[t] = {"status": "error", "line": f"{type(exc).__name__}: {str(exc)[:400]}"}
            continue
        bitwise = all(a[n].tobytes() == b[n].tobytes() for n in a if n not in STOCHASTIC)
        res[t] = {"status": "ok", "convert_s": convert_s, "bytes": {k: len(v) for k, v in files.items()},
                  "dtype": runner.dtype, "bitwise_repeat": bitwise,
                  "rows_per_call": getattr(runner, "max_rows", getattr(runner, "rows", None)), "figures": summary(judged(ref, a, names)),
                  "outputs": {n: {k: f.get(k) for k in ("ok", "max_abs", "max_bound", "ratio", "equal", "ties")}
                              for n, f in judged(ref, a, names).items()},
                  "latency_b1_us": median_us(lambda: runner.infer(one), iters)}
    return res


def row(r, t):
    d = r[t]
    if d.get("status") != "ok":
        return f"| {r['fixture']} | {t} | {d['status']}: {d['line']} | | | |"
    f = d["figures"]
    arg = "; ".join(f"{n} {a['equal']}/{a['count']}" + (f" ({a['ties']} ties)" if a["ties"] else "")
                    for n, a in f["argmax"].items())
    err = (f"{f['ratio']:.3f} ({f['worst']})" if f["worst"] else "-") + (f"; argmax {arg}" if arg else "")
    return (f"| {r['fixture']} | {t} | {'PASS' if f['ok'] else 'FAIL'} {err} | {'yes' if d['bitwise_repeat'] else 'NO'} "
            f"| {d['latency_b1_us']:.0f} | {r['onnxruntime']['latency_b1_us']:.0f} |")


def merged_table(paths):
    """One Markdown table from several ``--json`` files (one per target's environment): a row per fixture,
    per target its worst max |error| / float32 bound (argmax outputs: equal of count), bitwise, b1 latency."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    targets = [t for d in docs for t in d["results"][0] if t not in ("fixture", "onnxruntime")]
    by = {}
    for d in docs:
        for r in d["results"]:
            by.setdefault(r["fixture"], {}).update(r)
    head = "| fixture | " + " | ".join(f"{t}: error/bound, repeat, b1 us" for t in targets) + " | onnxruntime b1 us |"
    lines = [head, "|---" * (len(targets) + 2) + "|"]
    for name, r in by.items():
        cells = []
        for t in targets:
            d = r.get(t, {})
            if d.get("status") != "ok":
                cells.append(f"{d.get('status', '-')}: {d.get('line', '')}")
                continue
            f = d["figures"]
            parts = [f"{f['ratio']:.3f}"] if f["worst"] else []
            parts += [f"argmax {a['equal']}/{a['count']}" for a in f["argmax"].values()]
            ok = "" if f["ok"] else "FAIL "
            cells.append(f"{ok}{', '.join(parts)}; {'bitwise' if d['bitwise_repeat'] else 'DIFFERS'}; "
                         f"{d['latency_b1_us']:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['onnxruntime']['latency_b1_us']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="openvino,litert,executorch")
    ap.add_argument("--fixtures", default="", help="comma-separated fixture names (default: every fixture)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--table", nargs="+", type=Path, default=None,
                    help="print one Markdown table from these --json files (one per environment) and exit")
    a = ap.parse_args(argv)
    if a.table:
        print(merged_table(a.table))
        return 0
    from huggy_convert.runtime import torch_threads

    fx = fixtures()
    chosen = [f for f in a.fixtures.split(",") if f] or list(fx)
    targets = [t for t in a.targets.split(",") if t]
    print("| fixture | target | max error/bound (worst output); argmax equal | bitwise repeat | target b1 us "
          "| onnxruntime b1 us |")
    print("|---|---|---|---|---|---|")
    out = []
    with torch_threads(1):
        for name in chosen:
            r = measure(name, *fx[name], targets, a.rows, a.seed, a.iters)
            out.append(r)
            for t in targets:
                print(row(r, t), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"host": platform.processor() or platform.machine(), "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
