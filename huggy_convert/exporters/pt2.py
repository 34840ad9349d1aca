"""The ``.pt2`` artifact: the policy's torch module as a ``torch.export`` program.

The supported way, and the default: trace once per architecture (``PolicySpec``), copy each
policy's weights into that ``ExportedProgram`` and ``torch.export.save`` it.

``torch.export.save`` re-serializes the whole graph every time (its ``serialize`` deep-copies and
canonicalizes the graph: ~40 ms for Huggy), although only the weights differ between the
checkpoints of one run. ``ProgramWriter(fast=True)`` (what a run-directory batch uses) therefore
serializes the graph once per architecture and writes each archive with torch's own
``PT2ArchiveWriter`` and packaging functions: the same records in the same order as
``torch.export.save`` (checked byte for byte on the first policy of each architecture; any
difference and that architecture falls back to ``torch.export.save``; so does a torch without those
private steps: ``torchcompat.fast_pt2``). No zip record is written by hand, and the files are
verified only through ``torch.export.load`` and by comparing their bytes with what this writer
gives for the policy read back from the ``.safetensors``.
``benchmarks/batch.py --pt2`` measures the two ways side by side.

The archive holds no source location (``exporters.torch_module.export_program`` drops the nodes'
stack traces: our install path and line numbers), so the bytes are the same from any install.

``torch.export`` (trace, save, load) is not thread-safe: tracing swaps global state, so it runs
alone (``EXPORT_GATE.exclusive()``) while a batch's workers hold ``EXPORT_GATE.shared()``.
"""
from __future__ import annotations

import io
import json
import threading
from contextlib import contextmanager
from typing import Dict, List, Optional

import numpy as np
import torch

from ..converter.checkpoint import torch_load_weights_only
from ..core import torchcompat
from ..errors import describe
from ..core.numerics import same_arrays
from .torch_module import build_module, export_program


