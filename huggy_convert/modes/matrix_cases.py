"""The matrix's table of cases: one entry per case (group, title, the equivalent huggy-convert command,
what it needs from the input, its check), registered in order by :func:`case`; numbers (1.1, 1.2, ...)
are the order within a group. A check is a function of the running :class:`~.matrix.Matrix` (``m``:
the input's sources, files and comparison helpers) returning an :class:`Outcome`; it raises
:class:`Skip` when the input lacks what it needs beyond :data:`~.matrix.NEEDS`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..converter import load_policy
from ..core.bounds import PRECISIONS
from ..errors import DeviceError
from ..exporters.devices import resolve_device
from ..exporters.torch_module import build_module, export_program, save_program
from ..runtime import ModuleRunner, ProgramRunner, draw_noise, module_runner
from ..verify.bounds import Float64Policy
from ..verify.checks import check_onnx_structure, fingerprint as fp
from ..verify.compare import Comparison, compare_arrays
from .actions import act, sample
from .batch_sizes import batch_sizes
from .benchmark import benchmark
from .common import FAIL, PASS, SKIP, half_agree
from .compare import onnx_compare
from .export import export
from .fingerprint import fingerprint
from .info import counted_parameters, environment, normalizer_summary
from .precision import precision
from .sources import make_feed, make_runner, run_inventory
from .stats import rollout

Matrix = Any  # the running modes.matrix.Matrix: it imports this table, so the table does not import it
LATENCY_BUDGET_MS = 50.0  # p99 per call, batch <= 64, CPU: a loose bound that only a broken build misses
TAMPER = 1e-3

# The variant fixtures (fixtures/variants/<name>) and, for a user's input, which policies stand in for
# them: the input itself when its spec is of that kind (None: only the fixture will do).
VARIANTS: Dict[str, Tuple[Optional[Callable], str]] = {
    "discrete": (lambda s: bool(s.discrete_branches), "a policy with discrete actions"),
    "hybrid": (lambda s: bool(s.discrete_branches) and bool(s.continuous_size), "a hybrid (continuous + discrete) policy"),
    "lstm": (lambda s: bool(s.memory_size), "a policy with memory (LSTM)"),
    "nonorm": (lambda s: not s.normalize, "a policy without a normalizer (normalize: false)"),
    "sac": (lambda s: s.algorithm == "sac", "a SAC policy"),
    "small": (None, "the fixture variant 'small'"),
    "twoobs": (lambda s: len(s.obs_sizes) > 1 and not s.obs_shapes, "a policy with several vector observations"),
}


class Skip(Exception):
    """A case that cannot run on this input: its message says what it needs."""


@dataclass
class Outcome:
    ok: bool
    figures: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class CaseDef:
    """One row of the table: ``command(m)`` the equivalent command line, ``check(m)`` the case itself,
    ``needs`` what the input must have (see :meth:`Matrix.lacks`)."""

    group: int
    title: str
    command: Callable[[Matrix], str]
    check: Callable[[Matrix], Outcome]
    needs: Tuple[str, ...] = ()
    quick: bool = True


TABLE: List[CaseDef] = []


def case(group: int, title: str, command: Callable[[Matrix], str], needs: Sequence[str] = (), quick: bool = True):
    """Add the decorated check (or, called with it, a bound one) to :data:`TABLE`."""
    def add(check):
        TABLE.append(CaseDef(group, title, command, check, tuple(needs), quick))
        return check
    return add


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


def main_output(spec) -> str:
    """The deterministic output a case looks at: the continuous head's, else the discrete one's."""
    return C.OUT_CONT_DET if spec.continuous_size else C.OUT_DISC_DET


# Order within a group gives the case numbers (1.1, 1.2, ...): append, never insert.

# 1 environment and model info ----------------------------------------------------------------------
@case(1, "environment: versions and devices", lambda m: m.cmd("info", m.home))
def c_env(m):
    e = environment()
    return Outcome("cpu" in e["devices"], {k: e[k] for k in ("torch", "onnx", "onnxruntime", "numpy")} |
                   {"devices": list(e["devices"]), "ort_providers": e["onnxruntime_providers"]})


@case(1, "spec and parameter count (formula = tensors; the bundled Huggy: its known counts)",
      lambda m: m.cmd("info", m.ck))
def c_params(m):
    s = m.main
    c = counted_parameters(s)
    ok = c["linear"] == c["tensors_linear"] and c[C.P_WITH_LOG_SIGMA] == c[C.P_TENSORS_WITH_LOG_SIGMA]
    figs = {"family": s.spec.family, "linear": c["linear"], C.P_WITH_LOG_SIGMA: c[C.P_WITH_LOG_SIGMA],
            "from_tensors": [c["tensors_linear"], c[C.P_TENSORS_WITH_LOG_SIGMA]]}
    if m.t.expect_params is not None:
        huggy_spec = s.spec.obs_sizes == (59,) and s.spec.continuous_size == 21 and s.spec.hidden_units == 512 \
            and s.spec.num_layers == 3
        ok = ok and huggy_spec and (c["linear"], c[C.P_WITH_LOG_SIGMA]) == m.t.expect_params
        figs["expected"] = list(m.t.expect_params)
    return Outcome(ok, figs)


@case(1, "normalizer summary", lambda m: m.cmd("info", m.ck), needs=("normalizer",))
def c_norm(m):
    n = normalizer_summary(m.main)
    ok = bool(n) and all(x["steps"] and x["steps"] > 0 and x["divisor_range"][0] > 0
                         and np.isfinite(x["divisor_range"][1]) and x["variance_range"][0] > 0 for x in n)
    x = n[0]
    return Outcome(ok, {"steps": x["steps"], "mean_range": x["mean_range"], "variance_range": x["variance_range"],
                        "divisor_range": x["divisor_range"], "constant_dims": x["constant_dims"],
                        "fp16_overflow": x["fp16_overflow"]})


@case(1, f"run-directory checkpoint inventory ({Path(C.STATUS_FILE).name})", lambda m: m.cmd("info", m.home),
      needs=("rundir",))
def c_inv(m):
    inv = run_inventory(m.t.run_dir)
    beh = inv["behaviors"].get(m.ck.parent.name)
    rows = beh["checkpoints"] if beh else [r for b in inv["behaviors"].values() for r in b["checkpoints"]]
    steps = [r["steps"] for r in rows]
    present = all(r.get("pt_present") and r.get("onnx_present", True) for r in rows)
    newest_ok = bool(steps) and max(steps) == m.t.newest_step
    return Outcome(present and steps == sorted(steps) and newest_ok,
                   {"checkpoints": len(rows), "steps": steps,
                    "rewards": [round(float(r["reward"]), 4) for r in rows if r.get("reward") is not None],
                    "files_present": present})


@case(1, "every variant's spec matches the fixture manifest", lambda m: m.variants_cmd("info"), needs=("variants",))
def c_variants(m):
    figs, ok = {}, True
    for name, vck in m.t.variants.items():
        if vck is None:
            figs[name] = "missing"
            continue
        s = m.src(vck).spec
        want = m.t.manifest.get(name)
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


@case(1, "canonical safetensors round trip (bitwise)",
      lambda m: f"huggy-convert {m.p(m.ck)} {m.p(m.out)}/ --no-verify --no-program")
def c_st(m):
    p = m.safetensors()
    back = load_policy(p)
    pol = m.main.policy
    eq = sum(1 for k, v in pol.tensors.items() if k in back.tensors and back.tensors[k].tobytes() == v.tobytes())
    ok = eq == len(pol.tensors) == len(back.tensors) and back.spec == pol.spec
    return Outcome(ok, {"tensors": len(pol.tensors), "bitwise_equal": eq,
                        "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:16]})


@case(1, "official ONNX: spec and parameters read from the graph", lambda m: m.cmd("info", m.off or "<stem>.onnx"),
      needs=("official",))
def c_onnx_info(m):
    so, sc = m.src(m.off), m.main
    a, b = so.spec, sc.spec
    keys = ("obs_sizes", "continuous_size", "discrete_branches", "memory_size", "hidden_units", "num_layers",
            "normalize", "algorithm")
    same = all(getattr(a, k) == getattr(b, k) for k in keys)
    pc = counted_parameters(so)
    ok = same and (pc["linear"], pc[C.P_WITH_LOG_SIGMA]) == (b.parameter_count(False), b.parameter_count(True))
    return Outcome(ok, {"opset": so.onnx_view.opset, "inputs": [n for n, _ in so.onnx_view.inputs],
                        "spec_equal": same, "parameters": [pc["linear"], pc[C.P_WITH_LOG_SIGMA]]})


# 2 deterministic actions ---------------------------------------------------------------------------
case(2, "zeros: torch vs official ONNX within the derived bound; rebuilt ONNX bitwise",
     lambda m: m.cmd("act", m.ck, "--obs zeros"), needs=("official",))(
    lambda m: m.vs_official(m.ck, make_feed(m.main, "zeros", 1)))


@case(2, "zeros through an ONNX input equals the checkpoint through onnxruntime (bitwise)",
      lambda m: m.cmd("act", m.off or "<stem>.onnx", "--obs zeros"), needs=("official",))
def c_zero_onnx(m):
    out = main_output(m.spec)
    a = act(m.main, runtime="onnxruntime", obs="zeros")
    b = act(m.src(m.off), obs="zeros")
    s = compare_arrays(b.data["outputs"][out], a.data["outputs"][out])
    return Outcome(s.bitwise, _st(s) | {"sha": _sha(a.data["outputs"])})


for _seed, _rows in ((0, 8), (1, 32)):
    case(2, f"random obs seed {_seed}, {_rows} rows, at the normalizer's scale",
         lambda m, seed=_seed, rows=_rows: m.cmd("act", m.ck, f"--obs random --seed {seed} --rows {rows}"),
         needs=("official",))(
        lambda m, seed=_seed, rows=_rows: m.vs_official(m.ck, make_feed(m.main, "random", rows, seed)))


def _flat(m) -> bool:
    """Whether one flat array holds the observations (all vectors); else an .npz by input name does."""
    return not m.spec.obs_shapes


def probes_npy(m, rows: Optional[int] = None) -> Path:
    """verify's 64 probes of the observations, concatenated, as a .npy file (by input name in an .npz
    where an observation is not a vector: entity sets); ``rows``: the first rows only."""
    feed = make_feed(m.main, "probes", 64, 0)
    names = [C.OBS_INPUT.format(i=i) for i in range(len(m.spec.obs_sizes))]
    if _flat(m):
        p = m.file("probes.npy" if rows is None else f"obs{rows}.npy")
        np.save(p, np.concatenate([feed[k] for k in names], axis=1)[:rows])
    else:
        p = m.file("probes.npz" if rows is None else f"obs{rows}.npz")
        np.savez(p, **{k: feed[k][:rows] for k in names})
    return p


@case(2, "verify's 64 probes from a .npy (an .npz by input name beside entity sets; outliers to +-1e4 hit both clips)",
      lambda m: m.cmd("act", m.ck, f"--obs {m.p(m.out)}/probes.{'npy' if _flat(m) else 'npz'} --rows 64"),
      needs=("official",))
def c_npy(m):
    p = probes_npy(m)
    o = m.vs_official(m.ck, make_feed(m.main, str(p)))
    if m.spec.continuous_size:
        a = act(m.main, obs=str(p)).data["outputs"][C.OUT_CONT_DET]
        o.figures["at_clip"] = float(np.mean(np.abs(a) == 1.0))
    return o


@case(2, "observations from JSON equal the same rows from .npy (.npz beside entity sets; bitwise)",
      lambda m: m.cmd("act", m.ck, f"--obs {m.p(m.out)}/obs.json"))
def c_json(m):
    p4, jp = probes_npy(m, 4), m.file("obs.json")
    if _flat(m):
        jp.write_text(json.dumps(np.load(p4).tolist()))
    else:  # a JSON object by input name
        jp.write_text(json.dumps({k: v.tolist() for k, v in np.load(p4).items()}))
    # the same 4 rows both ways (a GEMM's rounding may depend on the batch size on some CPUs)
    out = main_output(m.spec)
    a = act(m.main, obs=str(jp)).data["outputs"][out]
    b = act(m.main, obs=str(p4)).data["outputs"][out]
    s = compare_arrays(b, a)
    return Outcome(s.bitwise, _st(s))


@case(2, "safetensors policy acts exactly like the checkpoint",
      lambda m: m.cmd("act", m.out / f"{m.ck.stem}.safetensors", "--obs zeros"))
def c_st_act(m):
    out = main_output(m.spec)
    a = act(m.src(m.safetensors()), obs="zeros").data["outputs"]
    b = act(m.main, obs="zeros").data["outputs"]
    s = compare_arrays(b[out], a[out])
    return Outcome(s.bitwise, _st(s))


@case(2, "older checkpoint vs its own official ONNX (and differs from the newest)",
      lambda m: m.cmd("act", m.old or m.ck, "--obs random --seed 0 --rows 8"), needs=("older",))
def c_old(m):
    feed = make_feed(m.src(m.old), "random", 8, 0)
    o = m.vs_official(m.old, feed)
    out = main_output(m.spec)
    new = m.det(m.ck, make_feed(m.main, "random", 8, 0))[out]
    old = m.det(m.old, feed)[out]
    o.figures["differs_from_newest"] = float(np.mean(new != old))
    o.ok = o.ok and o.figures["differs_from_newest"] > 0.5
    return o


@case(2, "two observations: .npz by input name = concatenated .npy; vs official",
      lambda m: m.cmd("act", m.variant_label("twoobs"), f"--obs {m.p(m.out)}/twoobs.npz"))
def c_twoobs(m):
    vck = m.variant("twoobs")
    s = m.src(vck)
    feed = make_feed(s, "random", 4, 0)
    names = [C.OBS_INPUT.format(i=i) for i in range(len(s.spec.obs_sizes))]
    npz, npy = m.file("twoobs.npz"), m.file("twoobs.npy")
    np.savez(npz, **{k: feed[k] for k in names})
    np.save(npy, np.concatenate([feed[k] for k in names], axis=1))
    out = main_output(s.spec)
    a = act(s, obs=str(npz)).data["outputs"][out]
    b = act(s, obs=str(npy)).data["outputs"][out]
    sa = compare_arrays(a, b)
    o = m.vs_official(vck, make_feed(s, str(npz)))
    o.figures["npz_vs_npy"] = _st(sa)
    o.ok = o.ok and sa.bitwise
    return o


def c_variant_act(m, name):
    vck = m.variant(name)
    return m.vs_official(vck, make_feed(m.src(vck), "probes", 64, 0))


for _name in VARIANTS:
    case(2, f"variant {_name}: 64 probes, torch within the derived bound and rebuilt bitwise vs official",
         lambda m, name=_name: m.cmd("act", m.variant_label(name), "--obs probes --rows 64"))(
        partial(c_variant_act, name=_name))


# 3 sampled actions ---------------------------------------------------------------------------------
@case(3, "same seed twice: identical", lambda m: m.cmd("sample", m.ck, "--seed 0 --rows 8"), needs=("continuous",))
def c_same(m):
    a, b = m.sample(m.ck, 0), m.sample(m.ck, 0)
    s = compare_arrays(a[C.OUT_CONT], b[C.OUT_CONT])
    return Outcome(s.bitwise, {"bitwise": f"{s.bitwise_equal}/{s.count}", "sha": _sha(a)})


@case(3, "different seeds: different samples (> half the elements; the rest sit at the +-1 clip)",
      lambda m: m.cmd("sample", m.ck, "--seed 1 --rows 8"), needs=("continuous",))
def c_diff(m):
    a, b = m.sample(m.ck, 0), m.sample(m.ck, 1)
    frac = float(np.mean(a[C.OUT_CONT] != b[C.OUT_CONT]))
    return Outcome(frac > 0.5, {"fraction_different": frac})


case(3, "ONNX input (same CPU noise injected) vs checkpoint: within the derived float32 bound",
     lambda m: m.cmd("sample", m.off or "<stem>.onnx", "--seed 0 --rows 8"), needs=("official", "continuous"))(
    lambda m: m.sample_agree(m.ck, m.sample(m.ck, 0), m.sample(m.off, 0), 8))


@case(3, "rebuilt ONNX vs official ONNX with the same noise: bitwise",
      lambda m: m.cmd("sample", m.ck, "--seed 0 --rows 8 --runtime onnxruntime"), needs=("official", "continuous"))
def c_ort_sample(m):
    a, b = m.sample(m.ck, 0, runtime="onnxruntime"), m.sample(m.off, 0)
    s = compare_arrays(b[C.OUT_CONT], a[C.OUT_CONT])
    return Outcome(s.bitwise, _st(s))


@case(3, "sample = clip(mu + eps*exp(log sigma), -3, 3)/3 with the seed's CPU noise",
      lambda m: m.cmd("sample", m.ck, "--seed 5 --rows 256"), needs=("ppo_continuous",))
def c_formula(m):
    s = m.main
    feed = make_feed(s, "random", 256, 0)
    det = m.det(m.ck, feed)[C.OUT_CONT_DET].astype(np.float64)
    smp = make_runner(s).sample(feed, 5)[C.OUT_CONT].astype(np.float64)
    eps, _ = draw_noise(s.spec, 256, 5)
    sigma = np.exp(s.policy.tensors[C.C_LOG_SIGMA].astype(np.float64))
    mu = det * C.ACTION_CLIP
    free = np.abs(mu) < C.ACTION_CLIP - 1e-3  # mu itself not clipped: recoverable from the output
    want = np.clip(mu + eps * sigma, -C.ACTION_CLIP, C.ACTION_CLIP) / C.ACTION_CLIP
    err = float(np.max(np.abs(want - smp)[free]))
    return Outcome(err <= 1e-6 and free.mean() > 0.5, {"max_abs": err, "elements": int(free.sum()),
                                                       "at_clip": float(np.mean(np.abs(smp) == 1.0))})


for _dev in ("cuda", "npu"):
    case(3, f"{_dev} sample vs cpu sample, same seed (derived float32 bound)",
         lambda m, dev=_dev: m.cmd("sample", m.ck, f"--seed 0 --rows 64 --device {dev}"), needs=(_dev, "continuous"))(
        lambda m, dev=_dev: m.sample_agree(m.ck, m.sample(m.ck, 0, rows=64), m.sample(m.ck, 0, rows=64, device=dev), 64))


@case(3, "discrete: same seed identical, valid choices, another seed differs",
      lambda m: m.cmd("sample", m.variant_label("discrete"), "--seed 0 --rows 64"))
def c_disc(m):
    vck = m.variant("discrete")
    s = m.src(vck)
    a, b, c = m.sample(vck, 0, 64), m.sample(vck, 0, 64), m.sample(vck, 1, 64)
    d = a[C.OUT_DISC]
    valid = bool(np.all(d >= 0) and np.all(d < np.asarray(s.spec.discrete_branches)))
    return Outcome(bool(np.array_equal(a[C.OUT_DISC], b[C.OUT_DISC])) and valid
                   and not np.array_equal(a[C.OUT_DISC], c[C.OUT_DISC]),
                   {"valid": valid, "sha": _sha(a), "seed1_differs": float(np.mean(a[C.OUT_DISC] != c[C.OUT_DISC]))})


@case(3, "SAC: tanh-squashed sample, checkpoint vs official ONNX (derived float32 bound)",
      lambda m: m.cmd("sample", m.variant_label("sac"), "--seed 0 --rows 64"))
def c_sac(m):
    vck = m.variant("sac")
    a, b = m.sample(vck, 0, 64), m.sample(m.official_of(vck), 0, 64)
    o = m.sample_agree(vck, a, b, 64)
    inside = bool(np.all(np.abs(a[C.OUT_CONT]) <= 1.0))
    return Outcome(o.ok and inside, o.figures | {"tanh_bounded": inside})


@case(3, "hybrid ONNX: continuous sample = checkpoint; unseeded discrete said so",
      lambda m: m.cmd("sample", Path(m.variant_label("hybrid")).with_suffix(".onnx"), "--seed 0 --rows 64"))
def c_hybrid(m):
    vck = m.variant("hybrid")
    r = sample(m.src(m.official_of(vck)), rows=64, seed=0)
    a = m.sample(vck, 0, 64)
    o = m.sample_agree(vck, a, r.data["outputs"], 64)
    noted = "Multinomial" in r.data.get("note", "")
    return Outcome(o.ok and noted, o.figures | {"discrete_note": noted})


# 4 batch sizes -------------------------------------------------------------------------------------
def c_batch(m, path=None, dtype="float32", runtime="auto", device="cpu", variant=None):
    path = m.variant(variant) if variant else (path(m) if callable(path) else m.ck)
    r = batch_sizes(m.src(path), device, dtype, runtime, repeats=1 if m.quick else 5)
    figs = {}
    for row in r.data["results"]:
        for k, s in row["outputs"].items():
            key = "equal" if "mismatches" in s else "max_abs"
            val = f"{s['bitwise_equal']}/{s['count']}" if key == "equal" else float(s["max_abs"])
            figs.setdefault(f"{k}:{key}", []).append(val)
    figs["bitwise_sizes"] = sum(all(s["bitwise"] for s in row["outputs"].values()) for row in r.data["results"])
    return Outcome(r.ok, figs, {"median_ms": {k: round(v["median_ms"], 3) for k, v in r.timings["per_batch"].items()}})


case(4, "torch cpu fp32: rows stable across sizes (derived float32 bound)",
     lambda m: m.cmd("batch-sizes", m.ck))(c_batch)
case(4, "onnxruntime (rebuilt) cpu: rows stable across sizes",
     lambda m: m.cmd("batch-sizes", m.ck, "--runtime onnxruntime"))(partial(c_batch, runtime="onnxruntime"))
case(4, "official ONNX input: rows stable across sizes", lambda m: m.cmd("batch-sizes", m.off or "<stem>.onnx"),
     needs=("official",))(partial(c_batch, path=lambda m: m.off))
case(4, "torch cpu fp16: rows stable (<= 1e-2)", lambda m: m.cmd("batch-sizes", m.ck, "--dtype float16"))(
    partial(c_batch, dtype="float16"))
case(4, "torch cpu bf16: rows stable (<= 5e-2)", lambda m: m.cmd("batch-sizes", m.ck, "--dtype bfloat16"))(
    partial(c_batch, dtype="bfloat16"))
for _name in ("discrete", "lstm"):
    case(4, f"variant {_name}: rows stable ({'integers equal' if _name == 'discrete' else 'memory out too'})",
         lambda m, name=_name: m.cmd("batch-sizes", m.variant_label(name)))(partial(c_batch, variant=_name))
for _dev in ("cuda", "npu"):
    case(4, f"{_dev} fp32: rows stable across sizes", lambda m, dev=_dev: m.cmd("batch-sizes", m.ck, f"--device {dev}"),
         needs=(_dev,))(partial(c_batch, device=_dev))


# 5 precision ---------------------------------------------------------------------------------------
case(5, "the CPU fp32 module vs official ONNX on 64 probes (derived float32 bound)",
     lambda m: m.cmd("act", m.ck, "--obs probes --rows 64"), needs=("official",))(
    lambda m: m.vs_official(m.ck, make_feed(m.main, "probes", 64, 0)))


def c_prec(m, dev, dtype):
    r = precision(m.main, [dev], [dtype], 64, 0)
    row = r.data["results"][0]
    if row["status"] == SKIP:
        raise Skip(row["reason"])
    figs = {}
    for k, s in row["outputs"].items():
        figs[k] = ({"equal": f"{s['bitwise_equal']}/{s['count']}"} if "mismatches" in s else
                   {"cosine": round(float(s["cosine"]), 9), "max_abs": float(s["max_abs"])})
    return Outcome(row["status"] == PASS, figs)


for _dev in ("cpu", "cuda", "npu"):
    for _dtype in ("float32", "float16", "bfloat16") if _dev != "cpu" else ("float16", "bfloat16"):
        case(5, f"{_dev} {_dtype} vs cpu fp32 (within its derived {_dtype} bound)",
             lambda m, dev=_dev, dtype=_dtype: m.cmd("precision", m.ck, f"--device {dev} --dtype {dtype}"),
             needs=() if _dev == "cpu" else (_dev,))(partial(c_prec, dev=_dev, dtype=_dtype))


@case(5, "fp16 keeps the normalizer fp32: an fp16 normalizer is caught (Huggy overflows fp16)",
      lambda m: m.cmd("precision", m.ck, "--device cpu --dtype float16"), needs=("normalizer", "continuous"))
def c_fp16_norm(m):
    """The module in fp16 keeps its normalizer fp32 and stays within the derived float16 bound (as
    ``precision`` judges it). That an fp16 normalizer fails depends on the policy's scale: required on
    the bundled Huggy (the known trap), reported for any other input."""
    s = m.main
    out = C.OUT_CONT_DET
    feed = make_feed(s, "probes", 64, 0)
    ref = m.det(m.ck, feed)[out]
    ref16 = Float64Policy(s.policy).forward(feed, precision=PRECISIONS["float16"])
    good = module_runner(build_module(s.policy, "cpu", "float16"))(feed)[out]
    bad = module_runner(build_module(s.policy, "cpu", "float16", normalizer_dtype="float16"))(feed)[out]
    sg, sb = half_agree(ref16, out, ref, good), half_agree(ref16, out, ref, bad)
    figs = {"fp32_normalizer": {"cosine": round(sg.cosine, 6), "max_abs": sg.max_abs,
                                "bound_ratio": round(sg.bound_ratio, 6)},
            "fp16_normalizer": {"cosine": round(sb.cosine, 6), "max_abs": sb.max_abs,
                                "bound_ratio": round(sb.bound_ratio, 6)}}
    if m.t.expect_params is None:  # not the bundled Huggy: whether its fp16 normalizer fails is a figure
        return Outcome(sg.ok, figs | {"fp16_normalizer_caught": not sb.ok})
    return Outcome(sg.ok and not sb.ok, figs)


@case(5, "every variant in fp16 on cpu (within the derived float16 bound; an argmax flip within its margin passes)",
      lambda m: m.variants_cmd("precision", "--device cpu --dtype float16"), needs=("variants",))
def c_var_fp16(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        row = precision(m.src(vck), ["cpu"], ["float16"], 64, 0).data["results"][0]
        cos = [float(s["cosine"]) for s in row["outputs"].values() if "cosine" in s and "mismatches" not in s]
        eq = [f"{s['bitwise_equal']}/{s['count']}" for s in row["outputs"].values() if "mismatches" in s]
        figs[name] = " ".join(([f"cos={min(cos):.6f}"] if cos else []) + ([f"equal={','.join(eq)}"] if eq else []))
        ok = ok and row["status"] != FAIL
    return Outcome(ok, figs)


@case(5, "fp16 on an ONNX input: refused with a one-line error naming the file (exit 2)",
      lambda m: m.cmd("act", m.off or "<stem>.onnx", "--dtype float16"), needs=("official",))
def c_onnx_dtype(m):
    try:
        act(m.src(m.off), dtype="float16")
    except DeviceError as e:
        return Outcome(e.exit_code == 2 and str(m.p(m.off)) in e.one_line(), {"exit_code": e.exit_code,
                                                                              "says": "canonical tensors" in e.message})
    return Outcome(False, {"error": "none raised"})


# 6 ONNX cross-validation ---------------------------------------------------------------------------
def compare_onnx(m, ref, onnx_files, rows, expect_ok=True) -> Outcome:
    r = onnx_compare(m.src(ref), onnx_files, rows=rows, seed=0, bitwise=True)
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


for _rows in (32, 64, 128):
    case(6, f"official ONNX at batch {_rows}: deterministic, constants and injected-noise sample bitwise",
         lambda m, rows=_rows: m.cmd("onnx-compare", m.ck, m.off or "<stem>.onnx", f"--rows {rows} --bitwise"),
         needs=("official",))(lambda m, rows=_rows: compare_onnx(m, m.ck, [m.off], [rows]))

case(6, f"run-root <Behavior>.onnx vs <Behavior>/{C.CHECKPOINT_FILE}",
     lambda m: m.cmd("onnx-compare", m.root_ck, m.root_onnx, "--rows 64 --bitwise"), needs=("run_root",))(
    lambda m: compare_onnx(m, m.root_ck, [m.root_onnx], [64]))
case(6, "older checkpoint vs its official ONNX", lambda m: m.cmd("onnx-compare", m.old or m.ck, "--rows 64 --bitwise"),
     needs=("older",))(lambda m: compare_onnx(m, m.old, [m.old.with_suffix(".onnx")], [64]))


@case(6, f"negative control: official ONNX with mu.bias[0] + {TAMPER:g} must FAIL the comparison",
      lambda m: m.cmd("onnx-compare", m.ck, m.out / "tampered.onnx", "--rows 64 --bitwise") + "  (expect exit 1)",
      needs=("official", "continuous"))
def c_tamper(m):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(m.off))
    for t in model.graph.initializer:
        if t.name == C.MU.format(p="bias"):  # the official initializer keeps the checkpoint key
            a = numpy_helper.to_array(t).copy()
            a[0] += TAMPER
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    p = m.file("tampered.onnx")
    p.write_bytes(model.SerializeToString())
    return compare_onnx(m, m.ck, [p], [64], expect_ok=False)


def c_variant_cmp(m, name):
    vck = m.variant(name)
    return compare_onnx(m, vck, [m.official_of(vck)], [64])


for _name in VARIANTS:
    case(6, f"variant {_name}: official ONNX bitwise at batch 64",
         lambda m, name=_name: m.cmd("onnx-compare", m.variant_label(name), "--rows 64 --bitwise"))(
        partial(c_variant_cmp, name=_name))


# 7 fingerprints ------------------------------------------------------------------------------------
def fpr(m, path, steps=(64, 128), seed=0, runtime="auto", device="cpu"):
    return fingerprint(m.src(path), device, "float32", runtime, steps, seed)


def c_fp(m, steps):
    r = fpr(m, m.ck, (steps,))
    v = r.data["fingerprints"][str(steps)]
    return Outcome(r.ok, {"sha256": v["sha256"], "stable": v["stable"]})


for _steps in (64, 128):
    case(7, f"torch cpu fp32, {_steps} steps: stable over two runs",
         lambda m, steps=_steps: m.cmd("fingerprint", m.ck, f"--steps {steps}"))(partial(c_fp, steps=_steps))


def _shas(r) -> Dict[str, str]:
    return {k: v["sha256"] for k, v in r.data["fingerprints"].items()}


@case(7, "rebuilt ONNX file and official ONNX: equal fingerprints (64, 128)",
      lambda m: m.cmd("fingerprint", m.out / f"{m.ck.stem}.opset9.onnx") + " == "
      + m.cmd("fingerprint", m.off or "<stem>.onnx"), needs=("official",))
def c_fp_onnx(m):
    p, _ = m.exported(9)
    a, b = fpr(m, p), fpr(m, m.off)
    fa, fb = _shas(a), _shas(b)
    return Outcome(fa == fb and a.ok and b.ok, {k: v[:16] for k, v in fb.items()} | {"equal": fa == fb})


@case(7, "safetensors policy: same fingerprints as the checkpoint",
      lambda m: m.cmd("fingerprint", m.out / f"{m.ck.stem}.safetensors"))
def c_fp_st(m):
    fa, fb = _shas(fpr(m, m.safetensors())), _shas(fpr(m, m.ck))
    return Outcome(fa == fb, {"equal": fa == fb})


@case(7, "another seed gives another fingerprint", lambda m: m.cmd("fingerprint", m.ck, "--steps 64 --seed 1"))
def c_fp_seed(m):
    a, b = fpr(m, m.ck, (64,), 0), fpr(m, m.ck, (64,), 1)
    return Outcome(a.data["fingerprints"]["64"]["sha256"] != b.data["fingerprints"]["64"]["sha256"],
                   {"seed1": b.data["fingerprints"]["64"]["sha256"][:16]})


@case(7, "every variant: torch stable, rebuilt ONNX = official ONNX on the same probes (LSTM memory fed back)",
      lambda m: m.variants_cmd("fingerprint", "--steps 64 --runtime onnxruntime"), needs=("variants",))
def c_fp_variants(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        s = m.src(vck)
        t1 = fp(make_runner(s).infer, s.policy, 64, 0)
        t2 = fp(make_runner(s).infer, s.policy, 64, 0)
        o1 = fp(make_runner(s, runtime="onnxruntime").infer, s.policy, 64, 0)
        o2 = fp(make_runner(m.src(m.official_of(vck))).infer, s.policy, 64, 0)
        figs[name] = t1[:12]
        ok = ok and t1 == t2 and o1 == o2
    return Outcome(ok, figs)


def c_fp_dev(m, dev):
    a, b = fpr(m, m.ck, device=dev), fpr(m, m.ck)
    same = {k: a.data["fingerprints"][k]["sha256"] == b.data["fingerprints"][k]["sha256"] for k in ("64", "128")}
    return Outcome(a.ok, {"stable": a.ok, "equal_to_cpu": same},
                   note="device arithmetic may differ from the CPU: equality reported, stability required")


for _dev in ("cuda", "npu"):
    case(7, f"{_dev}: fingerprints stable (equality with cpu reported)",
         lambda m, dev=_dev: m.cmd("fingerprint", m.ck, f"--device {dev}"), needs=(_dev,))(partial(c_fp_dev, dev=_dev))


# 8 closed-loop stats -------------------------------------------------------------------------------
def roll(m, path, stochastic=False, runtime="auto", device="cpu", steps=256, rows=8):
    return rollout(m.src(path), device, "float32", runtime, steps, rows, 0, stochastic)


def stat_figs(r):
    d = r.data
    f = {"bounded": d["bounded"], "max_abs_u": round(d["max_abs_u"], 6), "traj": d["trajectory_sha256"][:16]}
    if "summary" in d:
        f.update({"frac_at_clip": round(d["summary"]["frac_at_clip"], 6),
                  "mean_std": round(d["summary"]["mean_std"], 6)})
    return f


def c_roll(m, stochastic):
    r = roll(m, m.ck, stochastic)
    return Outcome(r.ok, stat_figs(r))


case(8, "deterministic, 256 steps x 8: bounded", lambda m: m.cmd("stats", m.ck))(partial(c_roll, stochastic=False))
case(8, "stochastic (seeded CPU noise): bounded", lambda m: m.cmd("stats", m.ck, "--stochastic"))(
    partial(c_roll, stochastic=True))


@case(8, "the stochastic rollout repeats exactly", lambda m: m.cmd("stats", m.ck, "--stochastic"))
def c_repeat(m):
    a, b = roll(m, m.ck, True), roll(m, m.ck, True)
    same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
    return Outcome(same, {"identical": same})


@case(8, "rebuilt vs official ONNX in the closed loop: identical trajectories",
      lambda m: m.cmd("stats", m.off or "<stem>.onnx") + " == " + m.cmd("stats", m.ck, "--runtime onnxruntime"),
      needs=("official",))
def c_roll_onnx(m):
    a, b = roll(m, m.ck, runtime="onnxruntime"), roll(m, m.off)
    same = a.data["trajectory_sha256"] == b.data["trajectory_sha256"]
    return Outcome(same and a.ok, {"identical": same, "traj": b.data["trajectory_sha256"][:16]})


def _stat_diff(a, b) -> float:
    da = np.array([[x["mean"], x["std"]] for x in a.data["continuous"]])
    db = np.array([[x["mean"], x["std"]] for x in b.data["continuous"]])
    return float(np.max(np.abs(da - db)))


@case(8, "torch vs onnxruntime in the closed loop: per-dim mean/std agree (<= 1e-3)",
      lambda m: m.cmd("stats", m.ck) + " ~ " + m.cmd("stats", m.off or "<stem>.onnx"), needs=("official", "continuous"))
def c_roll_torch_ort(m):
    a, b = roll(m, m.ck), roll(m, m.off)
    diff = _stat_diff(a, b)
    return Outcome(diff <= 1e-3 and a.ok and b.ok, {"max_stat_diff": diff})


def c_var_roll(m, stochastic):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        r = roll(m, vck, stochastic, steps=128)
        figs[name] = f"max|u|={r.data['max_abs_u']:.4f}"
        ok = ok and r.ok
    return Outcome(ok, figs)


for _stochastic in (False, True):
    case(8, f"every variant {'stochastic' if _stochastic else 'deterministic'}, 128 steps: bounded",
         lambda m, st=_stochastic: m.variants_cmd("stats", "--steps 128" + (" --stochastic" if st else "")),
         needs=("variants",))(partial(c_var_roll, stochastic=_stochastic))


def c_roll_dev(m, dev):
    a, b = roll(m, m.ck, device=dev), roll(m, m.ck)
    diff = _stat_diff(a, b)
    return Outcome(a.ok and diff <= 1e-3, stat_figs(a) | {"max_stat_diff_vs_cpu": diff})


for _dev in ("cuda", "npu"):
    case(8, f"{_dev}: bounded, stats agree with cpu (<= 1e-3)", lambda m, dev=_dev: m.cmd("stats", m.ck, f"--device {dev}"),
         needs=(_dev, "continuous"))(partial(c_roll_dev, dev=_dev))


# 9 latency -----------------------------------------------------------------------------------------
def c_lat(m, runtime, device="cpu", batch=1, onnx_input=False):
    path = m.off if onnx_input else m.ck
    r = benchmark(path, [device], [runtime], [batch], "float32", warmup=20, iters=200, src=m.src(path))
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


for _b in (1, 64):
    case(9, f"torch eager cpu, batch {_b}",
         lambda m, b=_b: m.cmd("benchmark", m.ck, f"--device cpu --runtime torch --batch {b}"), quick=False)(
        partial(c_lat, runtime="torch", batch=_b))
    case(9, f"onnxruntime cpu (rebuilt), batch {_b}",
         lambda m, b=_b: m.cmd("benchmark", m.ck, f"--device cpu --runtime onnxruntime --batch {b}"), quick=False)(
        partial(c_lat, runtime="onnxruntime", batch=_b))
case(9, "onnxruntime cpu, official ONNX input, batch 1",
     lambda m: m.cmd("benchmark", m.off or "<stem>.onnx", "--device cpu --batch 1"), needs=("official",),
     quick=False)(partial(c_lat, runtime="onnxruntime", onnx_input=True))


@case(9, "load time (file -> ready) and RSS delta, torch and onnxruntime", lambda m: m.cmd("benchmark", m.ck, "--device cpu"),
      quick=False)
def c_load(m):
    r = benchmark(m.ck, ["cpu"], ["torch", "onnxruntime"], [1], "float32", warmup=2, iters=10)
    t = {f"{x['runtime']}_load_ms": round(x["load_s"] * 1e3, 2) for x in r.timings["rows"]}
    t.update({f"{x['runtime']}_rss_delta_mb": round(x["rss_delta_mb"], 1) for x in r.timings["rows"]})
    ok = all(x["load_s"] < 10.0 and x["rss_delta_mb"] < 1024 for x in r.timings["rows"])
    return Outcome(ok and r.ok, {"load_budget_s": 10, "rss_budget_mb": 1024}, t)


case(9, "cuda torch eager, batch 64 (max_memory_allocated)",
     lambda m: m.cmd("benchmark", m.ck, "--device cuda --runtime torch --batch 64"), needs=("cuda",), quick=False)(
    partial(c_lat, runtime="torch", device="cuda", batch=64))
case(9, "cuda onnxruntime CUDA EP, batch 64",
     lambda m: m.cmd("benchmark", m.ck, "--device cuda --runtime onnxruntime --batch 64"), needs=("cuda_ep",),
     quick=False)(partial(c_lat, runtime="onnxruntime", device="cuda", batch=64))
case(9, "npu torch eager, batch 64", lambda m: m.cmd("benchmark", m.ck, "--device npu --runtime torch --batch 64"),
     needs=("npu",), quick=False)(partial(c_lat, runtime="torch", device="npu", batch=64))


# 10 export and multi-device ------------------------------------------------------------------------
def c_export(m, opset):
    _, r = m.exported(opset)
    d = r.data
    return Outcome(r.ok and d["checker_full_check"] == "pass" and d["matches_reference"],
                   {"checker": d["checker_full_check"], "bitwise": d["bitwise"], "sha256": d["sha256"][:16],
                    "bytes": d["bytes"]})


for _opset in C.ONNX_OPSETS:
    case(10, f"export opset {_opset}: onnx.checker full_check, matches the reference",
         lambda m, opset=_opset: m.cmd("export", m.ck, f"--opset {opset} -o {m.p(m.out)}/{m.ck.stem}.opset{opset}.onnx"))(
        partial(c_export, opset=_opset))


@case(10, "opset-9 export vs official: same I/O, op sequence, attributes, initializers bitwise",
      lambda m: m.cmd("export", m.ck, f"--opset 9 -o {m.p(m.out)}/{m.ck.stem}.opset9.onnx"), needs=("official",))
def c_struct(m):
    import onnx

    p, _ = m.exported(9)
    c = check_onnx_structure(onnx.load(str(p)), onnx.load(str(m.off)), "rebuilt", m.p(m.off))
    return Outcome(c.status == "pass", {k.title: k.status for k in c.children})


@case(10, "export from the safetensors policy = export from the checkpoint (bytes)",
      lambda m: m.cmd("export", m.out / f"{m.ck.stem}.safetensors", "--opset 13"))
def c_st_export(m):
    p = m.file(f"{m.ck.stem}.from-safetensors.opset13.onnx")
    export(m.src(m.safetensors()), 13, p)
    q, _ = m.exported(13)
    same = p.read_bytes() == q.read_bytes()
    return Outcome(same, {"identical_bytes": same})


@case(10, "an ONNX alone re-exported at opset 13: rebuilt from the tensors recovered from it, bitwise against it",
      lambda m: m.cmd("export", m.off or "<stem>.onnx", "--opset 13"), needs=("official",))
def c_onnx_reexport(m):
    r = export(m.src(m.off), 13, m.file(f"{m.off.stem}.from-onnx.opset13.onnx"))
    return Outcome(r.ok and r.data["bitwise"], {"bitwise": r.data["bitwise"], "checker": r.data["checker_full_check"],
                                                "outputs": len(r.data["outputs"])})


@case(10, "export opset 11 with the noise input: sample bitwise vs the reference with the same noise",
      lambda m: m.cmd("export", m.ck, "--opset 11 --noise-input"), needs=("continuous",))
def c_noise(m):
    _, r = m.exported(11, noise=True)
    o = r.data["outputs"].get(C.OUT_CONT, {})
    return Outcome(r.ok and o.get("bitwise", False), {C.OUT_CONT: f"{o.get('bitwise_equal')}/{o.get('count')}",
                                                      "checker": r.data["checker_full_check"]})


@case(10, "every variant exports at opset 13 (checker + reference)", lambda m: m.variants_cmd("export", "--opset 13"),
      needs=("variants",))
def c_var_export(m):
    figs, ok = {}, True
    for name, vck in m.present_variants():
        _, r = m.exported(13, vck)
        figs[name] = "bitwise" if r.data["bitwise"] else \
            f"max_abs={max(o.get('max_abs', 0) for o in r.data['outputs'].values()):.3g}"
        ok = ok and r.ok
    return Outcome(ok, figs)


@case(10, "torch.export .pt2: loads with torch.export.load, equals the module (derived float32 bound)",
      lambda m: f"huggy-convert {m.p(m.ck)} {m.p(m.out)}/ --no-verify", quick=False)
def c_pt2(m):
    s = m.main
    mod = build_module(s.policy)
    p = m.file(f"{m.ck.stem}.pt2")
    save_program(export_program(mod), p)
    prog = ProgramRunner(p, s.spec.input_names(), s.spec.deterministic_output_names())
    feed = make_feed(s, "probes", 64, 0)
    out = main_output(s.spec)
    o = m.agree(m.ck, feed, ModuleRunner(mod).infer(feed), prog.infer(feed), [out])
    return Outcome(o.ok and all(v == "float32" for v in prog.buffers.values()),
                   o.figures | {"normalizer": sorted(set(prog.buffers.values()))})


@case(10, "--device auto resolves and agrees with cpu", lambda m: m.cmd("act", m.ck, "--obs probes --rows 64 --device auto"))
def c_auto(m):
    feed = make_feed(m.main, "probes", 64, 0)
    a = m.det(m.ck, feed, device="auto")
    b = m.det(m.ck, feed)
    o = m.agree(m.ck, feed, b, a, [main_output(m.spec)])
    return Outcome(o.ok, {"auto": resolve_device("auto").split(":")[0]} | o.figures)


def c_dev_act(m, dev):
    figs, ok = {}, True
    for path in [m.ck] + [v for _, v in m.present_variants()]:
        feed = make_feed(m.src(path), "probes", 64, 0)
        o = m.agree(path, feed, m.det(path, feed), m.det(path, feed, device=dev))
        ok = ok and o.ok
        figs[path.parent.parent.name] = o.figures
    return Outcome(ok, figs)


for _dev in ("cuda", "npu"):
    case(10, f"{_dev} vs cpu, fp32, the input and every variant (derived float32 bound)",
         lambda m, dev=_dev: m.cmd("act", m.ck, f"--obs probes --rows 64 --device {dev}"), needs=(_dev,))(
        partial(c_dev_act, dev=_dev))


@case(10, "onnxruntime CUDA EP vs CPU EP on the official ONNX (derived float32 bound)",
      lambda m: m.cmd("act", m.off or "<stem>.onnx", "--obs probes --rows 64 --device cuda"),
      needs=("cuda_ep", "official"))
def c_ep(m):
    feed = make_feed(m.src(m.off), "probes", 64, 0)
    a, b = m.det(m.off, feed), m.det(m.off, feed, device="cuda")
    return m.agree(m.ck, feed, a, b, [main_output(m.spec)])
