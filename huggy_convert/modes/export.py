"""``export``: an ONNX at any opset 9-15 from a checkpoint, a canonical policy or an ML-Agents ONNX (its
recovered tensors), checked with onnx.checker (full_check) and verified as a conversion verifies:
against the official ONNX (the ``<stem>.onnx`` beside a checkpoint, the input ONNX itself, or
``--reference``) through verify's checks 2 and 3; without one, against the opset-9 rebuild (outputs
bitwise in onnxruntime)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from .. import contract as C
from ..conformance.target import apply_target
from ..core.files import atomic_write_bytes
from ..errors import DeviceError, ExportError, InputError, describe
from ..exporters.atc import atc_plan, render
from ..exporters.onnx_export import build_onnx, model_bytes, with_noise_input
from ..importers.own import export_target
from ..pipeline import default_reference, load_reference, prepare_conversion
from ..runtime import STOCHASTIC, OrtRunner, make_noise
from ..verify import VerifyOptions
from ..verify.compare import Comparison, compare_arrays
from ..verify.engine import compare_with_official
from .common import ModeResult, g
from .sources import KIND_CHECKPOINT, KIND_ONNX, Source, display_path, make_feed


def default_out(src: Source, opset: int, out_dir: Optional[Path] = None) -> Path:
    """OUT/<stem>.opset<N>.onnx: OUT given, or the folder of the set a canonical input belongs to."""
    return export_target(src.path, out_dir, opset)


def _official_for(src: Source, reference: Optional[Path]) -> Optional[Path]:
    """The official ONNX to verify an export against: ``--reference``, else the ``<stem>.onnx`` ML-Agents
    wrote beside a checkpoint, or the input ONNX whose tensors were recovered (a canonical policy's
    sibling ONNX is this tool's own rebuild: not one)."""
    if reference is not None:
        return Path(reference)
    if src.kind == KIND_ONNX:
        return src.path if src.has_tensors else None
    if src.kind == KIND_CHECKPOINT:
        return default_reference(src.path)
    return None


@dataclass(frozen=True)
class ExportOptions:
    """How an export is written and checked beside its opset and file: ``noise_input`` (RandomNormalLike
    as an input), the device and dtype asked (CPU float32: the reference runtime, the Unity contract),
    the probes' ``rows`` and ``seed``, and the official ONNX to verify against (``reference``; default:
    the one beside a checkpoint)."""

    noise_input: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    rows: int = 64
    seed: int = 0
    reference: Optional[Path] = None
    target: Optional[str] = None  # --target: the file written checked for it (conformance.target), ATC for its CANN
    out_dir: Optional[Path] = None  # OUT/: where <stem>.opset<N>.onnx goes (default: beside a set's .safetensors)


def _refuse(src: Source, opset: int, o: ExportOptions) -> None:
    if opset not in C.ONNX_OPSETS:
        raise ExportError(f"opset {opset} is not supported: choose one of {C.ONNX_OPSETS[0]}-{C.ONNX_OPSETS[-1]} "
                          f"({C.opset_story()})")
    if o.dtype != "float32":
        raise ExportError(f"--dtype {o.dtype}: the Unity-contract ONNX is float32 (cast at deployment, e.g. ATC "
                          "--precision_mode; the torch module takes --dtype)", src.path)
    if o.device not in ("cpu", "auto"):
        raise DeviceError(f"--device {o.device}: export verifies in onnxruntime's CPU execution provider, the "
                          "reference runtime")


def _build(src: Source, opset: int, noise_input: bool, official_path, prepared, official, r: ModeResult):
    """(the policy exported, the ONNX's bytes): rebuilt from the canonical tensors, or an ONNX without
    them written unchanged where it already is what was asked."""
    policy = src.policy
    if src.kind == KIND_ONNX and not src.has_tensors:
        have = src.onnx_view.opset
        if have != opset or noise_input:
            what = f"opset {have} to opset {opset}" if have != opset else "with a noise input"
            src.require_tensors(f"re-exporting an ONNX {what}")
        r.data["note"] = f"the ONNX is already opset {opset}: written unchanged"
        return policy, src.path.read_bytes()
    if official is not None and src.checkpoint is not None:  # the divisor decided against it, as convert does
        policy = (prepared or prepare_conversion(src.checkpoint, official_path)).conversion.policy
    model = build_onnx(policy, opset)
    if noise_input:
        model = with_noise_input(model)
    return policy, model_bytes(model)


def _against_official(policy, loaded, official, official_path, o: ExportOptions, out: Path):
    """verify's checks 2 and 3 against the official ONNX: (per output figures, the checks, matched)."""
    checks = compare_with_official(policy, loaded, official, official_path, VerifyOptions(rows=o.rows, seed=o.seed),
                                   subject=display_path(out))
    outs: Dict[str, Dict] = {}
    for ch in checks[-1].children:
        f = ch.figures or {}
        if "count" in f:
            c = Comparison.of(f, ch.status != "fail", "verify's check 3")
            outs[ch.title] = dict(c.figures(), bitwise=c.bitwise, ok=c.ok)
    return outs, checks, all(c.status != "fail" for c in checks)


def _against_rebuild(src: Source, policy, loaded, o: ExportOptions) -> Dict[str, Dict]:
    """No official ONNX: the opset-9 rebuild (an ONNX input: itself), same probes, onnxruntime, bitwise."""
    ref_model = src.reference_onnx() if src.kind == KIND_ONNX else build_onnx(policy, C.ONNX_OPSET_DEFAULT)
    feed = make_feed(src, "probes", o.rows, o.seed)
    if o.noise_input:
        ref_model = with_noise_input(ref_model)
        feed = dict(feed, **{C.NOISE_INPUT: make_noise(src.probe_policy(), o.rows, o.seed)})
    want, got = OrtRunner(ref_model).infer(feed), OrtRunner(loaded).infer(feed)
    outs: Dict[str, Dict] = {}
    for name, a in want.items():
        if name in STOCHASTIC and not (o.noise_input and name == C.OUT_CONT):
            continue
        if name not in got:
            outs[name] = {"missing": True, "ok": False}
            continue
        c = compare_arrays(a, got[name])
        outs[name] = dict(c.figures(), bitwise=c.bitwise, ok=c.bitwise and a.dtype == got[name].dtype)
    return outs


def export(src: Source, opset: int = C.ONNX_OPSET_DEFAULT, out: Optional[Path] = None,
           options: ExportOptions = ExportOptions()) -> ModeResult:
    """Write the ONNX, check it with onnx.checker (full_check) and verify it as a conversion does:
    against the official ONNX (verify's checks 2 and 3, verify.engine.compare_with_official) when there
    is one, else against the opset-9 rebuild (outputs bitwise in onnxruntime)."""
    import onnx

    o = options
    _refuse(src, opset, o)
    if out and o.out_dir:
        raise InputError("give OUT/ or --out, not both", out)
    out = Path(out) if out else default_out(src, opset, o.out_dir)
    if out.exists() and out.resolve() == src.path.resolve():
        raise InputError("refusing to overwrite the input: choose another --out", out)
    official_path = _official_for(src, o.reference)
    prepared = None  # load_source's decision against this very reference: its official ONNX and policy reused
    if official_path is not None and src.prepared is not None and src.prepared.reference == official_path:
        prepared = src.prepared
    official = prepared.official if prepared is not None else (
        load_reference(official_path) if official_path is not None else None)
    r = ModeResult("export")
    policy, data = _build(src, opset, o.noise_input, official_path, prepared, official, r)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)
    loaded = onnx.load(str(out))
    try:
        onnx.checker.check_model(loaded, full_check=True)
        checker = "pass"
    except Exception as exc:
        checker = f"FAIL: {describe(exc, 160)}"
    checks = []
    if official is not None and not o.noise_input:
        outs, checks, matched = _against_official(policy, loaded, official, official_path, o, out)
        ref_text = f"official {display_path(official_path)} (verify's checks 2 and 3)"
    else:
        outs = _against_rebuild(src, policy, loaded, o)
        matched = all(x["ok"] for x in outs.values())
        ref_text = ("the input ONNX" if src.kind == KIND_ONNX else "opset-9 rebuild") + " (onnxruntime cpu, bitwise)"
    if src.kind == KIND_ONNX and src.has_tensors:
        r.data["note"] = "rebuilt from the tensors recovered from the input ONNX"
    r.ok = checker == "pass" and matched
    r.data.update({"source": src.label, "out": display_path(out), "opset": opset, "noise_input": o.noise_input,
                   "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "checker_full_check": checker,
                   "reference": ref_text, "rows": o.rows, "seed": o.seed, "outputs": outs, "matches_reference": matched,
                   "bitwise": bool(outs) and all(x.get("bitwise", False) for x in outs.values())})
    if checks:
        r.data["checks"] = [c.to_dict() for c in checks]
    r.data["atc"] = atc_plan(loaded, display_path(out), src.spec)
    aimed = apply_target(o.target, out, src.spec) if o.target else None
    if aimed is not None:
        r.data["target"] = aimed.summary()
        r.data["atc"] = aimed.atc or r.data["atc"]
        r.ok = r.ok and aimed.ok
    _render(r, src, checks)
    r.lines += aimed.lines() if aimed is not None else []
    return r


