"""Run the checks over a set of artifacts and build the report (plus the golden I/O file)."""
from __future__ import annotations

import difflib
import io
import json
import os
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx

from .. import contract as C
from ..converter import Checkpoint
from ..converter.policy_file import loads
from ..converter.reference import describe as describe_divisor
from ..converter.reference import divisor_record, official_divisors
from ..core.artifacts import BUILT, GOLDEN, ONNX, PT2, REPORT, SAFETENSORS, ArtifactSet, sha256_bytes
from ..core.bounds import PRECISIONS
from ..core.files import atomic_write_bytes, load_npz, read_input_file
from ..core.numerics import same_arrays
from ..core.policy import Policy
from ..core.version import __version__
from ..errors import HuggyError, InputError, describe
from ..exporters.devices import NPU, available_devices, device_name, resolve_device, torch_npu_installed
from ..exporters.onnx_export import build_onnx, model_bytes, with_noise_input
from ..exporters.pt2 import EXPORT_GATE, program_bytes
from ..exporters.torch_module import build_module
from ..host import describe as describe_host
from ..host import host_info, same_arithmetic
from ..runtime import (INTRA_OP_THREADS, VERIFY_THREADS, OrtRunner, ProgramRunner, cann_available, module_runner,
                       ort_run, ort_session, torch_threads)
from ..runtime.feeds import make_noise, make_probes
from . import checks as K
from .bounds import Float64Policy, Reference as Ref64, within_both
from .report import FAIL, PASS, SKIP, WARN, Check, Report

GOLDEN_IN, GOLDEN_OUT, GOLDEN_NOISE, GOLDEN_NOISED = "in.", "out.", "noise", "noised." + C.OUT_CONT
GOLDEN_HOST = "host"  # JSON of host.host_info() where the golden outputs were computed


@dataclass
class VerifyOptions:
    rows: int = 64
    seed: int = 0
    devices: Optional[Sequence[str]] = None  # None: every device present
    dtypes: Sequence[str] = ("float32", "float16", "bfloat16")
    atol: Dict[str, float] = field(default_factory=dict)
    cosine: Dict[str, float] = field(default_factory=dict)
    rtol: Dict[str, float] = field(default_factory=dict)
    fingerprint_steps: Sequence[int] = (64, 128)
    include_npu: Optional[bool] = None  # None: NPUs where torch_npu is installed
    program_load: bool = True  # run the .pt2 through torch.export.load (False: check 6 compares its bytes only)


TOLERANCE_OPTIONS = (("--atol", "atol"), ("--rtol", "rtol"), ("--cosine", "cosine"))


def named_tolerances(o: Optional[VerifyOptions]) -> List[tuple]:
    """(option, output, value) of each per-output ``--atol/--rtol/--cosine OUTPUT:VALUE`` (``*`` left out)."""
    if o is None:
        return []
    return [(opt, name, v) for opt, attr in TOLERANCE_OPTIONS for name, v in (getattr(o, attr, None) or {}).items()
            if name != "*"]


