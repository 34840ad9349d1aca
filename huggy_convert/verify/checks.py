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
from ..converter import Checkpoint
from ..converter.reference import (compare_divisor, divisor_initializers, divisor_problem, divisor_record,
                                   official_divisors, policy_ieee_divisors, ulp_problem)
from ..core.policy import Policy
from ..runtime.feeds import Memory, make_probes
from ..runtime.threads import torch_threads
from .bounds import Float64Policy, judge
from ..errors import describe
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
    c = Check("1 safetensors vs checkpoint", id="safetensors")
    if ckpt is None:
        c.status, c.summary = SKIP, "no checkpoint given"
        return c
    import torch

    equal, bad = 0, []
    derived = {C.c_divisor(i) for i, _ in policy.spec.vector_obs} if policy.spec.normalize else set()
    div_line = check_divisor_tensors(policy, bad)
    for name, arr in sorted(policy.tensors.items()):
        if name in derived:
            continue
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
    n = len(policy.tensors) - len(derived)
    c.figures = {"tensors": n, "bitwise_equal": equal, "file": path_name, "checkpoint_sha256": ckpt.sha256,
                 "divisor": div_line}
    whose = f"the tensors recovered from {ckpt.path.name}" if ckpt.recovered else "their checkpoint keys"
    c.summary = f"{equal}/{n} tensors bitwise equal to {whose}" + (f"; divisor {div_line}" if div_line else "")
    if bad:
        c.status = FAIL
        c.summary += "; " + bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
        c.figures["differences"] = bad
    return c


def check_divisor_tensors(policy: Policy, bad: List[str]) -> str:
    """The stored divisors against ``sqrt(variance / steps)`` recomputed IEEE-exactly: equal, or (when the
    metadata says adopted from the official ONNX) within 1 ulp; appends what is wrong to ``bad``."""
    if not policy.spec.normalize:
        return ""
    adopted = divisor_record(policy).get("source") == "official"
    ieee = policy_ieee_divisors(policy)
    differs = 0
    for i, want in ieee.items():
        got = policy.tensors.get(C.c_divisor(i))
        if got is None or got.shape != want.shape:
            bad.append(f"{C.c_divisor(i)}: missing or of the wrong shape")
            continue
        cmp = compare_divisor(got, want)
        differs += cmp["differs"]
        p = ulp_problem(cmp, C.c_divisor(i), "IEEE sqrt(variance/steps)", 1 if adopted else 0,
                        "" if adopted else "the metadata says IEEE")
        if p:
            bad.append(p)
    if adopted:
        return f"adopted from the official ONNX ({differs} element(s) 1 ulp from IEEE)"
    return "IEEE (recomputed: bitwise equal)" if not differs else "NOT the IEEE value"


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


