"""The matrix's cases, groups 1-3: environment and model info, deterministic actions for varied
observations, sampled actions (registered into ``matrix_table.TABLE`` in order; see there)."""
from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from .. import contract as C
from ..converter import load_policy
from ..core.flow import SAMPLED
from ..runtime import draw_noise
from ..verify.compare import compare_arrays
from .actions import act, sample
from .info import counted_parameters, environment, normalizer_summary
from .matrix_table import VARIANTS, Outcome, _sha, _st, case
from .ports import integer_actions, main_output, real_actions, variant_with
from .sources import make_feed, make_runner, run_inventory

HUGGY_ACTIONS = 21  # the bundled Huggy's action width (with its observation width and body, its known counts)
SAME_FIELDS = ("obs_sizes", "hidden_units", "num_layers", "normalize", "algorithm")  # beside the ports
TRAINER_ALIASES = {"poca": C.TRAINER_PPO}  # a trainer type whose actor is another's
_INTEGER, _TANH, _MIXED = variant_with("integer_output"), variant_with("tanh_sample"), variant_with("integer_and_real")

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
        huggy_spec = s.spec.obs_sizes == (59,) and [p.width for p in real_actions(s.spec)] == [HUGGY_ACTIONS] \
            and s.spec.hidden_units == 512 and s.spec.num_layers == 3
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


