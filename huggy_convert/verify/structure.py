"""Check 2 of the verification: the rebuilt ONNX against the official one — I/O (names, dtypes, dims),
opset, op sequence, node attributes, initializers bitwise, the folded normalizer divisors in ulps."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import onnx
from onnx import numpy_helper

from .. import contract as C
from ..converter.reference import (compare_divisor, divisor_initializers, divisor_problem, official_divisors,
                                   policy_ieee_divisors, ulp_problem)
from ..core.policy import Policy
from .compare import array_stats, first_diff_text
from .report import FAIL, PASS, WARN, Check


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
    paired = [n.op_type for n in on] == [n.op_type for n in rn]
    c.add(_op_sequence(ours, official, on, rn))
    if paired:
        c.add(_attributes(on, rn))
        c.add(_paired_initializers(ours, official, (on, oal), (rn, ral)))
    else:
        c.add(_matched_initializers(ours, official))
    c.add(check_divisor(policy, ours, official))
    return c


def _op_sequence(ours: onnx.ModelProto, official: onnx.ModelProto, on, rn) -> Check:
    """The op types of the normalized nodes, in order."""
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
    return sub


def _attributes(on, rn) -> Check:
    """The attributes of paired nodes (clip bounds, axes, transB...)."""
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
    return sub


def _matched_initializers(ours: onnx.ModelProto, official: onnx.ModelProto) -> Check:
    """Without a node pairing: each official initializer (the divisors aside) has a bitwise-equal one."""
    oinit = {i.name: i for i in official.graph.initializer}
    sub = Check("initializers")
    have = {(t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in ours.graph.initializer}
    divisors = set(divisor_initializers(official).values())
    missing = [n for n, t in oinit.items() if n not in divisors
               and (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) not in have]
    sub.summary = f"{len(oinit) - len(missing)}/{len(oinit)} official initializers have a bitwise-equal counterpart"
    if missing:
        sub.status = FAIL
        sub.summary += f"; none for {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
    return sub


def _paired_initializers(ours: onnx.ModelProto, official: onnx.ModelProto, off, reb) -> Check:
    """Initializers paired by role: (node index in the normalized sequence, input slot); ``off``/``reb``:
    each model's (normalized nodes, alias -> initializer)."""
    (on, oal), (rn, ral) = off, reb
    oinit = {i.name: i for i in official.graph.initializer}
    rinit = {i.name: i for i in ours.graph.initializer}
    sub = Check("initializers")
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
                                 f"{first_diff_text(b, s)}")
    sub.figures = {"paired": pairs, "official_initializers": len(oinit), "differences": diffs}
    sub.summary = f"{pairs - len(diffs)}/{pairs} paired initializers bitwise equal" + (
        " (the divisor: below)" if divisors else "")
    if diffs:
        sub.status = FAIL
        sub.summary += "; " + diffs[0] + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else "")
    return sub