def check_divisor(policy: Optional[Policy], ours: onnx.ModelProto, official: onnx.ModelProto) -> Check:
    """The folded normalizer divisors: the official's against IEEE ``sqrt(variance / steps)`` (equal, or
    1 ulp on some elements: folded by a sqrt that is not correctly rounded; more: not this normalizer,
    a failure), and the rebuilt one's against the official's (equal when adopted; IEEE with
    ``--divisor ieee``)."""
    c = Check("normalizer divisor")
    off, reb = official_divisors(official), official_divisors(ours)
    if not off and not reb:
        c.summary = "no normalizer"
        return c
    ieee = policy_ieee_divisors(policy) if policy is not None and policy.spec.normalize else {}
    lines, problems, figures = [], [], {}
    for i in sorted(set(off) | set(reb)):
        if i not in off or i not in reb:
            problems.append(f"{C.OBS_INPUT.format(i=i)}: a divisor in {'the rebuilt' if i in reb else 'the official'} ONNX only")
            continue
        f: Dict[str, object] = {}
        if i in ieee:
            cmp = compare_divisor(off[i], ieee[i])
            f["official_vs_ieee"] = cmp
            p = divisor_problem(i, cmp)
            if p:
                problems.append(p)
                continue
        rb = compare_divisor(reb[i], off[i])
        f["rebuilt_vs_official"] = rb
        figures[C.OBS_INPUT.format(i=i)] = f
        p = ulp_problem(rb, f"{C.OBS_INPUT.format(i=i)}: rebuilt {divisor_initializers(ours).get(i, 'divisor')}", "the official's", 1,
                        "at most 1 ulp is another CPU's sqrt")
        if p:
            problems.append(p)
            continue
        n_off = f.get("official_vs_ieee", {}).get("differs", 0)
        where = f" at {f['official_vs_ieee']['indices']}" if n_off else ""
        if rb["differs"]:
            lines.append(f"{C.OBS_INPUT.format(i=i)}: official 1 ulp from IEEE on {n_off}/{rb['count']} elements{where} "
                         "(folded by a sqrt that is not correctly rounded); rebuilt keeps IEEE (--divisor ieee): outputs judged by the derived bound")
        elif n_off:
            lines.append(f"{C.OBS_INPUT.format(i=i)}: official 1 ulp from IEEE on {n_off}/{rb['count']} elements{where} "
                         "(folded by a sqrt that is not correctly rounded: MKL's generic or AVX-512 path): adopted, bitwise equal")
        else:
            lines.append(f"{C.OBS_INPUT.format(i=i)}: official equals IEEE on all {rb['count']} elements; rebuilt bitwise equal")
    c.figures = figures
    if problems:
        c.status, c.summary = FAIL, problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
    else:
        c.summary = "; ".join(lines)
    return c


