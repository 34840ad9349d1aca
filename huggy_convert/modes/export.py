"""``export``: an ONNX at any opset 9-15 from a checkpoint or a canonical policy, checked with
onnx.checker (full_check) and against the reference (the opset-9 rebuild, both in onnxruntime)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .. import contract as C
from ..converter import atomic_write_bytes
from ..errors import ExportError, InputError, UnsupportedError
from ..verify.compare import array_stats
from ..verify.runtime import ort_run
from .common import ModeResult, compact_stats, g, is_bitwise, tolerance, within
from .sources import (CONSTANT_OUTPUTS, KIND_ONNX, STOCHASTIC, Source, display_path, make_feed, ort_session_on)


def default_out(src: Source, opset: int) -> Path:
    return Path.cwd() / f"{src.path.stem}.opset{opset}.onnx"


def export(src: Source, opset: int = C.ONNX_OPSET_DEFAULT, out: Optional[Path] = None, noise_input: bool = False,
           device: str = "cpu", dtype: str = "float32", rows: int = 64, seed: int = 0) -> ModeResult:
    import onnx

    from ..exporters.onnx_export import build_onnx, model_bytes, with_noise_input

    if opset not in C.ONNX_OPSETS:
        raise ExportError(f"opset {opset} is not supported: choose one of {C.ONNX_OPSETS[0]}-{C.ONNX_OPSETS[-1]}")
    if dtype != "float32":
        raise ExportError(f"--dtype {dtype}: the Unity-contract ONNX is float32 (cast at deployment, e.g. ATC "
                          "--precision_mode; the torch module takes --dtype)", src.path)
    out = Path(out) if out else default_out(src, opset)
    if out.exists() and out.resolve() == src.path.resolve():
        raise InputError("refusing to overwrite the input: choose another --out", out)
    r = ModeResult("export")
    if src.kind == KIND_ONNX:
        have = src.onnx_view.opset
        if have != opset or noise_input:
            what = f"opset {have} to opset {opset}" if have != opset else "with a noise input"
            raise UnsupportedError(f"cannot re-export this ONNX {what}: an ONNX carries no canonical tensors to "
                                   "rebuild from (give the .pt checkpoint or the .safetensors policy)", src.path)
        model = src.model
        r.data["note"] = f"the ONNX is already opset {opset}: written unchanged"
        data = src.path.read_bytes()
    else:
        model = build_onnx(src.policy, opset)
        if noise_input:
            model = with_noise_input(model)
        data = model_bytes(model)
    atomic_write_bytes(out, data)
    loaded = onnx.load(str(out))
    try:
        onnx.checker.check_model(loaded, full_check=True)
        checker = "pass"
    except Exception as exc:
        checker = f"FAIL: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    r.ok = checker == "pass"
    # against the reference: the opset-9 rebuild (an ONNX input: itself), same probes, onnxruntime
    ref_model = src.reference_onnx()
    feed = make_feed(src, "probes", rows, seed)
    ref_sess, dev = ort_session_on(ref_model, device)
    sess = ort_session_on(loaded, device)[0]
    if noise_input:
        from ..verify.probes import make_noise

        ref_sess = ort_session_on(with_noise_input(ref_model), device)[0]
        feed = dict(feed, **{C.NOISE_INPUT: make_noise(src.probe_policy(), rows, seed)})
    want, got = ort_run(ref_sess, feed), ort_run(sess, feed)
    atol = tolerance("float32").atol
    outs = {}
    for name, a in want.items():
        if name in STOCHASTIC and not (noise_input and name == C.OUT_CONT):
            continue
        if name not in got:
            outs[name] = {"missing": True, "ok": False}
            continue
        s = array_stats(a, got[name])
        exact = name in CONSTANT_OUTPUTS or a.dtype.kind in "iub"
        ok = is_bitwise(s) if exact else within(s, atol)
        outs[name] = dict(compact_stats(s), bitwise=is_bitwise(s), ok=ok)
    matched = all(o["ok"] for o in outs.values())
    r.ok = r.ok and matched
    import hashlib

    r.data.update({"source": src.label, "out": display_path(out), "opset": opset, "noise_input": noise_input,
                   "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "checker_full_check": checker,
                   "reference": "opset-9 rebuild (onnxruntime " + dev + ")" if src.kind != KIND_ONNX else "the input ONNX",
                   "rows": rows, "seed": seed, "atol": atol, "outputs": outs, "matches_reference": matched,
                   "bitwise": all(o.get("bitwise", False) for o in outs.values())})
    r.lines.append(f"export {src.label} -> {display_path(out)} (opset {opset}{', noise input' if noise_input else ''}, "
                   f"{len(data):,} bytes, sha256 {r.data['sha256'][:16]}…)")
    if "note" in r.data:
        r.lines.append(f"  note: {r.data['note']}")
    r.lines.append(f"  {'✓' if checker == 'pass' else '✗'} onnx.checker full_check: {checker}")
    for name, o in outs.items():
        text = "missing" if o.get("missing") else (f"{o['bitwise_equal']}/{o['count']} equal" if "mismatches" in o else
                                                   f"max_abs={g(o['max_abs'], 3)} bitwise={o['bitwise_equal']}/{o['count']}")
        r.lines.append(f"  {'✓' if o['ok'] else '✗'} {name} vs reference on {rows} probes: {text}")
    return r

