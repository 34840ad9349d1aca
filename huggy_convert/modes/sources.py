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

import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..blocks.attention import OBS_ENTITY
from ..blocks.visual import OBS_VISUAL
from ..converter import Checkpoint, load_checkpoint, load_policy
from ..converter.reference import read_onnx
from ..core.artifacts import SAFETENSORS, SUFFIXES
from ..core.files import load_npz, read_input_file
from ..core.policy import Policy
from ..core.spec import OBS_VECTOR, PolicySpec
from ..errors import DeviceError, InputError, UnsupportedError, describe
from ..exporters.devices import DTYPES, available_devices
from ..exporters.onnx_export import build_onnx
from ..importers import is_onnx_source
from ..importers.from_onnx import checkpoint_from_onnx, infer_spec
from ..pipeline import Prepared, default_reference, prepare_conversion
from ..batch.rundir import STATUS_KEY, discover, newest_checkpoint
from ..runtime import ModuleRunner, OrtRunner, Runner, complete_feed, make_probes, random_obs, zeros_obs

KIND_CHECKPOINT, KIND_POLICY, KIND_ONNX = "checkpoint", "policy", "onnx"
RUNTIME_TORCH, RUNTIME_ORT = "torch", "onnxruntime"
CONSTANT_OUTPUTS = (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_DISC_SHAPE)
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


# --- ONNX reading ------------------------------------------------------------------------
def load_onnx(path):
    """An ML-Agents policy ONNX, read and validated (``converter.reference.read_onnx``)."""
    return read_onnx(path)[0]


class OnnxView:
    """What an ML-Agents-shaped ONNX says about itself: I/O, constants, folded normalizer."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.model = model
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.alias: Dict[str, str] = {}
        for n in g.node:
            if n.op_type == "Identity" and n.input[0] in self.inits:
                self.alias[n.output[0]] = n.input[0]
        self.consumers: Dict[str, List] = {}
        for n in g.node:
            for x in n.input:
                self.consumers.setdefault(x, []).append(n)
        self.producer = {o: n for n in g.node for o in n.output}
        self._np = numpy_helper.to_array
        init_names = set(self.inits)
        self.inputs = [(i.name, [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim])
                       for i in g.input if i.name not in init_names]
        self.outputs = [o.name for o in g.output]
        self.opset = {o.domain or "": o.version for o in model.opset_import}.get("", 0)

    def tensor(self, name: str) -> Optional[np.ndarray]:
        name = self.alias.get(name, name)
        t = self.inits.get(name)
        if t is not None:
            return self._np(t)
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return self._np(a.t)
        return None

    def output_constant(self, out: str) -> Optional[np.ndarray]:
        n = self.producer.get(out)
        if n is not None and n.op_type == "Identity":
            return self.tensor(n.input[0])
        return None

    def obs_scale(self, i: int) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(running_mean, folded divisor) of observation ``i``: Sub(obs_i, mean) -> Div(., D)."""
        name = C.OBS_INPUT.format(i=i)
        for n in self.consumers.get(name, []):
            if n.op_type == "Sub" and n.input[0] == name:
                mean = self.tensor(n.input[1])
                for d in self.consumers.get(n.output[0], []):
                    if d.op_type == "Div":
                        return mean, self.tensor(d.input[1])
        return None, None

    def parameter_counts(self) -> Tuple[int, int]:
        """(linear layers incl. LSTM and convolutions, + log_sigma) from the graph's Gemm/LSTM/MatMul/Conv/Add initializers
        (a Linear on a 3-D input is a MatMul and an Add of its bias; the other Add of an initializer
        is PPO's log_sigma; the 0-d exponents of 0.30's Pow are no parameters)."""
        lin, sig = 0, 0
        for n in self.model.graph.node:
            if n.op_type in ("Gemm", "LSTM", "MatMul", "Conv"):
                size = sum(int(t.size) for t in (self.tensor(x) for x in n.input[1:4] if x) if t is not None)
                if C.SCOPE_LOG_SIGMA_MARK in n.name or (n.op_type == "Gemm" and C.SCOPE_LOG_SIGMA_MARK in n.input[1]):
                    sig += size
                else:
                    lin += size
            elif n.op_type == "Add":
                after_matmul = any(getattr(self.producer.get(x), "op_type", "") == "MatMul" for x in n.input)
                for x in n.input:
                    t = self.tensor(x) if (self.alias.get(x, x) in self.inits) else None
                    if t is not None and (after_matmul or C.SCOPE_BODY_MARK in n.name):
                        lin += int(t.size)  # a Linear's bias on a 3-D input; a generated layer's (goal)
                    elif t is not None:
                        sig += int(t.size)
        return lin, lin + sig


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
    if suffix in CKPT_SUFFIXES:
        ckpt = load_checkpoint(p)
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
                         "an .onnx model or a run directory", p)
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