def check_onnx_structure(ours: onnx.ModelProto, official: onnx.ModelProto, ours_name: str, official_name: str,
                         policy: Optional[Policy] = None) -> Check:
    """I/O, opset, op sequence, attributes, initializers (the divisor by :func:`check_divisor`)."""
    c = Check(f"2 rebuilt ONNX vs official ({official_name})", id="official")
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
        c.add(check_divisor(policy, ours, official))
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
        divisors = set(divisor_initializers(official).values())
        missing = [n for n, t in oinit.items() if n not in divisors
                   and (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) not in have]
        sub.summary = f"{len(oinit) - len(missing)}/{len(oinit)} official initializers have a bitwise-equal counterpart"
        if missing:
            sub.status = FAIL
            sub.summary += f"; none for {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
        c.add(sub)
        c.add(check_divisor(policy, ours, official))
        return c
    pairs, diffs = 0, []
    divisors = set(divisor_initializers(official).values())
    for x, y in zip(on, rn):
        for slot, (a, b) in enumerate(zip(x.input, y.input)):
            a, b = oal.get(a, a), ral.get(b, b)
            if a in oinit or b in rinit:
                pairs += 1
                if a in divisors:
                    continue  # judged element by element, in ulps, by check_divisor
                if a not in oinit or b not in rinit:
                    diffs.append(f"{x.op_type} input {slot}: official {a!r} vs rebuilt {b!r} (one is not an initializer)")
                    continue
                ta, tb = numpy_helper.to_array(oinit[a]), numpy_helper.to_array(rinit[b])
                if ta.dtype != tb.dtype or ta.shape != tb.shape or ta.tobytes() != tb.tobytes():
                    s = array_stats(ta, tb)
                    diffs.append(f"{b} (official {a}) {ta.dtype}{list(ta.shape)} vs {tb.dtype}{list(tb.shape)}"
                                 f"{_first_diff_text(b, s)}")
    sub.figures = {"paired": pairs, "official_initializers": len(oinit), "differences": diffs}
    sub.summary = f"{pairs - len(diffs)}/{pairs} paired initializers bitwise equal" + (
        " (the divisor: below)" if divisors else "")
    if diffs:
        sub.status = FAIL
        sub.summary += "; " + diffs[0] + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else "")
    c.add(sub)
    c.add(check_divisor(policy, ours, official))
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
                  noise: Dict[str, np.ndarray], policy: Policy, ref_name: str, fallback=None) -> Check:
    """onnxruntime on the rebuilt ONNX vs the reference (onnxruntime on the official file, or the
    golden outputs it wrote earlier): deterministic and constant outputs bitwise.

    ``fallback``: where bitwise equality is not expected — the divisors differ by 1 ulp by request
    (``--divisor ieee``), or the golden outputs were written on another host — ``(reason,
    judge(feed_name, feed, output, ours, ref) -> figures)`` judges a float output by the derived
    bound instead (``bounds.within_both``)."""
    c = Check(f"3 outputs: rebuilt vs {ref_name}", id="outputs")

    def verdict(name: str, feed_name: str, feed, a, b, s) -> Check:
        ok = s["bitwise_equal"] == s["count"] and "shape_mismatch" not in s and a.dtype == b.dtype
        if ok:
            return Check(f"{name} [{feed_name}]", PASS, "bitwise " + _fmt(s), figures=s)
        if fallback is not None and "shape_mismatch" not in s and a.dtype == b.dtype and a.dtype.kind == "f" \
                and name not in (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_DISC_SHAPE):
            reason, judge = fallback
            j = judge(feed_name, feed, name, a, b)
            fig = dict(s, bound_ratio=j["ratio"], over_bound=j["over"])
            return Check(f"{name} [{feed_name}]", PASS if j["ok"] else FAIL,
                         f"not bitwise ({reason}): {_fmt(s)}; {'within' if j['ok'] else 'OVER'} the derived bound "
                         f"(max error/bound {j['ratio']:.3g}" + ("" if j["ok"] else f", {j['over']} element(s) over") + ")",
                         figures=fig)
        return Check(f"{name} [{feed_name}]", FAIL, "NOT bitwise: " + _fmt(s) + _first_diff_text(name, s), figures=s)

    per_output: Dict[str, List[Dict]] = {}
    for feed_name, feed in feeds.items():
        try:
            ro, rr = run_ours(feed), run_ref(feed_name, feed)
        except Exception as exc:
            c.add(Check(f"[{feed_name}]", FAIL, f"could not run: {describe(exc)}"))
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
            c.add(verdict(name, feed_name, feed, ro[name], rr[name], s))
        if run_ours_noise is not None and run_ref_noise is not None and feed_name in noise:
            f2 = dict(feed, **{C.NOISE_INPUT: noise[feed_name]})
            try:
                a, b = run_ours_noise(f2)[C.OUT_CONT], run_ref_noise(feed_name, f2)[C.OUT_CONT]
            except Exception as exc:
                c.add(Check(f"{C.OUT_CONT} with injected noise [{feed_name}]", FAIL,
                            f"could not run: {describe(exc)}"))
                continue
            s = array_stats(b, a)
            per_output.setdefault(C.OUT_CONT + " (injected noise)", []).append(s)
            ch = verdict(C.OUT_CONT, feed_name, f2, a, b, s)
            ch.title = f"{C.OUT_CONT} with injected noise [{feed_name}]"
            c.add(ch)
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


def _margins(flips: List[Dict], within: bool, most: int = 3) -> str:
    """The flipped rows' float64 margins against their bounds (the first ``most``)."""
    sel = [f for f in flips if (f["margin"] <= f["bound"]) == within]
    txt = ", ".join(f"{f['index']}: {f['expected']}->{f['got']}, margin {f['margin']:.3g} "
                    f"{'<=' if within else '>'} bound {f['bound']:.3g}" for f in sel[:most])
    return txt + (f" (+{len(sel) - most} more)" if len(sel) > most else "")