def _manifest_match(s, want: Dict[str, Any]) -> bool:
    """Every spec field the fixture manifest states, as it states it, and its trainer type."""
    fields = [k for k in s.values() if k in want]
    same = all(_plain(getattr(s, k)) == _plain(want[k]) for k in fields)
    return same and s.algorithm == TRAINER_ALIASES.get(want["trainer_type"], want["trainer_type"])


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


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
            match = _manifest_match(s, want)
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
    # the ports (every observation's, action's and carried state's size) and the body: the same policy
    same = a.io_signature() == b.io_signature() and all(getattr(a, k) == getattr(b, k) for k in SAME_FIELDS)
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
    where an observation is not a vector); ``rows``: the first rows only."""
    feed = make_feed(m.main, "probes", 64, 0)
    names = [C.OBS_INPUT.format(i=i) for i in range(len(m.spec.obs_sizes))]
    if _flat(m):
        p = m.file("probes.npy" if rows is None else f"obs{rows}.npy")
        np.save(p, np.concatenate([feed[k] for k in names], axis=1)[:rows])
    else:
        p = m.file("probes.npz" if rows is None else f"obs{rows}.npz")
        np.savez(p, **{k: feed[k][:rows] for k in names})
    return p


@case(2, "verify's 64 probes from a .npy (an .npz by input name beside other observations; outliers to +-1e4 hit both clips)",
      lambda m: m.cmd("act", m.ck, f"--obs {m.p(m.out)}/probes.{'npy' if _flat(m) else 'npz'} --rows 64"),
      needs=("official",))
def c_npy(m):
    p = probes_npy(m)
    o = m.vs_official(m.ck, make_feed(m.main, str(p)))
    real = real_actions(m.spec)
    if real:
        a = act(m.main, obs=str(p)).data["outputs"][real[0].name]
        o.figures["at_clip"] = float(np.mean(np.abs(a) == 1.0))
    return o


@case(2, "observations from JSON equal the same rows from .npy (.npz beside other observations; bitwise)",
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
@case(3, "same seed twice: identical", lambda m: m.cmd("sample", m.ck, "--seed 0 --rows 8"), needs=("normal_sample",))
def c_same(m):
    a, b = m.sample(m.ck, 0), m.sample(m.ck, 0)
    s = compare_arrays(a[C.OUT_CONT], b[C.OUT_CONT])
    return Outcome(s.bitwise, {"bitwise": f"{s.bitwise_equal}/{s.count}", "sha": _sha(a)})


@case(3, "different seeds: different samples (> half the elements; the rest sit at the +-1 clip)",
      lambda m: m.cmd("sample", m.ck, "--seed 1 --rows 8"), needs=("normal_sample",))
def c_diff(m):
    a, b = m.sample(m.ck, 0), m.sample(m.ck, 1)
    frac = float(np.mean(a[C.OUT_CONT] != b[C.OUT_CONT]))
    return Outcome(frac > 0.5, {"fraction_different": frac})


case(3, "ONNX input (same CPU noise injected) vs checkpoint: within the derived float32 bound",
     lambda m: m.cmd("sample", m.off or "<stem>.onnx", "--seed 0 --rows 8"), needs=("official", "normal_sample"))(
    lambda m: m.sample_agree(m.ck, m.sample(m.ck, 0), m.sample(m.off, 0), 8))


@case(3, "rebuilt ONNX vs official ONNX with the same noise: bitwise",
      lambda m: m.cmd("sample", m.ck, "--seed 0 --rows 8 --runtime onnxruntime"), needs=("official", "normal_sample"))
def c_ort_sample(m):
    a, b = m.sample(m.ck, 0, runtime="onnxruntime"), m.sample(m.off, 0)
    s = compare_arrays(b[C.OUT_CONT], a[C.OUT_CONT])
    return Outcome(s.bitwise, _st(s))


@case(3, "sample = clip(mu + eps*exp(log sigma), -3, 3)/3 with the seed's CPU noise",
      lambda m: m.cmd("sample", m.ck, "--seed 5 --rows 256"), needs=("fixed_sigma",))
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
         lambda m, dev=_dev: m.cmd("sample", m.ck, f"--seed 0 --rows 64 --device {dev}"), needs=(_dev, "normal_sample"))(
        lambda m, dev=_dev: m.sample_agree(m.ck, m.sample(m.ck, 0, rows=64), m.sample(m.ck, 0, rows=64, device=dev), 64))


@case(3, f"{_INTEGER}: same seed identical, valid choices, another seed differs",
      lambda m: m.cmd("sample", m.variant_label(_INTEGER), "--seed 0 --rows 64"))
def c_integer_sample(m):
    vck = m.variant(_INTEGER)
    port = integer_actions(m.src(vck).spec, SAMPLED)[0]
    k = port.name
    a, b, c = m.sample(vck, 0, 64), m.sample(vck, 0, 64), m.sample(vck, 1, 64)
    d = a[k]
    valid = bool(np.all(d >= 0) and np.all(d < np.asarray(port.levels)))
    return Outcome(bool(np.array_equal(a[k], b[k])) and valid and not np.array_equal(a[k], c[k]),
                   {"valid": valid, "sha": _sha(a), "seed1_differs": float(np.mean(a[k] != c[k]))})


@case(3, f"{_TANH.upper()}: tanh-bounded sample, checkpoint vs official ONNX (derived float32 bound)",
      lambda m: m.cmd("sample", m.variant_label(_TANH), "--seed 0 --rows 64"))
def c_tanh_sample(m):
    vck = m.variant(_TANH)
    a, b = m.sample(vck, 0, 64), m.sample(m.official_of(vck), 0, 64)
    o = m.sample_agree(vck, a, b, 64)
    inside = bool(np.all(np.abs(a[C.OUT_CONT]) <= 1.0))
    return Outcome(o.ok and inside, o.figures | {"tanh_bounded": inside})


@case(3, f"{_MIXED} ONNX: real-valued sample = checkpoint; unseeded integer sample said so",
      lambda m: m.cmd("sample", Path(m.variant_label(_MIXED)).with_suffix(".onnx"), "--seed 0 --rows 64"))
def c_mixed_sample(m):
    vck = m.variant(_MIXED)
    r = sample(m.src(m.official_of(vck)), rows=64, seed=0)
    a = m.sample(vck, 0, 64)
    o = m.sample_agree(vck, a, r.data["outputs"], 64)
    noted = "Multinomial" in r.data.get("note", "")
    return Outcome(o.ok and noted, o.figures | {"integer_note": noted})
