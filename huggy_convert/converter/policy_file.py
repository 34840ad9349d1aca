"""The canonical safetensors policy, byte-for-byte reproducible, with safetensors' four verbs:
``dumps(policy) -> bytes``, ``loads(data) -> Policy``, ``save(policy, path)``, ``load(path) -> Policy``
(``policy_bytes`` / ``load_policy`` / ``save_policy`` are the same under their older names).

    >>> data = dumps(policy); loads(data).tensors.keys() == policy.tensors.keys()  # doctest: +SKIP

Layout: every tensor float32 under its canonical name (see ``contract``); metadata (str -> str,
keys sorted) holds the format, the spec as JSON, the source file's name and sha256, the
training step, the ML-Agents key of every tensor, the original dtype/shape of tensors that
were not float32, exact normalizer step counts beyond 2^24, and the tool's versions.

safetensors keeps ``__metadata__`` in a hash map whose order changes from process to process;
so that the same input gives the same bytes, the header is re-serialised with sorted keys.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from .. import contract as C
from ..core.files import atomic_write_bytes, clip, read_input_file
from ..core.policy import Policy
from ..core.spec import PolicySpec
from ..core.version import __version__
from ..errors import HuggyError, PolicyFileError, SpecError, describe, utf8_name
from .mapping import MappedPolicy, map_policy_as
from .reference import reconcile_divisors


def build_metadata(mapped: MappedPolicy, *, source_name: str, source_sha256: str, step: Optional[int],
                   recovered: Optional[Dict[str, object]] = None,
                   origin: Optional[Dict[str, object]] = None) -> Dict[str, str]:
    """The canonical file's metadata for ``mapped`` (``converter.mapping.MappedPolicy``: its spec, where each
    tensor came from, the keys ignored, the original dtypes, the exact step counts) from ``source_name``."""
    import safetensors

    spec, sources, ignored, original, exact_steps = (mapped.spec, mapped.sources, mapped.ignored, mapped.original,
                                                     mapped.exact_steps)

    j = lambda o: json.dumps(o, sort_keys=True, separators=(",", ":"))  # noqa: E731
    md = {
        "format": C.FORMAT_NAME,
        "format_version": C.FORMAT_VERSION,
        "spec": spec.to_json(),
        "source_file": utf8_name(source_name),  # valid UTF-8 whatever the file name
        "source_sha256": source_sha256,
        "training_step": "" if step is None else str(step),
        "sources": j(sources),
        "ignored_keys": j(ignored),
        "original_dtypes": j(original),
        "normalizer_exact_steps": j({k: str(v) for k, v in exact_steps.items()}),
        "versions": j({"huggy_convert": __version__, "safetensors": safetensors.__version__, "numpy": np.__version__}),
    }
    if recovered is not None:  # an ONNX-only policy (importers.from_onnx): what it holds instead of the sums
        md[C.MD_RECOVERED] = j(recovered)
    if origin is not None:  # another trainer's file (importers.sb3): what it was, what it does not hold
        md[C.MD_ORIGIN] = j(origin)
    return md


def policy_bytes(tensors: Dict[str, np.ndarray], metadata: Dict[str, str]) -> bytes:
    import safetensors.numpy as stnp

    for k, v in tensors.items():
        if v.dtype != np.float32:
            raise PolicyFileError(f"tensor '{k}' is {v.dtype}; the canonical file holds float32 only")
    raw = stnp.save({k: (v if v.flags.c_contiguous else v.copy(order="C")) for k, v in tensors.items()}, metadata=metadata)
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    ordered = {"__metadata__": dict(sorted(meta.items()))}
    ordered.update(header)  # tensor entries keep safetensors' own order (it fixes the data offsets)
    text = json.dumps(ordered, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


def dumps(policy: Policy) -> bytes:
    """The canonical file's bytes (float32 tensors, sorted metadata): the same policy, the same bytes."""
    return policy_bytes(policy.tensors, policy.metadata)


def save(policy: Policy, path) -> Path:
    """Write the canonical file atomically (temporary name, fsync, rename)."""
    atomic_write_bytes(path, dumps(policy))
    return Path(path)


def save_policy(policy: Policy, path) -> Path:
    """``save`` under its public name: the policy first, the destination second, as every verb here and
    safetensors' ``save_file(tensors, filename)``. The reversed order is refused before anything is written."""
    if isinstance(policy, (str, os.PathLike)):
        raise TypeError("save_policy(policy, path): the policy first, the destination second (the arguments "
                        "came the other way round)")
    return save(policy, path)


def _header(data: bytes) -> Dict[str, str]:
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"header of {n} bytes in a {len(data)}-byte file")
    md = json.loads(data[8:8 + n]).get("__metadata__") or {}
    if not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values()):
        raise ValueError("metadata is not a str -> str map")
    return dict(md)


def _json_map(md: Dict[str, str], key: str, p) -> dict:
    """Metadata ``key`` parsed: a JSON object (a ``PolicyFileError`` otherwise)."""
    try:
        v = json.loads(md.get(key, "{}"))
    except (ValueError, RecursionError):
        v = None
    if not isinstance(v, dict):
        raise PolicyFileError(f"damaged metadata: '{key}' is not a JSON object", p)
    return v


