"""Target P3 of issue 15: one ``huggy-convert CKPT OUT/`` on the Huggy checkpoint next to importing the
five modules it is built on, measured in one run, interleaved round by round.

    python benchmarks/startup.py [--rounds 5] [--baseline DIR]

Each round runs, one after the other, in fresh interpreters:

- ``python -c "import torch, onnx, onnxruntime, safetensors, click"``: the floor of any conversion
  (**import**; every ratio below is against it);
- the same with ``gc.freeze()`` before exiting, as ``cli.entry`` does (the interpreter's teardown then
  skips walking torch's objects, ~0.2 s): a stricter floor, printed beside;
- the same plus ``torch._dynamo`` (``torch.export.export``, ``.save`` and ``.load`` all import it:
  ``torch.export.pt2_archive._package`` does), and plus exporting, saving, loading and running a
  one-Linear ``.pt2``: the floor of a conversion that writes a ``.pt2`` and verifies it by loading it
  (both exit as ``cli.entry`` does);
- ``huggy-convert CKPT OUT`` (convert, ONNX, ``.pt2``, verify): target <= 2x import;
- ``huggy-convert CKPT OUT --no-program`` (no ``.pt2``): target <= 1.2x import;
- with ``--baseline DIR`` (another checkout, e.g. ``git worktree add --detach DIR main``) the same two
  conversions by that checkout's package, and a byte-for-byte comparison of the files both wrote.

Printed: the median (and range) of each, each ratio next to its floor, then where the time goes, from
one more run of each conversion instrumented in-process (``--breakdown`` child): the interpreter's
start and exit, the five imports, the package's own import, the imports done on the way (torch._dynamo
and torch.export for the ``.pt2``), and the stages (load, official ONNX read + onnx.checker, the
exports, writes, onnxruntime sessions and runs, torch forwards, the float64 reference, the ``.pt2``
load, hashing), each as time spent in it and not in a stage below it. The instrumented run is a little
slower than the timed ones (its timers); its total is printed beside the timed median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, huggy_checkpoint  # noqa: E402

FIVE = "import torch, onnx, onnxruntime, safetensors, click"
# the least a conversion that writes a .pt2 and verifies it by loading it does: export, save, load and
# run a one-Linear module with a dynamic batch (torch._dynamo, torch.export, sympy imported on the way),
# then exit as cli.entry does (gc.freeze)
PT2_FLOOR = (FIVE + "; import io; m = torch.nn.Linear(59, 21); d = torch.export.Dim('batch', min=1, max=1 << 20); "
             "ep = torch.export.export(m, (torch.zeros(2, 59),), dynamic_shapes=({0: d},)); b = io.BytesIO(); "
             "torch.export.save(ep, b); b.seek(0); torch.export.load(b).module()(torch.zeros(1, 59)); "
             "import gc; gc.freeze()")  # and exits as cli.entry does


def launcher(package_root: Path):
    """A fresh interpreter running ``huggy-convert`` from ``package_root`` (its ``huggy_convert``
    first on sys.path), as the console script does (``cli.entry``)."""
    code = f"import sys; sys.path.insert(0, {str(package_root)!r}); from huggy_convert.cli import entry; entry()"
    return [sys.executable, "-c", code]


def wall(cmd, env=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))[:200]} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return dt


# --- the instrumented child -----------------------------------------------------------------------
PT2_IMPORTS = ("torch._dynamo", "torch.export", "torch._export", "torch._functorch", "torch._subclasses",
               "torch.fx", "sympy", "torch._inductor", "torch.utils._sympy", "torch._higher_order_ops")


def child(args) -> None:
    """One conversion in this process, each stage timed exclusively of the stages inside it; writes
    ``{category: seconds}`` as JSON to ``args[0]``; the conversion's arguments follow."""
    import builtins
    import collections
    import itertools

    t_start = time.perf_counter()
    out_json, conv_args = args[0], args[1:]
    totals = collections.defaultdict(float)
    stack = []  # [category, time spent in timed children]

    def timed(cat, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            stack.append([cat, 0.0])
            try:
                return fn(*a, **k)
            finally:
                c, inner = stack.pop()
                dt = time.perf_counter() - t
                totals[c] += dt - inner
                if stack:
                    stack[-1][1] += dt
        wrapper.__wrapped__ = fn
        return wrapper

    t = time.perf_counter()
    import torch, onnx, onnxruntime, safetensors, click  # noqa: E401,F401
    totals["import torch, onnx, onnxruntime, safetensors, click"] = time.perf_counter() - t
    t = time.perf_counter()
    from huggy_convert import cli
    from huggy_convert import pipeline  # noqa: F401
    from huggy_convert.core import artifacts  # noqa: F401
    from huggy_convert.converter import checkpoint, reference
    from huggy_convert.exporters import pt2, registry, torch_module
    from huggy_convert.runtime import ort, torch_runners
    from huggy_convert.verify import bounds, checks, engine
    totals["import huggy_convert (the package)"] = time.perf_counter() - t

    original_import = builtins.__import__

    def traced_import(name, *a, **k):
        """An import statement that loads modules: its time under the import category (the .pt2's if
        any module it loaded is torch._dynamo's, torch.export's, sympy's...), not the caller's."""
        if stack and stack[-1][0] == "import":
            return original_import(name, *a, **k)
        mods = len(sys.modules)
        t = time.perf_counter()
        stack.append(["import", 0.0])
        try:
            return original_import(name, *a, **k)
        finally:
            _, inner = stack.pop()
            dt = time.perf_counter() - t
            if len(sys.modules) > mods:  # modules were loaded (sys.modules keeps insertion order)
                new = itertools.islice(sys.modules, mods, None)
                cat = ("import torch._dynamo, torch.export, sympy (the .pt2: export, save, load)"
                       if any(m.startswith(PT2_IMPORTS) for m in new) else "import (other modules, on first use)")
                totals[cat] += dt - inner
                if stack:
                    stack[-1][1] += dt

    def patch(owner, name, cat):
        """Wrap ``owner.name`` wherever that object is bound in the package's modules."""
        fn = getattr(owner, name)
        w = timed(cat, fn)
        setattr(owner, name, w)
        if not isinstance(owner, type):
            for m in list(sys.modules.values()):
                if getattr(m, "__name__", "").startswith("huggy_convert") and getattr(m, name, None) is fn:
                    setattr(m, name, w)

    patch(checkpoint, "load_checkpoint", "load the checkpoint (torch.load, weights_only)")
    patch(reference, "read_onnx", "read the official ONNX (onnx.checker full check)")
    patch(pipeline, "prepare_conversion", "map the checkpoint, decide divisors")
    for kind in list(registry.EXPORTERS):
        registry.EXPORTERS[kind] = timed(f"export {kind}", registry.EXPORTERS[kind])
    patch(torch_module, "export_program", "export .pt2: torch.export trace")
    patch(pt2, "_save", "export .pt2: torch.export.save")
    patch(torch_module, "build_module", "build torch modules")
    patch(artifacts._Transaction, "write_all", "write files (atomic, fsync)")
    patch(ort, "ort_session", "onnxruntime sessions (4)")
    patch(ort, "ort_run", "onnxruntime runs (64 rows + 384 single rows)")
    patch(torch_runners.ModuleRunner, "infer", "torch module forwards (64 rows x 3 dtypes + 384 single rows)")
    patch(torch_runners.ProgramRunner, "__init__", "load the .pt2 (check, torch.export.load, .module())")
    patch(torch_runners.ProgramRunner, "infer", "run the .pt2 program")
    patch(bounds.Float64Policy, "__init__", "float64 reference")
    patch(bounds.Float64Policy, "_forward", "float64 reference")
    patch(engine, "check_files", "check 6: hash and compare the files")
    patch(checks, "_fingerprint", "check 5 (fingerprints): hashing, feeds")
    patch(engine, "golden_of", "golden file")
    patch(engine, "environment", "report: environment, host")
    builtins.__import__ = traced_import
    main_wrapped = timed("the rest: CLI, checks' Python, rendering", cli.main)
    t_main = time.perf_counter()
    code = 0
    try:
        main_wrapped(conv_args, standalone_mode=False)
    except SystemExit as e:
        code = e.code or 0
    finally:
        builtins.__import__ = original_import
    totals["(in-process total)"] = time.perf_counter() - t_start
    totals["(main)"] = time.perf_counter() - t_main
    Path(out_json).write_text(json.dumps(totals))
    import gc

    gc.freeze()  # as cli.entry does
    sys.exit(code)


def breakdown(ckpt: Path, out: Path, extra, env) -> dict:
    js = out.with_suffix(".json")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", str(js), str(ckpt), str(out)] + list(extra),
                       capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"instrumented run failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    d = json.loads(js.read_text())
    d.pop("(main)")
    d["interpreter start and exit"] = dt - d.pop("(in-process total)")
    d["(wall)"] = dt
    return d


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout whose package converts beside ours (e.g. main)")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning on a core during the timed rounds "
                    "(a shared host: torch's intra-op threads collapse when a core is taken)")
    a = ap.parse_args()
    ckpt = huggy_checkpoint()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cases = {
            "import": [sys.executable, "-c", FIVE],
            "import, exit as cli.entry": [sys.executable, "-c", FIVE + "; import gc; gc.freeze()"],
            "import + torch.export": [sys.executable, "-c", FIVE + "; import torch.export._trace, torch._dynamo, gc; gc.freeze()"],
            "import + a one-Linear .pt2": [sys.executable, "-c", PT2_FLOOR],
            "convert": launcher(ROOT) + [str(ckpt), str(t / "full")],
            "convert --no-program": launcher(ROOT) + [str(ckpt), str(t / "noprog"), "--no-program"],
        }
        if a.baseline:
            cases["baseline convert"] = launcher(a.baseline.resolve()) + [str(ckpt), str(t / "base_full")]
            cases["baseline --no-program"] = launcher(a.baseline.resolve()) + [str(ckpt), str(t / "base_noprog"),
                                                                               "--no-program"]
        times = {k: [] for k in cases}
        wall(cases["import"])  # warm the page cache
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        try:
            for _ in range(a.rounds):
                for k, cmd in cases.items():
                    times[k].append(wall(cmd, env))
        finally:
            for p in busy:
                p.kill()
                p.wait()
        same = None
        if a.baseline:
            same = {}
            for ours, theirs in (("full", "base_full"), ("noprog", "base_noprog")):
                names = sorted(p.name for p in (t / ours).iterdir())
                same[ours] = (names == sorted(p.name for p in (t / theirs).iterdir())
                              and all((t / ours / n).read_bytes() == (t / theirs / n).read_bytes() for n in names),
                              names)
        parts = {"convert": breakdown(ckpt, t / "bd_full", [], env),
                 "convert --no-program": breakdown(ckpt, t / "bd_noprog", ["--no-program"], env)}
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["import"]

    def line(k, note=""):
        v = times[k]
        return (f"  {k:28s} {med[k]:6.2f} s  ({min(v):.2f}-{max(v):.2f})  {med[k] / base:5.2f}x import"
                + (f"   {note}" if note else ""))

    print(f"{ckpt.relative_to(ROOT)} ({ckpt.stat().st_size / 1e6:.1f} MB), {a.rounds} rounds interleaved"
          + (f" beside {a.busy} spinning process(es)" if a.busy else "")
          + f", median (range) wall time; import = python -c \"{FIVE}\"")
    print(line("import", "the floor of any conversion"))
    print(line("import, exit as cli.entry", "gc.freeze() before exit, as the CLI does: a stricter floor"))
    print(line("import + torch.export", "imports torch._dynamo (torch.export's save and load need it)"))
    print(line("import + a one-Linear .pt2", "the floor of a conversion that writes a .pt2 and loads it"))
    fl = med["import + a one-Linear .pt2"] / base
    print(line("convert", f"target <= 2x; floor {fl:.2f}x (import + a one-Linear .pt2)"))
    print(line("convert --no-program", f"target <= 1.2x; floor 1.00x (import; exiting as cli.entry: "
                                       f"{med['import, exit as cli.entry'] / base:.2f}x)"))
    if a.baseline:
        print(line("baseline convert", f"{a.baseline}"))
        print(line("baseline --no-program"))
        for k, (ok, names) in same.items():
            print(f"  files written by ours and by {a.baseline} ({k}): "
                  f"{'byte-identical' if ok else 'DIFFER'} ({', '.join(names)})")
    strict = med["import, exit as cli.entry"]
    print(f"  against the stricter floor (the import, exiting as cli.entry): convert {med['convert'] / strict:.2f}x "
          f"(its floor {med['import + a one-Linear .pt2'] / strict:.2f}x), --no-program "
          f"{med['convert --no-program'] / strict:.2f}x")
    per_round = [c / i for c, i in zip(times["convert"], times["import"])]
    per_round_np = [c / i for c, i in zip(times["convert --no-program"], times["import"])]
    print(f"  ratios round by round: convert {', '.join(f'{r:.2f}' for r in per_round)}; "
          f"--no-program {', '.join(f'{r:.2f}' for r in per_round_np)}")
    for name, d in parts.items():
        w = d.pop("(wall)")
        print(f"\nwhere the time of '{name}' goes (instrumented run: {w:.2f} s; timed median {med[name]:.2f} s; "
              f"import alone {base:.2f} s):")
        for k, v in sorted(d.items(), key=lambda kv: -kv[1]):
            if v >= 0.0005:
                print(f"  {v * 1e3:7.0f} ms  {k}")
        beyond = sum(v for k, v in d.items() if not k.startswith("import torch, onnx"))
        print(f"  {beyond * 1e3:7.0f} ms  beyond the five imports (interpreter start and exit included); timed: "
              f"{(med[name] - base) * 1e3:.0f} ms beyond the import's median")


if __name__ == "__main__":
    main()
