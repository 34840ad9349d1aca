"""Reading Stable-Baselines3's files without ever running a pickle.

- ``model.zip`` (``model.save``): the ``data`` JSON as parsed (its ``":serialized:"`` base64 cloudpickles
  are left as text, never decoded), ``policy.pth`` through torch's weights-only loader
  (``converter.checkpoint.load_weights_only``), the SB3 version. The zip's members are bounded
  (stored or deflated only, each claimed size within the bounds and its compression ratio, so a zip bomb
  is refused before it is inflated).
- ``vec_normalize.pkl`` (``VecNormalize.save``: the whole object pickled): an allow-listing
  ``pickle.Unpickler`` whose ``find_class`` answers every global the file may name with an inert
  stand-in of ours — SB3's, gymnasium's and numpy.random's classes and constructors become objects that
  only record their arguments and state; numpy's ``ndarray``/``dtype``/``scalar`` rebuilds become
  stand-ins that build a plain numeric array from the pickled bytes with ``np.frombuffer`` — and refuses
  every other global by name, before it is called. No class of SB3, gymnasium or numpy.random is
  imported or run; nothing in the file is executed.

Every byte goes through ``core.files.read_input_file``; every failure is one line of the error taxonomy
(``InputError``, ``CheckpointError``, ``UnsupportedError``), never a partial result.
"""
from __future__ import annotations

import io
import json
import math
import pickle
import pickletools
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import contract as C
from ..converter.checkpoint import check_tensor, load_weights_only
from ..core.artifacts import sha256_bytes
from ..core.files import MAX_INPUT_BYTES, check_regular, clip, quote, read_input_file
from ..errors import CheckpointError, InputError, UnsupportedError, describe

ZIP_WHAT = "SB3 model zip"
VN_WHAT = "VecNormalize file"
MAX_DATA_BYTES = 256 << 20  # the data JSON: KBs for a vector policy, MBs with image observations' last obs
MAX_VERSION_BYTES = 64
MAX_MEMBERS = 10_000
MAX_RATIO = 1100  # deflate cannot do better than ~1032:1; a member claiming more is a bomb

# --- model.zip -------------------------------------------------------------------------------------


@dataclass
class Sb3Zip:
    """What an SB3 ``model.zip`` holds that a conversion reads."""

    path: Path
    sha256: str  # of the zip's bytes
    data: Dict[str, Any]  # the data JSON as parsed; ":serialized:" values left as they are, never decoded
    state: Dict[str, "object"]  # policy.pth: key -> torch.Tensor (CPU), read weights-only
    version: str  # _stable_baselines3_version, "" if absent
    members: Tuple[str, ...]


def is_sb3_zip(path) -> bool:
    """``path`` ends in ``.zip`` and its central directory lists both ``data`` and ``policy.pth`` (only the
    directory is read, after ``check_regular``; ``False`` on any error)."""
    try:
        p = Path(path)
        if p.suffix.lower() != C.SB3_ZIP_SUFFIX:
            return False
        check_regular(p, ZIP_WHAT)
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
        return all(m in names for m in C.SB3_REQUIRED_MEMBERS)
    except Exception:  # a probe: anything unreadable is simply not one
        return False


_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, ValueError, OSError, EOFError,
               struct.error, NotImplementedError, RuntimeError)