def check_tolerance_outputs(o: Optional[VerifyOptions], policies: Sequence[tuple]) -> List[str]:
    """Every output a tolerance option names (``--atol/--rtol/--cosine OUTPUT:VALUE``) is an output of at
    least one of ``policies`` ((subject, PolicySpec) pairs: their ``io_signature`` gives the names), else an
    ``InputError`` (exit 2) naming the outputs there are; ``*`` is every output. One policy (a conversion):
    a name that is not its own is refused, whatever other policies have; several (a batch, ``verify OUT/``):
    refused when it names an output of none of them. The callers run it before anything is written.
    Returns a warning for each name that is an output of some of the policies only, saying which not."""
    named = named_tolerances(o)
    if not named or not policies:
        return []
    groups: Dict[tuple, List[str]] = {}
    for subject, spec in policies:
        groups.setdefault(tuple(spec.output_names()), []).append(str(subject))
    known = [n for outs in groups for n in outs]
    bad = [(opt, name, v) for opt, name, v in named if name not in known]
    if not bad:
        warn = []
        for opt, name, _ in named:
            without = [sub for outs, subs in groups.items() if name not in outs for sub in subs]
            if without:
                warn.append(f"{opt} {name}: an output of {len(policies) - len(without)} of the {len(policies)} "
                            f"policies, not of {', '.join(without[:3])}{' …' if len(without) > 3 else ''}: "
                            "applied where it is one")
        return warn
    opt, name, v = bad[0]
    close = difflib.get_close_matches(name, list(dict.fromkeys(known)), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""

    def who(subjects):
        return subjects[0] + (f" and {len(subjects) - 1} more" if len(subjects) > 1 else "")

    if len(policies) == 1:
        what = f"not an output of {policies[0][0]}{hint}; its outputs: {', '.join(known)}"
    else:
        listed = "; ".join(f"{', '.join(outs)} ({who(subs)})" for outs, subs in groups.items())
        what = f"an output of none of the {len(policies)} policies{hint}; their outputs: {listed}"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise InputError(f"{opt} {name}:{v:g}{more}: {what}, or * for all")


def environment(devices: Sequence[str]) -> Dict[str, object]:
    import onnxruntime
    import safetensors
    import torch

    return {
        "huggy_convert": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__, "safetensors": safetensors.__version__,
        "execution_provider": "CPUExecutionProvider", "ort_intra_op_threads": INTRA_OP_THREADS,
        "ort_inter_op_threads": 1, "torch_threads": torch.get_num_threads(),
        "devices": {d: device_name(d) for d in devices}, "host": host_info(),
    }


def load_golden(path, spec=None, data: Optional[bytes] = None) -> Dict[str, Dict[str, np.ndarray]]:
    """A golden file's arrays (``core.files.load_npz``: no pickle, bounded; ``InputError``; ``data``: its
    bytes, already read), holding what check 3 reads from it for ``spec``'s policy: each input in its
    shape, one row count, the deterministic outputs, and for continuous actions the injected noise and
    the outputs it gave, both or neither, each of shape (rows, continuous actions). An empty ``.npz``,
    a host record that is not a JSON object, or any of the above missing or misshapen is an
    ``InputError`` too, which the verification makes its check 3's failure."""
    d = load_npz(path, "golden file", data=data)
    try:
        host = json.loads(str(d.pop(GOLDEN_HOST))) if GOLDEN_HOST in d else None
    except ValueError:
        host = None
    except RecursionError:
        raise InputError(f"golden file's {GOLDEN_HOST!r} record nests too deep", path) from None
    if host is not None and not isinstance(host, dict):
        raise InputError(f"golden file's {GOLDEN_HOST!r} record is a JSON {type(host).__name__}, not an object", path)
    g = {
        "host": host,
        "inputs": {k[len(GOLDEN_IN):]: v for k, v in d.items() if k.startswith(GOLDEN_IN)},
        "outputs": {k[len(GOLDEN_OUT):]: v for k, v in d.items() if k.startswith(GOLDEN_OUT)},
        "noise": {"probes": d[GOLDEN_NOISE]} if GOLDEN_NOISE in d else {},
        "noised": {"probes": d[GOLDEN_NOISED]} if GOLDEN_NOISED in d else {},
    }
    if not d:
        raise InputError("golden file holds no arrays", path)
    if spec is not None:
        rows = set()
        for port in spec.io_signature().inputs:
            a = g["inputs"].get(port.name)
            if a is None:
                raise InputError(f"golden file holds no input {port.name!r}", path)
            if a.ndim != len(port.dims) or any(isinstance(n, int) and n != m for n, m in zip(port.dims, a.shape)):
                raise InputError(f"golden input {port.name!r} has shape {list(a.shape)}, not {list(port.dims)}", path)
            rows.add(a.shape[0])
        if len(rows) > 1 or 0 in rows:
            raise InputError(f"golden inputs of {sorted(rows)} rows, not one count of at least 1", path)
        missing = [n for n in spec.deterministic_output_names() if n not in g["outputs"]]
        if missing:
            raise InputError(f"golden file holds no output {missing[0]!r}", path)
        if spec.continuous_size:
            want = [next(iter(rows)), spec.continuous_size]
            for name, arr in ((GOLDEN_NOISE, g["noise"]), (GOLDEN_NOISED, g["noised"])):
                if not arr:
                    raise InputError(f"golden file holds no {name!r} array (continuous actions: the injected "
                                     f"noise and its outputs, {GOLDEN_NOISE!r} and {GOLDEN_NOISED!r}, go together)",
                                     path)
                if list(arr["probes"].shape) != want or arr["probes"].dtype.kind != "f":
                    raise InputError(f"golden {name!r} is {arr['probes'].dtype} of shape {list(arr['probes'].shape)},"
                                     f" not float of {want}", path)
    return g


def golden_bytes(feed, outputs, noise=None, noised=None) -> bytes:
    arrays = {GOLDEN_IN + k: v for k, v in sorted(feed.items())}
    arrays.update({GOLDEN_OUT + k: v for k, v in sorted(outputs.items()) if k not in K.STOCHASTIC_OUTPUTS})
    if noise is not None:
        arrays[GOLDEN_NOISE] = noise
        arrays[GOLDEN_NOISED] = noised
    arrays[GOLDEN_HOST] = np.array(json.dumps(host_info(), sort_keys=True))  # a str array: no pickle
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _ml_agents_golden(official_path: Optional[Path]) -> Optional[Dict[str, np.ndarray]]:
    """Golden inputs written beside an official ONNX (``<stem>.golden.npz``: inputs under their names)."""
    if official_path is None:
        return None
    p = official_path.with_suffix(".golden.npz")
    if not p.is_file():
        return None
    return load_npz(p, "golden file")


def _with_divisors(policy: Policy, divisors: Dict[int, np.ndarray]) -> Policy:
    """``policy`` dividing by ``divisors`` (the official ONNX's) instead of its own."""
    tensors = dict(policy.tensors)
    for i, d in divisors.items():
        if C.c_divisor(i) in tensors and tensors[C.c_divisor(i)].shape == d.shape:
            tensors[C.c_divisor(i)] = d
    return replace(policy, tensors=tensors)


def _once(seen: list, session, feed):
    """``ort_run(session, feed)``, once per feed (``seen``: the feeds run so far, with their outputs):
    checks 3 and 4 and the golden file run one session on the same probes; they share its outputs
    (a CPU session on one thread gives the same bytes for the same input: check 5 runs every row
    twice to prove it)."""
    for f, out in seen:
        if same_arrays(f, feed):
            return out
    out = ort_run(session, feed)
    seen.append((dict(feed), out))
    return out


def _without_noise(ref):
    """A float64 reference run with injected noise, as the forward without it: ``continuous_actions``
    (the one output the noise enters) left out."""
    return Ref64({k: v for k, v in ref.values.items() if k != C.OUT_CONT},
                 {k: v for k, v in ref.bounds.items() if k != C.OUT_CONT}, ref.logits, ref.precision)


class Context:
    """What checks 2-4 share for one policy: the rebuilt ONNX's sessions, the feeds (seeded probes,
    plus the golden inputs ML-Agents' generator wrote beside an official file), the injected noise,
    the reference outputs (onnxruntime on the official file, or a golden file) and the float64
    references (bounds.Float64Policy, weights prepared once; one forward per role and feed). The roles:
    ``ours`` (the policy), ``official`` (the policy dividing by the official ONNX's divisors: the
    same policy unless ``--divisor ieee`` kept IEEE against an official 1 ulp away)."""

    def __init__(self, policy: Policy, rebuilt: onnx.ModelProto, o: "VerifyOptions", data: Optional[bytes] = None):
        spec = policy.spec
        self.policy, self.o, self.onnx_data = policy, o, data
        self.ours_sess = ort_session(data if data is not None else model_bytes(rebuilt))
        self.ours_noise = ort_session(model_bytes(with_noise_input(rebuilt))) if spec.continuous_size else None
        noise = make_noise(policy, o.rows, o.seed) if spec.continuous_size else None
        self.feeds = {"probes": make_probes(policy, o.rows, o.seed)}
        self.noises = {"probes": noise} if noise is not None else {}
        self.ref_name = None
        self.official: Optional[onnx.ModelProto] = None
        self.run_ref = self.run_ref_noise = self.fallback = None
        self.policies = {"ours": policy, "official": policy}
        self._prepared: Dict[str, Float64Policy] = {}
        self._refs: Dict[tuple, object] = {}
        self._outputs: Dict[str, list] = {}  # session -> [(feed, outputs)]: each feed run once (_once)
        self.rebuilt = rebuilt

    @property
    def divisors_differ(self) -> bool:
        """The official ONNX divides by other divisors than the policy (1 ulp apart, by request)."""
        return self.policies["official"] is not self.policy

    def run_ours(self, feed):
        return _once(self._outputs.setdefault("ours", []), self.ours_sess, feed)

    def run_ours_noise(self, feed):
        return _once(self._outputs.setdefault("ours_noise", []), self.ours_noise, feed)

    def run_ours_row(self, feed):
        """The rebuilt ONNX's session on ``feed``, run each call (the fingerprints' rows)."""
        return ort_run(self.ours_sess, feed)

    def prepared(self, role: str) -> Float64Policy:
        if role not in self._prepared:
            pol = self.policies[role]
            same = next((r for r, p in self.policies.items() if p is pol and r in self._prepared), None)
            self._prepared[role] = self._prepared[same] if same else Float64Policy(pol)
        return self._prepared[role]

    def reference(self, role: str, feed_name: str, with_noise: bool = False, dtype: str = "float32"):
        """The float64 reference of ``role`` on feed ``feed_name`` (with its injected noise), its bounds
        derived for a runtime in ``dtype`` (float32; float16 and bfloat16 only when a module of that
        dtype is checked). A feed with noise runs one forward for both: the injected noise enters
        ``continuous_actions`` only, every other output and bound is the forward's without it
        (``_without_noise``)."""
        prep = self.prepared(role)
        key = (prep, feed_name, with_noise, dtype)
        if key not in self._refs:
            p = PRECISIONS[dtype]
            noise = self.noises.get(feed_name)
            if noise is None:
                self._refs[key] = prep.forward(self.feeds[feed_name], precision=p)
            else:
                full = prep.forward(self.feeds[feed_name], noise, precision=p)
                self._refs[(prep, feed_name, True, dtype)] = full
                self._refs[(prep, feed_name, False, dtype)] = _without_noise(full)
        return self._refs[key]

    def values32(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """``Float64Policy.values32`` of the policy on ``feed`` (the reference fingerprint): the values of
        a forward already run on a bitwise-equal feed (a batch's 16 probe rows are its 16-step
        fingerprint's; the bounds never enter the values), else a forward of the values alone."""
        prep = self.prepared("ours")
        for (p, name, *_), ref in self._refs.items():
            if p is prep and same_arrays(self.feeds[name], feed):
                return {k: (v.astype(np.float32) if v.dtype.kind == "f" else v)
                        for k, v in ref.values.items() if k != C.OUT_CONT}
        return prep.values32(feed)

    def judge_pair(self, role_a: str, role_b: str):
        """check_outputs' fallback: two float32 results of the roles' references, by the derived bound."""
        def judge(feed_name, feed, name, a, b):
            w = name == C.OUT_CONT
            return within_both(self.reference(role_a, feed_name, w), self.reference(role_b, feed_name, w), name, a, b)
        return judge

    def use_official(self, official: onnx.ModelProto, official_path: Optional[Path], subject: str,
                     bitwise: bool = False) -> List[Check]:
        """Check 2 against ``official``, and its sessions as the reference of check 3 (``bitwise``: no
        derived-bound fallback for divisors 1 ulp apart)."""
        policy, spec, out = self.policy, self.policy.spec, []
        self.official = official
        self.ref_name = f"official {official_path.name if official_path else 'ONNX'}"
        out.append(K.check_onnx_structure(self.rebuilt, official, subject, self.ref_name, policy=policy))
        theirs = _with_divisors(policy, official_divisors(official)) if spec.normalize else policy
        if any(theirs.tensors[k].tobytes() != policy.tensors[k].tobytes() for k in policy.tensors):
            self.policies["official"] = theirs
            if not bitwise:
                self.fallback = ("the divisors differ by 1 ulp: --divisor ieee", self.judge_pair("ours", "official"))
        try:
            off_sess = ort_session(official.SerializeToString())
            off_noise = ort_session(with_noise_input(official).SerializeToString()) if spec.continuous_size else None
            ran, ran_noise = [], []  # (the closures hold no reference to self: no cycle keeps a Context alive)
            self.run_ref = lambda name, feed: _once(ran, off_sess, feed)  # noqa: E731
            self.run_ref_noise = (lambda name, feed: _once(ran_noise, off_noise, feed)) if off_noise else None  # noqa: E731
        except Exception as exc:
            out.append(Check("3 outputs", FAIL, f"official ONNX does not run in onnxruntime: {describe(exc)}",
                             id="outputs"))
            return out
        mlg = _ml_agents_golden(official_path)
        if mlg is not None:
            names = [i.name for i in off_sess.get_inputs()]
            if all(n in mlg for n in names):
                self.feeds["golden (ML-Agents)"] = {n: mlg[n] for n in names}
                if self.noises:
                    rows = mlg[names[0]].shape[0]
                    self.noises["golden (ML-Agents)"] = make_noise(policy, rows, self.o.seed + 1)
        return out

    def use_golden(self, golden: Dict, golden_path: Path, here: Dict, notes: List[str]) -> None:
        """The golden file written at conversion as the reference of check 3 (no official ONNX)."""
        self.ref_name = f"golden outputs ({Path(golden_path).name})"
        gh = golden["host"]
        if gh is None:
            notes.append("no official ONNX: outputs compared with the golden file written at conversion "
                         "(it does not say which host wrote it)")
        elif same_arithmetic(gh, here):
            notes.append("no official ONNX: outputs compared with the golden file written at conversion on this host")
        else:
            notes.append(f"no official ONNX: the golden file was written on another host ({describe_host(gh)}); "
                         f"this is {describe_host(here)}: outputs that are not bitwise are judged by the derived bound")
        if gh is None or not same_arithmetic(gh, here):
            self.fallback = ("golden written on another host" if gh is not None else "golden of an unknown host",
                             self.judge_pair("ours", "ours"))
        self.feeds = {"golden": golden["inputs"]}
        self.noises = {"golden": golden["noise"]["probes"]} if golden["noise"] else {}
        self.run_ref = lambda name, feed: golden["outputs"]  # noqa: E731
        if golden["noised"]:
            self.run_ref_noise = lambda name, feed: {C.OUT_CONT: golden["noised"]["probes"]}  # noqa: E731

    def check_outputs(self) -> Check:
        """Check 3: the rebuilt ONNX against the reference, in onnxruntime."""
        if self.run_ref is None:
            return Check("3 outputs", SKIP, "no reference outputs (no official ONNX, no golden file)", id="outputs")
        return K.check_outputs(self.run_ours, self.run_ref, self.run_ours_noise if self.ours_noise else None,
                               self.run_ref_noise, self.feeds, self.noises, self.policy, self.ref_name, self.fallback)


def compare_with_official(policy: Policy, rebuilt: onnx.ModelProto, official: onnx.ModelProto,
                          official_path: Optional[Path] = None, options: Optional["VerifyOptions"] = None,
                          subject: str = "", bitwise: bool = False) -> List[Check]:
    """Checks 2 and 3 of :func:`verify` against one official ONNX: what ``onnx-compare`` and ``export``
    report, so every command reaches the same verdict on the same pair."""
    ctx = Context(policy, rebuilt, options or VerifyOptions())
    out = ctx.use_official(official, official_path, subject, bitwise)
    if not any(c.id == "outputs" for c in out):
        out.append(ctx.check_outputs())
    return out


CHECK_IDS = ("safetensors", "official", "outputs", "runtimes", "fingerprints", "files")  # checks 1-6
RECORDED_KINDS = (SAFETENSORS, ONNX, PT2, GOLDEN)  # the kinds a record can name (the report is the record)


@dataclass
class Reference:
    """What a policy's written files are verified against (each part optional)."""

    checkpoint: Optional[Checkpoint] = None
    official: Optional[onnx.ModelProto] = None  # the official ONNX ML-Agents wrote
    official_path: Optional[Path] = None
    golden_path: Optional[Path] = None  # golden outputs of an earlier verification (used without an official)
    # check id ("safetensors", "official") -> {"reason", "detail"}: a source the conversion used that a
    # re-verification could not use (not found, or its sha256 differs): that check is reported not run
    not_run: Dict[str, Dict[str, str]] = field(default_factory=dict)


@dataclass
class Record:
    """What ``<stem>.verify.json`` says its conversion wrote and read (``Report.recorded``), as read back by a
    re-verification. ``artifacts``: kind -> sha256 of each file written (the golden file included; from an
    older report, check 6's figures); ``sources``: "checkpoint"/"official" -> {path, relative, sha256} or None
    (an empty dict: not recorded); ``missing``: why there is no record ('' when there is one)."""

    artifacts: Dict[str, str] = field(default_factory=dict)
    sources: Dict[str, Optional[Dict[str, str]]] = field(default_factory=dict)
    raw: Dict = field(default_factory=dict)  # the report's "recorded" object, kept in the rewritten report
    missing: str = ""
    damaged: str = ""  # the report is there but does not read


def source_record(path, sha256: str, folder) -> Dict[str, Optional[str]]:
    """A source as ``verify.json`` records it: its absolute path, its path relative to ``folder`` (the
    artifacts': found again when both trees moved together) and its sha256."""
    p = Path(os.path.abspath(path))
    try:
        rel = os.path.relpath(p, os.path.abspath(folder))
    except ValueError:  # another drive (Windows)
        rel = None
    return {"path": str(p), "relative": rel, "sha256": sha256}


def _source_entry(src) -> bool:
    """A well-formed record of a source (``source_record``): its sha256, and where it was (a path, a
    relative path or both, each a string or null)."""
    where = [src.get(k) for k in ("path", "relative")] if isinstance(src, dict) else []
    return (isinstance(src, dict) and isinstance(src.get("sha256"), str)
            and all(w is None or isinstance(w, str) for w in where) and any(isinstance(w, str) for w in where))


def read_record(artifacts: ArtifactSet) -> Record:
    """The record in the report beside the files (``<stem>.verify.json``), if any."""
    name = artifacts.name(REPORT)
    if not os.path.lexists(artifacts.path(REPORT)):
        return Record(missing=f"no {name}")
    try:
        rep = json.loads(artifacts.read(REPORT))
        if not isinstance(rep, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Record(missing=f"{name} does not read", damaged=f"{name} does not read ({why})")
    raw = rep.get("recorded")
    arts, sources, malformed = {}, {}, []
    if isinstance(raw, dict):
        recorded_arts = raw.get("artifacts") or {}
        for kind, a in (recorded_arts.items() if isinstance(recorded_arts, dict) else ()):
            if isinstance(a, dict) and isinstance(a.get("sha256"), str):
                arts[str(kind)] = a["sha256"]
        recorded_sources = raw.get("sources") or {}
        if not isinstance(recorded_sources, dict):
            malformed.append("sources")
            recorded_sources = {}
        for role, src in recorded_sources.items():
            if src is None:  # a real null: the conversion had no such source
                sources[str(role)] = None
            elif _source_entry(src):
                sources[str(role)] = src
            else:  # not a record of what it read: that check is not run (never taken for "none")
                malformed.append(str(role))
    else:
        raw = {}
        arts = _recorded_written(rep) or {}
    if malformed:
        missing = f"{name}'s record of its {', '.join(malformed)} is malformed"
    else:
        missing = "" if sources else f"{name} records no sources (written before huggy-convert recorded them)"
    return Record(arts, sources, raw, missing)


def locate_source(rec: Dict[str, str], folder) -> tuple:
    """(the path of the recorded source, its bytes, '', '') where a file with its recorded sha256 is there,
    else (None, None, what happened: 'not found' / 'changed since the conversion' / 'cannot be read', the
    detail): its path relative to ``folder`` first (both trees moved together), then its absolute path.
    A file there with another sha256 is never used. (Read once, by ``read_input_file``: a regular file
    within the size bound.)"""
    candidates = []
    if rec.get("relative"):
        candidates.append(Path(folder) / rec["relative"])
    if rec.get("path"):
        candidates.append(Path(rec["path"]))
    other = None
    for c in candidates:
        try:
            if not os.path.lexists(c):
                continue
            data = read_input_file(c, "source")
        except (OSError, HuggyError) as exc:
            why = exc.message if isinstance(exc, HuggyError) else exc.strerror or type(exc).__name__
            other = other or ("cannot be read", f"{c}: {why}")
            continue
        sha = sha256_bytes(data)
        if sha == rec["sha256"]:
            return c, data, "", ""
        other = other or ("changed since the conversion", f"{c}: sha256 {sha[:12]}…, recorded {rec['sha256'][:12]}…")
    if other is not None:
        return (None, None) + other
    return None, None, "not found", f"recorded at {rec.get('path') or rec.get('relative')}, sha256 {rec['sha256'][:12]}…"


def _recorded_written(rep: Dict) -> Optional[Dict[str, str]]:
    """The sha256 of each file as its conversion wrote it, from an older report (``rep``, parsed) that
    records them in check 6's figures only."""
    try:
        c = next(c for c in rep.get("checks", []) if c.get("id") == "files")
        w = (c.get("figures") or {}).get("written")
        return {str(k): str(v) for k, v in w.items()} if isinstance(w, dict) else None
    except (OSError, ValueError, StopIteration, AttributeError, TypeError):
        return None


def check_files(artifacts: ArtifactSet, files: Dict[str, bytes], policy: Policy, rebuilt: onnx.ModelProto,
                written: Optional[Dict[str, str]], regenerate: Sequence[str], writer=None,
                written_bytes: Optional[Dict[str, bytes]] = None, unreadable: Optional[Dict[str, str]] = None,
                damaged_record: str = "") -> Check:
    """Check 6: the written files (``files``: kind -> the bytes read back) are the bytes their
    conversion wrote (``written``: sha256 per kind, given by the conversion or recorded in the earlier
    report) and the kinds in ``regenerate`` (``.onnx``, ``.pt2``) are exactly what the policy read back
    from the ``.safetensors`` gives. A kind in ``written`` that is not in ``files`` fails: missing, or
    (``unreadable``: kind -> why) there but not readable; ``damaged_record``: the report that should hold
    the record does not read (a failure too). ``written_bytes``: the bytes the conversion wrote, where it
    still has them (``written`` their sha256): a file read back equal to them, byte for byte, has their
    sha256 without hashing it again."""
    c = Check("6 files", id="files")
    found: Dict[str, str] = {}
    if damaged_record:
        c.add(Check(artifacts.name(REPORT), FAIL, f"{damaged_record}: its record of the files written is lost"))
    for kind, why in (unreadable or {}).items():
        if kind not in files:
            c.add(Check(artifacts.name(kind), FAIL, f"cannot be read: {why}"))
    for kind, want in (written or {}).items():
        if kind not in files and kind not in (unreadable or {}) and kind in RECORDED_KINDS:
            c.add(Check(artifacts.name(kind), FAIL, f"missing: its conversion wrote it (sha256 {want[:12]}…)"))
    for kind, data in files.items():
        name = artifacts.name(kind)
        want = (written or {}).get(kind)
        mine = (written_bytes or {}).get(kind)
        found[kind] = want if want is not None and mine is not None and mine == data else sha256_bytes(data)
        if want is not None:
            same = found[kind] == want
            c.add(Check(name, PASS if same else FAIL,
                        "bitwise the bytes its conversion wrote" if same else
                        f"changed since its conversion wrote it (sha256 {found[kind][:12]}…, written {want[:12]}…)"))
        if kind in regenerate:
            if kind == ONNX:
                opset = next((o.version for o in rebuilt.opset_import if o.domain in ("", "ai.onnx")), None)
                again = model_bytes(build_onnx(policy, opset=opset))
                what = f"build_onnx(opset {opset})"
            else:
                again = program_bytes(policy, writer)
                what = "torch.export.save"
            same = again == data
            c.add(Check(f"{name} from {artifacts.name(SAFETENSORS)}", PASS if same else FAIL,
                        f"bitwise what {what} gives for the policy in {artifacts.name(SAFETENSORS)}" if same else
                        f"NOT what {what} gives for the policy in {artifacts.name(SAFETENSORS)} "
                        f"({len(data)} bytes vs {len(again)}; first difference at byte "
                        f"{next((i for i, (x, y) in enumerate(zip(data, again)) if x != y), min(len(data), len(again)))})"))
    c.figures = {"found": found, "written": dict(written) if written else dict(found)}
    n = len(c.children)
    c.summary = (f"{sum(ch.status == PASS for ch in c.children)}/{n} file checks pass" if n else
                 "no record of the bytes written and nothing to regenerate")
    return c


def check_runtimes(ctx: Context, artifacts: ArtifactSet, devices: Sequence[str], extra_modules: Sequence = (),
                   program: Optional[bytes] = None):
    """Check 4: every float32 runtime (onnxruntime on the rebuilt and official files, the torch module on
    every device and dtype, the ``.pt2`` through ``torch.export.load``: ``program``, its bytes already
    read) against the float64 reference of the canonical tensors; returns (the check, the cpu float32
    module's runner for check 5)."""
    import torch

    policy, o, spec = ctx.policy, ctx.o, ctx.policy.spec
    feed_name = next(iter(ctx.feeds))
    feed, noise = ctx.feeds[feed_name], ctx.noises.get(feed_name)
    ref64 = ctx.reference("ours", feed_name)
    noised_feed = dict(feed, **{C.NOISE_INPUT: noise}) if noise is not None else None
    zero_feed = {k: np.zeros_like(v) for k, v in feed.items()}
    c4 = Check("4 runtimes vs the float64 reference", id="runtimes")

    def ort_check(title, run, run_noise, role):
        noised = None
        if run_noise is not None and noised_feed is not None:
            noised = (lambda: run_noise(noised_feed)[C.OUT_CONT], ctx.reference(role, feed_name, True))
        return K.check_runtime(title, run, ctx.reference(role, feed_name), feed, "float32", o.atol, o.cosine, {},
                               None, o.rtol, noised)

    def ref_for(dt):  # the reference with the bounds of a runtime in dtype (float16/bfloat16: only when checked)
        return ctx.reference("ours", feed_name, dtype=dt) if dt in PRECISIONS else ref64

    def module_check(title, mod, dt, noised=None):
        runner = module_runner(mod)
        norm = mod.pinned_dtypes() if hasattr(mod, "pinned_dtypes") else {}
        c4.add(K.check_runtime(title, runner, ref_for(dt), feed, dt, o.atol, o.cosine, norm, lambda: runner(zero_feed),
                               o.rtol, noised))
        return runner

    c4.add(ort_check("onnxruntime: rebuilt ONNX (cpu float32)", ctx.run_ours,
                     ctx.run_ours_noise if ctx.ours_noise else None, "ours"))
    if ctx.official is not None and ctx.run_ref is not None:
        c4.add(ort_check(f"onnxruntime: {ctx.ref_name} (cpu float32)", lambda f: ctx.run_ref(feed_name, f),
                         (lambda f: ctx.run_ref_noise(feed_name, f)) if ctx.run_ref_noise else None, "official"))
    cpu32 = None
    cann = any(d.split(":")[0] == NPU for d in devices) and cann_available()
    for dev in devices:
        on_npu = dev.split(":")[0] == NPU
        if on_npu and cann:  # the same file on the NPU, through onnxruntime-cann (no ATC)
            data = ctx.onnx_data if ctx.onnx_data is not None else model_bytes(ctx.rebuilt)

            def run_cann(f, dev=dev):  # one call: a failure to start is this check's failure
                return OrtRunner(data, dev, policy.spec, precision_mode=C.CANN_EP_PRECISION_DEFAULT).infer(f)

            c4.add(ort_check(f"onnxruntime: rebuilt ONNX ({dev} {C.CANN_EP}, {C.CANN_OPT_PRECISION}="
                             f"{C.CANN_EP_PRECISION_DEFAULT})", run_cann, None, "ours"))
        if on_npu and not torch_npu_installed():
            c4.add(Check(f"torch module {dev}", SKIP, "torch_npu is not installed: the NPU runs the ONNX through "
                         "onnxruntime's CANN execution provider only"))
            continue
        for dt in o.dtypes:
            try:
                mod = build_module(policy, device=dev, dtype=dt)
            except Exception as exc:
                c4.add(Check(f"torch module {dev} {dt}", FAIL, f"could not build: {exc}"))
                continue
            nz = None
            if noise is not None:
                def run_noise(mod=mod, dev=dev):
                    with torch.no_grad():
                        xs = [torch.from_numpy(feed[n]).to(dev) for n in mod.input_names]
                        return mod.sample(*xs, seed=o.seed, noise=torch.from_numpy(noise))[0].float().cpu().numpy()
                nz = (run_noise, ctx.reference("ours", feed_name, True, dt))
            runner = module_check(f"torch module {dev} {dt}", mod, dt, nz)
            if dev == "cpu" and dt == "float32":
                cpu32 = runner
    for title, mod in extra_modules:
        module_check(title, mod, str(next(mod.parameters()).dtype).replace("torch.", "") if list(mod.parameters())
                     else "float32")
    pt2_path = artifacts.path(PT2)
    if o.program_load and pt2_path.is_file():
        try:
            with EXPORT_GATE.exclusive():  # torch.export.load is not thread-safe
                prog = ProgramRunner(pt2_path, spec.input_names(), spec.deterministic_output_names(), data=program)
            c4.add(K.check_runtime(f"saved program {pt2_path.name} (cpu)", prog.infer, ref_for(prog.dtype), feed,
                                   prog.dtype, o.atol, o.cosine, prog.buffers, lambda: prog.infer(zero_feed), o.rtol))
        except HuggyError as exc:  # refused before torch.export.load (see exporters.pt2.unsafe_reason)
            c4.add(Check(f"saved program {pt2_path.name}", FAIL, exc.message))
        except Exception as exc:
            c4.add(Check(f"saved program {pt2_path.name}", FAIL,
                         f"does not load with torch.export.load: {describe(exc)}"))
    nfail = sum(1 for ch in c4.children if ch.status == FAIL)
    by_dtype: Dict[str, List[float]] = {}
    for ch in c4.children:
        if ch.figures.get("max_bound_ratio") is not None:
            by_dtype.setdefault(ch.figures.get("dtype", "float32"), []).append(ch.figures["max_bound_ratio"])
    ratios = by_dtype.get("float32", [])
    halves = {dt: max(v) for dt, v in by_dtype.items() if dt != "float32"}
    c4.summary = (f"{len(c4.children) - nfail}/{len(c4.children)} runs within bounds"
                  + (f"; float32 worst error/bound {max(ratios):.3g}" if ratios else "")
                  + "".join(f", {dt} {r:.3g}" for dt, r in halves.items())
                  + f" ({feed_name}, {int(next(iter(feed.values())).shape[0])} rows)")
    c4.figures = {"feed": feed_name, "max_bound_ratio": max(ratios) if ratios else None}
    if halves:
        c4.figures["max_bound_ratio_half"] = halves
    return c4, cpu32


def check_devices(names) -> None:
    """Every device asked for (``--verify-device``) is here, else a ``DeviceError``, before anything is
    written: torch's (``exporters.devices.resolve_device``), or for ``npu[:i]`` onnxruntime's CANN
    execution provider where onnxruntime-cann is installed (the NPU then runs the ONNX only)."""
    for name in names or ():
        name = str(name)
        if name.split(":")[0] == NPU and cann_available():
            continue
        resolve_device(name)


def check_fingerprints(ctx: Context, devices: Sequence[str], cpu32=None) -> Check:
    """Check 5: the float64 reference's fingerprint (the same on every host) and this host's runtimes,
    stable between two runs."""
    policy, o = ctx.policy, ctx.o
    c5 = Check("5 determinism fingerprints", id="fingerprints")
    cpu32 = cpu32 or module_runner(build_module(policy, "cpu", "float32"))
    fps = {}
    for steps in o.fingerprint_steps:
        probes = make_probes(policy, rows=steps, seed=o.seed)  # drawn once: every run below reads them
        f = K.reference_fingerprint(policy, steps, o.seed, ctx.prepared("ours"), probes, ctx.values32)
        a, b = (K.fingerprint(cpu32, policy, steps, o.seed, probes) for _ in range(2))
        ra, rb = (K.fingerprint(ctx.run_ours_row, policy, steps, o.seed, probes) for _ in range(2))
        fps[steps] = {"reference": f, "torch_cpu_float32": a, "onnxruntime_rebuilt": ra}
        c5.add(Check(f"{steps} steps", PASS if a == b and ra == rb else FAIL,
                     f"reference {f[:16]}… (float64, any host); this host: torch cpu {a[:12]}… "
                     f"({'stable' if a == b else 'CHANGED between runs'}), onnxruntime {ra[:12]}… "
                     f"({'stable' if ra == rb else 'CHANGED between runs'})"))
        for dev in devices:
            if dev == "cpu" or (dev.split(":")[0] == NPU and not torch_npu_installed()):  # no torch module there
                continue
            d = K.fingerprint(module_runner(build_module(policy, dev, "float32")), policy, steps, o.seed, probes)
            fps[steps][f"torch_{dev}_float32"] = d
            c5.add(Check(f"{steps} steps on {dev}", PASS if d == a else WARN,
                         f"{d[:16]}… " + ("equal to cpu" if d == a else "differs from cpu (device arithmetic differs; "
                                                                           "not a failure)")))
    c5.figures = {"fingerprints": fps}
    c5.summary = ", ".join(f"{s}: {v['reference'][:12]}" for s, v in fps.items())
    return c5


def golden_of(ctx: Context) -> bytes:
    """The golden file: the probes with the official's outputs where the rebuilt ONNX must reproduce
    them bitwise, the rebuilt's own where it divides by other divisors (--divisor ieee) or there is no
    official file."""
    feed_name = next(iter(ctx.feeds))
    feed, noise = ctx.feeds[feed_name], ctx.noises.get(feed_name)
    official = ctx.official is not None and ctx.run_ref is not None and not ctx.divisors_differ
    outputs = ctx.run_ref(feed_name, feed) if official else ctx.run_ours(feed)
    noised = None
    if noise is not None:
        noised_feed = dict(feed, **{C.NOISE_INPUT: noise})
        rn = ctx.run_ref_noise if official and ctx.run_ref_noise is not None else (lambda n, f: ctx.run_ours_noise(f))
        noised = rn(feed_name, noised_feed)[C.OUT_CONT]
    return golden_bytes(feed, outputs, noise, noised)


def verify(artifacts: ArtifactSet, reference: Optional[Reference] = None, options: Optional[VerifyOptions] = None, *,
           subject: Optional[str] = None, written: Optional[Dict[str, str]] = None, writer=None,
           golden: bool = False, extra_modules: Sequence = (), written_bytes: Optional[Dict[str, bytes]] = None,
           record: Optional[Record] = None) -> Report:
    """Verify the files of ``artifacts`` as written: the ``.safetensors`` read back (check 1 against
    the checkpoint), the ``.onnx`` read back (2: against the official ONNX; 3: its outputs against the
    official's or the golden file's), every runtime (4: onnxruntime on the file, the torch module
    built from the ``.safetensors``, the ``.pt2`` through ``torch.export.load``) against the float64
    reference of the canonical tensors, fingerprints (5), and the files themselves (6).

    ``written``: the sha256 of each file as the caller just wrote it (a conversion); without it (a
    re-verification) they are taken from the record in the report beside the files (``record``, read
    here when not given: ``read_record``), every file it records must be there with that sha256 (the
    golden file too), and the ``.onnx``/``.pt2`` are regenerated from the ``.safetensors`` and compared
    byte for byte. ``written_bytes``: the bytes behind ``written``, where the caller still has them
    (check 6 compares each file read back with them). ``golden``: put the golden
    file's bytes in ``report.golden``. ``extra_modules``: (title, module) pairs checked like the
    built ones. ``reference.not_run``: checks 1-2 reported not run (``Report.not_run``) and why.

    torch runs on ``runtime.VERIFY_THREADS`` intra-op threads throughout (``runtime.threads``: small
    forwards, fastest on one thread and unslowed by shared cores); the report's environment records
    the process's own setting."""
    o = options or VerifyOptions()
    devices = list(o.devices) if o.devices else available_devices(o.include_npu)
    rep = Report(subject=subject or f"{artifacts.stem} ({artifacts.dir})", environment=environment(devices))
    ref = reference or Reference()
    if written is None and record is None:
        record = read_record(artifacts)
    for cid, why in ref.not_run.items():
        rep.not_run.append({"check": CHECK_IDS.index(cid) + 1, "id": cid, "reason": why["reason"],
                            "detail": why.get("detail", "")})
    rep.not_run.sort(key=lambda n: n["check"])
    with torch_threads(VERIFY_THREADS):
        return _verify(rep, artifacts, ref, o, devices, written, writer, golden, extra_modules,
                       written_bytes, record)


def _not_run(ref: Reference, cid: str) -> Optional[str]:
    """The summary of a check 1-2 that a re-verification could not run (``Reference.not_run``)."""
    why = ref.not_run.get(cid)
    if why is None:
        return None
    return f"not run: {why['reason']}" + (f" ({why['detail']})" if why.get("detail") else "")


def _verify(rep: Report, artifacts: ArtifactSet, ref: Reference, o: VerifyOptions, devices: List[str],
            written: Optional[Dict[str, str]], writer, golden: bool, extra_modules: Sequence,
            written_bytes: Optional[Dict[str, bytes]] = None, record: Optional[Record] = None) -> Report:
    again = written is None  # a re-verification: what its conversion recorded must all be there
    if again:
        written = dict(record.artifacts) if record is not None and record.artifacts else None
    files: Dict[str, bytes] = {}
    unreadable: Dict[str, str] = {}
    kinds = list(BUILT) + ([GOLDEN] if again and written and GOLDEN in written else [])
    for kind in kinds:  # each file read once: what the checks below run and compare is these bytes
        if not os.path.lexists(artifacts.path(kind)):
            if kind == SAFETENSORS:
                rep.checks.append(Check("1 safetensors vs checkpoint", FAIL, f"{artifacts.name(kind)} is missing"
                                        + (" (its conversion wrote it)" if written and kind in written else ""),
                                        id="safetensors"))
                return rep
            continue
        try:
            files[kind] = read_input_file(artifacts.path(kind), artifacts.name(kind))
        except HuggyError as exc:
            if kind == SAFETENSORS:
                rep.checks.append(Check("1 safetensors vs checkpoint", FAIL, f"does not load: {exc.one_line()}",
                                        id="safetensors"))
                return rep
            unreadable[kind] = exc.message
    try:
        policy = loads(files[SAFETENSORS], artifacts.path(SAFETENSORS))
    except HuggyError as exc:
        rep.checks.append(Check("1 safetensors vs checkpoint", FAIL, f"does not load: {exc.one_line()}",
                                id="safetensors"))
        return rep
    outputs = set(policy.spec.output_names())
    for opt, name, _ in named_tolerances(o):  # a batch's option may name another policy's output
        if name not in outputs:
            rep.notes.append(f"{opt} {name}: not an output of this policy (another policy's): not applied here")
    skipped = _not_run(ref, "safetensors") if ref.checkpoint is None else None
    rep.checks.append(Check("1 safetensors vs checkpoint", SKIP, skipped, id="safetensors") if skipped else
                      K.check_safetensors(policy, ref.checkpoint, artifacts.name(SAFETENSORS)))  # 1
    if ONNX not in files:
        why = f"cannot be read: {unreadable[ONNX]}" if ONNX in unreadable else \
            "is missing" + (" (its conversion wrote it)" if written and ONNX in written else "")
        rep.checks.append(Check("2 rebuilt ONNX vs official", FAIL, f"{artifacts.name(ONNX)} {why}", id="official"))
        return rep
    try:
        onnx_data = files[ONNX]
        rebuilt = onnx.load_model_from_string(onnx_data)
    except Exception as exc:
        rep.checks.append(Check("2 rebuilt ONNX vs official", FAIL, f"{artifacts.name(ONNX)} does not load: "
                                f"{type(exc).__name__}", id="official"))
        return rep
    decision = divisor_record(policy)
    if policy.spec.normalize and decision:
        rep.notes.append(f"divisor: {describe_divisor(decision)}")

    ctx = Context(policy, rebuilt, o, onnx_data)  # 2 and the reference of 3
    if ref.official is not None:
        rep.checks.extend(ctx.use_official(ref.official, ref.official_path, rep.subject))
    else:
        golden_in = damaged = None
        if ref.golden_path and Path(ref.golden_path).is_file():
            try:
                read = files.get(GOLDEN) if Path(ref.golden_path) == artifacts.path(GOLDEN) else None
                golden_in = load_golden(ref.golden_path, policy.spec, data=read)  # the bytes check 6 vouches for
            except HuggyError as exc:  # a damaged golden file in OUT: the verdict, not bad input
                damaged = Check("3 outputs vs the reference", FAIL, f"does not load: {exc.one_line()}", id="outputs")
        if golden_in is not None:
            ctx.use_golden(golden_in, ref.golden_path, rep.environment["host"], rep.notes)
        elif damaged is None:
            rep.notes.append("no official ONNX found: verified what can be verified without one")
        skipped = _not_run(ref, "official")
        rep.checks.append(Check("2 rebuilt ONNX vs official", SKIP, skipped or "no official ONNX to compare with",
                                id="official"))
        if damaged is not None:
            rep.checks.append(damaged)
    if rep.check("outputs") is None:  # 3
        rep.checks.append(ctx.check_outputs())
    c4, cpu32 = check_runtimes(ctx, artifacts, devices, extra_modules, files.get(PT2))  # 4
    rep.checks.append(c4)
    rep.checks.append(check_fingerprints(ctx, devices, cpu32))  # 5
    # 6: the files themselves (a .pt2 that check 4 did not run: its bytes regenerated from the policy read back)
    regenerate = (ONNX, PT2) if again else () if o.program_load else (PT2,)
    rep.checks.append(check_files(artifacts, files, policy, rebuilt, written, regenerate, writer,
                                  None if again else written_bytes, unreadable,
                                  record.damaged if again and record is not None else ""))
    if golden:
        rep.golden = golden_of(ctx)
    return rep


def report_bytes(rep: Report) -> bytes:
    """The bytes of ``<stem>.verify.json``."""
    return (rep.to_json() + "\n").encode()


def write_report(rep: Report, path, fsync: bool = True) -> Dict[str, str]:
    """Write the report's JSON (atomically; an ``OSError`` becomes an ``OutputError`` naming ``path``,
    as ``atomic_write_bytes`` does); returns ``{path, file, sha256}``."""
    data = report_bytes(rep)
    atomic_write_bytes(path, data, fsync=fsync)
    return {"path": str(path), "file": Path(path).name, "sha256": sha256_bytes(data)}

