"""The numbered, reproducible test matrix over the user's checkpoint or run directory (or, in a source
checkout, the bundled fixtures: Huggy and the ML-Agents variants).

The cases are a declarative table (``matrix_cases.TABLE``): each is a group, a title, the equivalent
huggy-convert command, what it needs and its check (a function of the :class:`Matrix` returning an
:class:`Outcome`). A case whose needs the input lacks (an official ONNX beside the checkpoint, an older
checkpoint, a run directory, a trait of the policy: carried state, integer actions..., a variant fixture,
an accelerator) is SKIPPED
with the reason. Every case prints one line: number, command, figures, verdict (PASS / FAIL / SKIP)
and, in a separate column, latencies (they change run to run). Inputs are seeded, so two runs print
the same figures; ``quick`` skips the latency-heavy ones (group 9, the .pt2 export).

Thresholds (every verdict is a real check):
- float32, same arithmetic (onnxruntime vs onnxruntime, torch vs torch): bitwise;
- float32 across runtimes, devices and batch sizes: each within the derived bound of the float64
  reference of the canonical tensors (verify.bounds: the rule verify uses, the same on every host);
- float16 / bfloat16: each within the bound derived for the format (verify.bounds, as ``precision``
  judges it; an argmax flip within its float64 logit margin passes); batch-size stability in a half
  format: verify's Tolerance (atol 1e-2 / cosine 0.999; 5e-2 / 0.995);
- integer outputs (``levels``): equal; latency: p99 within a generous budget, outputs finite.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..converter import save_policy
from ..core.files import atomic_write_bytes
from ..errors import HuggyError, describe
from ..runtime import draw_noise, ort_providers, torch_threads
from ..verify.compare import compare_arrays
from . import matrix_cases, matrix_loops, matrix_numerics
from .actions import sample
from .common import FAIL, PASS, SKIP, ModeResult, fp32_agree, fp32_reference, g
from .export import ExportOptions, export
from .info import environment
from .matrix_table import TABLE, VARIANTS, CaseDef, Outcome, Skip, _st
from .matrix_target import Target, resolve_target
from .ports import described, traits
from .sources import Source, devices_present, display_path, load_source, make_feed, make_runner, to_jsonable

# the case modules register their groups into TABLE when imported (1-3, 4-7, 8-10); a run orders the
# table by group (a group's cases in registration order)
CASE_MODULES = (matrix_cases, matrix_numerics, matrix_loops)

GROUPS = {
    1: "environment and model info",
    2: "deterministic actions for varied observations",
    3: "sampled actions",
    4: "batch 16 -> 512",
    5: "precision fp32 / fp16 / bf16 vs CPU fp32",
    6: "ONNX cross-validation (rebuilt vs official ML-Agents ONNX)",
    7: "sequence fingerprints",
    8: "closed-loop stats",
    9: "latency percentiles",
    10: "export (opsets 9-15) and multi-device consistency",
}


@dataclass
class Case:
    """A case of one run: its number, command and result."""

    number: str
    group: int
    title: str
    command: str
    definition: CaseDef
    verdict: str = SKIP
    figures: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def quick(self) -> bool:
        return self.definition.quick

    @property
    def needs(self) -> Optional[str]:
        return ", ".join(self.definition.needs) or None

    def to_dict(self) -> Dict[str, Any]:
        return to_jsonable({"number": self.number, "group": self.group, "title": self.title, "command": self.command,
                            "verdict": self.verdict, "figures": self.figures, "note": self.note,
                            "timings": self.timings})


def fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        return g(v, 6)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + " ".join(f"{k}={fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def fig_line(figs: Dict[str, Any]) -> str:
    return " ".join(f"{k}={fmt(v)}" for k, v in figs.items())


# --- the run's context -----------------------------------------------------------------------------
NEEDS = {  # need -> (what it is, whether the matrix has it)
    "official": ("the official ONNX ML-Agents wrote beside the checkpoint", lambda m: m.off is not None),
    "older": ("another checkpoint of the run (with its official ONNX)",
              lambda m: m.t.older is not None and m.t.older.with_suffix(".onnx").is_file()),
    "rundir": (f"a run directory ({C.STATUS_FILE})", lambda m: m.t.run_dir is not None),
    "run_root": (f"the run root's <Behavior>.onnx and <Behavior>/{C.CHECKPOINT_FILE}",
                 lambda m: m.root_onnx.is_file() and m.root_ck.is_file()),
    "variants": ("variant fixtures (--fixtures or the bundled ones)", lambda m: bool(m.present_variants())),
    "normalizer": ("a normalizer (normalize: true)", lambda m: m.spec.normalize),
    **{t: (described(t), lambda m, t=t: t in m.traits) for t in ("normal_sample", "fixed_sigma")},
    "cuda": ("a cuda device", lambda m: any(d.startswith("cuda") for d in m.devices)),
    "npu": ("a npu device", lambda m: any(d.startswith("npu") for d in m.devices)),
    "cuda_ep": ("onnxruntime's CUDA execution provider", lambda m: "CUDAExecutionProvider" in m.providers),
}


class Matrix:
    def __init__(self, out: Path, target: Target, quick: bool):
        self.out, self.t, self.quick = Path(out), target, quick
        self._src: Dict[str, Source] = {}
        self.devices = devices_present()
        self.providers = ort_providers()
        self.ck, self.off, self.old = target.ck, target.official, target.older
        self.home = target.run_dir or target.ck  # what `info` is shown on
        self.root_onnx = self.ck.parent.parent / f"{self.ck.parent.name}.onnx"
        self.root_ck = self.ck.parent / C.CHECKPOINT_FILE
        self.cases: List[Case] = []
        counters: Dict[int, int] = {}
        for d in sorted(TABLE, key=lambda d: d.group):  # stable: a group's cases in registration order
            counters[d.group] = counters.get(d.group, 0) + 1
            self.cases.append(Case(f"{d.group}.{counters[d.group]}", d.group, d.title, d.command(self), d))

    @property
    def main(self) -> Source:
        return self.src(self.ck)

    @property
    def spec(self):
        return self.main.spec

    @property
    def traits(self):
        """The input's traits (``modes.ports.traits``)."""
        return traits(self.spec)

    # --- helpers --------------------------------------------------------------------------
    def src(self, path) -> Source:
        key = str(Path(path).resolve())
        if key not in self._src:
            self._src[key] = load_source(path)
        return self._src[key]

    def p(self, path) -> str:
        return display_path(path)

    def cmd(self, mode: str, *args) -> str:
        return " ".join(["huggy-convert", mode] + [self.p(a) if isinstance(a, Path) else str(a) for a in args])

    def lacks(self, needs: Sequence[str]) -> Optional[str]:
        """Why the input cannot run a case with ``needs`` (None: it can)."""
        for n in needs:
            what, have = NEEDS[n]
            if not have(self):
                return f"needs {what}: none here"
        return None

    def present_variants(self) -> List[Tuple[str, Path]]:
        """(name, newest step checkpoint) of every variant fixture that has one."""
        return [(name, ck) for name, ck in self.t.variants.items() if ck is not None]

    def variant(self, name: str) -> Path:
        """The checkpoint standing for variant ``name``: its fixture, or the input when it is of that kind."""
        if self.t.variants_dir is not None:
            ck = self.t.variants.get(name)
            if ck is None:
                raise Skip(f"fixture variant '{name}' is not present")
            return ck
        trait, what = VARIANTS[name]
        if trait is not None and trait in self.traits:
            return self.ck
        raise Skip(f"needs {what}: {self.t.label} is {self.spec.family}")

    def variant_label(self, name: str):
        return self.t.variants.get(name) or (self.ck if self.t.variants_dir is None else name)

    def variants_cmd(self, mode: str, *args) -> str:
        return self.cmd(mode, (self.t.variants_dir or Path("variants")) / "<name>", *args)

    def official_of(self, ck: Path) -> Path:
        p = ck.with_suffix(".onnx")
        if not p.is_file():
            raise Skip(f"needs the official ONNX beside {self.p(ck)}: none here")
        return p

    def file(self, name: str) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / name

    def safetensors(self) -> Path:
        p = self.file(f"{self.ck.stem}.safetensors")
        if not p.is_file():
            save_policy(self.main.policy, p)
        return p

    def exported(self, opset: int, ck: Optional[Path] = None, noise: bool = False):
        ck = ck or self.ck
        p = self.file(f"{ck.stem}.opset{opset}{'.noise' if noise else ''}.onnx")
        return p, export(self.src(ck), opset, p, ExportOptions(noise_input=noise))

    def det(self, path, feed, device="cpu", dtype="float32", runtime="auto"):
        return make_runner(self.src(path), device, dtype, runtime).deterministic(feed)

    def agree(self, path: Path, feed, a: Dict, b: Dict, names=None, noise=None) -> Outcome:
        """Two float32 runs of the policy at ``path``: each within the derived bound of the float64
        reference (modes.common.fp32_agree), the rule verify uses on every host."""
        ref = fp32_reference(self.src(path).policy, feed, noise)
        figs, ok = {}, True
        for n in names or [k for k in a if k in b]:
            j = fp32_agree(ref, n, a[n], b[n])
            figs[n] = _st(j) | ({"bound_ratio": round(float(j.bound_ratio), 6)} if j.bound_ratio is not None else {})
            ok = ok and j.ok
        return Outcome(ok, figs)

    def vs_official(self, ck: Path, feed, bitwise_ort: bool = True) -> Outcome:
        """torch fp32 vs ORT official (both within the derived bound of the float64 reference) and ORT
        rebuilt vs ORT official (bitwise)."""
        s = self.src(ck)
        names = s.spec.deterministic_output_names()
        off = self.det(self.official_of(ck), feed)
        torch_out = self.det(ck, feed)
        ort_out = self.det(ck, feed, runtime="onnxruntime")
        o = self.agree(ck, feed, off, torch_out, names)
        figs, ok = {f"torch:{k}": v for k, v in o.figures.items()}, o.ok
        for n in names:
            b = compare_arrays(off[n], ort_out[n])
            figs[f"ort:{n}"] = _st(b)
            ok = ok and (b.bitwise if bitwise_ort else self.agree(ck, feed, off, ort_out, [n]).ok)
        return Outcome(ok, figs)

    def sample(self, path, seed, rows=8, runtime="auto", device="cpu"):
        return sample(self.src(path), device=device, runtime=runtime, rows=rows, seed=seed).data["outputs"]

    def sample_agree(self, path, a, b, rows, seed=0) -> Outcome:
        """Two float32 samples of ``path`` with the seed's CPU noise, judged by the derived bound."""
        s = self.src(path)
        eps, _ = draw_noise(s.spec, rows, seed)
        return self.agree(path, make_feed(s, "random", rows, 0), a, b, [C.OUT_CONT], eps)

    # --- running --------------------------------------------------------------------------
    def run(self, only: Sequence[str] = (), echo=None) -> None:
        for c in self.cases:
            why = self.lacks(c.definition.needs)
            if only and not any(c.number == o or str(c.group) == o for o in only):
                c.verdict, c.note = SKIP, "not selected (--only)"
            elif why:
                c.verdict, c.note = SKIP, why
            elif self.quick and not c.quick:
                c.verdict, c.note = SKIP, "latency-heavy: not run with --quick"
            else:
                t0 = time.perf_counter()
                try:
                    o = c.definition.check(self)
                    c.verdict = PASS if o.ok else FAIL
                    c.figures, c.timings, c.note = o.figures, dict(o.timings), o.note
                except Skip as s:
                    c.verdict, c.note = SKIP, str(s)
                except HuggyError as e:
                    c.verdict, c.note = FAIL, f"error: {e.one_line()}"
                except Exception as e:  # a crash in a case is that case's failure, not the matrix's
                    c.verdict, c.note = FAIL, f"crashed: {describe(e)}"
                c.timings["case_s"] = round(time.perf_counter() - t0, 3)
            if echo:
                echo(self.line(c))

    @staticmethod
    def line(c: Case) -> str:
        figs = fig_line(c.figures)
        if c.note:
            figs = (figs + "  " if figs else "") + f"({c.note})"
        lat = " ".join(f"{k}={fmt(v)}" for k, v in c.timings.items())
        return f"{c.number:<5} | {c.verdict:<4} | {c.command} | {figs} | latency: {lat}"

    def summary(self) -> Dict[str, Any]:
        counts = {v: sum(1 for c in self.cases if c.verdict == v) for v in (PASS, FAIL, SKIP)}
        groups = {str(gn): {"title": t, "cases": sum(1 for c in self.cases if c.group == gn),
                            **{v.lower(): sum(1 for c in self.cases if c.group == gn and c.verdict == v)
                               for v in (PASS, FAIL, SKIP)}} for gn, t in GROUPS.items()}
        return {"cases": len(self.cases), "groups": len({c.group for c in self.cases}), "pass": counts[PASS],
                "fail": counts[FAIL], "skip": counts[SKIP], "per_group": groups}


