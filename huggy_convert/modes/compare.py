"""``onnx-compare``: any ONNX against the ONNX rebuilt from the policy's canonical tensors, through
verify's own checks 2 and 3, so it reaches the verdict a conversion or ``verify`` reaches."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .. import contract as C
from ..errors import DeviceError, ExportError, InputError
from ..exporters.onnx_export import build_onnx
from ..pipeline import prepare_conversion
from ..verify import VerifyOptions
from ..verify.compare import Comparison
from ..verify.engine import compare_with_official
from .common import ModeResult
from .sources import CKPT_SUFFIXES, Source, display_path, load_onnx, load_source

ROWS = (64,)


def policy_beside(onnx_path: Path) -> Path:
    """The policy an ONNX came from: ``<stem>.pt`` or ``<stem>.safetensors`` beside it, or for a run
    directory's ``<Behavior>.onnx`` the ``<Behavior>/checkpoint.pt`` below it."""
    p = Path(onnx_path)
    for cand in [p.with_suffix(s) for s in CKPT_SUFFIXES + (".safetensors",)] + [p.parent / p.stem / C.CHECKPOINT_FILE]:
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


def _policy_for(ref_src: Source, onnx_path: Path, divisor: str = "auto"):
    """The policy compared with ``onnx_path``, as a conversion with ``--reference onnx_path`` would
    make it: a checkpoint's divisors are decided against that file (pipeline.prepare_conversion); a
    canonical policy keeps the divisors it stores (the artifacts' own)."""
    if ref_src.checkpoint is not None:
        return prepare_conversion(ref_src.checkpoint, onnx_path, divisor=divisor, lenient=True).conversion.policy
    return ref_src.policy


def _outputs(c3, feed_name: str) -> Dict[str, Dict]:
    """Check 3's per-output figures on one feed, keyed as the JSON has them."""
    out = {}
    for ch in c3.children:
        if not ch.title.endswith(f"[{feed_name}]"):
            continue
        name = ch.title[:-len(feed_name) - 3]
        if name.endswith(" with injected noise"):
            name = name[:-len(" with injected noise")] + " (injected noise)"
        f = dict(ch.figures or {})
        if "count" not in f:  # the Multinomial sample: checked for validity, never bitwise (no seed)
            continue
        c = Comparison.of(f, ch.status != "fail", "verify's check 3")
        out[name] = dict(c.figures(), bitwise=c.bitwise, ok=c.ok, summary=ch.summary)
    return out


def onnx_compare(ref_src: Source, onnx_paths: Sequence[Path] = (), rows: Sequence[int] = ROWS, seed: int = 0,
                 device: str = "cpu", bitwise: bool = False) -> ModeResult:
    """Each ONNX against the policy, through verify's own checks 2 and 3
    (verify.engine.compare_with_official): the ONNX rebuilt from the policy at that file's opset,
    both in onnxruntime (the reference runtime, CPU) on the seeded probes of each ``rows`` (and the
    golden inputs ML-Agents' generator wrote beside it); a checkpoint's divisor is decided against
    the file as a conversion decides it. The verdict is verify's: ``bitwise=True`` also refuses the
    derived-bound judgement of divisors 1 ulp apart."""
    if device not in ("cpu", "auto"):
        raise DeviceError(f"--device {device}: onnx-compare runs onnxruntime's CPU execution provider, the reference "
                          "runtime its verdict is defined on")
    ref_src.require_tensors("a reference for onnx-compare")
    if not onnx_paths:
        onnx_paths = [onnx_beside(ref_src)]
    r = ModeResult("onnx-compare")
    files = []
    r.lines.append(f"onnx-compare against the ONNX rebuilt from {ref_src.label} (onnxruntime cpu); probes seed {seed}, "
                   f"rows {', '.join(map(str, rows))}; verify's checks 2 and 3"
                   + (" (bitwise required)" if bitwise else ""))
    for path in onnx_paths:
        path = Path(path)
        model = load_onnx(path)
        opset = {o.domain or "": o.version for o in model.opset_import}.get("", 0)
        policy = _policy_for(ref_src, path)
        try:
            rebuilt = build_onnx(policy, opset if opset in C.ONNX_OPSETS else C.ONNX_OPSET_DEFAULT)
        except ExportError:
            rebuilt = build_onnx(policy)
        entry: Dict = {"file": display_path(path), "ok": True, "runs": [], "opset": opset}
        checks = []
        for n in rows:
            c2, c3 = compare_with_official(policy, rebuilt, model, path, VerifyOptions(rows=int(n), seed=seed),
                                           subject=ref_src.label, bitwise=bitwise)
            checks.append((n, c2, c3))
            run = {"rows": int(n), "outputs": _outputs(c3, "probes"), "ok": c3.status != "fail"}
            run["bitwise"] = bool(run["outputs"]) and all(o["bitwise"] for o in run["outputs"].values())
            entry["runs"].append(run)
            entry["ok"] = entry["ok"] and c2.status != "fail" and c3.status != "fail"
        c2 = checks[0][1]
        entry["structure"] = {"status": c2.status, "checks": {c.title: f"{c.status}: {c.summary}" for c in c2.children}}
        entry["checks"] = [c.to_dict() for _, a, b in checks[:1] for c in (a, b)]
        entry["bitwise"] = bool(entry["runs"]) and all(x["bitwise"] for x in entry["runs"])
        if entry["ok"] is False and c2.status == "fail" and not checks[0][2].children:
            entry["error"] = c2.summary or next((c.summary for c in c2.children if c.status == "fail"), "")
        r.ok = r.ok and entry["ok"]
        files.append(entry)
        r.lines.append(f"  {entry['file']} (opset {opset})")
        for c in c2.children:
            r.lines.append(f"    {'✓' if c.status != 'fail' else '✗'} 2 {c.title}: {c.summary}")
        for n, _, c3 in checks:
            for ch in c3.children:
                r.lines.append(f"    {'✓' if ch.status != 'fail' else '✗'} [{n:>3} rows] {ch.title}: {ch.summary}")
        r.lines.append(f"  => {'PASS' if entry['ok'] else 'FAIL'}" + (" (bitwise on every output)" if entry["bitwise"] else ""))
    r.data = {"reference": f"rebuilt from {ref_src.label} (onnxruntime cpu)", "seed": seed, "rows": list(rows),
              "bitwise_required": bitwise, "files": files}
    return r


def onnx_compare_paths(paths: Sequence[Path], **kw) -> ModeResult:
    policy, onnx_files = split_inputs(paths)
    return onnx_compare(load_source(policy), onnx_files, **kw)

