"""Inputs of the run modes: any source (.pt, .safetensors, .onnx, run directory), its signature,
observation feeds, and which runtime runner (runtime/: torch eager on cpu/cuda/npu, onnxruntime on
CPU / CUDA EP) runs it.

An ML-Agents ONNX is read back into its canonical policy (``importers.from_onnx``): it runs through
onnxruntime as it is (the default), and through torch from the recovered tensors (``--runtime torch``,
any dtype and device). An ONNX whose graph is not ML-Agents' export, node for node, but whose inputs and
outputs are, still runs in onnxruntime (float32); where a mode needs the tensors the error says why
they could not be recovered, and the command exits 2.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..converter import Checkpoint, load_policy
from ..converter.reference import read_onnx
from ..core.artifacts import SAFETENSORS, SUFFIXES
from ..core.policy import Policy
from ..core.spec import OBS_VECTOR, PolicySpec
from ..errors import DeviceError, InputError, UnsupportedError
from ..exporters.devices import DTYPES, available_devices
from ..exporters.onnx_export import build_onnx
from ..importers import foreign_format, is_onnx_source, read_source
from ..importers.from_onnx import checkpoint_from_onnx, infer_spec
from ..pipeline import Prepared, default_reference, prepare_conversion
from ..batch.rundir import STATUS_KEY, discover, newest_checkpoint
from ..runtime import ModuleRunner, OrtRunner, Runner, complete_feed, make_probes, random_obs, zeros_obs
from .observations import obs_feed, read_obs_file
from .onnx_view import OnnxView, load_onnx

__all__ = [  # what the modes, the API and the tests import from here (some defined beside it)
    "CKPT_SUFFIXES", "DTYPES", "KIND_CHECKPOINT", "KIND_ONNX", "KIND_POLICY", "RUNTIME_ORT", "RUNTIME_TORCH",
    "OnnxView", "Source", "devices_present", "display_path", "load_onnx", "load_source", "make_feed",
    "make_runner", "obs_feed", "read_obs_file", "run_inventory", "to_jsonable"]

KIND_CHECKPOINT, KIND_POLICY, KIND_ONNX = "checkpoint", "policy", "onnx"
RUNTIME_TORCH, RUNTIME_ORT = "torch", "onnxruntime"
CKPT_SUFFIXES = (".pt", ".pth", ".ckpt")


def display_path(p) -> str:
    """``p`` relative to the working directory when it lies below it (for command lines)."""
    p = Path(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


# --- run directories ---------------------------------------------------------------------
def run_inventory(run_dir) -> Dict[str, object]:
    """Checkpoint inventory of a run directory (``batch.rundir.discover``: training_status.json, else
    the file names): per behavior, each checkpoint's step, reward and whether its files are there."""
    found = discover(Path(run_dir))
    status, items, warnings = found.status, found.items, found.warnings
    out: Dict[str, object] = {"run_dir": str(run_dir), STATUS_KEY: display_path(status) if status else None,
                              "warnings": warnings, "behaviors": {}}
    for it in items:
        key = (f"{it.sub}/" if it.sub else "") + (it.behavior or "(unknown)")  # several runs: <run>/<Behavior>
        beh = out["behaviors"].setdefault(key, {"checkpoints": [], "checkpoint_pt": None})
        if it.kind == "checkpoint":
            beh["checkpoint_pt"] = None if it.missing else display_path(it.path)
            continue
        onnx_p = it.path.with_suffix(".onnx")
        beh["checkpoints"].append({"steps": it.step, "reward": it.reward, "pt": display_path(it.path),
                                   "pt_present": not it.missing, "onnx": display_path(onnx_p),
                                   "onnx_present": onnx_p.is_file(), "newest": it.newest})
    return out


