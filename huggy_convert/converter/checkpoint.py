"""Reading an ML-Agents ``.pt`` checkpoint safely (``weights_only=True``: a pickle never runs code)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import pickletools
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import contract as C
from ..core.files import MAX_INPUT_BYTES, clip, quote, read_input_file, stored_zip
from ..core.policy import Policy
from ..errors import CheckpointError, InputError, describe


@dataclass
class Checkpoint:
    """An actor's ``Policy`` state dict and where it came from: a ``.pt`` checkpoint, or an ML-Agents
    ONNX read back into one (``importers.from_onnx``: ``recovered`` then says what could and could not
    be recovered, and becomes the canonical file's ``recovered_from`` metadata)."""

    path: Path
    sha256: str
    policy: Dict[str, "object"]  # ML-Agents key -> torch.Tensor (CPU)
    global_step: Optional[int]
    top_keys: List[str]
    recovered: Optional[Dict[str, object]] = None
    obs_sizes: Optional[Tuple[int, ...]] = None  # the split the file states where the state dict cannot (an ONNX's inputs)
    stated: Optional[Policy] = None  # a canonical file's policy (importers.own): what no tensor here says
    # another trainer's file (importers.sb3): the spec fields it states that no tensor does (its rules:
    # activation, normalizer, action mapping), and what it was (format, version, what it does not hold)
    fields: Optional[Dict[str, object]] = None
    origin: Optional[Dict[str, object]] = None


_PICKLE_OPCODES = {ord(op.code): op.name for op in pickletools.opcodes}

# The opcodes torch's weights-only unpickler implements (torch/_weights_only_unpickler.py): any other
# opcode in a checkpoint's pickle is refused by it.
_WEIGHTS_ONLY_OPCODES = frozenset((
    "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK", "TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT",
    "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID",
    "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1", "PROTO", "STOP"))
_TENSOR_MODULES = ("torch", "collections")  # what a checkpoint's GLOBALs name (tensor rebuilds, OrderedDict)

def _zip_pickle(data: bytes, p: Path):
    """A zip checkpoint's records must fit the file (``stored_zip``). Returns the zip, the pickle's
    record name and its bytes (``None`` for both when there is not exactly one readable ``data.pkl``)."""
    zf = stored_zip(data, p)
    infos = zf.infolist()
    pkl = [i for i in infos if i.filename.endswith("data.pkl")]
    if len(pkl) != 1:
        return zf, None, None
    try:
        return zf, pkl[0].filename, zf.read(pkl[0])
    except Exception:  # a damaged record: torch's loader says so below
        return zf, None, None


def _pickle_problem(pickle_bytes: bytes) -> Optional[str]:
    """What in the pickle torch's weights-only loader refuses, found by walking its opcodes
    (``pickletools.genops``): a byte that is no opcode, an opcode it does not implement, or a global
    (GLOBAL, or STACK_GLOBAL's two strings) outside torch's tensor rebuilds. ``None`` when the pickle
    holds nothing it refuses."""
    f = io.BytesIO(pickle_bytes)
    strings = []  # the strings pushed so far: STACK_GLOBAL's module and name are the last two
    try:
        for op, arg, _pos in pickletools.genops(f):
            if isinstance(arg, str):
                strings.append(arg)
            if op.name not in _WEIGHTS_ONLY_OPCODES and op.name != "STACK_GLOBAL":
                return (f"refused to load: the pickle uses opcode {op.name}, which loading with "
                        "weights_only=True does not allow (nothing was executed)")
            name = str(arg).replace(" ", ".") if op.name == "GLOBAL" else \
                ".".join(strings[-2:]) if op.name == "STACK_GLOBAL" and len(strings) >= 2 else None
            if name is not None and name.split(".")[0] not in _TENSOR_MODULES:
                return (f"refused to load: the pickle asks for more than tensors (the global {quote(name)}); "
                        "it must load with weights_only=True (nothing was executed)")
    except ValueError:  # genops stopped: the byte it just read is no opcode, or an argument is cut short
        at = f.tell() - 1
        code = pickle_bytes[at] if 0 <= at < len(pickle_bytes) else None
        if code is not None and code not in _PICKLE_OPCODES:
            return f"not a readable torch checkpoint (not a valid pickle: byte 0x{code:02x} is no pickle opcode)"
        return "not a readable torch checkpoint (not a valid pickle: it ends inside an opcode's argument)"
    return None


def _pickle_of(data: bytes) -> bytes:
    """The pickle of a torch file, for describing a refusal: a zip's one ``data.pkl``, else the bytes."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = [n for n in zf.namelist() if n.endswith("data.pkl")]
            return zf.read(names[0]) if len(names) == 1 else data
    except Exception:  # not a readable zip: the bytes themselves are the pickle, or nothing to say
        return data


def load_weights_only(data: bytes, p: Path, where: str = "", quiet_warnings: bool = True,
                      pickle_bytes: Optional[bytes] = None):
    """``torch_load_weights_only(data)`` with torch's warnings silenced (``quiet_warnings``); any failure is
    one ``CheckpointError`` saying why (the pickle's own opcodes first, ``_describe_load_failure``),
    prefixed with ``where`` (e.g. the archive member) when given. ``pickle_bytes``: the pickle, where the
    caller already has it."""
    try:
        with warnings.catch_warnings() if quiet_warnings else contextlib.nullcontext():
            if quiet_warnings:  # torch's own warnings would break the one-line error
                warnings.simplefilter("ignore")
            return torch_load_weights_only(data)
    except Exception as exc:  # torch raises many types for bad files; all mean "not loadable"
        why = _describe_load_failure(exc, pickle_bytes if pickle_bytes is not None else _pickle_of(data))
        raise CheckpointError(f"{where}: {why}" if where else why, p) from None


def _describe_load_failure(exc: BaseException, pickle_bytes: Optional[bytes]) -> str:
    """Why torch's weights-only loader refused the file: from the pickle itself where it says, else
    from the exception's type (never from the text of torch's message)."""
    problem = _pickle_problem(pickle_bytes) if pickle_bytes is not None else None
    if problem:
        return problem
    if isinstance(exc, pickle.UnpicklingError):
        return ("refused to load: the pickle asks for more than tensors; a checkpoint must load with "
                "weights_only=True")
    if isinstance(exc, zipfile.BadZipFile):
        return "not a readable torch checkpoint (damaged or truncated zip)"
    if isinstance(exc, EOFError):
        return "not a readable torch checkpoint (file ends too early: truncated?)"
    if isinstance(exc, MemoryError):
        return "not a readable torch checkpoint (too large to load)"
    return f"not a readable torch checkpoint ({describe(exc, 160)})"


# --- the fast reader: the same allow-list as weights_only=True, reading only what is used ----------
# Every object a pickle constructs comes from ``find_class`` (GLOBAL, STACK_GLOBAL, INST, EXT*) or
# ``persistent_load`` (BINPERSID); the only other things it builds are Python's own containers,
# strings and numbers. ``_PolicyUnpickler.find_class`` answers three names of torch's tensor-rebuild
# allow-list (``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2``, the legacy storage
# types, answered by an inert marker) and raises ``_NotFast`` for every other name, so it constructs
# a subset of what the weights-only ``torch.load`` would; anything it does not know (another
# global, a BUILD on a tensor, metadata, hooks, a big-endian archive, a missing or short record)
# sends the file to the weights-only ``torch.load`` (``torch_load_weights_only``), which gives
# the verdict and the error. The reader accepts any data opcode Python's unpickler knows (torch's
# own unpickler refuses a few harmless ones, e.g. SHORT_BINUNICODE); what can be constructed is the
# same allow-list or less.
# A tensor is a ``_TensorRef`` until asked for: only the ``Policy`` tensors and the global step are
# materialised (from their zip records), the optimizer state is never read.
_FAST_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                  "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}


class _NotFast(Exception):
    """Something the fast reader does not read: the weights-only ``torch.load`` decides."""


class _Inert:
    """The reader's own markers: a pickle's BUILD cannot give them state (``__setstate__`` refuses),
    so their fields are only ever what ``find_class`` / ``persistent_load`` / the rebuild checked."""

    __slots__ = ()

    def __setstate__(self, state):
        raise _NotFast("BUILD on a tensor or storage")


class _StorageType(_Inert):
    """What ``find_class`` answers for ``torch.<X>Storage``: a dtype name, not callable, no state."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = dtype


_STORAGE_TYPES = {name: _StorageType(dt) for name, dt in _FAST_STORAGES.items()}
_ITEM_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1}