def _open_zip(data: bytes, p: Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except _ZIP_ERRORS as exc:
        raise InputError(f"not a readable {ZIP_WHAT} (damaged or truncated zip: {type(exc).__name__})", p) from None
    if len(infos) > MAX_MEMBERS:
        raise InputError(f"not a readable {ZIP_WHAT} ({len(infos):,} members; at most {MAX_MEMBERS:,} are read)", p)
    return zf


def _member(zf: zipfile.ZipFile, name: str, limit: int, p: Path) -> Optional[bytes]:
    """The bytes of the member ``name`` (``None`` when absent): one member of that name, stored or deflated,
    its claimed size within ``limit`` and a deflate ratio, read with its CRC checked."""
    infos = [i for i in zf.infolist() if i.filename == name]
    if not infos:
        return None
    if len(infos) > 1:
        raise InputError(f"not a readable {ZIP_WHAT} (the member {quote(name)} appears {len(infos)} times)", p)
    info = infos[0]
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InputError(f"not a readable {ZIP_WHAT} (member {quote(name)} uses compression method "
                         f"{info.compress_type}; only stored and deflated members are read)", p)
    if info.file_size > limit:
        raise InputError(f"not a readable {ZIP_WHAT} (member {quote(name)} claims {info.file_size:,} bytes, "
                         f"over the {limit:,}-byte bound on it)", p)
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > max(info.compress_size, 1) * MAX_RATIO:
        raise InputError(f"not a readable {ZIP_WHAT} (member {quote(name)} claims {info.file_size:,} bytes from "
                         f"{info.compress_size:,} compressed: a zip bomb?)", p)
    if info.compress_type == zipfile.ZIP_STORED and info.file_size > info.compress_size:
        raise InputError(f"not a readable {ZIP_WHAT} (stored member {quote(name)} claims more bytes than it holds)", p)
    try:
        with zf.open(info) as f:  # zipfile never inflates past the claimed size, and checks the CRC at the end
            out = f.read(info.file_size + 1)
    except _ZIP_ERRORS as exc:
        raise InputError(f"not a readable {ZIP_WHAT} (member {quote(name)} is damaged: {describe(exc, 80)})",
                         p) from None
    if len(out) != info.file_size:
        raise InputError(f"not a readable {ZIP_WHAT} (member {quote(name)} holds {len(out):,} bytes, "
                         f"not the {info.file_size:,} it claims)", p)
    return out


def _parse_data(raw: bytes, p: Path) -> Dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not a readable {ZIP_WHAT} (its {quote(C.SB3_DATA)} member is not UTF-8 text: "
                         f"byte {exc.start:,})", p) from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not a readable {ZIP_WHAT} (its {quote(C.SB3_DATA)} member is not JSON: "
                         f"{describe(exc, 80)})", p) from None
    if not isinstance(obj, dict):
        raise InputError(f"not a readable {ZIP_WHAT} (its {quote(C.SB3_DATA)} member is a JSON "
                         f"{type(obj).__name__}, not an object)", p)
    return obj


def _load_state(pth: bytes, p: Path) -> Dict[str, "object"]:
    """``policy.pth`` through the checkpoint reader's weights-only load (``converter.checkpoint``: a refused
    pickle named by its opcodes, nothing executed), then checked as a flat state dict of dense tensors."""
    where = C.SB3_POLICY
    obj = load_weights_only(pth, p, where)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: holds a {type(obj).__name__}, not a state dict (str -> tensor)", p)
    for k, t in obj.items():
        check_tensor(k, t, len(pth), p, where)
    return dict(obj)


def read_sb3_zip(path, data: Optional[bytes] = None) -> Sb3Zip:
    """Read an SB3 ``model.zip``: ``data`` (JSON, never decoding a ``":serialized:"`` value), ``policy.pth``
    (weights-only), the version. ``data``: the file's bytes, already read (``read_input_file``)."""
    p = Path(path)
    if data is None:
        data = read_input_file(p, ZIP_WHAT)
    digest = sha256_bytes(data)
    zf = _open_zip(data, p)
    members = tuple(i.filename for i in zf.infolist())
    missing = [m for m in C.SB3_REQUIRED_MEMBERS if m not in members]
    if missing:
        shown = ", ".join(quote(m, 40) for m in members[:6]) + (" ..." if len(members) > 6 else "")
        raise InputError(f"not an SB3 model zip: no {' and no '.join(quote(m) for m in missing)} member "
                         f"(members: {shown or 'none'})", p)
    raw = _member(zf, C.SB3_DATA, MAX_DATA_BYTES, p)
    pth = _member(zf, C.SB3_POLICY, MAX_INPUT_BYTES, p)
    if len(raw) + len(pth) > MAX_INPUT_BYTES:
        raise InputError(f"not a readable {ZIP_WHAT} (its members add up to over the "
                         f"{MAX_INPUT_BYTES / 2 ** 30:g} GiB bound on input files)", p)
    version_raw = _member(zf, C.SB3_VERSION, MAX_VERSION_BYTES, p)
    version = ""
    if version_raw is not None:
        try:
            version = version_raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise InputError(f"not a readable {ZIP_WHAT} (its {quote(C.SB3_VERSION)} member is not UTF-8 text)",
                             p) from None
    parsed = _parse_data(raw, p)
    del raw
    state = _load_state(pth, p)
    return Sb3Zip(path=p, sha256=digest, data=parsed, state=state, version=version, members=members)


# --- vec_normalize.pkl -----------------------------------------------------------------------------


def zip_step(path) -> Optional[int]:
    """The training step an SB3 model zip states without reading its weights: ``<prefix>_<N>_steps.zip``
    (CheckpointCallback's name) gives ``N``; else the ``data`` JSON's ``num_timesteps``, read only when the
    member is small (``SB3_DATA_PROBE_BYTES``, stored or deflated); else ``None`` (never an error)."""
    p = Path(path)
    m = C.SB3_STEP_ZIP_RE.match(p.name)
    if m:
        return int(m["step"])
    try:
        check_regular(p, ZIP_WHAT)
        with zipfile.ZipFile(p) as zf:
            infos = [i for i in zf.infolist() if i.filename == C.SB3_DATA]
            if (len(infos) != 1 or infos[0].compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
                    or infos[0].file_size > C.SB3_DATA_PROBE_BYTES
                    or infos[0].compress_size > C.SB3_DATA_PROBE_BYTES):
                return None
            with zf.open(infos[0]) as f:
                raw = f.read(C.SB3_DATA_PROBE_BYTES + 1)
        if len(raw) > C.SB3_DATA_PROBE_BYTES:
            return None
        step = json.loads(raw.decode("utf-8")).get(C.SB3_NUM_TIMESTEPS)
    except Exception:  # a probe: the zip's own reader reports what is wrong with it
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2 ** 63 else None


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:
        return False


def find_vec_normalize(zip_path) -> Optional[Path]:
    """The VecNormalize file of the model zip ``zip_path``, the first of these that is a file:

    1. CheckpointCallback's own (``save_vecnormalize=True``): for ``<prefix>_<N>_steps.zip``,
       ``<prefix>_vecnormalize_<N>_steps.pkl`` beside it (the statistics of that very step);
    2. beside it: ``<stem>_vec_normalize.pkl``, ``<stem>.vec_normalize.pkl``, ``vec_normalize.pkl``,
       ``vecnormalize.pkl``;
    3. rl-baselines3-zoo's log folder (``logs/<algo>/<EnvName>_<n>/``): ``<EnvName>/vecnormalize.pkl``,
       where the zip's folder holds exactly one subfolder (hidden ones aside) that has a
       ``vecnormalize.pkl`` (the zoo's final statistics, which its ``enjoy.py`` also loads for a
       ``best_model.zip`` or an ``rl_model_<N>_steps.zip``); two or more such subfolders: none is chosen.

    Else ``None``."""
    p = Path(zip_path)
    folder = p.parent
    m = C.SB3_STEP_ZIP_RE.match(p.name)
    if m:
        candidate = folder / C.SB3_CALLBACK_VEC_NORMALIZE.format(prefix=m["prefix"], step=m["step"])
        if _is_file(candidate):
            return candidate
    for template in C.SB3_VEC_NORMALIZE_NAMES:
        candidate = folder / template.format(stem=p.stem)
        if _is_file(candidate):
            return candidate
    try:
        subs = [d for d in folder.iterdir() if not d.name.startswith(".") and d.is_dir()]
    except OSError:
        return None
    zoo = [d / C.SB3_ZOO_VEC_NORMALIZE for d in subs if _is_file(d / C.SB3_ZOO_VEC_NORMALIZE)]
    return zoo[0] if len(zoo) == 1 else None


@dataclass
class VecNormStats:
    """VecNormalize's observation statistics and settings."""

    mean: np.ndarray  # obs_rms.mean, as stored (float64)
    var: np.ndarray  # obs_rms.var
    count: float
    clip_obs: float
    epsilon: float
    norm_obs: bool
    obs_shape: Tuple[int, ...]  # observation_space._shape where stated, else mean.shape


class _Refused(Exception):
    """A pickle asks for something the reader does not build (the message says what)."""


class _Inert:
    """The stand-in of an allowed class or constructor: calling it, or pickle's NEWOBJ, makes an object that
    only records its arguments; BUILD records the state. No code of the real class runs."""

    _global = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state = args, {}
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            for part in state:  # (state, slotstate)
                if part:
                    self.state.update(part)
        elif isinstance(state, dict):
            self.state.update(state)
        else:
            self.state["__state__"] = state

    def __repr__(self):  # pragma: no cover - debugging aid
        return f"<stand-in {self._global}>"


def _stand_in(module: str, name: str) -> type:
    return type(f"StandIn_{name.strip('_')}", (_Inert,), {"_global": f"{module}.{name}"})


_NUMERIC_KINDS = "biufc"
_DTYPE_NAME = re.compile(r"[<>|=]?(b1|\?|[iu][1248]|f(2|4|8|16)|c(8|16|32))")


class _Dtype:
    """numpy.dtype(name, align, copy) as pickled, then BUILD's state (version, byteorder, ...): a numeric
    dtype only (bool, int, uint, float, complex), never an object, structured or string one."""

    def __init__(self, name=None, align=False, copy=True):
        if not isinstance(name, str) or not _DTYPE_NAME.fullmatch(name):
            raise _Refused(f"refuses the dtype {quote(name, 40)} (only plain numeric arrays are read)")
        self.dtype = np.dtype(name)

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) >= 5 and state[1] in ("<", ">", "|", "=")
                and state[2] is None and state[3] is None and state[4] is None):
            raise _Refused(f"refuses the dtype state {quote(state, 60)} (only plain numeric dtypes are read)")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


