"""The five verification checks.

1. safetensors vs checkpoint: every tensor bitwise equal to its source key.
2. rebuilt ONNX vs official: I/O (names, dtypes, dims), opset, op sequence, initializers bitwise.
3. outputs: onnxruntime rebuilt vs onnxruntime official on seeded probes (+ golden inputs):
   deterministic and constant outputs bitwise, the stochastic head bitwise with injected noise.
4. torch module (and the saved .pt2) vs the onnxruntime reference on every device and dtype.
5. determinism: sha256 fingerprints of seeded 64- and 128-step action sequences.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from .. import contract as C
from ..converter import Checkpoint, Policy
from .compare import DEFAULT_TOLERANCES, Tolerance, array_stats
from .report import FAIL, PASS, SKIP, WARN, Check

DETERMINISTIC_OUTPUTS = (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_CONT_DET, C.OUT_DISC_SHAPE,
                         C.OUT_DISC_DET, C.RECURRENT_OUT)
STOCHASTIC_OUTPUTS = (C.OUT_CONT, C.OUT_DISC)


def _fmt(s: Dict) -> str:
    if "shape_mismatch" in s:
        return f"shape {s['shape_mismatch'][1]} != expected {s['shape_mismatch'][0]}"
    if s.get("mismatches") is not None:
        return f"{s['bitwise_equal']}/{s['count']} equal"
    return (f"max_abs={s['max_abs']:.3g} max_rel={s['max_rel']:.3g} max_ulp={s['max_ulp']} "
            f"mean_abs={s['mean_abs']:.3g} p99_abs={s['p99_abs']:.3g} cos={s['cosine']:.9f} "
            f"bitwise={s['bitwise_equal']}/{s['count']}")


def _first_diff_text(name: str, s: Dict) -> str:
    fd = s.get("first_diff")
    if not fd:
        return ""
    ulps = f", {fd['ulps']} ulp" if "ulps" in fd else ""
    return f"; first difference {name}{fd['index']}: expected {fd['expected']!r}, got {fd['got']!r}{ulps}"


# --- 1 ---------------------------------------------------------------------------------------
def check_safetensors(policy: Policy, ckpt: Optional[Checkpoint], path_name: str) -> Check:
    c = Check("1 safetensors vs checkpoint")
    if ckpt is None:
        c.status, c.summary = SKIP, "no checkpoint given"
        return c
    import torch

    equal, bad = 0, []
    for name, arr in sorted(policy.tensors.items()):
        key = policy.sources.get(name)
        if key is None or key not in ckpt.policy:
            bad.append(f"{name}: source key {key!r} not in {ckpt.path.name}")
            continue
        src = ckpt.policy[key].detach().cpu()
        want = src.to(torch.float32).numpy() if src.dtype != torch.float32 else src.numpy()
        if src.dtype == torch.int64 and src.numel() == 1 and abs(int(src.reshape(-1)[0])) >= C.FLOAT32_EXACT_INT_LIMIT:
            exact = policy.exact_steps.get(name)
            if exact != int(src.reshape(-1)[0]):
                bad.append(f"{name}: exact step count {exact} != checkpoint {int(src.reshape(-1)[0])}")
                continue
        if want.shape != arr.shape or want.dtype != arr.dtype or want.tobytes() != arr.tobytes():
            s = array_stats(want.reshape(arr.shape) if want.size == arr.size else want, arr)
            bad.append(f"{name} (from {key}) differs{_first_diff_text(name, s)}")
        else:
            equal += 1
    c.figures = {"tensors": len(policy.tensors), "bitwise_equal": equal, "file": path_name,
                 "checkpoint_sha256": ckpt.sha256}
    c.summary = f"{equal}/{len(policy.tensors)} tensors bitwise equal to their checkpoint keys"
    if bad:
        c.status = FAIL
        c.summary += "; " + bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
        c.figures["differences"] = bad
    return c


# --- 2 ---------------------------------------------------------------------------------------
def _dims(vi) -> List:
    return [d.dim_value if d.HasField("dim_value") else "?" for d in vi.type.tensor_type.shape.dim]


def _io(m: onnx.ModelProto, which: str) -> List[Tuple[str, int, List]]:
    inits = {i.name for i in m.graph.initializer}
    items = m.graph.input if which == "input" else m.graph.output
    return [(v.name, v.type.tensor_type.elem_type, _dims(v)) for v in items if v.name not in inits]


def _normalized_nodes(m: onnx.ModelProto):
    """Nodes without torch 2.x's initializer-dedup Identity nodes; alias -> initializer name."""
    inits = {i.name for i in m.graph.initializer}
    alias = {}
    nodes = []
    for n in m.graph.node:
        if n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in {o.name for o in m.graph.output}:
            alias[n.output[0]] = n.input[0]
            continue
        nodes.append(n)
    return nodes, alias


