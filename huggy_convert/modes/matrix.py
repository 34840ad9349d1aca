"""The numbered, reproducible test matrix: 10 groups of cases over the bundled fixtures (Huggy and
the variants). Every case is one line: number, the equivalent huggy-convert command, figures,
verdict (PASS / FAIL / SKIP), and, in a separate column, latencies (they change run to run).

Inputs are seeded, so two runs print the same figures. Cases that need an accelerator are
SKIPPED where none exists; ``quick`` skips the latency-heavy ones (group 9, the .pt2 export).

Thresholds (every verdict is a real check):
- float32, same arithmetic (onnxruntime vs onnxruntime, torch vs torch): bitwise;
- float32 across runtimes, devices and batch sizes: each within the derived bound of the float64
  reference of the canonical tensors (verify.bounds: the rule verify uses, the same on every host);
- float16: max_abs <= 1e-2 and cosine >= 0.999; bfloat16: <= 5e-2 and >= 0.995;
- integer (discrete) outputs: equal; latency: p99 within a generous budget, outputs finite.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .. import contract as C
from ..errors import HuggyError, InputError
from ..verify.compare import DEFAULT_TOLERANCES, Comparison, compare_arrays
from .common import FAIL, PASS, SKIP, ModeResult, fp32_agree, fp32_reference, g
from .sources import (Source, devices_present, display_path, load_source, make_feed,
                      make_runner, ort_providers)
from ..rundir import step_checkpoints

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
HUGGY_PARAMS = (566_805, 566_826)  # REFERENCE.md: Huggy's actor, linear layers / with log_sigma
LATENCY_BUDGET_MS = 50.0  # p99 per call, batch <= 64, CPU: a loose bound that only a broken build misses
TAMPER = 1e-3


class Skip(Exception):
    pass


@dataclass
class Outcome:
    ok: bool
    figures: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Case:
    number: str
    group: int
    title: str
    command: str
    fn: Callable[[], Outcome]
    quick: bool = True
    needs: Optional[str] = None
    verdict: str = SKIP
    figures: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> Dict[str, Any]:
        from .sources import to_jsonable

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


def _st(c: Comparison) -> Dict[str, Any]:
    """max_abs and bitwise count of one comparison (integers: equal count)."""
    if c.shape_mismatch is not None:
        return {"shape_mismatch": c.shape_mismatch}
    if c.integer:
        return {"equal": f"{c.bitwise_equal}/{c.count}"}
    return {"max_abs": float(c.max_abs), "bitwise": f"{c.bitwise_equal}/{c.count}"}


def _sha(arrays: Dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()[:16]


class Matrix:
    def __init__(self, out: Path, fixtures: Path, quick: bool):
        self.out = Path(out)
        self.fx = Path(fixtures)
        self.quick = quick
        self.cases: List[Case] = []
        self._src: Dict[str, Source] = {}
        self._counters: Dict[int, int] = {}
        self.devices = devices_present()
        self.providers = ort_providers()
        huggy = self.fx / "huggy"
        self.huggy_dir = huggy
        self.huggy_ckpts = step_checkpoints(huggy) if huggy.is_dir() else []
        if not self.huggy_ckpts:
            raise InputError("no Huggy fixture (expected huggy/Huggy/Huggy-<step>.pt): pass --fixtures", huggy)
        self.ck = self.huggy_ckpts[-1]
        self.off = self.ck.with_suffix(".onnx")
        self.old = self.huggy_ckpts[0] if len(self.huggy_ckpts) > 1 else None
        vdir = self.fx / "variants"
        self.variants: Dict[str, Optional[Path]] = {}
        for d in sorted(p for p in vdir.iterdir() if p.is_dir()) if vdir.is_dir() else []:
            ck = step_checkpoints(d)
            self.variants[d.name] = ck[-1] if ck else None
        self.manifest = {}
        mf = self.fx / "manifest.json"
        if mf.is_file():
            try:
                for run in json.loads(mf.read_text()).get("runs", []):
                    self.manifest[run.get("name")] = run
            except (OSError, ValueError):
                self.manifest = {}
        self._define()

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

    def has(self, what: str) -> bool:
        if what == "cuda_ep":
            return "CUDAExecutionProvider" in self.providers
        return any(d.startswith(what) for d in self.devices)

    def present_variants(self):
        """(name, newest step checkpoint) of every variant fixture that has one."""
        return [(name, ck) for name, ck in self.variants.items() if ck is not None]

    def variant(self, name: str) -> Path:
        ck = self.variants.get(name)
        if ck is None:
            raise Skip(f"fixture variant '{name}' is not present")
        return ck

    def add(self, group: int, title: str, command: str, fn, quick: bool = True, needs: Optional[str] = None):
        n = self._counters.get(group, 0) + 1
        self._counters[group] = n
        self.cases.append(Case(f"{group}.{n}", group, title, command, fn, quick, needs))

    def file(self, name: str) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / name

    def safetensors(self) -> Path:
        from ..converter import save_policy

        p = self.file(f"{self.ck.stem}.safetensors")
        if not p.is_file():
            save_policy(p, self.src(self.ck).policy)
        return p

    def exported(self, opset: int, ck: Optional[Path] = None, noise: bool = False):
        from .export import export

        ck = ck or self.ck
        p = self.file(f"{ck.stem}.opset{opset}{'.noise' if noise else ''}.onnx")
        return p, export(self.src(ck), opset, p, noise_input=noise)

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
        off = self.det(ck.with_suffix(".onnx"), feed)
        torch_out = self.det(ck, feed)
        ort_out = self.det(ck, feed, runtime="onnxruntime")
        o = self.agree(ck, feed, off, torch_out, names)
        figs, ok = {f"torch:{k}": v for k, v in o.figures.items()}, o.ok
        for n in names:
            b = compare_arrays(off[n], ort_out[n])
            figs[f"ort:{n}"] = _st(b)
            ok = ok and (b.bitwise if bitwise_ort else self.agree(ck, feed, off, ort_out, [n]).ok)
        return Outcome(ok, figs)

    # --- the cases ------------------------------------------------------------------------
    def _define(self) -> None:  # noqa: C901 - one flat list of cases reads best
        ck, off, hd = self.ck, self.off, self.huggy_dir
        vnames = list(self.variants)

        # 1 environment and model info ------------------------------------------------------
        def c_env():
            from .info import environment

            e = environment()
            return Outcome("cpu" in e["devices"], {k: e[k] for k in ("torch", "onnx", "onnxruntime", "numpy")} |
                           {"devices": list(e["devices"]), "ort_providers": e["onnxruntime_providers"]})
        self.add(1, "environment: versions and devices", self.cmd("info", hd), c_env)

        def c_params():
            from .info import counted_parameters

            s = self.src(ck)
            c = counted_parameters(s)
            huggy_spec = s.spec.obs_sizes == (59,) and s.spec.continuous_size == 21 and s.spec.hidden_units == 512 \
                and s.spec.num_layers == 3
            ok = c["linear"] == c["tensors_linear"] and c["with_log_sigma"] == c["tensors_with_log_sigma"]
            ok = ok and huggy_spec and (c["linear"], c["with_log_sigma"]) == HUGGY_PARAMS
            return Outcome(ok, {"family": s.spec.family, "linear": c["linear"], "with_log_sigma": c["with_log_sigma"],
                                "from_tensors": [c["tensors_linear"], c["tensors_with_log_sigma"]],
                                "expected": list(HUGGY_PARAMS)})
        self.add(1, "Huggy spec and parameter count", self.cmd("info", ck), c_params)

        def c_norm():
            from .info import normalizer_summary

            n = normalizer_summary(self.src(ck))
            ok = bool(n) and all(x["steps"] and x["steps"] > 0 and x["divisor_range"][0] > 0
                                 and np.isfinite(x["divisor_range"][1]) and x["variance_range"][0] > 0 for x in n)
            x = n[0]
            return Outcome(ok, {"steps": x["steps"], "mean_range": x["mean_range"], "variance_range": x["variance_range"],
                                "divisor_range": x["divisor_range"], "constant_dims": x["constant_dims"],
                                "fp16_overflow": x["fp16_overflow"]})
        self.add(1, "Huggy normalizer summary", self.cmd("info", ck), c_norm)

        def c_inv():
            from .sources import run_inventory

            inv = run_inventory(hd)
            rows = [r for b in inv["behaviors"].values() for r in b["checkpoints"]]
            steps = [r["steps"] for r in rows]
            present = all(r.get("pt_present") and r.get("onnx_present", True) for r in rows)
            newest_ok = bool(steps) and max(steps) == int(ck.stem.rsplit("-", 1)[1])
            return Outcome(present and steps == sorted(steps) and newest_ok,
                           {"checkpoints": len(rows), "steps": steps,
                            "rewards": [round(float(r["reward"]), 4) for r in rows if r.get("reward") is not None],
                            "files_present": present})
        self.add(1, "run-directory checkpoint inventory (training_status.json)", self.cmd("info", hd), c_inv)

        def c_variants():
            figs, ok = {}, True
            if not self.variants:
                raise Skip("no fixture variants")
            for name, vck in self.variants.items():
                if vck is None:
                    figs[name] = "missing"
                    continue
                s = self.src(vck).spec
                want = self.manifest.get(name)
                match = True
                if want:
                    match = (list(s.obs_sizes) == want["obs_sizes"] and s.continuous_size == want["continuous_size"]
                             and list(s.discrete_branches) == want["discrete_branches"]
                             and s.hidden_units == want["hidden_units"] and s.num_layers == want["num_layers"]
                             and s.memory_size == want["memory_size"] and s.normalize == want["normalize"]
                             and s.algorithm == ("sac" if want["trainer_type"] == "sac" else "ppo"))
                ok = ok and match
                figs[name] = f"{s.parameter_count()}p{'' if match else ' MISMATCH'}"
            return Outcome(ok, figs)
        self.add(1, "every variant's spec matches the fixture manifest", self.cmd("info", self.fx / "variants" / "<name>"),
                 c_variants)

        def c_st():
            from ..converter import load_policy

            p = self.safetensors()
            back = load_policy(p)
            pol = self.src(ck).policy
            eq = sum(1 for k, v in pol.tensors.items() if k in back.tensors and back.tensors[k].tobytes() == v.tobytes())
            ok = eq == len(pol.tensors) == len(back.tensors) and back.spec == pol.spec
            return Outcome(ok, {"tensors": len(pol.tensors), "bitwise_equal": eq,
                                "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:16]})
        self.add(1, "canonical safetensors round trip (bitwise)", f"huggy-convert {self.p(ck)} {self.p(self.out)}/ "
                 "--no-verify --no-program", c_st)

        def c_onnx_info():
            from .info import counted_parameters

            so, sc = self.src(off), self.src(ck)
            a, b = so.spec, sc.spec
            same = (a.obs_sizes, a.continuous_size, a.discrete_branches, a.memory_size, a.hidden_units,
                    a.num_layers, a.normalize, a.algorithm) == (b.obs_sizes, b.continuous_size, b.discrete_branches,
                                                                b.memory_size, b.hidden_units, b.num_layers,
                                                                b.normalize, b.algorithm)
            pc = counted_parameters(so)
            ok = same and (pc["linear"], pc["with_log_sigma"]) == (b.parameter_count(False), b.parameter_count(True))
            return Outcome(ok, {"opset": so.onnx_view.opset, "inputs": [n for n, _ in so.onnx_view.inputs],
                                "spec_equal": same, "parameters": [pc["linear"], pc["with_log_sigma"]]})
        self.add(1, "official ONNX: spec and parameters read from the graph", self.cmd("info", off), c_onnx_info)

        # 2 deterministic actions ----------------------------------------------------------
        self.add(2, "zeros: torch vs official ONNX within the derived bound; rebuilt ONNX bitwise",
                 self.cmd("act", ck, "--obs zeros"),
                 lambda: self.vs_official(ck, make_feed(self.src(ck), "zeros", 1)))

        def c_zero_onnx():
            from .actions import act

            a = act(self.src(ck), runtime="onnxruntime", obs="zeros")
            b = act(self.src(off), obs="zeros")
            s = compare_arrays(b.data["outputs"][C.OUT_CONT_DET], a.data["outputs"][C.OUT_CONT_DET])
            return Outcome(s.bitwise, _st(s) | {"sha": _sha(a.data["outputs"])})
        self.add(2, "zeros through an ONNX input equals the checkpoint through onnxruntime (bitwise)",
                 self.cmd("act", off, "--obs zeros"), c_zero_onnx)
        for seed, rows in ((0, 8), (1, 32)):
            self.add(2, f"random obs seed {seed}, {rows} rows, at the normalizer's scale",
                     self.cmd("act", ck, f"--obs random --seed {seed} --rows {rows}"),
                     lambda seed=seed, rows=rows: self.vs_official(ck, make_feed(self.src(ck), "random", rows, seed)))

        def probes_npy():
            p = self.file("probes.npy")
            feed = make_feed(self.src(ck), "probes", 64, 0)
            np.save(p, feed[C.OBS_INPUT.format(i=0)])
            return p

        def c_npy():
            from .actions import act

            p = probes_npy()
            o = self.vs_official(ck, make_feed(self.src(ck), str(p)))
            a = act(self.src(ck), obs=str(p)).data["outputs"][C.OUT_CONT_DET]
            o.figures["at_clip"] = float(np.mean(np.abs(a) == 1.0))
            return o
        self.add(2, "verify's 64 probes from a .npy (outliers to +-1e4 hit both clips)",
                 self.cmd("act", ck, f"--obs {self.p(self.out)}/probes.npy --rows 64"), c_npy)

        def c_json():
            from .actions import act

            rows = np.load(probes_npy())[:4]
            jp, p4 = self.file("obs.json"), self.file("obs4.npy")
            jp.write_text(json.dumps(rows.tolist()))
            np.save(p4, rows)
            # the same 4 rows both ways (a GEMM's rounding may depend on the batch size on some CPUs)
            a = act(self.src(ck), obs=str(jp)).data["outputs"][C.OUT_CONT_DET]
            b = act(self.src(ck), obs=str(p4)).data["outputs"][C.OUT_CONT_DET]
            s = compare_arrays(b, a)
            return Outcome(s.bitwise, _st(s))
        self.add(2, "observations from JSON equal the same rows from .npy (bitwise)",
                 self.cmd("act", ck, f"--obs {self.p(self.out)}/obs.json"), c_json)

        def c_st_act():
            from .actions import act

            a = act(self.src(self.safetensors()), obs="zeros").data["outputs"]
            b = act(self.src(ck), obs="zeros").data["outputs"]
            s = compare_arrays(b[C.OUT_CONT_DET], a[C.OUT_CONT_DET])
            return Outcome(s.bitwise, _st(s))
        self.add(2, "safetensors policy acts exactly like the checkpoint",
                 self.cmd("act", self.out / f"{ck.stem}.safetensors", "--obs zeros"), c_st_act)

        def c_old():
            if self.old is None:
                raise Skip("only one Huggy checkpoint in the fixture")
            feed = make_feed(self.src(self.old), "random", 8, 0)
            o = self.vs_official(self.old, feed)
            new = self.det(ck, make_feed(self.src(ck), "random", 8, 0))[C.OUT_CONT_DET]
            old = self.det(self.old, feed)[C.OUT_CONT_DET]
            o.figures["differs_from_newest"] = float(np.mean(new != old))
            o.ok = o.ok and o.figures["differs_from_newest"] > 0.5
            return o
        self.add(2, "older checkpoint vs its own official ONNX (and differs from the newest)",
                 self.cmd("act", self.old or ck, "--obs random --seed 0 --rows 8"), c_old)

        def c_twoobs():
            from .actions import act

            vck = self.variant("twoobs")
            s = self.src(vck)
            feed = make_feed(s, "random", 4, 0)
            npz, npy = self.file("twoobs.npz"), self.file("twoobs.npy")
            np.savez(npz, **{k: v for k, v in feed.items() if k != C.ACTION_MASKS and k != C.RECURRENT_IN})
            np.save(npy, np.concatenate([feed[C.OBS_INPUT.format(i=i)] for i in range(len(s.spec.obs_sizes))], axis=1))
            a = act(s, obs=str(npz)).data["outputs"][C.OUT_CONT_DET]
            b = act(s, obs=str(npy)).data["outputs"][C.OUT_CONT_DET]
            sa = compare_arrays(a, b)
            o = self.vs_official(vck, make_feed(s, str(npz)))
            o.figures["npz_vs_npy"] = _st(sa)
            o.ok = o.ok and sa.bitwise
            return o
        self.add(2, "two observations: .npz by input name = concatenated .npy; vs official",
                 self.cmd("act", self.variants.get("twoobs") or "twoobs", f"--obs {self.p(self.out)}/twoobs.npz"),
                 c_twoobs)
        for name in vnames:
            self.add(2, f"variant {name}: 64 probes, torch within the derived bound and rebuilt bitwise vs official",
                     self.cmd("act", self.variants[name] or name, "--obs probes --rows 64"),
                     lambda name=name: self.vs_official(self.variant(name),
                                                        make_feed(self.src(self.variant(name)), "probes", 64, 0)))

        # 3 sampled actions -------------------------------------------------------------------
        def samp(path, seed, rows=8, runtime="auto", device="cpu"):
            from .actions import sample

            return sample(self.src(path), device=device, runtime=runtime, rows=rows, seed=seed).data["outputs"]

        def c_same():
            a, b = samp(ck, 0), samp(ck, 0)
            s = compare_arrays(a[C.OUT_CONT], b[C.OUT_CONT])
            return Outcome(s.bitwise, {"bitwise": f"{s.bitwise_equal}/{s.count}", "sha": _sha(a)})
        self.add(3, "same seed twice: identical", self.cmd("sample", ck, "--seed 0 --rows 8"), c_same)

        def c_diff():
            a, b = samp(ck, 0), samp(ck, 1)
            frac = float(np.mean(a[C.OUT_CONT] != b[C.OUT_CONT]))
            return Outcome(frac > 0.5, {"fraction_different": frac})
        self.add(3, "different seeds: different samples (> half the elements; the rest sit at the +-1 clip)", self.cmd("sample", ck, "--seed 1 --rows 8"), c_diff)

        def sample_agree(path, a, b, rows, seed=0):
            """Two float32 samples of ``path`` with the seed's CPU noise, judged by the derived bound."""
            from ..runtime import draw_noise

            s = self.src(path)
            eps, _ = draw_noise(s.spec, rows, seed)
            return self.agree(path, make_feed(s, "random", rows, 0), a, b, [C.OUT_CONT], eps)

        def c_onnx_sample():
            return sample_agree(ck, samp(ck, 0), samp(off, 0), 8)
        self.add(3, "ONNX input (same CPU noise injected) vs checkpoint: within the derived float32 bound",
                 self.cmd("sample", off, "--seed 0 --rows 8"), c_onnx_sample)

        def c_ort_sample():
            a, b = samp(ck, 0, runtime="onnxruntime"), samp(off, 0)
            s = compare_arrays(b[C.OUT_CONT], a[C.OUT_CONT])
            return Outcome(s.bitwise, _st(s))
        self.add(3, "rebuilt ONNX vs official ONNX with the same noise: bitwise",
                 self.cmd("sample", ck, "--seed 0 --rows 8 --runtime onnxruntime"), c_ort_sample)

        def c_formula():
            from ..runtime import draw_noise

            s = self.src(ck)
            feed = make_feed(s, "random", 256, 0)
            det = self.det(ck, feed)[C.OUT_CONT_DET].astype(np.float64)
            smp = make_runner(s).sample(feed, 5)[C.OUT_CONT].astype(np.float64)
            eps, _ = draw_noise(s.spec, 256, 5)
            sigma = np.exp(s.policy.tensors[C.C_LOG_SIGMA].astype(np.float64))
            mu = det * C.ACTION_CLIP
            free = np.abs(mu) < C.ACTION_CLIP - 1e-3  # mu itself not clipped: recoverable from the output
            want = np.clip(mu + eps * sigma, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP
            err = float(np.max(np.abs(want - smp)[free]))
            return Outcome(err <= 1e-6 and free.mean() > 0.5, {"max_abs": err, "elements": int(free.sum()),
                                                               "at_clip": float(np.mean(np.abs(smp) == 1.0))})
        self.add(3, "sample = clip(mu + eps*exp(log_sigma), -3, 3)/3 with the seed's CPU noise",
                 self.cmd("sample", ck, "--seed 5 --rows 256"), c_formula)
        for dev in ("cuda", "npu"):
            def c_dev(dev=dev):
                return sample_agree(ck, samp(ck, 0, rows=64), samp(ck, 0, rows=64, device=dev), 64)
            self.add(3, f"{dev} sample vs cpu sample, same seed (derived float32 bound)",
                     self.cmd("sample", ck, f"--seed 0 --rows 64 --device {dev}"), c_dev, needs=dev)

        def c_disc():
            vck = self.variant("discrete")
            s = self.src(vck)
            a, b, c = samp(vck, 0, 64), samp(vck, 0, 64), samp(vck, 1, 64)
            d = a[C.OUT_DISC]
            valid = bool(np.all(d >= 0) and np.all(d < np.asarray(s.spec.discrete_branches)))
            return Outcome(bool(np.array_equal(a[C.OUT_DISC], b[C.OUT_DISC])) and valid
                           and not np.array_equal(a[C.OUT_DISC], c[C.OUT_DISC]),
                           {"valid": valid, "sha": _sha(a), "seed1_differs": float(np.mean(a[C.OUT_DISC] != c[C.OUT_DISC]))})
        self.add(3, "discrete: same seed identical, valid choices, another seed differs",
                 self.cmd("sample", self.variants.get("discrete") or "discrete", "--seed 0 --rows 64"), c_disc)

        def c_sac():
            vck = self.variant("sac")
            a, b = samp(vck, 0, 64), samp(vck.with_suffix(".onnx"), 0, 64)
            o = sample_agree(vck, a, b, 64)
            inside = bool(np.all(np.abs(a[C.OUT_CONT]) <= 1.0))
            return Outcome(o.ok and inside, o.figures | {"tanh_bounded": inside})
        self.add(3, "SAC: tanh-squashed sample, checkpoint vs official ONNX (derived float32 bound)",
                 self.cmd("sample", self.variants.get("sac") or "sac", "--seed 0 --rows 64"), c_sac)

        def c_hybrid():
            from .actions import sample

            vck = self.variant("hybrid")
            r = sample(self.src(vck.with_suffix(".onnx")), rows=64, seed=0)
            a = samp(vck, 0, 64)
            o = sample_agree(vck, a, r.data["outputs"], 64)
            noted = "Multinomial" in r.data.get("note", "")
            return Outcome(o.ok and noted, o.figures | {"discrete_note": noted})
        self.add(3, "hybrid ONNX: continuous sample = checkpoint; unseeded discrete said so",
                 self.cmd("sample", (self.variants.get("hybrid") or Path("hybrid")).with_suffix(".onnx"), "--seed 0 --rows 64"),
                 c_hybrid)

        # 4 batch ---------------------------------------------------------------------------
        reps = 1 if self.quick else 5

        def c_batch(path, dtype="float32", runtime="auto", device="cpu"):
            from .batch_sizes import batch_sizes

            r = batch_sizes(self.src(path), device, dtype, runtime, repeats=reps)
            figs = {}
            for row in r.data["results"]:
                for k, s in row["outputs"].items():
                    key = "equal" if "mismatches" in s else "max_abs"
                    val = f"{s['bitwise_equal']}/{s['count']}" if key == "equal" else float(s["max_abs"])
                    figs.setdefault(f"{k}:{key}", []).append(val)
            figs["bitwise_sizes"] = sum(all(s["bitwise"] for s in row["outputs"].values()) for row in r.data["results"])
            return Outcome(r.ok, figs, {"median_ms": {k: round(v["median_ms"], 3) for k, v in r.timings["per_batch"].items()}})
        self.add(4, "torch cpu fp32: rows stable across sizes (derived float32 bound)", self.cmd("batch-sizes", ck),
                 lambda: c_batch(ck))
        self.add(4, "onnxruntime (rebuilt) cpu: rows stable across sizes", self.cmd("batch-sizes", ck, "--runtime onnxruntime"),
                 lambda: c_batch(ck, runtime="onnxruntime"))
        self.add(4, "official ONNX input: rows stable across sizes", self.cmd("batch-sizes", off), lambda: c_batch(off))
        self.add(4, "torch cpu fp16: rows stable (<= 1e-2)", self.cmd("batch-sizes", ck, "--dtype float16"),
                 lambda: c_batch(ck, "float16"))
        self.add(4, "torch cpu bf16: rows stable (<= 5e-2)", self.cmd("batch-sizes", ck, "--dtype bfloat16"),
                 lambda: c_batch(ck, "bfloat16"))
        for name in ("discrete", "lstm"):
            self.add(4, f"variant {name}: rows stable ({'integers equal' if name == 'discrete' else 'memory out too'})",
                     self.cmd("batch-sizes", self.variants.get(name) or name), lambda name=name: c_batch(self.variant(name)))
        for dev in ("cuda", "npu"):
            self.add(4, f"{dev} fp32: rows stable across sizes", self.cmd("batch-sizes", ck, f"--device {dev}"),
                     lambda dev=dev: c_batch(ck, device=dev), needs=dev)

        # 5 precision -----------------------------------------------------------------------
        def c_ref():
            return self.vs_official(ck, make_feed(self.src(ck), "probes", 64, 0))
        self.add(5, "the CPU fp32 module vs official ONNX on 64 probes (derived float32 bound)",
                 self.cmd("act", ck, "--obs probes --rows 64"), c_ref)

        def c_prec(dev, dtype, path=None):
            from .precision import precision

            r = precision(self.src(path or ck), [dev], [dtype], 64, 0)
            row = r.data["results"][0]
            if row["status"] == SKIP:
                raise Skip(row["reason"])
            figs = {}
            for k, s in row["outputs"].items():
                figs[k] = ({"equal": f"{s['bitwise_equal']}/{s['count']}"} if "mismatches" in s else
                           {"cosine": round(float(s["cosine"]), 9), "max_abs": float(s["max_abs"])})
            return Outcome(row["status"] == PASS, figs)
        for dev in ("cpu", "cuda", "npu"):
            for dtype in ("float32", "float16", "bfloat16") if dev != "cpu" else ("float16", "bfloat16"):
                tol = DEFAULT_TOLERANCES[dtype]
                self.add(5, f"{dev} {dtype} vs cpu fp32 (max_abs <= {g(tol.atol)}, cosine >= {tol.cosine})",
                         self.cmd("precision", ck, f"--device {dev} --dtype {dtype}"),
                         lambda dev=dev, dtype=dtype: c_prec(dev, dtype), needs=None if dev == "cpu" else dev)

        def c_fp16_norm():
            from ..exporters.torch_module import build_module
            from ..runtime import module_runner

            s = self.src(ck)
            feed = make_feed(s, "probes", 64, 0)
            ref = self.det(ck, feed)[C.OUT_CONT_DET]
            good = module_runner(build_module(s.policy, "cpu", "float16"))(feed)[C.OUT_CONT_DET]
            bad = module_runner(build_module(s.policy, "cpu", "float16", normalizer_dtype="float16"))(feed)[C.OUT_CONT_DET]
            tol = DEFAULT_TOLERANCES["float16"]
            sg, sb = tol.compare(ref, good), tol.compare(ref, bad)
            return Outcome(sg.ok and not sb.ok,
                           {"fp32_normalizer": {"cosine": round(sg.cosine, 6), "max_abs": sg.max_abs},
                            "fp16_normalizer": {"cosine": round(sb.cosine, 6), "max_abs": sb.max_abs}})
        self.add(5, "fp16 keeps the normalizer fp32: an fp16 normalizer is caught (Huggy overflows fp16)",
                 self.cmd("precision", ck, "--device cpu --dtype float16"), c_fp16_norm)

        def c_var_fp16():
            from .precision import precision

            figs, ok = {}, True
            for name, vck in self.present_variants():
                row = precision(self.src(vck), ["cpu"], ["float16"], 64, 0).data["results"][0]
                cos = [float(s["cosine"]) for s in row["outputs"].values() if "cosine" in s and "mismatches" not in s]
                eq = [f"{s['bitwise_equal']}/{s['count']}" for s in row["outputs"].values() if "mismatches" in s]
                figs[name] = " ".join(([f"cos={min(cos):.6f}"] if cos else []) + ([f"equal={','.join(eq)}"] if eq else []))
                ok = ok and row["status"] != FAIL
            return Outcome(ok, figs)
        self.add(5, "every variant in fp16 on cpu (floats within fp16 tolerance; argmax flips reported)",
                 self.cmd("precision", self.fx / "variants" / "<name>", "--device cpu --dtype float16"), c_var_fp16)

        def c_onnx_dtype():
            from .actions import act
            from ..errors import DeviceError

            try:
                act(self.src(off), dtype="float16")
            except DeviceError as e:
                return Outcome(e.exit_code == 2 and str(self.p(off)) in e.one_line(), {"exit_code": e.exit_code,
                                                                                      "says": "canonical tensors" in e.message})
            return Outcome(False, {"error": "none raised"})
        self.add(5, "fp16 on an ONNX input: refused with a one-line error naming the file (exit 2)",
                 self.cmd("act", off, "--dtype float16"), c_onnx_dtype)

        # 6 ONNX cross-validation -------------------------------------------------------------
        def c_cmp(ref, onnx_files, rows, expect_ok=True):
            from .compare import onnx_compare

            r = onnx_compare(self.src(ref), onnx_files, rows=rows, seed=0, bitwise=True)
            f = r.data["files"][0]
            figs = {"structure": f.get("structure", {}).get("status"), "bitwise": f.get("bitwise", False)}
            for run in f.get("runs", []):
                for k, o in run["outputs"].items():
                    if k in (C.OUT_CONT_DET, C.OUT_DISC_DET, C.RECURRENT_OUT, C.OUT_CONT + " (injected noise)"):
                        figs[f"{run['rows']}:{k.split(' ')[0] + ('+noise' if 'noise' in k else '')}"] = \
                            (f"{o['bitwise_equal']}/{o['count']}" if "bitwise_equal" in o else "missing")
                        if "max_abs" in o and not o.get("bitwise"):
                            figs[f"{run['rows']}:max_abs"] = float(o["max_abs"])
            structure_ok = f.get("structure", {}).get("status") in ("pass", "warn")
            if expect_ok:
                return Outcome(r.ok and structure_ok, figs)
            return Outcome(not r.ok, figs, note="negative control: a tampered ONNX must fail")
        for rows in (32, 64, 128):
            self.add(6, f"official ONNX at batch {rows}: deterministic, constants and injected-noise sample bitwise",
                     self.cmd("onnx-compare", ck, off, f"--rows {rows} --bitwise"),
                     lambda rows=rows: c_cmp(ck, [off], [rows]))
        final_onnx = hd / "Huggy.onnx"
        final_ck = hd / "Huggy" / C.CHECKPOINT_FILE

        def c_final():
            if not final_onnx.is_file() or not final_ck.is_file():
                raise Skip("no run-root Huggy.onnx / Huggy/checkpoint.pt")
            return c_cmp(final_ck, [final_onnx], [64])
        self.add(6, "run-root Huggy.onnx vs Huggy/checkpoint.pt", self.cmd("onnx-compare", final_ck, final_onnx,
                                                                          "--rows 64 --bitwise"), c_final)

        def c_old_cmp():
            if self.old is None:
                raise Skip("only one Huggy checkpoint in the fixture")
            return c_cmp(self.old, [self.old.with_suffix(".onnx")], [64])
        self.add(6, "older checkpoint vs its official ONNX",
                 self.cmd("onnx-compare", self.old or ck, "--rows 64 --bitwise"), c_old_cmp)

        def c_tamper():
            import onnx
            from onnx import numpy_helper

            m = onnx.load(str(off))
            for t in m.graph.initializer:
                if t.name == C.MU.format(p="bias"):  # the official initializer keeps the checkpoint key
                    a = numpy_helper.to_array(t).copy()
                    a[0] += TAMPER
                    t.CopyFrom(numpy_helper.from_array(a, t.name))
            p = self.file("tampered.onnx")
            p.write_bytes(m.SerializeToString())
            return c_cmp(ck, [p], [64], expect_ok=False)
        self.add(6, f"negative control: official ONNX with mu.bias[0] + {TAMPER:g} must FAIL the comparison",
                 self.cmd("onnx-compare", ck, self.out / "tampered.onnx", "--rows 64 --bitwise") + "  (expect exit 1)",
                 c_tamper)
        for name in vnames:
            self.add(6, f"variant {name}: official ONNX bitwise at batch 64",
                     self.cmd("onnx-compare", self.variants[name] or name, "--rows 64 --bitwise"),
                     lambda name=name: c_cmp(self.variant(name), [self.variant(name).with_suffix(".onnx")], [64]))

        # 7 fingerprints ----------------------------------------------------------------------
        def fpr(path, steps=(64, 128), seed=0, runtime="auto", device="cpu"):
            from .fingerprint import fingerprint

            return fingerprint(self.src(path), device, "float32", runtime, steps, seed)

        def c_fp(steps):
            r = fpr(ck, (steps,))
            v = r.data["fingerprints"][str(steps)]
            return Outcome(r.ok, {"sha256": v["sha256"], "stable": v["stable"]})
        for steps in (64, 128):
            self.add(7, f"torch cpu fp32, {steps} steps: stable over two runs", self.cmd("fingerprint", ck, f"--steps {steps}"),
                     lambda steps=steps: c_fp(steps))

        def c_fp_onnx():
            p, _ = self.exported(9)
            a, b = fpr(p), fpr(off)
            fa = {k: v["sha256"] for k, v in a.data["fingerprints"].items()}
            fb = {k: v["sha256"] for k, v in b.data["fingerprints"].items()}
            return Outcome(fa == fb and a.ok and b.ok, {k: v[:16] for k, v in fb.items()} | {"equal": fa == fb})
        self.add(7, "rebuilt ONNX file and official ONNX: equal fingerprints (64, 128)",
                 self.cmd("fingerprint", self.out / f"{ck.stem}.opset9.onnx") + " == " + self.cmd("fingerprint", off),
                 c_fp_onnx)

        def c_fp_st():
            a, b = fpr(self.safetensors()), fpr(ck)
            fa = {k: v["sha256"] for k, v in a.data["fingerprints"].items()}
            fb = {k: v["sha256"] for k, v in b.data["fingerprints"].items()}
            return Outcome(fa == fb, {"equal": fa == fb})
        self.add(7, "safetensors policy: same fingerprints as the checkpoint",
                 self.cmd("fingerprint", self.out / f"{ck.stem}.safetensors"), c_fp_st)

        def c_fp_seed():
            a, b = fpr(ck, (64,), 0), fpr(ck, (64,), 1)
            return Outcome(a.data["fingerprints"]["64"]["sha256"] != b.data["fingerprints"]["64"]["sha256"],
                           {"seed1": b.data["fingerprints"]["64"]["sha256"][:16]})
        self.add(7, "another seed gives another fingerprint", self.cmd("fingerprint", ck, "--steps 64 --seed 1"), c_fp_seed)

        def c_fp_variants():
            from ..verify.checks import fingerprint as fp

            figs, ok = {}, True
            for name, vck in self.present_variants():
                s = self.src(vck)
                t1 = fp(make_runner(s).infer, s.policy, 64, 0)
                t2 = fp(make_runner(s).infer, s.policy, 64, 0)
                o1 = fp(make_runner(s, runtime="onnxruntime").infer, s.policy, 64, 0)
                o2 = fp(make_runner(self.src(vck.with_suffix(".onnx"))).infer, s.policy, 64, 0)
                figs[name] = t1[:12]
                ok = ok and t1 == t2 and o1 == o2
            return Outcome(ok, figs)
        self.add(7, "every variant: torch stable, rebuilt ONNX = official ONNX on the same probes (LSTM memory fed back)",
                 self.cmd("fingerprint", self.fx / "variants" / "<name>", "--steps 64 --runtime onnxruntime"), c_fp_variants)

        def c_fp_dev(dev):
            a, b = fpr(ck, device=dev), fpr(ck)
            same = {k: a.data["fingerprints"][k]["sha256"] == b.data["fingerprints"][k]["sha256"] for k in ("64", "128")}
            return Outcome(a.ok, {"stable": a.ok, "equal_to_cpu": same},
                           note="device arithmetic may differ from the CPU: equality reported, stability required")
        for dev in ("cuda", "npu"):
            self.add(7, f"{dev}: fingerprints stable (equality with cpu reported)", self.cmd("fingerprint", ck, f"--device {dev}"),
                     lambda dev=dev: c_fp_dev(dev), needs=dev)

        # 8 closed-loop stats -----------------------------------------------------------------
        def roll(path, stochastic=False, runtime="auto", device="cpu", steps=256, rows=8):
            from .stats import rollout

            return rollout(self.src(path), device, "float32", runtime, steps, rows, 0, stochastic)

        def stat_figs(r):
            d = r.data
            f = {"bounded": d["bounded"], "max_abs_u": round(d["max_abs_u"], 6), "traj": d["trajectory_sha256"][:16]}
            if "summary" in d:
                f.update({"frac_at_clip": round(d["summary"]["frac_at_clip"], 6),
                          "mean_std": round(d["summary"]["mean_std"], 6)})
            return f
        self.add(8, "Huggy deterministic, 256 steps x 8: bounded", self.cmd("stats", ck),
                 lambda: (lambda r: Outcome(r.ok, stat_figs(r)))(roll(ck)))
        self.add(8, "Huggy stochastic (seeded CPU noise): bounded", self.cmd("stats", ck, "--stochastic"),
                 lambda: (lambda r: Outcome(r.ok, stat_figs(r)))(roll(ck, True)))

        def c_repeat():
            a, b = roll(ck, True), roll(ck, True)
            same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
            return Outcome(same, {"identical": same})
        self.add(8, "the stochastic rollout repeats exactly", self.cmd("stats", ck, "--stochastic"), c_repeat)

        def c_roll_onnx():
            a, b = roll(ck, runtime="onnxruntime"), roll(off)
            same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
            return Outcome(same and a.ok, {"identical": same, "traj": b.data["trajectory_sha256"][:16]})
        self.add(8, "rebuilt vs official ONNX in the closed loop: identical trajectories",
                 self.cmd("stats", off) + " == " + self.cmd("stats", ck, "--runtime onnxruntime"), c_roll_onnx)

        def c_roll_torch_ort():
            a, b = roll(ck), roll(off)
            da = np.array([[x["mean"], x["std"]] for x in a.data["continuous"]])
            db = np.array([[x["mean"], x["std"]] for x in b.data["continuous"]])
            diff = float(np.max(np.abs(da - db)))
            return Outcome(diff <= 1e-3 and a.ok and b.ok, {"max_stat_diff": diff})
        self.add(8, "torch vs onnxruntime in the closed loop: per-dim mean/std agree (<= 1e-3)",
                 self.cmd("stats", ck) + " ~ " + self.cmd("stats", off), c_roll_torch_ort)
        for stochastic in (False, True):
            def c_var_roll(stochastic=stochastic):
                figs, ok = {}, True
                for name, vck in self.present_variants():
                    r = roll(vck, stochastic, steps=128)
                    figs[name] = f"max|u|={r.data['max_abs_u']:.4f}"
                    ok = ok and r.ok
                return Outcome(ok, figs)
            self.add(8, f"every variant {'stochastic' if stochastic else 'deterministic'}, 128 steps: bounded",
                     self.cmd("stats", self.fx / "variants" / "<name>", "--steps 128" + (" --stochastic" if stochastic else "")),
                     c_var_roll)
        for dev in ("cuda", "npu"):
            def c_roll_dev(dev=dev):
                a, b = roll(ck, device=dev), roll(ck)
                da = np.array([[x["mean"], x["std"]] for x in a.data["continuous"]])
                db = np.array([[x["mean"], x["std"]] for x in b.data["continuous"]])
                diff = float(np.max(np.abs(da - db)))
                return Outcome(a.ok and diff <= 1e-3, stat_figs(a) | {"max_stat_diff_vs_cpu": diff})
            self.add(8, f"{dev}: bounded, stats agree with cpu (<= 1e-3)", self.cmd("stats", ck, f"--device {dev}"),
                     c_roll_dev, needs=dev)

        # 9 latency -----------------------------------------------------------------------------
        def c_lat(path, runtime, device="cpu", batch=1):
            from .benchmark import benchmark

            r = benchmark(path, [device], [runtime], [batch], "float32", warmup=20, iters=200, src=self.src(path))
            row = r.timings["rows"][0]
            if "skipped" in row:
                raise Skip(row["skipped"])
            p = row["batches"][str(batch)]
            ok = row["outputs_finite"] and p["p99_ms"] <= LATENCY_BUDGET_MS * max(1, batch // 64)
            t = {k: round(p[k], 4) for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms")}
            t["load_ms"] = round(row["load_s"] * 1e3, 2)
            t["rss_delta_mb"] = round(row["rss_delta_mb"], 1)
            if "cuda_max_memory_allocated_mb" in row:
                t["cuda_peak_mb"] = round(row["cuda_max_memory_allocated_mb"], 1)
            return Outcome(ok, {"runtime": runtime, "batch": batch, "iters": p["iters"], "finite": row["outputs_finite"],
                                "budget_p99_ms": LATENCY_BUDGET_MS * max(1, batch // 64)}, t)
        for batch_n in (1, 64):
            self.add(9, f"torch eager cpu, batch {batch_n}", self.cmd("benchmark", ck, f"--device cpu --runtime torch --batch {batch_n}"),
                     lambda b=batch_n: c_lat(ck, "torch", batch=b), quick=False)
            self.add(9, f"onnxruntime cpu (rebuilt), batch {batch_n}",
                     self.cmd("benchmark", ck, f"--device cpu --runtime onnxruntime --batch {batch_n}"),
                     lambda b=batch_n: c_lat(ck, "onnxruntime", batch=b), quick=False)
        self.add(9, "onnxruntime cpu, official ONNX input, batch 1", self.cmd("benchmark", off, "--device cpu --batch 1"),
                 lambda: c_lat(off, "onnxruntime"), quick=False)

        def c_load():
            from .benchmark import benchmark

            r = benchmark(ck, ["cpu"], ["torch", "onnxruntime"], [1], "float32", warmup=2, iters=10)
            t = {f"{x['runtime']}_load_ms": round(x["load_s"] * 1e3, 2) for x in r.timings["rows"]}
            t.update({f"{x['runtime']}_rss_delta_mb": round(x["rss_delta_mb"], 1) for x in r.timings["rows"]})
            ok = all(x["load_s"] < 10.0 and x["rss_delta_mb"] < 1024 for x in r.timings["rows"])
            return Outcome(ok and r.ok, {"load_budget_s": 10, "rss_budget_mb": 1024}, t)
        self.add(9, "load time (file -> ready) and RSS delta, torch and onnxruntime", self.cmd("benchmark", ck, "--device cpu"),
                 c_load, quick=False)
        self.add(9, "cuda torch eager, batch 64 (max_memory_allocated)", self.cmd("benchmark", ck, "--device cuda --runtime torch --batch 64"),
                 lambda: c_lat(ck, "torch", "cuda", 64), quick=False, needs="cuda")
        self.add(9, "cuda onnxruntime CUDA EP, batch 64", self.cmd("benchmark", ck, "--device cuda --runtime onnxruntime --batch 64"),
                 lambda: c_lat(ck, "onnxruntime", "cuda", 64), quick=False, needs="cuda_ep")
        self.add(9, "npu torch eager, batch 64", self.cmd("benchmark", ck, "--device npu --runtime torch --batch 64"),
                 lambda: c_lat(ck, "torch", "npu", 64), quick=False, needs="npu")

        # 10 export and multi-device ------------------------------------------------------------
        def c_export(opset):
            _, r = self.exported(opset)
            d = r.data
            return Outcome(r.ok and d["checker_full_check"] == "pass" and d["matches_reference"],
                           {"checker": d["checker_full_check"], "bitwise": d["bitwise"], "sha256": d["sha256"][:16],
                            "bytes": d["bytes"]})
        for opset in C.ONNX_OPSETS:
            self.add(10, f"export opset {opset}: onnx.checker full_check, matches the reference",
                     self.cmd("export", ck, f"--opset {opset} -o {self.p(self.out)}/{ck.stem}.opset{opset}.onnx"),
                     lambda opset=opset: c_export(opset))

        def c_struct():
            import onnx

            from ..verify.checks import check_onnx_structure

            p, _ = self.exported(9)
            c = check_onnx_structure(onnx.load(str(p)), onnx.load(str(off)), "rebuilt", self.p(off))
            return Outcome(c.status == "pass", {k.title: k.status for k in c.children})
        self.add(10, "opset-9 export vs official: same I/O, op sequence, attributes, initializers bitwise",
                 self.cmd("export", ck, f"--opset 9 -o {self.p(self.out)}/{ck.stem}.opset9.onnx"), c_struct)

        def c_st_export():
            from .export import export

            p = self.file(f"{ck.stem}.from-safetensors.opset13.onnx")
            export(self.src(self.safetensors()), 13, p)
            q, _ = self.exported(13)
            same = p.read_bytes() == q.read_bytes()
            return Outcome(same, {"identical_bytes": same})
        self.add(10, "export from the safetensors policy = export from the checkpoint (bytes)",
                 self.cmd("export", self.out / f"{ck.stem}.safetensors", "--opset 13"), c_st_export)

        def c_onnx_reexport():
            from ..errors import UnsupportedError
            from .export import export

            try:
                export(self.src(off), 13, self.file("never.onnx"))
            except UnsupportedError as e:
                return Outcome(e.exit_code == 2 and "canonical tensors" in e.message, {"exit_code": e.exit_code})
            return Outcome(False, {"error": "none raised"})
        self.add(10, "re-export of an ONNX at another opset: refused, one line, exit 2",
                 self.cmd("export", off, "--opset 13") + "  (expect exit 2)", c_onnx_reexport)

        def c_noise():
            _, r = self.exported(11, noise=True)
            o = r.data["outputs"].get(C.OUT_CONT, {})
            return Outcome(r.ok and o.get("bitwise", False), {"continuous_actions": f"{o.get('bitwise_equal')}/{o.get('count')}",
                                                              "checker": r.data["checker_full_check"]})
        self.add(10, "export opset 11 with the noise input: sample bitwise vs the reference with the same noise",
                 self.cmd("export", ck, "--opset 11 --noise-input"), c_noise)

        def c_var_export():
            figs, ok = {}, True
            for name, vck in self.present_variants():
                _, r = self.exported(13, vck)
                figs[name] = "bitwise" if r.data["bitwise"] else f"max_abs={max(o.get('max_abs', 0) for o in r.data['outputs'].values()):.3g}"
                ok = ok and r.ok
            return Outcome(ok, figs)
        self.add(10, "every variant exports at opset 13 (checker + reference)",
                 self.cmd("export", self.fx / "variants" / "<name>", "--opset 13"), c_var_export)

        def c_pt2():
            from ..exporters.torch_module import build_module, export_program, save_program
            from ..runtime import module_runner, program_runner

            s = self.src(ck)
            mod = build_module(s.policy)
            p = self.file(f"{ck.stem}.pt2")
            save_program(export_program(mod), p)
            run, bufs = program_runner(p, s.spec.input_names(), s.spec.deterministic_output_names())
            feed = make_feed(s, "probes", 64, 0)
            o = self.agree(ck, feed, module_runner(mod)(feed), run(feed), [C.OUT_CONT_DET])
            return Outcome(o.ok and all(v == "float32" for v in bufs.values()),
                           o.figures | {"normalizer": sorted(set(bufs.values()))})
        self.add(10, "torch.export .pt2: loads with torch.export.load, equals the module (derived float32 bound)",
                 f"huggy-convert {self.p(ck)} {self.p(self.out)}/ --no-verify", c_pt2, quick=False)

        def c_auto():
            from ..exporters.devices import resolve_device

            feed = make_feed(self.src(ck), "probes", 64, 0)
            a = self.det(ck, feed, device="auto")
            b = self.det(ck, feed)
            dev = resolve_device("auto")
            o = self.agree(ck, feed, b, a, [C.OUT_CONT_DET])
            return Outcome(o.ok, {"auto": dev.split(":")[0]} | o.figures)
        self.add(10, "--device auto resolves and agrees with cpu", self.cmd("act", ck, "--obs probes --rows 64 --device auto"),
                 c_auto)
        for dev in ("cuda", "npu"):
            def c_dev_act(dev=dev):
                figs, ok = {}, True
                for path in [ck] + [v for v in self.variants.values() if v is not None]:
                    feed = make_feed(self.src(path), "probes", 64, 0)
                    o = self.agree(path, feed, self.det(path, feed), self.det(path, feed, device=dev))
                    ok = ok and o.ok
                    figs[path.parent.parent.name] = o.figures
                return Outcome(ok, figs)
            self.add(10, f"{dev} vs cpu, fp32, Huggy and every variant (derived float32 bound)",
                     self.cmd("act", ck, f"--obs probes --rows 64 --device {dev}"), c_dev_act, needs=dev)

        def c_ep():
            feed = make_feed(self.src(off), "probes", 64, 0)
            a, b = self.det(off, feed), self.det(off, feed, device="cuda")
            return self.agree(ck, feed, a, b, [C.OUT_CONT_DET])
        self.add(10, "onnxruntime CUDA EP vs CPU EP on the official ONNX (derived float32 bound)",
                 self.cmd("act", off, "--obs probes --rows 64 --device cuda"), c_ep, needs="cuda_ep")

    # --- running --------------------------------------------------------------------------
    def run(self, only: Sequence[str] = (), echo=None) -> None:
        for c in self.cases:
            if only and not any(c.number == o or str(c.group) == o for o in only):
                c.verdict, c.note = SKIP, "not selected (--only)"
            elif c.needs and not self.has(c.needs):
                what = {"cuda_ep": "onnxruntime's CUDA execution provider"}.get(c.needs, f"a {c.needs} device")
                c.verdict, c.note = SKIP, f"needs {what}: none here"
            elif self.quick and not c.quick:
                c.verdict, c.note = SKIP, "latency-heavy: not run with --quick"
            else:
                t0 = time.perf_counter()
                try:
                    o = c.fn()
                    c.verdict = PASS if o.ok else FAIL
                    c.figures, c.timings, c.note = o.figures, dict(o.timings), o.note
                except Skip as s:
                    c.verdict, c.note = SKIP, str(s)
                except HuggyError as e:
                    c.verdict, c.note = FAIL, f"error: {e.one_line()}"
                except Exception as e:  # a crash in a case is that case's failure, not the matrix's
                    c.verdict, c.note = FAIL, f"crashed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
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


def bundled_fixtures() -> Path:
    return Path(__file__).resolve().parents[2] / "fixtures"


def run_matrix(out, quick: bool = False, fixtures: Optional[Path] = None, only: Sequence[str] = (),
               echo: bool = True) -> ModeResult:
    import click

    from .info import environment

    fixtures = Path(fixtures) if fixtures else bundled_fixtures()
    if not fixtures.is_dir():
        raise InputError("no fixtures folder: pass --fixtures", fixtures)
    out = Path(out)
    t0 = time.perf_counter()
    import torch

    m = Matrix(out, fixtures, quick)
    env = environment()
    threads = torch.get_num_threads()
    head = [f"# huggy-convert matrix ({'quick' if quick else 'full'}): {len(m.cases)} cases in {len(GROUPS)} groups; "
            f"fixtures {display_path(fixtures)}",
            f"# environment: torch {env['torch']}, onnx {env['onnx']}, onnxruntime {env['onnxruntime']}, "
            f"numpy {env['numpy']}; devices {', '.join(env['devices'])}; "
            f"onnxruntime providers {', '.join(env['onnxruntime_providers'])}; torch and onnxruntime on 1 CPU thread",
            "# columns: number | verdict | equivalent command | figures (seeded: identical run to run) | "
            "latency: (varies run to run; ignore in diffs)"]
    lines: List[str] = list(head)
    say = (lambda s: click.echo(s)) if echo else (lambda s: None)
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
    torch.set_num_threads(1)
    try:
        m.run(only, echo=on_case)
    finally:
        torch.set_num_threads(threads)
    s = m.summary()
    total = time.perf_counter() - t0
    tail = f"# summary: {s['cases']} cases, {s['groups']} groups: {s['pass']} PASS, {s['fail']} FAIL, {s['skip']} SKIP"
    emit(tail)
    emit(f"# latency: total {total:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    from ..converter import atomic_write_bytes

    atomic_write_bytes(out / "matrix.log", ("\n".join(lines) + "\n").encode())
    doc = {"mode": "matrix", "quick": quick, "ok": s["fail"] == 0, "summary": s, "fixtures": display_path(fixtures),
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


def list_cases(fixtures: Optional[Path] = None, out: Path = Path("huggy-matrix")) -> List[Dict[str, Any]]:
    """The full numbered listing without running anything."""
    m = Matrix(out, Path(fixtures) if fixtures else bundled_fixtures(), quick=False)
    return [{"number": c.number, "group": c.group, "title": c.title, "command": c.command, "quick": c.quick,
             "needs": c.needs} for c in m.cases]