class _StorageRef(_Inert):
    __slots__ = ("dtype", "key", "numel")

    def __init__(self, dtype: str, key: str, numel: int):
        self.dtype, self.key, self.numel = dtype, key, numel


class _TensorRef(_Inert):
    """``_rebuild_tensor_v2``'s arguments, kept until the tensor is wanted."""

    __slots__ = ("storage", "offset", "size", "stride", "requires_grad")

    def __init__(self, storage, offset, size, stride, requires_grad):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.requires_grad = requires_grad


def _rebuild_tensor_ref(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    if (not isinstance(storage, _StorageRef) or type(storage_offset) is not int or type(size) is not tuple
            or type(stride) is not tuple or len(size) != len(stride) or type(requires_grad) is not bool
            or metadata or type(backward_hooks).__name__ != "OrderedDict" or backward_hooks
            or not all(type(x) is int and x >= 0 for x in size + stride) or storage_offset < 0):
        raise _NotFast("tensor rebuild arguments")
    return _TensorRef(storage, storage_offset, size, stride, requires_grad)


class _PolicyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_ref
        if module == "torch" and name in _STORAGE_TYPES:
            return _STORAGE_TYPES[name]
        raise _NotFast(f"GLOBAL {module}.{name}")

    def persistent_load(self, pid):
        if (type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], _StorageType)
                or type(pid[2]) is not str or pid[3] != "cpu" or type(pid[4]) is not int or pid[4] < 0):
            raise _NotFast("persistent id")
        return _StorageRef(pid[1].dtype, pid[2], pid[4])


