"""One checkpoint through every stage: convert -> export -> verify, writing ``OUT/<stem>.*``.

Artifacts are built in memory first and each one is written under a temporary name and
renamed, so a bad input leaves nothing in OUT and a kill never leaves a half file.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import onnx

from . import contract as C
from .converter import Checkpoint, Conversion, load_checkpoint, load_policy, policy_from_checkpoint
from .converter.mapping import map_policy_as
from .converter.reference import describe as describe_divisor, read_onnx
from .converter.reference import divisor_record, stated_fields
from .converter.state_dict import checkpoint_bytes, checkpoint_dict
from .core.artifacts import (BUILT, GOLDEN, ONNX, PT2, REPORT, SAFETENSORS, SUFFIXES, ArtifactSet,
                             clean_stale_temporaries, locked, make_dirs, sha256_bytes)
from .core.files import atomic_write_bytes
from .core.policy import Policy
from .errors import InputError
from .exporters.atc import atc_plan
from .exporters.registry import EXPORTERS, TARGETS, require_targets
from .importers import checkpoint_from_onnx, foreign_format, is_onnx_source, read_source
from .verify import Reference, VerifyOptions, verify
from .verify.engine import check_devices, check_tolerance_outputs, report_bytes, source_record
from .verify.record import Written
from .verify.report import Report

@dataclass
class ConvertOptions:
    opset: int = C.ONNX_OPSET_DEFAULT
    obs_sizes: Optional[Sequence[int]] = None
    reference: Optional[Path] = None  # official ONNX; default: <stem>.onnx beside the checkpoint
    divisor: str = "auto"  # auto: adopt an official divisor within 1 ulp of IEEE; ieee: never (converter.reference)
    verify: bool = True
    program: bool = True  # write <stem>.pt2
    targets: Sequence[str] = ()  # deploy targets written in the same set (--targets; one refusing the policy: nothing)
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
    atc_plan: Optional[Dict[str, object]] = None  # exporters.atc's plan for the .onnx written

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok

    def outputs(self) -> Dict[str, Dict[str, str]]:
        """kind -> {file, sha256} (a batch manifest's record)."""
        return {k: {"file": a["file"], "sha256": a["sha256"]} for k, a in self.artifacts.items()}

    def summary(self) -> Dict[str, object]:
        spec = self.conversion.policy.spec
        decision = divisor_record(self.conversion.policy)
        d: Dict[str, object] = {
            "source": str(self.source), "source_sha256": self.conversion.checkpoint.sha256,
            "training_step": self.conversion.checkpoint.global_step, "out": str(self.out_dir), "stem": self.stem,
            "spec": spec.summary(),
            "artifacts": self.artifacts, "reference": str(self.reference) if self.reference else None,
            "divisor": describe_divisor(decision) if spec.normalize else None,
            "divisor_decision": decision if spec.normalize else None,
            "recovered_from": self.conversion.checkpoint.recovered,
            "seconds": round(self.seconds, 3),
        }
        if self.conversion.checkpoint.origin is not None:  # another trainer's file (importers.sb3)
            d["trained_with"] = self.conversion.checkpoint.origin
        if self.report is not None:
            d["verify"] = {"verdict": self.report.verdict, "ok": self.report.ok,
                           "first_failure": self.report.first_failure()}
        return d

    def atc(self) -> Optional[Dict[str, object]]:
        """The ``atc`` command for the ``.onnx`` written (``exporters.atc``), made by ``convert_one`` from
        the model it wrote."""
        return self.atc_plan


def default_reference(ckpt_path: Path) -> Optional[Path]:
    """ML-Agents writes ``<stem>.onnx`` beside every ``<stem>.pt`` (not beside its checkpoint.pt). An ONNX
    source is its own reference: the policy recovered from it is verified against it. Another trainer's file
    (an SB3 model zip) has none: no ML-Agents export of it exists."""
    if foreign_format(ckpt_path):
        return None
    p = ckpt_path.with_suffix(SUFFIXES[ONNX])
    try:
        return p if p.is_file() else None
    except OSError:  # e.g. a name too long for a sibling: the output names are checked later
        return None


def step_onnx(ckpt: Checkpoint) -> Optional[Path]:
    """For ``checkpoint.pt`` (the newest step saved a second time, no ONNX beside it under its name):
    the ONNX ML-Agents wrote beside the step file of its global step, ``<Behavior>-<step>.onnx``."""
    if ckpt.path.name != C.CHECKPOINT_FILE or ckpt.global_step is None:
        return None
    try:
        found = [p for p in ckpt.path.parent.glob(f"*-{int(ckpt.global_step)}{SUFFIXES[ONNX]}") if p.is_file()]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def obs_sizes_from_reference(ckpt: Checkpoint, model: Optional[onnx.ModelProto]) -> Optional[List[int]]:
    """How the vector observations' width splits, from the official ONNX's inputs (those of shape
    ``[batch, n]``), for a policy without normalizers (``normalize: false`` keeps no per-observation
    tensors); None otherwise."""
    if model is None or any(C.NORMALIZER_INFIX in k for k in ckpt.policy):
        return None
    sizes = [d.type.tensor_type.shape.dim[1].dim_value for d in model.graph.input
             if d.name.startswith(C.OBS_INPUT.format(i="")) and len(d.type.tensor_type.shape.dim) == 2]
    return sizes if len(sizes) > 1 and all(sizes) else None


def read_reference(path, data: Optional[bytes] = None):
    """(the official ONNX, its sha256), the file read once (``data``: its bytes, already read; checked
    as the file would be)."""
    path = Path(path)
    if data is None and not path.exists() and not path.is_symlink():
        raise InputError("reference ONNX not found", path)
    model, data = read_onnx(path, "reference ONNX", data=data)
    return model, sha256_bytes(data)


def load_reference(path: Path) -> onnx.ModelProto:
    return read_reference(path)[0]


@dataclass
class Prepared:
    """A checkpoint ready to export: its canonical policy (divisors decided) and its reference."""

    conversion: Conversion
    official: Optional[onnx.ModelProto]
    reference: Optional[Path]
    reference_sha256: Optional[str] = None


def prepare_conversion(ckpt: Checkpoint, reference: Optional[Path], obs_sizes: Optional[Sequence[int]] = None,
                       divisor: str = "auto", lenient: bool = False, reference_read: Optional[tuple] = None) -> Prepared:
    """checkpoint + official ONNX -> canonical policy: the observation split (``normalize: false``
    keeps none: the official's inputs give it) and the divisors (``converter.reconcile_divisors``).
    The one place single conversion, batch and the modes decide both. ``lenient``: an unreadable
    reference is ignored (the modes), instead of an error (a conversion). ``reference_read``: (model,
    sha256) of ``reference``, already read and checked (an ONNX source that is its own reference)."""
    official, ref_sha = reference_read if reference_read is not None else (None, None)
    if reference is not None and reference_read is None:
        try:
            official, ref_sha = read_reference(Path(reference))
        except InputError:
            if not lenient:
                raise
            reference = None
    sizes = obs_sizes if obs_sizes is not None else obs_sizes_from_reference(ckpt, official)
    hints_from = None
    step = step_onnx(ckpt) if official is None else None
    if step is not None:  # checkpoint.pt: what no tensor says, from its step's ONNX
        try:
            hints_from = read_reference(step)[0]
        except InputError:
            hints_from = None
    conv = policy_from_checkpoint(ckpt, obs_sizes=sizes, official=official, divisor=divisor,
                                  reference_name=Path(reference).name if official is not None else None,
                                  reference_sha256=ref_sha, stated=stated_fields(official),
                                  hints_from=hints_from)
    return Prepared(conv, official, Path(reference) if official is not None else None, ref_sha)


def _same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one file (a path compared as written, else resolved)."""
    if a == b:
        return True
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


def _refuse_overwriting_sources(arts: ArtifactSet, src: Path, reference: Optional[Path]) -> None:
    """Never write over what the user brought: the checkpoint, the official ONNX (or the golden
    file beside it) must not be among the paths this conversion writes."""
    theirs = {src.resolve(): src.name}
    for p in ([reference, reference.with_suffix(SUFFIXES[GOLDEN])] if reference else []) + \
            [src.with_suffix(SUFFIXES[ONNX]), src.with_suffix(SUFFIXES[GOLDEN])]:
        if p.is_file():
            theirs[p.resolve()] = p.name
    for kind in SUFFIXES:
        target = arts.path(kind)
        name = theirs.get(target.resolve()) if target.exists() else None
        if name is not None and target.resolve() == src.resolve():  # e.g. OUT/<stem>.safetensors into OUT/
            raise InputError(f"{target.name} would overwrite the input; choose another output directory", arts.dir)
        if name is not None:
            raise InputError(f"{target.name} would overwrite {name}, which this tool did not write (the official "
                             "files ML-Agents wrote beside the checkpoint are the reference); choose another output "
                             "directory", arts.dir)


@dataclass(frozen=True)
class InBatch:
    """How a batch runs :func:`convert_one` on one of its checkpoints (the defaults: a conversion alone).
    ``checkpoint``: already loaded (a batch reads and hashes each file once); ``writer``: the ``.pt2``
    writer shared by a batch (``exporters.pt2.ProgramWriter``: one trace per architecture); ``stem``: the
    files' stem (default: the source's); ``notes``: added to the report; ``fsync``: each file's;
    ``suggest_reference``: a report without an official ONNX suggests ``--reference``;
    ``check_tolerances``: refuse a tolerance option naming an output this policy does not have (a batch
    checks its options against all its policies before it starts, and passes False)."""

    checkpoint: Optional[Checkpoint] = None
    writer: Any = None
    stem: Optional[str] = None
    notes: Sequence[str] = ()
    fsync: bool = True
    suggest_reference: bool = True
    check_tolerances: bool = True


ALONE = InBatch()


def convert_one(source, out_dir, options: Optional[ConvertOptions] = None, *, profile=None,
                batch: InBatch = ALONE) -> ConvertResult:
    """load -> map -> export -> write -> verify the written files, into ``out_dir/<stem>.*``.

    ``profile``: the VerifyOptions (default: the options'); ``batch``: how a batch runs it (``InBatch``).
    Every artifact is built in memory before the first is written, so bad input leaves nothing: a
    tolerance option naming an output this policy does not have too (``InBatch.check_tolerances``).
    The report records the files written and the sources read (``Report.recorded``), so that
    ``verify OUT/`` checks them all and re-runs checks 1-2 while the sources are still there."""
    t0 = time.perf_counter()
    o = options or ConvertOptions()
    require_targets(o.targets)
    if o.verify:
        check_devices(getattr(profile or o.verify_options, "devices", None))
    src = Path(source)
    ref_path = Path(o.reference) if o.reference else default_reference(src)
    read = None
    if batch.checkpoint is None and is_onnx_source(src) and ref_path is not None and _same_file(ref_path, src):
        model, data = read_onnx(src, "ONNX model")  # an ONNX source that is its own reference: read once
        ckpt = checkpoint_from_onnx(src, model, data)
        read = (model, ckpt.sha256)
    else:
        ckpt = batch.checkpoint or read_source(src)  # a .pt, or an ML-Agents .onnx read back (importers.from_onnx)
    prep = prepare_conversion(ckpt, ref_path, o.obs_sizes, o.divisor, reference_read=read)
    conv, reference = prep.conversion, prep.reference
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", out)
    arts = ArtifactSet(out, batch.stem or src.stem)
    arts.check_names()
    _refuse_overwriting_sources(arts, src, reference)
    if batch.check_tolerances:
        check_tolerance_outputs(profile or o.verify_options, [(arts.stem, conv.policy.spec)])

    kinds = [k for k in BUILT if k != PT2 or o.program]
    blobs = {k: EXPORTERS[k](conv.policy, o.opset, batch.writer) for k in kinds}
    blobs.update({k: b for t in o.targets for k, b in TARGETS[t](conv.policy, o.opset, batch.writer).items()})
    res = ConvertResult(source=src, out_dir=out, stem=arts.stem, conversion=conv, reference=reference)
    make_dirs(out)
    # the set is written and verified as one: a lock on OUT/<stem> (see artifacts.locked), and every
    # file rolled back if any write (or the verification) raises
    with locked(out, arts.stem), arts.transaction() as tx:
        clean_stale_temporaries(out, arts.names())
        res.artifacts.update(tx.write_all(blobs, fsync=batch.fsync))
        res.atc_plan = atc_plan(onnx.load_model_from_string(blobs[ONNX]), res.artifacts[ONNX]["path"], conv.policy.spec)
        if o.verify:  # the bytes kept until check 6 has compared the files read back with them
            wrote = Written({k: a["sha256"] for k, a in res.artifacts.items()}, blobs, golden=True)
            blobs = None
            res.report = _verify_written(res, (ckpt, prep), (arts, tx, wrote), profile or o.verify_options, batch)
    res.seconds = time.perf_counter() - t0
    return res


def _verify_written(res: ConvertResult, sources, written, profile, batch: InBatch) -> Report:
    """Verify the files just written (``written``: their set, its transaction, what was written; the
    bytes dropped once check 6 has compared the files read back with them) against ``sources`` (the
    checkpoint, the prepared conversion); write the golden file and the report, with its record."""
    (ckpt, prep), (arts, tx, wrote) = sources, written
    src, out, official, reference = res.source, res.out_dir, prep.official, prep.reference
    rep = verify(arts, Reference(ckpt, official, reference), profile or VerifyOptions(),
                 subject=f"{arts.stem} ({src.name})", written=wrote, writer=batch.writer)
    if ckpt.recovered is not None:
        rep.notes.insert(0, f"the policy was recovered from {src.name} (importers.from_onnx): verified against "
                            f"{reference.name if reference else 'no official ONNX'} as the official file")
    elif ckpt.origin is not None and official is None:  # another trainer's file: no official ONNX exists
        by = f"{ckpt.origin.get('format')} {ckpt.origin.get('version') or ''}".strip()
        vn = ckpt.origin.get("vec_normalize")
        rep.notes.insert(0, f"{src.name} was written by {by}, which exports no ONNX: checks 2-3 have no official file "
                            "to compare with; check 4 holds every runtime to the float64 reference of its arithmetic; "
                            + (f"its observation normalizer is {vn['file']}'s (VecNormalize)" if vn else
                               "no VecNormalize file beside it: the policy takes the observations as they are")
                            + f"; its actions are what SB3's predict returns, in the action space {ckpt.origin.get('action_space')}")
    elif official is None:
        rep.notes.insert(0, f"no official ONNX found beside {src.name} "
                            f"({src.with_suffix(SUFFIXES[ONNX]).name})"
                            + ("; use --reference to name one" if batch.suggest_reference else ""))
    rep.notes.extend(batch.notes)
    # what verify OUT/ checks later: every file written (the golden file too), the sources read
    res.artifacts.update(tx.write_all({GOLDEN: rep.golden}, fsync=batch.fsync))
    rep.recorded = {"artifacts": res.outputs(), "sources": {
        "checkpoint": source_record(src, ckpt.sha256, out) if ckpt.sha256 else None,
        "official": source_record(reference, prep.reference_sha256, out)
        if reference is not None and prep.reference_sha256 else None}}
    res.artifacts.update(tx.write_all({REPORT: report_bytes(rep)}, fsync=batch.fsync))
    return rep


@dataclass
class ToCheckpointResult:
    """A canonical policy written back as ML-Agents' ``checkpoint.pt`` and read back."""

    source: Optional[Path]  # None: a policy given in memory
    path: Path
    policy: object
    global_step: int
    sha256: str
    size: int
    keys: List[str]
    read_back: Dict[str, object]
    behavior: Optional[str]
    warnings: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.read_back.get("ok"))

    def summary(self) -> Dict[str, object]:
        spec = self.policy.spec
        return {"ok": self.ok, "source": str(self.source) if self.source else None, "out": str(self.path), "sha256": self.sha256,
                "bytes": self.size, "family": spec.family, "training_step": self.global_step,
                "modules": [C.CKPT_POLICY, C.CKPT_GLOBAL_STEP], "policy_keys": self.keys,
                "not_included": "optimizer, critic and reward-signal state: ML-Agents logs 'Failed to load for "
                                "module ...' for each and starts it fresh",
                "behavior": self.behavior, "read_back": self.read_back, "usage": self.usage(),
                "warnings": list(self.warnings)}

    def usage(self) -> List[str]:
        """How ML-Agents takes the file: ``--initialize-from`` (its run directory layout) or ``init_path``."""
        b = self.behavior or "<Behavior>"
        return [f"copy it to {C.RESULTS_DIR}/<run-id>/{b}/{C.CHECKPOINT_FILE}, then {C.LEARN_COMMAND} CONFIG.yaml "
                f"{C.LEARN_RUN_ID}=<new-id> {C.LEARN_INITIALIZE_FROM}=<run-id>",
                f"or set behaviors.{b}.{C.SETTING_INIT_PATH}: {self.path.resolve()} in CONFIG.yaml"]