class _NdarrayType:
    """What ``numpy.ndarray`` stands for: only an argument of ``_reconstruct``."""


def _as_dtype(d) -> np.dtype:
    if not isinstance(d, _Dtype) or d.dtype.kind not in _NUMERIC_KINDS or d.dtype.hasobject:
        raise _Refused(f"refuses an array of dtype {quote(getattr(d, 'dtype', d), 40)} (plain numbers only)")
    return d.dtype


class _Array:
    """numpy's ``_reconstruct(ndarray, (0,), b'b')`` then BUILD's ``(version, shape, dtype, fortran, bytes)``:
    the array is made here by ``np.frombuffer`` from the bytes (a copy), never by numpy's unpickling."""

    def __init__(self, subtype=None, shape=None, code=None):
        if subtype is not _NdarrayType:
            raise _Refused(f"refuses to rebuild an array of type {quote(subtype, 60)} (plain ndarrays only)")
        self.array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _Refused("refuses an array state that is not (version, shape, dtype, fortran, bytes)")
        _version, shape, dtype, fortran, raw = state
        dt = _as_dtype(dtype)
        self.array = _from_bytes(raw, dt, shape, bool(fortran))


def _from_bytes(raw, dt: np.dtype, shape, fortran: bool) -> np.ndarray:
    if not (isinstance(shape, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in shape)):
        raise _Refused(f"refuses an array of shape {quote(shape, 40)}")
    if not isinstance(raw, (bytes, bytearray)):
        raise _Refused(f"refuses an array whose data is a {type(raw).__name__}, not bytes (an object array?)")
    if len(raw) != math.prod(shape) * dt.itemsize:
        raise _Refused(f"refuses an array of shape {quote(shape, 40)} with {len(raw):,} bytes of data")
    return np.frombuffer(bytes(raw), dtype=dt).reshape(shape, order="F" if fortran else "C").copy()