class Gate:
    """A reader-writer gate: workers compute under a shared hold; torch.export runs exclusively.

    A thread that holds the shared side and asks for the exclusive one gives its shared hold up
    meanwhile (so two such threads cannot deadlock) and takes it back afterwards."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0
        self._local = threading.local()

    @contextmanager
    def shared(self):
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        self._local.held = True
        try:
            yield
        finally:
            self._local.held = False
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self):
        held = getattr(self._local, "held", False)
        with self._cond:
            if held:
                self._shared -= 1
                self._cond.notify_all()
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
                if held:
                    while self._exclusive or self._waiting:
                        self._cond.wait()
                    self._shared += 1


EXPORT_GATE = Gate()


def _save(ep) -> bytes:
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def _same_tensors(kept, tensors) -> bool:
    """``core.numerics.same_arrays``, never an array compared with itself or a view of it (a policy changed in
    place since would compare equal to what it was)."""
    return not any(np.may_share_memory(kept[k], v) for k, v in tensors.items() if k in kept) \
        and same_arrays(kept, tensors)


class ProgramWriter:
    """``.pt2`` bytes for policies, the graph traced once per architecture (thread-safe).

    ``fast``: write later archives with the graph serialized once (see the module docstring).

    A program's bytes are a function of the policy's spec and tensors alone (the module is built
    from nothing else, and the archive holds no time or path): the writer keeps the archive it wrote
    last per architecture with the policy's tensors, until its next call for that architecture; a
    policy whose tensors equal those, bit for bit, then gets those bytes again without a second build
    (check 6 of a conversion regenerates the ``.pt2`` from the ``.safetensors`` read back: the same
    tensors as the checkpoint's, or a failure)."""

    def __init__(self, fast: bool = False):
        self.fast = fast
        self._programs: Dict[object, object] = {}  # spec -> ExportedProgram
        self._graphs: Dict[object, Optional[object]] = {}  # spec -> serialized graph (None: save)
        self._locks: Dict[object, threading.Lock] = {}
        self._lock = threading.Lock()
        self._last: Dict[object, tuple] = {}  # spec -> (tensors, bytes) of the last program written
        self.notes: List[str] = []

    def _trace(self, policy, module) -> Optional[bytes]:
        """Trace the architecture of ``policy`` if it is new (alone: torch.export is not thread-safe);
        returns the first policy's bytes when this call traced, else None."""
        spec = policy.spec
        if spec in self._programs:
            return None
        with EXPORT_GATE.exclusive():
            if spec in self._programs:
                return None
            ep = export_program(module)  # without the nodes' stack traces: the same bytes from any install
            real = _save(ep)
            if self.fast:  # serialize the graph once; kept only if it gives torch.export.save's bytes
                graph = None
                fast = torchcompat.fast_pt2()  # None where this torch lacks the private steps
                if fast is None:
                    self.notes.append(f"{spec.family}: .pt2 written with torch.export.save (this torch has no "
                                      "split writer)")
                else:
                    try:
                        graph = (fast, fast.serialize_graph(ep))
                        if fast.write(ep, graph[1]) != real:
                            graph = None
                            self.notes.append(f"{spec.family}: the graph serialized once did not reproduce "
                                              "torch.export.save; every .pt2 written with torch.export.save")
                    except Exception as exc:  # a torch whose packaging differs: the supported way only
                        graph = None
                        self.notes.append(f"{spec.family}: .pt2 written with torch.export.save "
                                          f"({type(exc).__name__})")
                self._graphs[spec] = graph
            self._locks[spec] = threading.Lock()
            self._programs[spec] = ep
            return real

    def program_bytes(self, policy) -> bytes:
        spec = policy.spec
        last = self._last.pop(spec, None)  # kept for one call: nothing outlives the conversion that wrote it
        if last is not None and _same_tensors(last[0], policy.tensors):
            return last[1]
        traced = spec in self._programs
        data = self._program_bytes(policy)
        if traced:  # not the call that traced (a batch traces in the parent, before its workers fork)
            self._last[spec] = (dict(policy.tensors), data)
        return data

    def _program_bytes(self, policy) -> bytes:
        module = build_module(policy, "cpu", "float32")
        first = self._trace(policy, module)
        if first is not None:
            return first
        spec = policy.spec
        ep = self._programs[spec]
        with self._locks[spec]:  # one program object per architecture: swap and write one at a time
            sd = module.state_dict()
            with torch.no_grad():
                for k, v in ep.state_dict.items():
                    v.copy_(sd[k])
                for k, v in ep.constants.items():
                    if k in sd and isinstance(v, torch.Tensor):
                        v.copy_(sd[k])
            graph = self._graphs.get(spec) if self.fast else None
            return _save(ep) if graph is None else graph[0].write(ep, graph[1])


_DEFAULT = ProgramWriter()


def program_bytes(policy, writer: Optional[ProgramWriter] = None) -> bytes:
    """The ``.pt2`` bytes of ``policy`` (``writer``: a batch's, tracing once per architecture)."""
    return (writer or _DEFAULT).program_bytes(policy)


# --- reading a .pt2 that may come from anyone --------------------------------------------------
_FIXED_RECORDS = ("archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id")


def unsafe_reason(data: bytes) -> Optional[str]:
    """Why ``torch.export.load`` must not open this archive, or None.

    ``torch.export.load`` unpickles with ``weights_only=False`` whatever the archive says is a pickle
    (weights or constants with ``use_pickle``, custom and opaque objects, legacy weight files) and
    falls back to ``weights_only=False`` when its sample inputs do not load weights-only: any of
    them runs code. Allowed is what ``torch.export.save`` writes for a plain program: the fixed
    records, one model's JSON, raw weight and tensor-constant records named in their configs without
    pickles, and sample inputs that load weights-only. Read with torch's own
    archive reader (``torchcompat.open_pt2``: ``zipfile`` where torch has none); nothing is unpickled
    but those sample inputs, weights-only."""
    P = torchcompat.pt2_layout()
    try:
        with torchcompat.open_pt2(data) as r:
            names = r.names
            models = [n[len("models/"):-len(".json")] for n in names if n.startswith("models/") and n.endswith(".json")]
            if len(models) != 1:
                return f"{len(models)} models in the archive (a plain torch.export.save holds one)"
            m = models[0]
            cfgs = {"weights": P.WEIGHTS_CONFIG_FILENAME_FORMAT.format(m),
                    "constants": P.CONSTANTS_CONFIG_FILENAME_FORMAT.format(m)}
            allowed = set(_FIXED_RECORDS) | set(cfgs.values()) | {P.MODELS_FILENAME_FORMAT.format(m),
                                                                 P.SAMPLE_INPUTS_FILENAME_FORMAT.format(m)}
            prefixes = {"weights": P.WEIGHTS_DIR + P.WEIGHT_FILENAME_PREFIX,
                        "constants": P.CONSTANTS_DIR + P.TENSOR_CONSTANT_FILENAME_PREFIX}
            for kind, cfg_name in cfgs.items():
                if cfg_name not in names:
                    return f"no {cfg_name}"
                cfg = json.loads(r.read_string(cfg_name)).get("config") or {}
                for fqn, meta in cfg.items():
                    path = (P.WEIGHTS_DIR if kind == "weights" else P.CONSTANTS_DIR) + str(meta.get("path_name"))
                    if meta.get("use_pickle") or not path.startswith(prefixes[kind]):
                        return f"{kind[:-1]} {fqn!r} is stored as a pickle ({meta.get('path_name')})"
                    allowed.add(path)
            extra = sorted(n for n in names - allowed)
            if extra:
                return f"records a plain program does not have: {', '.join(extra[:3])}"
            sample = P.SAMPLE_INPUTS_FILENAME_FORMAT.format(m)
            if sample in names:
                torch_load_weights_only(r.read_bytes(sample))
    except Exception as exc:
        return f"not a readable torch.export archive ({describe(exc, 120)})"
    return None
