"""Every use of torch's private APIs, each with a fallback to public ones that gives the same result, slower.

A torch release that moves or renames one of these names then costs speed, not correctness: the probe
finds it missing and the public way is taken. What each private name is for, and its fallback:

- ``module_params(m)`` / ``module_buffers(m)``: a module's own parameter / buffer dict (``m._parameters``,
  ``m._buffers``), read per call at batch 1, where ``nn.Module``'s attribute lookup (~1 us) shows in the
  latency. Fallback: a live view that reads ``getattr(m, name)`` (the same tensors).
- ``MODULE_APPLY``: ``nn.Module._apply``, the hook every dtype and device conversion goes through, which
  ``PolicyModule`` overrides to keep its normalizer float32. Fallback: ``PolicyModule`` overrides the
  public conversions (``to``, ``half``, ``float``, ``double``, ``bfloat16``, ``cuda``, ``cpu``, ``type``).
- ``inplace_silu()``: ``torch._C._nn.silu_``, the kernel ``F.silu(x, inplace=True)`` calls. Fallback:
  ``F.silu(x, inplace=True)`` (the same kernel, the same bits, one Python call more).
- ``fast_pt2()``: the ``.pt2`` written with the graph serialized once (``torch._export.serde.serialize``
  and ``torch.export.pt2_archive._package``'s writer and packaging steps; see ``exporters.pt2``).
  Fallback: ``None``, and the writer calls ``torch.export.save`` for every program (the same archive,
  byte for byte: the fast writer is kept only where it reproduces ``torch.export.save``).
- ``open_pt2(data)`` / ``pt2_layout()``: reading a ``.pt2``'s records before ``torch.export.load`` may
  see it (``exporters.pt2.unsafe_reason``), with ``torch.export.pt2_archive``'s reader and its record
  names. Fallback: the standard library's ``zipfile`` over the same records under the archive's root
  folder, and the record names ``torch.export.save`` writes (the same verdict).
- ``preload_export()``: ``import torch._dynamo`` before a batch's workers fork (so they share its
  pages). Fallback: nothing (each worker imports it on its first ``.pt2``).

``without_private(*names)`` runs a block as a torch without those names would (every name when none is
given): what the tests use to check each fallback against the private way. Nothing here imports torch
until a function is called (``import huggy_convert`` stays torch-free).
"""
from __future__ import annotations

import io
import zipfile
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional

# the names of the private uses (``without_private`` takes them)
MODULE_DICTS = "module_dicts"  # nn.Module._parameters / _buffers
MODULE_APPLY = "module_apply"  # nn.Module._apply: the hook every dtype/device conversion goes through
SILU_KERNEL = "silu_kernel"  # torch._C._nn.silu_
PT2_WRITER = "pt2_writer"  # torch._export.serde.serialize.serialize + torch.export.pt2_archive._package
PT2_READER = "pt2_reader"  # torch.export.pt2_archive.PT2ArchiveReader + .constants
DYNAMO = "dynamo"  # torch._dynamo (imported ahead of a fork)
PRIVATE = (MODULE_DICTS, MODULE_APPLY, SILU_KERNEL, PT2_WRITER, PT2_READER, DYNAMO)

_disabled: set = set()
_cache: Dict[str, object] = {}


def _probe(name: str):
    """The private object for ``name``, or None where this torch does not have it (or it is disabled)."""
    if name in _disabled:
        return None
    if name not in _cache:
        try:
            _cache[name] = _PROBES[name]()
        except Exception:  # noqa: BLE001 - a torch without it: the public way
            _cache[name] = None
    return _cache[name]


def available(name: str) -> bool:
    """Whether the private API ``name`` (one of ``PRIVATE``) is used here rather than its fallback."""
    if name not in _PROBES:
        raise ValueError(f"unknown private API {name!r}: one of {', '.join(PRIVATE)}")
    return _probe(name) is not None


@contextmanager
def without_private(*names: str) -> Iterator[None]:
    """Within the block, behave as a torch without these private APIs (all of them when none is named):
    every function here takes its public fallback. Objects built inside keep what they bound."""
    names = names or PRIVATE
    for n in names:
        if n not in _PROBES:
            raise ValueError(f"unknown private API {n!r}: one of {', '.join(PRIVATE)}")
    before = set(_disabled)
    _disabled.update(names)
    _bind()
    try:
        yield
    finally:
        _disabled.clear()
        _disabled.update(before)
        _bind()