# --- sources -----------------------------------------------------------------------------
@dataclass
class Source:
    """One input of a mode: a policy with canonical tensors (a checkpoint, a canonical file, an ML-Agents
    ONNX read back), or an ONNX whose tensors could not be recovered (``unrecovered`` says why)."""

    path: Path
    kind: str
    spec: PolicySpec
    policy: Optional[Policy] = None
    checkpoint: Optional[Checkpoint] = None
    model: Optional[object] = None  # onnx.ModelProto for an ONNX input
    run_dir: Optional[Path] = None
    load_seconds: float = 0.0
    unrecovered: Optional[str] = None  # an ONNX input: why its canonical tensors could not be recovered
    prepared: Optional[Prepared] = None  # a checkpoint or a recovered ONNX: its divisors' decision and reference
    _cache: Dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def has_tensors(self) -> bool:
        return self.policy is not None

    @property
    def label(self) -> str:
        return display_path(self.path)

    @property
    def onnx_view(self) -> Optional[OnnxView]:
        if self.model is None:
            return None
        if "view" not in self._cache:
            self._cache["view"] = OnnxView(self.model)
        return self._cache["view"]

    def rebuilt_onnx(self, opset: int = C.ONNX_OPSET_DEFAULT):
        """Our ONNX rebuilt from the canonical tensors (cached per opset)."""
        self.require_tensors("rebuilding an ONNX")
        key = f"onnx{opset}"
        if key not in self._cache:
            self._cache[key] = build_onnx(self.policy, opset)
        return self._cache[key]

    def reference_onnx(self):
        """The graph onnxruntime runs for this source: the ONNX itself, or the rebuilt opset-9 one."""
        return self.model if self.model is not None else self.rebuilt_onnx()

    def require_tensors(self, what: str) -> None:
        if self.policy is None:
            raise UnsupportedError(f"{what} needs canonical tensors, and none could be recovered from this ONNX "
                                   f"({self.unrecovered or 'no tensors'}); give the .pt checkpoint or the "
                                   ".safetensors policy", self.path)

    def obs_scale(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Per observation: (running_mean, divisor) as float32, the divisor folded exactly as the
        ONNX does (so a checkpoint and its ONNX give the same random observations)."""
        if "scale" in self._cache:
            return self._cache["scale"]
        out = []
        for i, n in enumerate(self.spec.obs_sizes):
            mean = div = None
            if self.spec.obs_kind(i) != OBS_VECTOR:  # no normalizer: zeros and ones
                pass
            elif self.policy is not None and self.spec.normalize:
                mean = self.policy.tensors[C.c_norm(i, C.NORM_MEAN)]
                div = self.policy.divisor(i)
            elif self.model is not None:
                mean, div = self.onnx_view.obs_scale(i)
            if mean is None or div is None:
                mean, div = np.zeros(n, np.float32), np.ones(n, np.float32)
            out.append((np.asarray(mean, np.float32).reshape(n), np.asarray(div, np.float32).reshape(n)))
        self._cache["scale"] = out
        return out

    def probe_policy(self) -> Policy:
        """A policy for runtime.feeds.make_probes / checks.fingerprint: the real one, or for an ONNX a stand-in
        whose normalizer is its folded (mean, divisor) (variance = divisor^2 in float64, steps 1)."""
        if self.policy is not None:
            return self.policy
        tensors: Dict[str, np.ndarray] = {}
        if self.spec.normalize:
            for i, (mean, div) in enumerate(self.obs_scale()):
                if self.spec.obs_kind(i) != OBS_VECTOR:
                    continue
                tensors[C.c_norm(i, C.NORM_MEAN)] = mean
                tensors[C.c_norm(i, C.NORM_VAR)] = div.astype(np.float64) ** 2
                tensors[C.c_norm(i, C.NORM_STEPS)] = np.ones((), np.float32)
                tensors[C.c_divisor(i)] = div
        return Policy(spec=self.spec, tensors=tensors)


def load_source(path, obs_sizes: Optional[Sequence[int]] = None, divisor: str = "auto") -> Source:
    """Read a mode's input: ``.pt`` checkpoint, ``.safetensors`` policy, ``.onnx`` model, or a run
    directory (its newest step checkpoint). A checkpoint's divisors are decided as a conversion
    decides them (``pipeline.prepare_conversion``: the sibling official ONNX, ``divisor`` mode)."""
    p = Path(path)
    t0 = time.perf_counter()
    if not p.exists():
        raise InputError("no such file or directory", p)
    run_dir = None
    if p.is_dir():
        run_dir = p
        p = newest_checkpoint(p)
    suffix = p.suffix.lower()
    if suffix in CKPT_SUFFIXES or foreign_format(p):  # read_source: a .pt, or another trainer's file
        ckpt = read_source(p)
        prep = prepare_conversion(ckpt, default_reference(p), obs_sizes, divisor, lenient=True)
        pol = prep.conversion.policy
        src = Source(p, KIND_CHECKPOINT, pol.spec, policy=pol, checkpoint=ckpt, run_dir=run_dir, prepared=prep)
    elif suffix == SUFFIXES[SAFETENSORS]:
        pol = load_policy(p)
        src = Source(p, KIND_POLICY, pol.spec, policy=pol)
    elif is_onnx_source(p):
        src = _onnx_source(p)
    else:
        raise InputError(f"unknown input type '{suffix or p.name}': give a .pt checkpoint, a .safetensors policy, "
                         "an .onnx model, a Stable-Baselines3 model .zip or a run directory", p)
    src.load_seconds = time.perf_counter() - t0
    return src


def _onnx_source(p: Path) -> Source:
    """An ONNX input: its canonical policy recovered (``importers.from_onnx``; the divisors are the
    graph's own), or, for a graph with ML-Agents' inputs and outputs that is not its export node for
    node, the spec its I/O says and why the tensors could not be recovered."""
    m, data = read_onnx(p)
    try:
        ckpt = checkpoint_from_onnx(p, m, data)
    except InputError as exc:
        return Source(p, KIND_ONNX, infer_spec(m, p), model=m, unrecovered=exc.message)
    prep = prepare_conversion(ckpt, p, lenient=True)  # the ONNX its own reference, as convert does
    pol = prep.conversion.policy
    return Source(p, KIND_ONNX, pol.spec, policy=pol, checkpoint=ckpt, model=m, prepared=prep)


def make_feed(src: Source, obs: str = "random", rows: int = 1, seed: int = 0) -> Dict[str, np.ndarray]:
    """``obs``: ``random`` (seeded, at the normalizer's scale), ``zeros``, ``probes`` (verify's
    seeded probes incl. clip-hitting outliers) or a path to a .npy/.npz/.json file."""
    if rows < 1:
        raise InputError(f"--rows must be at least 1, got {rows}")
    if obs == "random":
        feed = random_obs(src.obs_scale(), rows, seed, [src.spec.obs_shape(i) for i in range(src.spec.obs_count)])
    elif obs == "zeros":
        feed = zeros_obs(src.spec, rows)
    elif obs == "probes":
        return make_probes(src.probe_policy(), rows=rows, seed=seed)
    else:
        feed = read_obs_file(src.spec, obs)
    return complete_feed(src.spec, feed)


# --- runners (runtime/) -------------------------------------------------------------------
def make_runner(src: Source, device: str = "cpu", dtype: str = "float32", runtime: str = "auto") -> Runner:
    """A runtime runner for ``src``: torch eager for a policy, onnxruntime for an ONNX (``runtime``
    forces one; onnxruntime on a policy runs the ONNX rebuilt from it, torch on an ONNX the module
    built from the tensors recovered from it)."""
    if runtime == "auto":
        runtime = RUNTIME_ORT if src.kind == KIND_ONNX else RUNTIME_TORCH
    if runtime == RUNTIME_TORCH:
        src.require_tensors("the torch runtime")
        if dtype not in DTYPES:
            raise DeviceError(f"unknown dtype '{dtype}': choose float32, float16 or bfloat16")
        return ModuleRunner.build(src.policy, device, dtype)
    if runtime == RUNTIME_ORT:
        if dtype != "float32":
            what = "an ONNX input in onnxruntime" if src.kind == KIND_ONNX else "the onnxruntime runtime"
            how = ("--runtime torch casts the canonical tensors recovered from it" if src.has_tensors else
                   "casting needs canonical tensors (use the torch runtime on the .pt or .safetensors)")
            raise DeviceError(f"--dtype {dtype} is not available for {what}: the ONNX is float32; {how}", src.path)
        return OrtRunner(src.reference_onnx(), device, spec=src.spec, path=src.path)
    raise InputError(f"unknown runtime '{runtime}': choose torch, onnxruntime or auto")


def devices_present() -> List[str]:
    """cpu, each CUDA device, and NPUs (torch_npu is imported only where it is installed)."""
    return available_devices()


def to_jsonable(o):
    if isinstance(o, dict):
        return {str(k): to_jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [to_jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return to_jsonable(o.tolist())
    if isinstance(o, (np.floating, float)):
        f = float(o)
        return f if np.isfinite(f) else str(f)
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, Path):
        return str(o)
    return o