def _bound_text(j: Dict, dtype: str = "float32") -> str:
    if "shape_mismatch" in j:
        return f"shape {j['shape_mismatch'][1]} != expected {j['shape_mismatch'][0]}"
    if "equal" in j:  # argmax: a flip passes when the float64 margin of its two logits is within their bound
        flips = j.get("flips", [])
        return (f"{j['equal']}/{j['count']} equal"
                + (f", {j['ties']} {dtype} tie(s) (float64 logit margin within the bound: {_margins(flips, True)})"
                   if j["ties"] else "")
                + (f"; {j['mismatches']} flip(s) OVER the bound ({_margins(flips, False)})" if j["mismatches"] and flips
                   else (f"; {j['mismatches']} element(s) OVER the bound, first {j['first_failure']}"
                         if j["mismatches"] else "")))
    return (f"max_abs={j['max_abs']:.3g}, error/bound {j['ratio']:.3g} (median bound {j['median_bound']:.2g})"
            + (f"; {j['unbounded']} element(s) without a finite {dtype} bound" if j.get("unbounded") else "")
            + ("" if j["ok"] else f"; {j['over']} element(s) OVER the bound, first {j['first_failure']}"))


def check_runtime(title: str, run, ref, feed: Dict[str, np.ndarray], dtype: str,
                  overrides_atol: Dict[str, float], overrides_cos: Dict[str, float],
                  normalizer_dtypes: Dict[str, str], zero_run=None,
                  overrides_rtol: Optional[Dict[str, float]] = None, noised=None) -> Check:
    """One runtime (``run(feed) -> {output: array}``) against the float64 reference ``ref``
    (bounds.Reference, its bounds derived for ``dtype``: ``ref.precision``): every element within
    its derived bound, one rule for float32, float16 and bfloat16 (bounds.judge; over the bound
    fails). An output named in ``--atol``/``--rtol``/``--cosine`` is judged by that rule instead
    (over it: a failure, or for bfloat16 a warning, as the user's threshold always was). A reference
    derived for another format than ``dtype`` (none given for it) falls back to the
    ``DEFAULT_TOLERANCES`` thresholds. ``noised``: ``(run_noise, reference with noise)`` adds
    ``continuous_actions`` with injected noise."""
    c = Check(title)
    try:
        got = run(feed)
    except Exception as exc:  # a device or artifact that cannot run is a failed check, not a crash
        c.status, c.summary = FAIL, f"could not run: {describe(exc)}"
        return c
    overrides_rtol = overrides_rtol or {}
    ratios, worst, ties = [], [], 0
    items = [(name, got[name], ref) for name in ref.values if name in got and name != C.OUT_CONT]
    if noised is not None:
        run_noise, ref_noise = noised
        try:
            items.append((C.OUT_CONT, run_noise(), ref_noise))
        except Exception as exc:
            c.add(Check(f"{C.OUT_CONT} (injected noise)", FAIL, f"could not run: {describe(exc, 160)}"))
    for name, arr, r in items:
        label = name + (" (injected noise)" if name == C.OUT_CONT else "")
        want = r.values[name]
        user = any(name in d or "*" in d for d in (overrides_atol, overrides_cos, overrides_rtol))
        if r.precision.name == dtype and not user:
            j = judge(r, name, arr)
            c.add(Check(label, PASS if j["ok"] else FAIL, _bound_text(j, dtype), figures=j))
            ties += j.get("ties", 0)
            if "ratio" in j:
                ratios.append(j["ratio"])
                worst.append(j["max_abs"])
            continue
        base = DEFAULT_TOLERANCES[dtype]
        rtol = overrides_rtol.get(name, overrides_rtol.get("*", base.rtol))
        tol = Tolerance(atol=overrides_atol.get(name, overrides_atol.get("*", base.atol)),
                        cosine=overrides_cos.get(name, overrides_cos.get("*", base.cosine)), rtol=rtol)
        ref32 = want.astype(np.float32) if want.dtype.kind == "f" else want
        s = array_stats(ref32, arr)
        ok = tol.passes(s, ref32, arr)
        warn = dtype == "bfloat16" and user  # the user's own bf16 threshold: reported, as it always was
        status = PASS if ok else (WARN if warn else FAIL)
        rule = f"atol {tol.atol:g}" + (f" or rtol {tol.rtol:g}" if tol.rtol is not None else "") + f", cosine {tol.cosine}"
        if ok:
            extra = f" (within {rule})"
        elif warn:
            extra = " over the bf16 threshold: not for production"
        else:
            n = tol.violations(ref32, arr) if s.get("mismatches") is None else s["mismatches"]
            extra = f" over tolerance ({rule}; {n} element(s))"
        c.add(Check(label, status, _fmt(s) + extra, figures=dict(s, atol=tol.atol, rtol=tol.rtol, min_cosine=tol.cosine)))
        worst.append(s.get("max_abs", 0.0))
    if c.status == FAIL:
        zero = zero_run() if zero_run else {}
        why = _diagnose(got, zero, normalizer_dtypes)
        c.summary = "FAILED" + (f": {why}" if why else "")
    else:
        c.summary = (f"max_abs {max(worst) if worst else 0:.3g}" + (f", error/bound {max(ratios):.3g}" if ratios else "")
                     + (f", {ties} argmax flip(s) within their float64 margin" if ties else "")
                     + (" (not for production)" if c.status == WARN else ""))
    c.figures = {"dtype": dtype, "max_bound_ratio": max(ratios) if ratios else None}
    return c