# --- module dicts ----------------------------------------------------------------------------
def _probe_module_dicts():
    """No tensor is made (the first read may come while torch.export traces)."""
    import torch

    m = torch.nn.Module()
    m.register_parameter("w", None)
    m.register_buffer("b", None)
    p, b = m.__dict__.get("_parameters"), m.__dict__.get("_buffers")
    return True if isinstance(p, dict) and "w" in p and isinstance(b, dict) and "b" in b else None


class _Live:
    """A module's parameters or buffers by name, read through the public attribute (the fallback)."""

    __slots__ = ("_m",)

    def __init__(self, module):
        self._m = module

    def __getitem__(self, name: str):
        return getattr(self._m, name)


def _private_params(m):
    return m._parameters


def _private_buffers(m):
    return m._buffers


def module_params(m):
    """``m``'s own parameters by name (``p["weight"]``), read live: ``torch.export`` and ``.to()`` swap them."""
    _bind()
    return module_params(m)


def module_buffers(m):
    """``m``'s own buffers by name, read live (see ``module_params``)."""
    _bind()
    return module_buffers(m)


def _probe_module_apply():
    """Whether ``.to()``, ``.half()``, ``.float()``, ``.cpu()`` reach an overridden ``_apply`` (no tensor made)."""
    import torch

    seen = []

    class Probe(torch.nn.Module):
        def _apply(self, fn, recurse=True):
            seen.append(1)
            return super()._apply(fn, recurse)

    m = Probe()
    m.register_buffer("b", None)
    m.to(torch.float64).half().float().cpu()
    return True if len(seen) == 4 else None


# --- the in-place SiLU kernel ------------------------------------------------------------------
def _probe_silu():
    import torch

    k = torch._C._nn.silu_
    return k if callable(k) else None


def _public_silu_(x):
    import torch.nn.functional as F

    return F.silu(x, inplace=True)


def inplace_silu() -> Callable:
    """The in-place SiLU: ``torch._C._nn.silu_`` (what ``F.silu(x, inplace=True)`` calls), or that call."""
    return _probe(SILU_KERNEL) or _public_silu_


# --- the .pt2 writer ---------------------------------------------------------------------------
class FastPT2:
    """torch's own steps of ``torch.export.save``, split so that the graph is serialized once."""

    def __init__(self, serialize, package):
        self._serialize, self._P = serialize, package

    def serialize_graph(self, ep):
        """The program's graph serialized (weights and constants left out)."""
        return self._serialize(ep, None, self._P.DEFAULT_PICKLE_PROTOCOL, serialize_state_dict=False,
                               serialize_constants=False)

    def write(self, ep, graph) -> bytes:
        """``torch.export.save(ep)``'s archive, the graph taken from ``graph``, written by torch's own
        archive writer (``torch.export.pt2_archive._package_exported_programs``' steps)."""
        P, name, buf = self._P, "model", io.BytesIO()
        with P.PT2ArchiveWriter(buf) as w:
            P._package_payload_config(w, P._package_state_dict(name, ep, w, P.DEFAULT_PICKLE_PROTOCOL),
                                      P.WEIGHTS_CONFIG_FILENAME_FORMAT.format(name))
            P._package_payload_config(w, P._package_constants(name, ep, w, P.DEFAULT_PICKLE_PROTOCOL),
                                      P.CONSTANTS_CONFIG_FILENAME_FORMAT.format(name))
            w.write_bytes(P.MODELS_FILENAME_FORMAT.format(name), graph.exported_program)
            w.write_bytes(P.SAMPLE_INPUTS_FILENAME_FORMAT.format(name), graph.example_inputs)
        return buf.getvalue()


def _probe_pt2_writer():
    from torch._export.serde.serialize import serialize
    from torch.export.pt2_archive import _package as P

    for n in ("PT2ArchiveWriter", "_package_payload_config", "_package_state_dict", "_package_constants",
              "DEFAULT_PICKLE_PROTOCOL", "WEIGHTS_CONFIG_FILENAME_FORMAT", "CONSTANTS_CONFIG_FILENAME_FORMAT",
              "MODELS_FILENAME_FORMAT", "SAMPLE_INPUTS_FILENAME_FORMAT"):
        getattr(P, n)
    return FastPT2(serialize, P)


