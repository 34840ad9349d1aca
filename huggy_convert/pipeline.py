"""One checkpoint through every stage: convert -> export -> verify, writing ``OUT/<stem>.*``.

Artifacts are built in memory first and each one is written under a temporary name and
renamed, so a bad input leaves nothing in OUT and a kill never leaves a half file.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import onnx

from . import contract as C
from .converter import Checkpoint, Conversion, atomic_write_bytes, load_checkpoint, policy_bytes, policy_from_checkpoint
from .converter.reference import describe as describe_divisor
from .converter.reference import divisor_record
from .errors import InputError
from .exporters.onnx_export import build_onnx, model_bytes

SUFFIX_POLICY = ".safetensors"
SUFFIX_ONNX = ".onnx"
SUFFIX_PROGRAM = ".pt2"
SUFFIX_REPORT = ".verify.json"
SUFFIX_GOLDEN = ".golden.npz"


@dataclass
class ConvertOptions:
    opset: int = C.ONNX_OPSET_DEFAULT
    obs_sizes: Optional[Sequence[int]] = None
    reference: Optional[Path] = None  # official ONNX; default: <stem>.onnx beside the checkpoint
    divisor: str = "auto"  # auto: adopt an official divisor within 1 ulp of IEEE; ieee: never (converter.reference)
    verify: bool = True
    program: bool = True  # write <stem>.pt2
    verify_options: Optional[object] = None


@dataclass
class ConvertResult:
    source: Path
    out_dir: Path
    stem: str
    conversion: Conversion
    artifacts: Dict[str, Dict[str, str]] = field(default_factory=dict)  # kind -> {path, sha256}
    report: Optional[object] = None
    reference: Optional[Path] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok

    def summary(self) -> Dict[str, object]:
        spec = self.conversion.policy.spec
        decision = divisor_record(self.conversion.policy)
        d: Dict[str, object] = {
            "source": str(self.source), "source_sha256": self.conversion.checkpoint.sha256,
            "training_step": self.conversion.checkpoint.global_step, "out": str(self.out_dir), "stem": self.stem,
            "spec": {"family": spec.family, "algorithm": spec.algorithm, "obs_sizes": list(spec.obs_sizes),
                     "normalize": spec.normalize, "hidden_units": spec.hidden_units, "num_layers": spec.num_layers,
                     "continuous_size": spec.continuous_size, "discrete_branches": list(spec.discrete_branches),
                     "memory_size": spec.memory_size, "parameters": spec.parameter_count()},
            "artifacts": self.artifacts, "reference": str(self.reference) if self.reference else None,
            "divisor": describe_divisor(decision) if spec.normalize else None,
            "divisor_decision": decision if spec.normalize else None,
            "seconds": round(self.seconds, 3),
        }
        if self.report is not None:
            d["verify"] = {"verdict": self.report.verdict, "ok": self.report.ok,
                           "first_failure": self.report.first_failure()}
        return d


def default_reference(ckpt_path: Path) -> Optional[Path]:
    """ML-Agents writes ``<stem>.onnx`` beside every ``<stem>.pt`` (not beside checkpoint.pt)."""
    p = ckpt_path.with_suffix(".onnx")
    return p if p.is_file() else None


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def obs_sizes_from_reference(ckpt: Checkpoint, model: Optional[onnx.ModelProto]) -> Optional[List[int]]:
    """How the observation width splits, from the official ONNX's inputs, for a policy without
    normalizers (``normalize: false`` keeps no per-observation tensors); None otherwise."""
    if model is None or any(".normalizer." in k for k in ckpt.policy):
        return None
    sizes = [d.type.tensor_type.shape.dim[1].dim_value for d in model.graph.input
             if d.name.startswith(C.OBS_INPUT.format(i=""))]
    return sizes if len(sizes) > 1 and all(sizes) else None


def read_reference(path: Path):
    """(the official ONNX, its sha256), the file read once."""
    path = Path(path)
    if not path.is_file():
        raise InputError("reference ONNX not found", path)
    data = path.read_bytes()
    try:
        return onnx.load_model_from_string(data), hashlib.sha256(data).hexdigest()
    except Exception as exc:
        raise InputError(f"not a readable ONNX model ({type(exc).__name__})", path) from None


def load_reference(path: Path) -> onnx.ModelProto:
    return read_reference(path)[0]


@dataclass
class Prepared:
    """A checkpoint ready to export: its canonical policy (divisors decided) and its reference."""

    conversion: Conversion
    official: Optional[onnx.ModelProto]
    reference: Optional[Path]

    @property
    def divisor(self) -> Dict[str, object]:
        from .converter import divisor_record

        return divisor_record(self.conversion.policy)


def prepare_conversion(ckpt: Checkpoint, reference: Optional[Path], obs_sizes: Optional[Sequence[int]] = None,
                       divisor: str = "auto", lenient: bool = False) -> Prepared:
    """checkpoint + official ONNX -> canonical policy: the observation split (``normalize: false``
    keeps none: the official's inputs give it) and the divisors (``converter.reconcile_divisors``).
    The one place single conversion, batch and the modes decide both. ``lenient``: an unreadable
    reference is ignored (the modes), instead of an error (a conversion)."""
    official = ref_sha = None
    if reference is not None:
        try:
            official, ref_sha = read_reference(Path(reference))
        except InputError:
            if not lenient:
                raise
            reference = None
    sizes = obs_sizes if obs_sizes is not None else obs_sizes_from_reference(ckpt, official)
    conv = policy_from_checkpoint(ckpt, obs_sizes=sizes, official=official, divisor=divisor,
                                  reference_name=Path(reference).name if official is not None else None,
                                  reference_sha256=ref_sha)
    return Prepared(conv, official, Path(reference) if official is not None else None)


_EXPORT_LOCK = threading.RLock()


def program_bytes(policy, cache: Optional[dict] = None) -> bytes:
    """torch.export program bytes; ``cache`` (spec -> ExportedProgram) lets a batch trace once per
    architecture and only swap the weights."""
    import io

    import torch

    from .exporters.torch_module import build_module, export_program

    module = build_module(policy, "cpu", "float32")
    with _EXPORT_LOCK:  # torch.export is not thread-safe, and a cached program is shared: trace/swap+save alone
        ep = cache.get(policy.spec) if cache is not None else None
        if ep is None:
            ep = export_program(module)
            if cache is not None:
                cache[policy.spec] = ep
        else:
            sd = module.state_dict()
            with torch.no_grad():
                for k, v in ep.state_dict.items():
                    v.copy_(sd[k])
                for k, v in ep.constants.items():
                    if k in sd and isinstance(v, torch.Tensor):
                        v.copy_(sd[k])
        buf = io.BytesIO()
        torch.export.save(ep, buf)
    return buf.getvalue()


def convert_one(source, out_dir, options: Optional[ConvertOptions] = None, checkpoint: Optional[Checkpoint] = None,
                program_cache: Optional[dict] = None, stem: Optional[str] = None) -> ConvertResult:
    """Convert one checkpoint into ``out_dir`` and (unless disabled) verify the artifacts."""
    from .verify import VerifyOptions, verify, write_report

    t0 = time.perf_counter()
    o = options or ConvertOptions()
    src = Path(source)
    ckpt = checkpoint or load_checkpoint(src)
    prep = prepare_conversion(ckpt, Path(o.reference) if o.reference else default_reference(src), o.obs_sizes,
                              o.divisor)
    conv, official, reference = prep.conversion, prep.official, prep.reference
    stem = stem or src.stem
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", out)

    # build everything in memory, then write
    blobs = {"safetensors": (SUFFIX_POLICY, policy_bytes(conv.policy.tensors, conv.policy.metadata))}
    model = build_onnx(conv.policy, opset=o.opset)
    blobs["onnx"] = (SUFFIX_ONNX, model_bytes(model))
    if o.program:
        blobs["pt2"] = (SUFFIX_PROGRAM, program_bytes(conv.policy, program_cache))
    res = ConvertResult(source=src, out_dir=out, stem=stem, conversion=conv, reference=reference)
    for kind, (suffix, data) in blobs.items():
        path = out / f"{stem}{suffix}"
        atomic_write_bytes(path, data)
        res.artifacts[kind] = {"path": str(path), "sha256": _sha(data)}

    if o.verify:
        vo = o.verify_options or VerifyOptions()
        rep = verify(conv.policy, model, subject=f"{stem} ({src.name})", checkpoint=ckpt,
                     policy_file_name=f"{stem}{SUFFIX_POLICY}", official=official, official_path=reference,
                     pt2_path=out / f"{stem}{SUFFIX_PROGRAM}" if o.program else None, options=vo,
                     write_golden=out / f"{stem}{SUFFIX_GOLDEN}")
        if official is None:
            rep.notes.insert(0, f"no official ONNX found beside {src.name} ({src.with_suffix('.onnx').name}); "
                                "use --reference to name one")
        write_report(rep, out / f"{stem}{SUFFIX_REPORT}")
        res.report = rep
        for kind, suffix in (("report", SUFFIX_REPORT), ("golden", SUFFIX_GOLDEN)):
            p = out / f"{stem}{suffix}"
            res.artifacts[kind] = {"path": str(p), "sha256": _sha(p.read_bytes())}
    res.seconds = time.perf_counter() - t0
    return res


def verify_dir(out_dir, reference=None, checkpoint=None, options=None, stem: Optional[str] = None):
    """Re-verify the artifacts already in ``out_dir`` (one report per ``<stem>.safetensors``)."""
    from .converter import load_policy
    from .verify import verify, write_report

    out = Path(out_dir)
    if not out.is_dir():
        raise InputError("no such directory", out)
    stems = [stem] if stem else sorted(p.name[:-len(SUFFIX_POLICY)] for p in out.glob(f"*{SUFFIX_POLICY}"))
    if not stems:
        raise InputError(f"no {SUFFIX_POLICY} policy to verify (run 'huggy-convert CKPT {out}' first)", out)
    official = load_reference(Path(reference)) if reference else None
    ckpt = load_checkpoint(checkpoint) if checkpoint else None
    reports = []
    for s in stems:
        policy = load_policy(out / f"{s}{SUFFIX_POLICY}")
        onnx_path = out / f"{s}{SUFFIX_ONNX}"
        if not onnx_path.is_file():
            raise InputError(f"missing {onnx_path.name} beside {s}{SUFFIX_POLICY}", out)
        try:
            rebuilt = onnx.load(str(onnx_path))
        except Exception as exc:
            raise InputError(f"not a readable ONNX model ({type(exc).__name__})", onnx_path) from None
        if ckpt is not None and ckpt.sha256 != policy.metadata.get("source_sha256"):
            raise InputError(f"checkpoint sha256 {ckpt.sha256[:12]}… is not the source of {s}{SUFFIX_POLICY} "
                             f"({policy.metadata.get('source_sha256', '')[:12]}…)", ckpt.path)
        rep = verify(policy, rebuilt, subject=f"{s} ({out})", checkpoint=ckpt, policy_file_name=f"{s}{SUFFIX_POLICY}",
                     official=official, official_path=Path(reference) if reference else None,
                     golden_path=out / f"{s}{SUFFIX_GOLDEN}", pt2_path=out / f"{s}{SUFFIX_PROGRAM}", options=options)
        write_report(rep, out / f"{s}{SUFFIX_REPORT}")
        reports.append(rep)
    return reports