def op_sequence(m: onnx.ModelProto) -> List[str]:
    return [n.op_type for n in _normalized_nodes(m)[0]]


def check_onnx_structure(ours: onnx.ModelProto, official: onnx.ModelProto, ours_name: str, official_name: str) -> Check:
    c = Check(f"2 rebuilt ONNX vs official ({official_name})")
    for which in ("input", "output"):
        a, b = _io(official, which), _io(ours, which)
        sub = Check(f"{which}s")
        if a == b:
            sub.summary = ", ".join(f"{n}{d}" for n, _, d in a)
        else:
            sub.status = FAIL
            sub.summary = f"official {a} != rebuilt {b}"
        c.add(sub)
    ov = {o.domain or "": o.version for o in official.opset_import}[""]
    rv = {o.domain or "": o.version for o in ours.opset_import}[""]
    if ov != rv:
        c.add(Check("opset", WARN, f"rebuilt {rv}, official {ov} (different opsets by request: "
                                   "op sequence and initializers not compared)"))
        c.figures = {"opset_official": ov, "opset_rebuilt": rv}
        return c
    c.add(Check("opset", PASS, f"{rv}"))
    on, oal = _normalized_nodes(official)
    rn, ral = _normalized_nodes(ours)
    oseq, rseq = [n.op_type for n in on], [n.op_type for n in rn]
    raw_equal = [n.op_type for n in official.graph.node] == [n.op_type for n in ours.graph.node]
    sub = Check("op sequence")
    if oseq == rseq:
        sub.summary = f"{len(rseq)} nodes in the same order" + ("" if raw_equal else
                                                                " (after removing initializer-dedup Identity nodes)")
    else:
        k = next((i for i, (x, y) in enumerate(zip(oseq, rseq)) if x != y), min(len(oseq), len(rseq)))
        sub.status = FAIL
        sub.summary = (f"differs at node {k}: official {oseq[k] if k < len(oseq) else 'end'} "
                       f"({on[k].name if k < len(on) else ''}), rebuilt {rseq[k] if k < len(rseq) else 'end'} "
                       f"({rn[k].name if k < len(rn) else ''}); {len(oseq)} vs {len(rseq)} nodes")
    c.add(sub)
    # attributes of paired nodes (clip bounds, axes, transB...)
    if oseq == rseq:
        bad = []
        for k, (x, y) in enumerate(zip(on, rn)):
            ax = {a.name: onnx.helper.get_attribute_value(a) for a in x.attribute}
            ay = {a.name: onnx.helper.get_attribute_value(a) for a in y.attribute}
            if x.op_type == "Constant":
                ax = {"value": numpy_helper.to_array(ax["value"]).tobytes()}
                ay = {"value": numpy_helper.to_array(ay["value"]).tobytes()}
            if ax != ay:
                bad.append(f"node {k} {x.op_type}: official {ax} != rebuilt {ay}")
        sub = Check("node attributes", PASS, f"{len(on)} nodes agree")
        if bad:
            sub.status, sub.summary = FAIL, bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
        c.add(sub)
    # initializers paired by role: (node index in the normalized sequence, input slot)
    oinit = {i.name: i for i in official.graph.initializer}
    rinit = {i.name: i for i in ours.graph.initializer}
    sub = Check("initializers")
    if oseq != rseq:
        # without a node pairing, fall back to content matching
        have = {(t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in rinit.values()}
        missing = [n for n, t in oinit.items()
                   if (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) not in have]
        sub.summary = f"{len(oinit) - len(missing)}/{len(oinit)} official initializers have a bitwise-equal counterpart"
        if missing:
            sub.status = FAIL
            sub.summary += f"; none for {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
        c.add(sub)
        return c
    pairs, diffs = 0, []
    for x, y in zip(on, rn):
        for slot, (a, b) in enumerate(zip(x.input, y.input)):
            a, b = oal.get(a, a), ral.get(b, b)
            if a in oinit or b in rinit:
                pairs += 1
                if a not in oinit or b not in rinit:
                    diffs.append(f"{x.op_type} input {slot}: official {a!r} vs rebuilt {b!r} (one is not an initializer)")
                    continue
                ta, tb = numpy_helper.to_array(oinit[a]), numpy_helper.to_array(rinit[b])
                if ta.dtype != tb.dtype or ta.shape != tb.shape or ta.tobytes() != tb.tobytes():
                    s = array_stats(ta, tb)
                    diffs.append(f"{b} (official {a}) {ta.dtype}{list(ta.shape)} vs {tb.dtype}{list(tb.shape)}"
                                 f"{_first_diff_text(b, s)}")
    sub.figures = {"paired": pairs, "official_initializers": len(oinit), "differences": diffs}
    sub.summary = f"{pairs - len(diffs)}/{pairs} paired initializers bitwise equal"
    if diffs:
        sub.status = FAIL
        sub.summary += "; " + diffs[0] + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else "")
    c.add(sub)
    return c