# --- running the matrix ----------------------------------------------------------------------------
def run_matrix(out, quick: bool = False, source: Optional[Path] = None, fixtures: Optional[Path] = None,
               only: Sequence[str] = (), echo: Optional[Callable[[str], None]] = None) -> ModeResult:
    """Run the table on ``source`` (a checkpoint or run directory; see :func:`resolve_target`), write
    OUT/matrix.log and OUT/matrix.json. ``echo``: given each line of the log as it is made (the CLI
    prints them); the mode itself prints nothing."""

    target = resolve_target(source, fixtures)
    out = Path(out)
    t0 = time.perf_counter()
    m = Matrix(out, target, quick)
    m.src(target.ck)  # a checkpoint that does not load is bad input (exit 2), not a hundred failed cases
    env = environment()
    head = [f"# huggy-convert matrix ({'quick' if quick else 'full'}): {len(m.cases)} cases in {len(GROUPS)} groups; "
            f"input {target.label}",
            f"# environment: torch {env['torch']}, onnx {env['onnx']}, onnxruntime {env['onnxruntime']}, "
            f"numpy {env['numpy']}; devices {', '.join(env['devices'])}; "
            f"onnxruntime providers {', '.join(env['onnxruntime_providers'])}; torch and onnxruntime on 1 CPU thread",
            "# columns: number | verdict | equivalent command | figures (seeded: identical run to run) | "
            "latency: (varies run to run; ignore in diffs)"]
    lines: List[str] = list(head)
    say = echo or (lambda s: None)
    for h in head:
        say(h)
    current = {"group": 0}

    def emit(text: str) -> None:
        lines.append(text)
        say(text)

    def on_case(text: str) -> None:
        gnum = int(text.split(".", 1)[0])
        if gnum != current["group"]:
            current["group"] = gnum
            emit(f"## {gnum} {GROUPS[gnum]}")
        emit(text)

    # one intra-op thread, like the onnxruntime reference sessions: the same figures on every
    # run, and no collapse when the cores are shared (torch's spinning threads are 40x slower then)
    with torch_threads(1):
        m.run(only, echo=on_case)
    s = m.summary()
    total = time.perf_counter() - t0
    emit(f"# summary: {s['cases']} cases, {s['groups']} groups: {s['pass']} PASS, {s['fail']} FAIL, {s['skip']} SKIP")
    emit(f"# latency: total {total:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "matrix.log", ("\n".join(lines) + "\n").encode())
    doc = {"mode": "matrix", "quick": quick, "ok": s["fail"] == 0, "summary": s, "input": target.label,
           "environment": {k: env[k] for k in ("torch", "onnx", "onnxruntime", "numpy", "python")} |
           {"devices": list(env["devices"]), "onnxruntime_providers": env["onnxruntime_providers"]},
           "cases": [c.to_dict() for c in m.cases], "timings": {"total_s": round(total, 3)}}
    atomic_write_bytes(out / "matrix.json", (json.dumps(doc, indent=2) + "\n").encode())
    r = ModeResult("matrix", ok=s["fail"] == 0)
    r.data = {k: v for k, v in doc.items() if k not in ("mode", "ok", "timings")}
    r.data["log"] = display_path(out / "matrix.log")
    r.timings = doc["timings"]
    r.lines = [f"wrote {display_path(out / 'matrix.log')} and {display_path(out / 'matrix.json')}"]
    return r


def list_cases(fixtures: Optional[Path] = None, out: Path = Path("huggy-matrix"),
               source: Optional[Path] = None) -> List[Dict[str, Any]]:
    """The full numbered listing without running anything."""
    m = Matrix(out, resolve_target(source, fixtures), quick=False)
    return [{"number": c.number, "group": c.group, "title": c.title, "command": c.command, "quick": c.quick,
             "needs": c.needs} for c in m.cases]