# --- observations ------------------------------------------------------------------------
def _as_rows(a, dims, name: str, path: Path, what: str = "") -> np.ndarray:
    """``a`` as float32 rows of ``dims`` (an int: a vector's width); one row may come without its
    batch axis. A wrong shape is one line naming the input, the shape given and the one expected."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    try:
        a = np.asarray(a, dtype=np.float32)
    except (TypeError, ValueError):
        raise InputError(f"'{name}' is not a numeric array", path) from None
    if a.ndim == len(dims):
        a = a.reshape((1,) + a.shape)
    if a.shape[1:] != dims or a.shape[0] == 0:
        raise InputError(f"'{name}' has shape {list(a.shape)}, expected [rows, {', '.join(map(str, dims))}]"
                         + (f" ({what})" if what else ""), path)
    return np.ascontiguousarray(a)


def _describe_input(spec: PolicySpec, i: int, given=None) -> str:
    """What observation ``i`` is, for an input-shape error (``given``: the shape given, to recognise an
    image in HWC where NCHW belongs)."""
    shape = spec.obs_shape(i)
    if spec.obs_kind(i) == OBS_VISUAL:
        c, h, w = shape
        hint = ""
        if given is not None and tuple(given[-3:]) == (h, w, c) and (h, w, c) != (c, h, w):
            hint = ": this one is HWC (channels last), transpose it to NCHW, e.g. x.transpose(0, 3, 1, 2)"
        elif given is not None and len(given) in (3, 4) and tuple(given[-3:]) != (c, h, w):
            hint = f": a {'x'.join(map(str, given[-3:]))} image is not this policy's {c}x{h}x{w}"
        return (f"a camera of {c} channels, {h}x{w} pixels, fed channels first (NCHW) as Unity feeds it, "
                f"to a {spec.vis_encode_type} encoder{hint}")
    if spec.obs_kind(i) == OBS_ENTITY:
        return (f"a variable-length observation: up to {shape[0]} entities of {shape[1]} features; an entity "
                f"whose squared features sum below {C.ENTITY_MASK_BELOW} is padding")
    return ""


def _split_flat(spec: PolicySpec, a, path: Path) -> Dict[str, np.ndarray]:
    other = [i for i in range(spec.obs_count) if spec.obs_kind(i) != OBS_VECTOR]
    if other:
        i = other[0]
        raise InputError(f"one flat array cannot hold {C.OBS_INPUT.format(i=i)} "
                         f"[rows, {', '.join(map(str, spec.obs_shape(i)))}] ({_describe_input(spec, i)}): give an .npz "
                         "(or a JSON object) with one array per input", path)
    total = spec.obs_total
    arr = _as_rows(a, total, "observations", path) if np.asarray(a).ndim <= 2 else None
    if arr is None:
        raise InputError(f"observations must be [rows, {total}]", path)
    out, start = {}, 0
    for i, n in enumerate(spec.obs_sizes):
        out[C.OBS_INPUT.format(i=i)] = np.ascontiguousarray(arr[:, start:start + n])
        start += n
    return out


def _named(spec: PolicySpec, d: Dict[str, object], path: Path) -> Dict[str, np.ndarray]:
    names = spec.input_names()
    unknown = [k for k in d if k not in names]
    if unknown:
        raise InputError(f"unknown input '{unknown[0]}' (the policy takes {', '.join(names)})", path)
    out = {}
    for i in range(spec.obs_count):
        k = C.OBS_INPUT.format(i=i)
        if k not in d:
            raise InputError(f"missing input '{k}'", path)
        out[k] = _as_rows(d[k], spec.obs_shape(i), k, path, _describe_input(spec, i, np.shape(d[k])))
    if C.ACTION_MASKS in d:
        out[C.ACTION_MASKS] = _as_rows(d[C.ACTION_MASKS], spec.discrete_total, C.ACTION_MASKS, path)
    if C.RECURRENT_IN in d:
        m = np.asarray(d[C.RECURRENT_IN], np.float32)
        out[C.RECURRENT_IN] = m.reshape(m.shape[0] if m.ndim > 1 else 1, 1, spec.memory_size)
    rows = {v.shape[0] for v in out.values()}
    if len(rows) != 1:
        raise InputError(f"inputs disagree on the number of rows: {sorted(rows)}", path)
    return out


def obs_feed(spec: PolicySpec, obs, path=None) -> Dict[str, np.ndarray]:
    """Observations given in memory, checked as an observation file's are: a dict by input name (masks and
    memories may come with them), one array per observation (a list or tuple of arrays), or one array of
    rows of the observations' concatenation; one row may come without its batch axis."""
    if isinstance(obs, dict):
        return _named(spec, obs, path)
    if isinstance(obs, (list, tuple)) and obs and all(isinstance(o, np.ndarray) for o in obs):
        if len(obs) != spec.obs_count:
            raise InputError(f"{len(obs)} observation arrays for a policy of {spec.obs_count} observations "
                             f"({', '.join(spec.input_names()[:spec.obs_count])})", path)
        return _named(spec, {C.OBS_INPUT.format(i=i): o for i, o in enumerate(obs)}, path)
    return _split_flat(spec, obs, path)


def read_obs_file(spec: PolicySpec, path) -> Dict[str, np.ndarray]:
    """.npy (rows x obs width; several observations: their concatenation), .npz (arrays by input
    name) or .json (a list of rows, or an object by input name)."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such observation file", p)
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            return _split_flat(spec, np.load(io.BytesIO(read_input_file(p, "observation file")), allow_pickle=False), p)
        if suffix == ".npz":
            return _named(spec, load_npz(p, "observation file"), p)
        if suffix == ".json":
            doc = json.loads(read_input_file(p, "observation file").decode("utf-8"))
            if isinstance(doc, dict):
                return _named(spec, doc, p)
            return _split_flat(spec, doc, p)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"not a readable observation file ({describe(exc, 120)})", p) from None
    raise InputError(f"unknown observation file type '{suffix}': give .npy, .npz or .json", p)


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