# --- 5 ---------------------------------------------------------------------------------------
def reference_fingerprint(policy: Policy, steps: int, seed: int = 0, prepared=None, probes=None,
                          values32=None) -> str:
    """:func:`fingerprint` of the float64 reference (bounds.Float64Policy), its outputs rounded once to
    float32: the same on every host (a float64 result would have to lie within ~1e-16 of a float32
    rounding boundary to change the hash). Without a memory every step is independent: the whole
    sequence runs as one batch, hashed step by step as :func:`fingerprint` hashes it. ``prepared``: the
    policy's bounds.Float64Policy, when the caller has one; ``probes``: ``make_probes(policy, steps,
    seed)``, when the caller has drawn them; ``values32``: what gives ``prepared.values32`` of a feed
    (the verifier's, which reuses a forward already run on the same feed)."""
    ref = prepared or Float64Policy(policy)
    if policy.spec.memory_size:
        return fingerprint(ref.values32, policy, steps, seed, probes)
    feed = dict(make_probes(policy, rows=steps, seed=seed) if probes is None else probes)
    if policy.spec.discrete_branches:
        feed[C.ACTION_MASKS] = np.ones_like(feed[C.ACTION_MASKS])
    with torch_threads():
        out = (values32 or ref.values32)(feed)
    h = hashlib.sha256()
    for t in range(steps):
        for name in (C.OUT_CONT_DET, C.OUT_DISC_DET):
            if name in out:
                h.update(np.ascontiguousarray(out[name][t:t + 1]).tobytes())
    return h.hexdigest()


def fingerprint(step_fn, policy: Policy, steps: int, seed: int = 0, probes=None) -> str:
    """sha256 over the float32 bytes of a seeded ``steps``-long action sequence.

    Observation t is drawn from ``default_rng(seed)`` at the normalizer's scale; an LSTM's
    memory is fed back; discrete masks allow everything. Row by row, torch on
    ``runtime.VERIFY_THREADS`` threads (``runtime.torch_threads``): each action is one row's own
    forward, so neither the batch nor the process's thread count enters the bytes hashed. ``probes``:
    ``make_probes(policy, steps, seed)``, when the caller has drawn them (read, never changed)."""
    with torch_threads():
        return _fingerprint(step_fn, make_probes(policy, rows=steps, seed=seed) if probes is None else probes,
                            policy, steps)


def _fingerprint(step_fn, feed_all, policy: Policy, steps: int) -> str:
    h = hashlib.sha256()
    memory = Memory(policy.spec, rows=1)
    for t in range(steps):
        feed = memory.step({k: v[t:t + 1].copy() for k, v in feed_all.items()})  # a copy: feed_all stays as drawn
        out = step_fn(feed)
        for name in (C.OUT_CONT_DET, C.OUT_DISC_DET):
            if name in out:
                h.update(np.ascontiguousarray(out[name]).tobytes())
        memory.update(out)
    return h.hexdigest()