def fast_policy_load(zf: zipfile.ZipFile, pickle_name: str, pickle_bytes: bytes) -> dict:
    """The checkpoint dict with its ``Policy`` tensors and global step as the weights-only ``torch.load``
    gives them (same dtype, shape, strides, offset, bytes, ``requires_grad``), every other tensor an
    unread ``_TensorRef``. Raises ``_NotFast`` for anything it does not read (see above), and for any
    other failure on the way (the weights-only ``torch.load`` then gives the verdict)."""
    try:
        return _fast_policy_load(zf, pickle_name, pickle_bytes)
    except _NotFast:
        raise
    except Exception as exc:
        raise _NotFast(type(exc).__name__) from None


def _fast_policy_load(zf: zipfile.ZipFile, pickle_name: str, pickle_bytes: bytes) -> dict:
    import torch

    prefix = pickle_name[: -len("data.pkl")]
    names = {i.filename: i for i in zf.infolist()}
    order = names.get(prefix + "byteorder")
    if order is not None and zf.read(order) != b"little":
        raise _NotFast("byte order")
    try:
        obj = _PolicyUnpickler(io.BytesIO(pickle_bytes)).load()
    except _NotFast:
        raise
    except Exception as exc:  # a broken pickle: torch's loader names the problem
        raise _NotFast(type(exc).__name__) from None
    if type(obj) is not dict:
        raise _NotFast("not a dict")
    storages: Dict[str, object] = {}

    def tensor(ref: "_TensorRef"):
        st = ref.storage
        dtype = getattr(torch, st.dtype)
        item = _ITEM_BYTES[st.dtype]
        base = storages.get(st.key)
        if base is None:
            info = names.get(f"{prefix}data/{st.key}")
            if info is None or info.file_size != st.numel * item:
                raise _NotFast("storage record")
            try:
                raw = bytearray(zf.read(info))
            except Exception as exc:  # a damaged record (zipfile checks its CRC; torch does not): torch decides
                raise _NotFast(f"storage record ({type(exc).__name__})") from None
            base = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
            storages[st.key] = base
        extent = 1 + sum((n - 1) * s for n, s in zip(ref.size, ref.stride)) if all(ref.size) else 0
        if ref.offset + extent > st.numel:
            raise _NotFast("tensor beyond its storage")
        t = torch.as_strided(base, ref.size, ref.stride, ref.offset)
        t.requires_grad = ref.requires_grad
        return t

    def refs(x):  # every tensor below x; containers only
        if isinstance(x, _TensorRef):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from refs(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from refs(v)

    for r in refs(obj):  # each storage any tensor names is in the archive with its size (as torch.load checks)
        info = names.get(f"{prefix}data/{r.storage.key}")
        if info is None or info.file_size != r.storage.numel * _ITEM_BYTES[r.storage.dtype]:
            raise _NotFast("storage record")
    out = dict(obj)
    for key in (C.CKPT_POLICY, C.CKPT_GLOBAL_STEP):
        val = obj.get(key)
        if isinstance(val, dict):
            if not all(isinstance(v, _TensorRef) for v in val.values()):
                raise _NotFast(f"{key} holds more than tensors")
            new = type(val)((k, tensor(v)) for k, v in val.items())
            if hasattr(val, "__dict__"):
                new.__dict__.update(val.__dict__)
            out[key] = new
    return out


def torch_load_weights_only(data: bytes):
    """``torch.load`` of ``data`` on the CPU with ``weights_only=True``: the package's one call of
    ``torch.load`` (a pickle is only ever read this way, so it never runs code)."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_checkpoint(path, data: Optional[bytes] = None, sha256: Optional[str] = None,
                    quiet_warnings: bool = True, fast: bool = True) -> Checkpoint:
    """Load ``path`` on the CPU with ``weights_only=True`` and return its ``Policy`` state dict.

    ``data`` (and its ``sha256``) let a caller that already read the file load it from memory, so
    a checkpoint is read once. ``quiet_warnings=False`` leaves torch's warnings alone (a threaded
    caller silences them once: ``warnings.catch_warnings`` is not thread-safe). ``fast``: read the
    ``Policy`` tensors with ``fast_policy_load`` (the same allow-list, ~10x faster; anything it does not
    know goes to the weights-only ``torch.load``); ``False``: ``torch.load`` always."""
    import torch  # deferred: only checkpoint reading needs torch here

    p = Path(path)
    if data is None:
        data = read_input_file(p, "checkpoint")
    if not data:
        raise CheckpointError("empty file, not a torch checkpoint", p)
    if data[:4] != b"PK\x03\x04" and data[:1] != b"\x80":
        raise CheckpointError(f"not a readable torch checkpoint (neither a zip archive nor a pickle; "
                              f"starts with bytes {data[:4].hex(' ')})", p)
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"too large for a checkpoint: over the {MAX_INPUT_BYTES / 2 ** 30:g} GiB bound on input files", p)
    zf, pickle_name, pickle_bytes = _zip_pickle(data, p) if data[:2] == b"PK" else (None, None, data)
    digest = sha256 or hashlib.sha256(data).hexdigest()
    size = len(data)
    obj = None
    if zf is not None and pickle_bytes is not None and fast:
        try:
            obj = fast_policy_load(zf, pickle_name, pickle_bytes)
        except _NotFast:
            obj = None
    if obj is None:
        obj = load_weights_only(data, p, quiet_warnings=quiet_warnings, pickle_bytes=pickle_bytes)
    zf = None
    del data, pickle_bytes
    if isinstance(obj, torch.Tensor):
        raise CheckpointError("holds a bare tensor, not an ML-Agents checkpoint (a dict with a 'Policy' state dict)", p)
    if not isinstance(obj, dict):
        raise CheckpointError(f"holds a {type(obj).__name__}, not an ML-Agents checkpoint dict", p)
    top = [k if isinstance(k, str) else repr(k) for k in obj.keys()]
    if C.CKPT_POLICY not in obj:
        shown = ", ".join(quote(k, 40) for k in top[:6]) + (" ..." if len(top) > 6 else "")
        raise CheckpointError(f"no '{C.CKPT_POLICY}' state dict: not an ML-Agents checkpoint (top-level keys: {shown or 'none'})", p)
    policy = obj[C.CKPT_POLICY]
    if not isinstance(policy, dict) or not all(isinstance(v, torch.Tensor) for v in policy.values()):
        raise CheckpointError(f"'{C.CKPT_POLICY}' is not a state dict of tensors", p)
    for k, t in policy.items():
        check_tensor(k, t, size, p)
    return Checkpoint(path=p, sha256=digest, policy=dict(policy), global_step=_global_step(obj, size, p), top_keys=top)


def check_tensor(key, t, size: int, p: Path, where: str = f"'{C.CKPT_POLICY}'") -> None:
    """A state dict's entry (``where``: the state dict, in the messages): a str key, a dense (strided)
    tensor on the CPU whose elements the file (``size`` bytes) really holds (a stride-0 or huge-extent
    view is refused before anything is materialised)."""
    import torch

    if not isinstance(key, str):
        raise CheckpointError(f"{where} has the key {quote(key)} ({type(key).__name__}), not a str", p)
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"{where}: {quote(key)} holds a {type(t).__name__}, not a tensor "
                              "(a flat state dict is expected)", p)
    if t.layout != torch.strided:
        raise CheckpointError(f"'{clip(key)}' is a sparse tensor ({str(t.layout).replace('torch.', '')}); "
                              "a state dict holds dense tensors", p)
    if t.numel() * t.element_size() > size:
        raise CheckpointError(f"'{clip(key)}' claims {t.numel():,} elements "
                              f"({list(t.shape)[:8]}), more than the {size:,}-byte file holds", p)


def _global_step(obj: dict, size: int, p: Path) -> Optional[int]:
    """The training step, an integer in [0, 2^63): NaN, Inf, complex, fractional or huge is an error."""
    import torch

    gs = obj.get(C.CKPT_GLOBAL_STEP)
    if not (isinstance(gs, dict) and isinstance(gs.get(C.GLOBAL_STEP_KEY), torch.Tensor)):
        return None
    t = gs[C.GLOBAL_STEP_KEY]
    check_tensor(C.GLOBAL_STEP_KEY, t, size, p)
    if t.numel() != 1:
        return None
    v = t.reshape(-1)[0]
    if t.dtype.is_complex or t.dtype == torch.bool:
        raise CheckpointError(f"'{C.CKPT_GLOBAL_STEP}' is {str(t.dtype).replace('torch.', '')}, not an integer step", p)
    x = float(v.item()) if t.dtype.is_floating_point else int(v.item())
    if not (isinstance(x, int) or (x == x and abs(x) != float("inf") and x.is_integer())) or not 0 <= x < 2 ** 63:
        raise CheckpointError(f"'{C.CKPT_GLOBAL_STEP}' is {quote(x)}, not a step (an integer in 0..2^63-1)", p)
    return int(x)