def _frombuffer(raw=None, dtype=None, shape=None, order="C") -> _Array:
    """numpy's ``_frombuffer(bytes, dtype, shape, order)`` (pickle protocol 5, in-band data only)."""
    if order not in ("C", "F"):
        raise _Refused(f"refuses an array of order {quote(order, 20)}")
    out = _Array(_NdarrayType)
    out.array = _from_bytes(raw, _as_dtype(dtype), shape, order == "F")
    return out


def _scalar(dtype=None, raw=None):
    """numpy's ``scalar(dtype, bytes)``: a numeric scalar from its bytes."""
    dt = _as_dtype(dtype)
    if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
        raise _Refused("refuses a numpy scalar whose data is not its dtype's bytes")
    return np.frombuffer(raw, dtype=dt)[0]


def _allowed() -> Dict[Tuple[str, str], Any]:
    table: Dict[Tuple[str, str], Any] = {}
    for module, name in (C.VN_CLASS, C.RMS_CLASS, *C.SPACE_CLASSES, *C.NUMPY_RANDOM_CLASSES):
        table[(module, name)] = _stand_in(module, name)
    for g in C.NP_RECONSTRUCT:
        table[g] = _Array
    for g in C.NP_FROMBUFFER:
        table[g] = _frombuffer
    for g in C.NP_SCALAR:
        table[g] = _scalar
    table[C.NP_NDARRAY] = _NdarrayType
    table[C.NP_DTYPE] = _Dtype
    return table