def _render(r: ModeResult, src: Source, checks) -> None:
    d = r.data
    r.lines.append(f"export {src.label} -> {d['out']} (opset {d['opset']}{', noise input' if d['noise_input'] else ''}, "
                   f"{d['bytes']:,} bytes, sha256 {d['sha256'][:16]}…)")
    if "note" in d:
        r.lines.append(f"  note: {d['note']}")
    checker = d["checker_full_check"]
    r.lines.append(f"  {'✓' if checker == 'pass' else '✗'} onnx.checker full_check: {checker}")
    r.lines.append(f"  against {d['reference']}:")
    if checks:
        for c in checks:
            for ch in c.children:
                mark = {"fail": "✗", "warn": "!"}.get(ch.status, "✓")
                r.lines.append(f"  {mark} {c.title.split(' ')[0]} {ch.title}: {ch.summary}")
    else:
        for name, o in d["outputs"].items():
            text = "missing" if o.get("missing") else (f"{o['bitwise_equal']}/{o['count']} equal" if "mismatches" in o else
                                                       f"max_abs={g(o['max_abs'], 3)} bitwise={o['bitwise_equal']}/{o['count']}")
            r.lines.append(f"  {'✓' if o['ok'] else '✗'} {name} on {d['rows']} probes: {text}")
    r.lines += render(d["atc"])