def _check_exact_steps(md: Dict[str, str], tensors: Dict[str, np.ndarray], p) -> None:
    """``normalizer_exact_steps``: canonical step tensors -> their exact count (a decimal string that
    rounds to the float32 tensor)."""
    for k, v in _json_map(md, "normalizer_exact_steps", p).items():
        ok = k in tensors and isinstance(v, str) and v.isdigit() and len(v) <= 19
        if ok:
            ok = 0 < int(v) < 2 ** 63 and np.float32(int(v)) == np.asarray(tensors[k]).reshape(-1)[:1].astype(np.float32)
        if not ok:
            raise PolicyFileError(f"damaged metadata: 'normalizer_exact_steps' has {clip(repr(k), 60)}: "
                                  f"{clip(repr(v), 40)}, not the exact count of a step tensor", p)


def _check_tensors(spec: PolicySpec, tensors: Dict[str, np.ndarray], sources: Dict, p) -> None:
    """The tensors are the spec's: the same key rules that wrote the file (``converter.mapping``) run
    on its tensors under their ML-Agents names (``sources``) and must find this very spec; the
    divisors have the observations' widths; no other tensor is in the file."""
    import torch

    sd = {}
    for canonical, key in sources.items():
        if not isinstance(key, str):
            raise PolicyFileError(f"damaged metadata: 'sources' maps {clip(repr(canonical), 60)} to a {type(key).__name__}", p)
        if canonical not in tensors:
            raise PolicyFileError(f"missing tensor {clip(repr(canonical), 60)} (its metadata lists it)", p)
        sd[key] = torch.from_numpy(np.ascontiguousarray(tensors[canonical]))
    try:
        mapped = map_policy_as(sd, spec)
    except HuggyError as exc:
        raise PolicyFileError(f"tensors do not match the spec metadata: {exc.message}", p) from None
    if mapped.spec != spec:
        raise PolicyFileError(f"tensors do not match the spec metadata: they are a {mapped.spec.family}, the spec "
                              f"says {spec.family}", p)
    divisors = {C.c_divisor(i): n for i, n in spec.vector_obs} if spec.normalize else {}
    for name, n in divisors.items():
        if name in tensors and tensors[name].shape != (n,):
            raise PolicyFileError(f"wrong shape for tensor '{name}': {list(tensors[name].shape)}, expected [{n}]", p)
    extra = sorted(set(tensors) - set(sources) - set(divisors))
    if extra:
        raise PolicyFileError(f"unexpected tensor {clip(repr(extra[0]), 60)} (not in its metadata's sources)", p)


def loads(data: bytes, path=None) -> Policy:
    """A canonical policy from the file's bytes (``path`` names the file in errors)."""
    import safetensors.numpy as stnp

    p = Path(path) if path is not None else None
    try:
        md = _header(data)
        tensors = stnp.load(data)
    except Exception as exc:
        raise PolicyFileError(f"not a readable safetensors file ({describe(exc, 160)})", p) from None
    if md.get("format") != C.FORMAT_NAME:
        raise PolicyFileError(f"not a huggy-convert policy (metadata format is {md.get('format')!r})", p)
    if md.get("format_version") not in C.FORMAT_VERSIONS_READ:
        raise PolicyFileError(f"policy format version {md.get('format_version')!r}, this tool reads "
                              f"{', '.join(C.FORMAT_VERSIONS_READ)}", p)
    if "spec" not in md:
        raise PolicyFileError("damaged metadata (no 'spec')", p)
    try:
        spec = PolicySpec.from_json(md["spec"])
    except SpecError as exc:
        raise PolicyFileError(f"damaged spec metadata: {exc.message}", p) from None
    sources = _json_map(md, "sources", p)
    for key in ("ignored_keys", "original_dtypes", "normalizer_exact_steps", C.MD_DIVISOR, C.MD_RECOVERED):
        if key in md:
            _json_map(md, key, p)
    _check_exact_steps(md, tensors, p)
    _check_tensors(spec, tensors, sources, p)
    policy = Policy(spec=spec, tensors=tensors, sources=sources, metadata=md)
    if not spec.normalize:
        return policy
    if md.get("format_version") == "1":  # written before divisors were stored: IEEE

        return reconcile_divisors(policy)[0]
    missing = [C.c_divisor(i) for i, _ in spec.vector_obs if C.c_divisor(i) not in tensors]
    if missing:
        raise PolicyFileError(f"missing tensor '{missing[0]}' (a format-2 policy stores each normalizer's divisor)", p)
    return policy


def load(path) -> Policy:
    """Read a canonical safetensors policy back into spec + tensors (bitwise round trip)."""
    p = Path(path)
    if not p.is_file():
        raise PolicyFileError("no such file", p)
    return loads(read_input_file(p, "policy file"), p)


def load_policy(path) -> Policy:
    return load(path)