def fast_pt2() -> Optional[FastPT2]:
    """The split ``torch.export.save`` (``FastPT2``), or None: then write with ``torch.export.save``."""
    return _probe(PT2_WRITER)


# --- reading a .pt2 ----------------------------------------------------------------------------
# what torch.export.save writes (torch.export.pt2_archive.constants); the fallback's record names
_LAYOUT = {"WEIGHTS_CONFIG_FILENAME_FORMAT": "data/weights/{}_weights_config.json",
           "CONSTANTS_CONFIG_FILENAME_FORMAT": "data/constants/{}_constants_config.json",
           "MODELS_FILENAME_FORMAT": "models/{}.json", "SAMPLE_INPUTS_FILENAME_FORMAT": "data/sample_inputs/{}.pt",
           "WEIGHTS_DIR": "data/weights/", "CONSTANTS_DIR": "data/constants/", "WEIGHT_FILENAME_PREFIX": "weight_",
           "TENSOR_CONSTANT_FILENAME_PREFIX": "tensor_", "ARCHIVE_FORMAT_PATH": "archive_format",
           "ARCHIVE_FORMAT_VALUE": "pt2"}


class _Layout:
    def __init__(self, values: Dict[str, str]):
        self.__dict__.update(values)


def _probe_pt2_reader():
    from torch.export import pt2_archive
    from torch.export.pt2_archive import constants

    return pt2_archive.PT2ArchiveReader, _Layout({k: getattr(constants, k) for k in _LAYOUT})


def pt2_layout():
    """The record names of a ``.pt2`` (``WEIGHTS_DIR``, ``MODELS_FILENAME_FORMAT``, ...), torch's or the
    ones ``torch.export.save`` writes."""
    found = _probe(PT2_READER)
    return found[1] if found else _Layout(_LAYOUT)


class _Records:
    """An archive's records by name, without the root folder (``names``, ``read_bytes``, ``read_string``)."""

    def __init__(self, names, read):
        self.names, self._read = set(names), read

    def read_bytes(self, name: str) -> bytes:
        return self._read(name)

    def read_string(self, name: str) -> str:
        return self._read(name).decode("utf-8")


@contextmanager
def open_pt2(data: bytes) -> Iterator[_Records]:
    """The records of a ``.pt2`` archive: torch's own reader, or ``zipfile`` over the same records
    (one root folder, as torch's writer makes; its format record saying ``pt2``, as torch's reader
    requires). Raises on an archive either cannot read."""
    found = _probe(PT2_READER)
    if found:
        with found[0](io.BytesIO(data)) as r:
            yield _Records(r.get_file_names(), r.read_bytes)
        return
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        full = [i.filename for i in z.infolist()]
        roots = {n.split("/", 1)[0] for n in full}
        if len(roots) != 1 or any("/" not in n for n in full):
            raise ValueError(f"{len(roots)} root folders in the archive (torch's writer makes one)")
        root = roots.pop() + "/"
        fmt = root + _LAYOUT["ARCHIVE_FORMAT_PATH"]
        if fmt not in full or z.read(fmt).decode("utf-8", "replace") != _LAYOUT["ARCHIVE_FORMAT_VALUE"]:
            raise ValueError("invalid archive format (torch's reader requires "
                             f"{_LAYOUT['ARCHIVE_FORMAT_PATH']} = {_LAYOUT['ARCHIVE_FORMAT_VALUE']})")
        yield _Records((n[len(root):] for n in full), lambda n: z.read(root + n))


# --- a batch's imports before its workers fork -------------------------------------------------
def _probe_dynamo():
    import torch._dynamo  # noqa: F401

    return True


def preload_export() -> None:
    """Import what ``torch.export``'s trace, save and load need, ahead of a fork (a no-op without it)."""
    _probe(DYNAMO)


_PROBES: Dict[str, Callable[[], object]] = {
    MODULE_DICTS: _probe_module_dicts, MODULE_APPLY: _probe_module_apply, SILU_KERNEL: _probe_silu, PT2_WRITER: _probe_pt2_writer,
    PT2_READER: _probe_pt2_reader, DYNAMO: _probe_dynamo}


def _bind() -> None:
    """Bind ``module_params`` / ``module_buffers`` to the private dicts or their public views."""
    global module_params, module_buffers
    if _probe(MODULE_DICTS):
        module_params, module_buffers = _private_params, _private_buffers
    else:
        module_params, module_buffers = _Live, _Live

