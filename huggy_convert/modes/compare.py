"""``onnx-compare``: any ONNX against our reference, the ONNX rebuilt from the policy's canonical
tensors, both run by onnxruntime on the same seeded probes (verify.probes.make_probes)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .. import contract as C
from ..errors import ExportError, InputError
from ..verify.compare import array_stats
from ..verify.probes import make_noise
from ..verify.runtime import ort_run
from .common import ModeResult, compact_stats, g, is_bitwise, stats_line, tolerance, within
from .sources import (CKPT_SUFFIXES, CONSTANT_OUTPUTS, STOCHASTIC, Source, display_path, load_onnx, load_source,
                      make_feed, ort_session_on)

ROWS = (64,)


def policy_beside(onnx_path: Path) -> Path:
    """The policy an ONNX came from: ``<stem>.pt`` or ``<stem>.safetensors`` beside it, or for a run
    directory's ``<Behavior>.onnx`` the ``<Behavior>/checkpoint.pt`` below it."""
    p = Path(onnx_path)
    for cand in [p.with_suffix(s) for s in CKPT_SUFFIXES + (".safetensors",)] + [p.parent / p.stem / "checkpoint.pt"]:
        if cand.is_file():
            return cand
    raise InputError("no policy to compare with (no <stem>.pt / .safetensors beside it): pass the checkpoint too", p)


def onnx_beside(src: Source) -> Path:
    p = src.path.with_suffix(".onnx")
    if p.is_file():
        return p
    raise InputError("no ONNX to compare (no <stem>.onnx beside it): pass the ONNX file too", src.path)


def split_inputs(paths: Sequence[Path]) -> Tuple[Path, List[Path]]:
    """(policy source, ONNX files) from the command's arguments, filling in what is beside them."""
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.exists():
            raise InputError("no such file or directory", p)
    onnx_files = [p for p in paths if p.suffix.lower() == ".onnx"]
    policies = [p for p in paths if p.suffix.lower() != ".onnx"]
    if len(policies) > 1:
        raise InputError(f"give one policy (.pt / .safetensors / run directory) and ONNX files; got {len(policies)} policies",
                         policies[1])
    policy = policies[0] if policies else policy_beside(onnx_files[0])
    return policy, onnx_files


def _one_rnl(model) -> bool:
    return sum(1 for n in model.graph.node if n.op_type == "RandomNormalLike") == 1