def to_checkpoint(source, out_dir, global_step: Optional[int] = None) -> ToCheckpointResult:
    """``source`` (a canonical ``.safetensors``, or a ``Policy`` in memory) -> ``out_dir/checkpoint.pt`` that ML-Agents 1.1.0
    initializes from (``converter.state_dict``), written under a temporary name and renamed, then read
    back by this tool's own reader: the same spec, every tensor bitwise (the divisors aside: ML-Agents
    computes its own from the statistics) and the step."""
    if isinstance(source, Policy):
        src, policy = None, source
    else:
        src = Path(source)
        if src.suffix != SUFFIXES[SAFETENSORS]:
            raise InputError(f"to-checkpoint reads a canonical {SUFFIXES[SAFETENSORS]} policy (convert the "
                             f"checkpoint first: huggy-convert CKPT OUT/)", src)
        policy = load_policy(src)
    origin = policy.metadata.get(C.MD_ORIGIN)
    if origin:  # another trainer's policy: ML-Agents' trainer has none of its rules (activation, normalizer, actions)
        raise InputError(f"to-checkpoint writes the trainer's {C.CHECKPOINT_FILE} this tool converts from; this "
                         f"policy was trained with {json.loads(origin).get('format', 'another trainer')}, whose "
                         "arithmetic that trainer does not have (keep training it where it was trained)", src)
    if global_step is None:
        recorded = policy.metadata.get("training_step", "")
        global_step = int(recorded) if recorded.isdigit() else 0
    ckpt = checkpoint_dict(policy, global_step)
    data, keys = checkpoint_bytes(ckpt), list(ckpt[C.CKPT_POLICY])
    warnings = normalizer_weight_warnings(policy, ckpt[C.CKPT_POLICY])
    del ckpt
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", out)
    make_dirs(out)
    path = out / C.CHECKPOINT_FILE
    if src is not None and path.exists() and path.resolve() == src.resolve():
        raise InputError("refusing to overwrite the input", path)
    with locked(out, C.CHECKPOINT_FILE):
        atomic_write_bytes(path, data)
    back = load_checkpoint(path)  # this tool's own reader (weights_only=True), on the file written
    mapped = map_policy_as(back.policy, policy.spec, back.path)
    compared = list(policy.sources)
    equal = [c for c in compared if c in mapped.tensors
             and mapped.tensors[c].tobytes() == np.asarray(policy.tensors[c], np.float32).tobytes()
             and mapped.tensors[c].shape == policy.tensors[c].shape]
    same_bytes = sha256_bytes(data) == back.sha256
    read_back = {"ok": mapped.spec == policy.spec and len(equal) == len(compared) and back.global_step == global_step
                 and same_bytes, "spec_equal": mapped.spec == policy.spec, "tensors": len(compared),
                 "bitwise_equal": len(equal), "training_step": back.global_step, "bytes_as_written": same_bytes}
    m = C.STEP_CHECKPOINT_RE.match(policy.metadata.get("source_file", ""))
    return ToCheckpointResult(src, path, policy, int(global_step), back.sha256, len(data), keys, read_back,
                              m.group("behavior") if m else None, warnings)


def normalizer_weight_warnings(policy, state: Dict[str, object]) -> List[str]:
    """One line when the written normalizer counts a single step (a policy recovered from an ONNX holds
    ``normalization_steps = 1``: the ONNX keeps only the folded divisor): ML-Agents' normalizer update
    weighs its statistics against each new batch by the step counts, so they count as one observation
    and the first batch of continued training replaces them."""
    ones = sorted(k for k, t in state.items() if k.endswith("." + C.NORM_STEPS) and int(t.reshape(-1)[0]) == 1)
    if not ones:
        return []
    why = ("recovered from an ONNX, which keeps only the folded divisor"
           if policy.metadata.get(C.MD_RECOVERED) else "the policy's normalizer counts one step")
    return [f"normalizer: {C.NORM_STEPS} = 1 ({why}): continued training counts these statistics as ONE "
            f"observation, so ML-Agents' running mean and variance become those of the first new observations "
            f"and the policy's inputs shift; to keep them, initialize from the run's own .pt checkpoint if you "
            f"have it, else expect the first updates to re-adapt the policy"]