_ALLOWED = _allowed()
_STAND_INS = {v: k for k, v in _ALLOWED.items() if isinstance(v, type) and issubclass(v, _Inert)}

# the opcodes a VecNormalize pickle (protocol 2-5) may use: no INST/OBJ (protocol 0 calls), no EXT* (copyreg's
# registry), no PERSID/BINPERSID (persistent ids)
_OPCODES = frozenset((
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT",
    "BINGET", "LONG_BINGET", "GET", "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG",
    "LONG1", "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
    "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "APPEND", "APPENDS", "LIST", "EMPTY_DICT", "DICT",
    "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET", "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD",
    "NEWOBJ", "NEWOBJ_EX"))


class _Unpickler(pickle.Unpickler):
    """``find_class`` answers only the allow-list (``_ALLOWED``: stand-ins of ours), naming any other global."""

    def find_class(self, module, name):
        target = _ALLOWED.get((module, name))
        if target is None:
            raise _Refused(f"refuses to load the global {quote(f'{module}.{name}')} (not part of a VecNormalize "
                           "file; nothing was executed)")
        return target

    def persistent_load(self, pid):
        raise _Refused("refuses a persistent id (not part of a VecNormalize file; nothing was executed)")


def _check_opcodes(blob: bytes, where: str, p: Path) -> None:
    try:
        for op, _arg, _pos in pickletools.genops(io.BytesIO(blob)):
            if op.name not in _OPCODES:
                raise InputError(f"{where}: refuses the pickle opcode {op.name} (not part of a VecNormalize file; "
                                 "nothing was executed)", p)
    except InputError:
        raise
    except Exception as exc:  # genops: a byte that is no opcode, an argument cut short
        raise InputError(f"{where}: not a readable pickle ({describe(exc, 80)})", p) from None


def _kind(obj) -> Optional[Tuple[str, str]]:
    return _STAND_INS.get(type(obj))