def onnx_compare(ref_src: Source, onnx_paths: Sequence[Path] = (), rows: Sequence[int] = ROWS, seed: int = 0,
                 device: str = "cpu", bitwise: bool = False) -> ModeResult:
    """Per output (verify.compare.array_stats): deterministic and constant outputs of each ONNX vs
    the rebuilt reference; ``continuous_actions`` with the same injected noise (RandomNormalLike
    replaced by an input). Pass: constants and integer outputs equal; float outputs bitwise with
    ``bitwise=True``, else max_abs <= 1e-6 (float32 tolerance). The structural comparison
    (verify.checks.check_onnx_structure) is reported alongside."""
    from ..exporters.onnx_export import with_noise_input
    from ..verify.checks import check_onnx_structure

    ref_src.require_tensors("a reference for onnx-compare")
    if not onnx_paths:
        onnx_paths = [onnx_beside(ref_src)]
    policy = ref_src.policy
    ref_model = ref_src.rebuilt_onnx()
    ref_sess, dev = ort_session_on(ref_model, device)
    ref_noise = ort_session_on(with_noise_input(ref_model), device)[0] if ref_src.spec.continuous_size else None
    atol = tolerance("float32").atol
    r = ModeResult("onnx-compare")
    files = []
    r.lines.append(f"onnx-compare against the ONNX rebuilt from {ref_src.label} (onnxruntime {dev}); "
                   f"probes seed {seed}, rows {', '.join(map(str, rows))}; pass: "
                   + ("bitwise" if bitwise else f"max_abs <= {g(atol)}") + " (constants and integers: equal)")
    for path in onnx_paths:
        path = Path(path)
        model = load_onnx(path)
        entry: Dict = {"file": display_path(path), "ok": True, "runs": []}
        opset = {o.domain or "": o.version for o in model.opset_import}.get("", 0)
        try:
            struct_ref = ref_src.rebuilt_onnx(opset) if opset in C.ONNX_OPSETS else ref_model
        except ExportError:
            struct_ref = ref_model
        st = check_onnx_structure(struct_ref, model, "rebuilt", display_path(path))
        entry["structure"] = {"status": st.status, "checks": {c.title: f"{c.status}: {c.summary}" for c in st.children}}
        try:
            sess = ort_session_on(model, device)[0]
            noise_sess = (ort_session_on(with_noise_input(model), device)[0]
                          if ref_noise is not None and _one_rnl(model) else None)
        except Exception as exc:
            if isinstance(exc, InputError):
                raise
            entry.update(ok=False, error=f"does not run in onnxruntime: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            files.append(entry)
            r.ok = False
            r.lines.append(f"  ✗ {entry['file']}: {entry['error']}")
            continue
        r.lines.append(f"  {entry['file']} (opset {opset}); structure vs rebuilt opset {opset if struct_ref is not ref_model else 9}: "
                       f"{st.status}")
        want_inputs = {i.name for i in ref_sess.get_inputs()}
        have_inputs = {i.name for i in sess.get_inputs()}
        if have_inputs != want_inputs:
            entry.update(ok=False, error=f"inputs {sorted(have_inputs)} != reference {sorted(want_inputs)}")
            files.append(entry)
            r.ok = False
            r.lines.append(f"    ✗ {entry['error']}")
            continue
        for n in rows:
            feed = make_feed(ref_src, "probes", n, seed)
            want, got = ort_run(ref_sess, feed), ort_run(sess, feed)
            run: Dict = {"rows": n, "outputs": {}}
            for name, a in want.items():
                if name in STOCHASTIC:
                    continue
                if name not in got:
                    run["outputs"][name] = {"missing": True, "ok": False}
                    continue
                s = array_stats(a, got[name])
                exact = name in CONSTANT_OUTPUTS or a.dtype.kind in "iub" or bitwise
                ok = (is_bitwise(s) and a.dtype == got[name].dtype) if exact else within(s, atol)
                run["outputs"][name] = dict(compact_stats(s), bitwise=is_bitwise(s), ok=ok)
            if noise_sess is not None:
                eps = make_noise(policy, n, seed)
                a = ort_run(ref_noise, dict(feed, **{C.NOISE_INPUT: eps}))[C.OUT_CONT]
                b = ort_run(noise_sess, dict(feed, **{C.NOISE_INPUT: eps}))[C.OUT_CONT]
                s = array_stats(a, b)
                ok = is_bitwise(s) if bitwise else within(s, atol)
                run["outputs"][C.OUT_CONT + " (injected noise)"] = dict(compact_stats(s), bitwise=is_bitwise(s), ok=ok)
            elif ref_noise is not None:
                run["note"] = "continuous_actions not compared: the ONNX has no single RandomNormalLike to inject noise into"
            run["ok"] = all(o["ok"] for o in run["outputs"].values())
            run["bitwise"] = all(o.get("bitwise", False) for o in run["outputs"].values())
            entry["runs"].append(run)
            entry["ok"] = entry["ok"] and run["ok"]
            for name, o in run["outputs"].items():
                text = "missing from the ONNX" if o.get("missing") else stats_line(o)
                r.lines.append(f"    {'✓' if o['ok'] else '✗'} [{n:>3} rows] {name}: {text}")
        entry["bitwise"] = bool(entry["runs"]) and all(x["bitwise"] for x in entry["runs"])
        r.ok = r.ok and entry["ok"]
        files.append(entry)
        r.lines.append(f"  => {'PASS' if entry['ok'] else 'FAIL'}" + (" (bitwise on every output)" if entry["bitwise"] else ""))
    r.data = {"reference": f"rebuilt from {ref_src.label} (opset 9, onnxruntime {dev})", "seed": seed,
              "rows": list(rows), "bitwise_required": bitwise, "atol": atol, "files": files}
    return r


def onnx_compare_paths(paths: Sequence[Path], **kw) -> ModeResult:
    policy, onnx_files = split_inputs(paths)
    return onnx_compare(load_source(policy), onnx_files, **kw)