# --- 3 ---------------------------------------------------------------------------------------
def _discrete_valid(actions: np.ndarray, masks: np.ndarray, branches: Sequence[int]) -> Optional[str]:
    start = 0
    for b, n in enumerate(branches):
        a = actions[:, b]
        if np.any(a < 0) or np.any(a >= n):
            return f"branch {b} action outside 0..{n - 1}"
        if np.any(masks[np.arange(len(a)), start + a] == 0):
            return f"branch {b} chose a masked action"
        start += n
    return None


def check_outputs(run_ours, run_ref, run_ours_noise, run_ref_noise, feeds: Dict[str, Dict[str, np.ndarray]],
                  noise: Dict[str, np.ndarray], policy: Policy, ref_name: str) -> Check:
    """onnxruntime on the rebuilt ONNX vs the reference (onnxruntime on the official file, or the
    golden outputs it wrote earlier): deterministic and constant outputs bitwise."""
    c = Check(f"3 outputs: rebuilt vs {ref_name}")
    per_output: Dict[str, List[Dict]] = {}
    for feed_name, feed in feeds.items():
        try:
            ro, rr = run_ours(feed), run_ref(feed_name, feed)
        except Exception as exc:
            c.add(Check(f"[{feed_name}]", FAIL, f"could not run: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
            continue
        for name in rr:
            if name not in ro:
                c.add(Check(f"{name} [{feed_name}]", FAIL, "missing from the rebuilt model"))
                continue
            if name in STOCHASTIC_OUTPUTS:
                if name == C.OUT_DISC:
                    why = _discrete_valid(ro[name], feed[C.ACTION_MASKS], policy.spec.discrete_branches)
                    c.add(Check(f"{name} [{feed_name}]", FAIL if why else PASS,
                                why or "sampled actions valid and unmasked (Multinomial has no seed: not bitwise)"))
                continue
            s = array_stats(rr[name], ro[name])
            per_output.setdefault(name, []).append(s)
            ok = s["bitwise_equal"] == s["count"] and "shape_mismatch" not in s and rr[name].dtype == ro[name].dtype
            c.add(Check(f"{name} [{feed_name}]", PASS if ok else FAIL,
                        ("bitwise " if ok else "NOT bitwise: ") + _fmt(s) + ("" if ok else _first_diff_text(name, s)),
                        figures=s))
        if run_ours_noise is not None and run_ref_noise is not None and feed_name in noise:
            f2 = dict(feed, **{C.NOISE_INPUT: noise[feed_name]})
            try:
                a, b = run_ours_noise(f2)[C.OUT_CONT], run_ref_noise(feed_name, f2)[C.OUT_CONT]
            except Exception as exc:
                c.add(Check(f"{C.OUT_CONT} with injected noise [{feed_name}]", FAIL,
                            f"could not run: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
                continue
            s = array_stats(b, a)
            per_output.setdefault(C.OUT_CONT + " (injected noise)", []).append(s)
            ok = s["bitwise_equal"] == s["count"]
            c.add(Check(f"{C.OUT_CONT} with injected noise [{feed_name}]", PASS if ok else FAIL,
                        ("bitwise " if ok else "NOT bitwise: ") + _fmt(s) + ("" if ok else _first_diff_text(C.OUT_CONT, s)),
                        figures=s))
    c.figures = {"feeds": {k: int(next(iter(v.values())).shape[0]) for k, v in feeds.items()}}
    c.summary = ", ".join(f"{k}: {sum(x['bitwise_equal'] for x in v)}/{sum(x['count'] for x in v)} bitwise"
                          for k, v in per_output.items())
    return c


# --- 4 ---------------------------------------------------------------------------------------
def _diagnose(outputs: Dict[str, np.ndarray], zero_outputs: Dict[str, np.ndarray], normalizer_dtypes: Dict[str, str]) -> str:
    hints = []
    for k, v in normalizer_dtypes.items():
        if v != "float32":
            hints.append(f"normalizer buffer {k} is {v} (must stay float32: Huggy-scale sums overflow fp16)")
    for name, v in outputs.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            hints.append(f"{name} has inf/NaN")
        elif name in zero_outputs and v.shape[0] > 1 and np.all(v == v[:1]) and np.array_equal(v[:1], zero_outputs[name][:1]):
            hints.append(f"{name} is the same for every observation (observations zeroed: normalizer overflow?)")
    return "; ".join(hints)


def check_module_outputs(title: str, run, ref: Dict[str, np.ndarray], feed: Dict[str, np.ndarray], dtype: str,
                         overrides_atol: Dict[str, float], overrides_cos: Dict[str, float],
                         normalizer_dtypes: Dict[str, str], zero_run=None,
                         overrides_rtol: Optional[Dict[str, float]] = None) -> Check:
    """``run(feed) -> {output: array}`` compared with ``ref`` under the dtype's tolerances."""
    c = Check(title)
    try:
        got = run(feed)
    except Exception as exc:  # a device or artifact that cannot run is a failed check, not a crash
        c.status, c.summary = FAIL, f"could not run: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return c
    base = DEFAULT_TOLERANCES[dtype]
    worst = []
    for name, want in ref.items():
        if name not in got:
            continue
        overrides_rtol = overrides_rtol or {}
        rtol = overrides_rtol.get(name, overrides_rtol.get(
            "*", None if name in overrides_atol or "*" in overrides_atol else base.rtol))
        tol = Tolerance(atol=overrides_atol.get(name, overrides_atol.get("*", base.atol)),
                        cosine=overrides_cos.get(name, overrides_cos.get("*", base.cosine)), rtol=rtol)
        s = array_stats(want, got[name])
        ok = tol.passes(s, want, got[name])
        status = PASS if ok else (WARN if dtype == "bfloat16" else FAIL)
        rule = f"atol {tol.atol:g}" + (f" or rtol {tol.rtol:g}" if tol.rtol is not None else "") + f", cosine {tol.cosine}"
        if ok:
            label = ""
        elif dtype == "bfloat16":
            label = " over the bf16 threshold: not for production"
        else:
            n = tol.violations(want, got[name]) if s.get("mismatches") is None else s["mismatches"]
            label = f" over tolerance ({rule}; {n} element(s))"
        c.add(Check(name, status, _fmt(s) + label, figures=dict(s, atol=tol.atol, rtol=tol.rtol, min_cosine=tol.cosine)))
        worst.append(s.get("max_abs", 0.0))
    if c.status == FAIL:
        zero = zero_run() if zero_run else {}
        why = _diagnose(got, zero, normalizer_dtypes)
        c.summary = "FAILED" + (f": {why}" if why else "")
    else:
        c.summary = f"max_abs {max(worst) if worst else 0:.3g}" + (" (not for production)" if c.status == WARN else "")
    return c


# --- 5 ---------------------------------------------------------------------------------------
def fingerprint(step_fn, policy: Policy, steps: int, seed: int = 0) -> str:
    """sha256 over the float32 bytes of a seeded ``steps``-long action sequence.

    Observation t is drawn from ``default_rng(seed)`` at the normalizer's scale; an LSTM's
    memory is fed back; discrete masks allow everything."""
    from .probes import make_probes

    feed_all = make_probes(policy, rows=steps, seed=seed)
    h = hashlib.sha256()
    mem = np.zeros((1, 1, policy.spec.memory_size), np.float32) if policy.spec.memory_size else None
    for t in range(steps):
        feed = {k: v[t:t + 1] for k, v in feed_all.items()}
        if policy.spec.discrete_branches:
            feed[C.ACTION_MASKS] = np.ones_like(feed[C.ACTION_MASKS])
        if mem is not None:
            feed[C.RECURRENT_IN] = mem
        out = step_fn(feed)
        for name in (C.OUT_CONT_DET, C.OUT_DISC_DET):
            if name in out:
                h.update(np.ascontiguousarray(out[name]).tobytes())
        if mem is not None:
            mem = out[C.RECURRENT_OUT]
    return h.hexdigest()