def _number(value, what: str, where: str, p: Path, positive: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{where}: {what} is {quote(value, 40)} ({type(value).__name__}), not a number", p)
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise InputError(f"{where}: {what} is {x!r}, not a finite {'positive' if positive else 'non-negative'} "
                         "number", p)
    return x


def _array(value, what: str, where: str, p: Path) -> np.ndarray:
    if isinstance(value, _Array) and value.array is not None:
        a = value.array
    else:
        raise InputError(f"{where}: {what} is a {type(value).__name__}, not a numpy array", p)
    if a.dtype.kind != "f":
        raise InputError(f"{where}: {what} is {a.dtype}, not floating point", p)
    if not np.all(np.isfinite(a)):
        raise InputError(f"{where}: {what} holds a NaN or an infinity", p)
    return a


def _stats(obj, where: str, p: Path) -> VecNormStats:
    if _kind(obj) != C.VN_CLASS:
        raise InputError(f"{where}: holds a {getattr(obj, '_global', type(obj).__name__)}, not a VecNormalize", p)
    st = obj.state
    keys = st.get(C.VN_NORM_OBS_KEYS)
    rms = st.get(C.VN_OBS_RMS)
    space = st.get(C.VN_OBSERVATION_SPACE)
    space_kind = _kind(space)
    if keys is not None or isinstance(rms, dict) or (space_kind and space_kind[1] == C.DICT_SPACE_NAME):
        raise UnsupportedError(f"{where}: normalizes a dict observation space ({C.VN_NORM_OBS_KEYS} "
                               f"{quote(keys, 60)}): not supported", p)
    norm_obs = st.get(C.VN_NORM_OBS)
    if not isinstance(norm_obs, (bool, np.bool_)):
        raise InputError(f"{where}: {C.VN_NORM_OBS} is {quote(norm_obs, 40)}, not a bool", p)
    if _kind(rms) != C.RMS_CLASS:
        raise InputError(f"{where}: {C.VN_OBS_RMS} is {quote(rms, 60)}, not a RunningMeanStd", p)
    mean = _array(rms.state.get(C.RMS_MEAN), f"{C.VN_OBS_RMS}.{C.RMS_MEAN}", where, p)
    var = _array(rms.state.get(C.RMS_VAR), f"{C.VN_OBS_RMS}.{C.RMS_VAR}", where, p)
    if mean.shape != var.shape:
        raise InputError(f"{where}: {C.VN_OBS_RMS}.{C.RMS_MEAN} has shape {list(mean.shape)} but "
                         f"{C.VN_OBS_RMS}.{C.RMS_VAR} {list(var.shape)}", p)
    if np.any(var < 0):
        raise InputError(f"{where}: {C.VN_OBS_RMS}.{C.RMS_VAR} holds a negative variance", p)
    count = _number(rms.state.get(C.RMS_COUNT), f"{C.VN_OBS_RMS}.{C.RMS_COUNT}", where, p)
    clip_obs = _number(st.get(C.VN_CLIP_OBS), C.VN_CLIP_OBS, where, p, positive=True)
    epsilon = _number(st.get(C.VN_EPSILON), C.VN_EPSILON, where, p)
    obs_shape = tuple(mean.shape)
    if space is not None and space_kind is not None:
        shape = space.state.get(C.SPACE_SHAPE)
        if shape is not None:
            if not (isinstance(shape, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                      for n in shape)):
                raise InputError(f"{where}: {C.VN_OBSERVATION_SPACE}.{C.SPACE_SHAPE} is {quote(shape, 40)}, "
                                 "not a shape", p)
            if shape != obs_shape:
                raise InputError(f"{where}: {C.VN_OBSERVATION_SPACE} has shape {list(shape)} but "
                                 f"{C.VN_OBS_RMS}.{C.RMS_MEAN} {list(obs_shape)}", p)
            obs_shape = shape
    return VecNormStats(mean=mean, var=var, count=count, clip_obs=clip_obs, epsilon=epsilon,
                        norm_obs=bool(norm_obs), obs_shape=obs_shape)


def read_vec_normalize(path, data: Optional[bytes] = None) -> VecNormStats:
    """The observation statistics of a ``VecNormalize.save`` pickle, read by the allow-listing unpickler
    (nothing in it runs). ``data``: the file's bytes, already read (``read_input_file``)."""
    p = Path(path)
    if data is None:
        data = read_input_file(p, VN_WHAT)
    where = clip(p.name, 60) if p.name else VN_WHAT
    if not data:
        raise InputError(f"{where}: empty file, not a VecNormalize pickle", p)
    if data[:1] != b"\x80":
        raise InputError(f"{where}: not a VecNormalize pickle (starts with bytes {data[:4].hex(' ')})", p)
    _check_opcodes(data, where, p)
    try:
        obj = _Unpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise InputError(f"{where}: {exc}", p) from None
    except RecursionError:
        raise InputError(f"{where}: not a readable pickle (nested too deeply)", p) from None
    except MemoryError:
        raise InputError(f"{where}: too large to read here (MemoryError)", p) from None
    except Exception as exc:  # a malformed pickle: a stand-in called wrongly, a bad stack, a cut-off file
        raise InputError(f"{where}: not a readable VecNormalize pickle ({describe(exc, 100)}; nothing was "
                         "executed)", p) from None
    return _stats(obj, where, p)
