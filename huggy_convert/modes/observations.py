"""Observations a mode reads: an observation file (.npy, .npz, .json) or arrays given in memory, checked
against the policy's inputs; a wrong shape is one line naming the input, and what it is
(``blocks.describe_input``)."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict

import numpy as np

from .. import contract as C
from ..blocks import describe_input
from ..core.files import load_npz, read_input_file
from ..core.flow import STATE
from ..core.spec import OBS_VECTOR, PolicySpec
from ..errors import InputError, describe


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


def _split_flat(spec: PolicySpec, a, path: Path) -> Dict[str, np.ndarray]:
    other = [i for i in range(spec.obs_count) if spec.obs_kind(i) != OBS_VECTOR]
    if other:
        i = other[0]
        raise InputError(f"one flat array cannot hold {C.OBS_INPUT.format(i=i)} "
                         f"[rows, {', '.join(map(str, spec.obs_shape(i)))}] ({describe_input(spec, i)}): give an .npz "
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
        out[k] = _as_rows(d[k], spec.obs_shape(i), k, path, describe_input(spec, i, np.shape(d[k])))
    for port in spec.io_signature().fills():  # the inputs a feed may leave out (masks, carried state)
        if port.name not in d:
            continue
        dims = tuple(int(x) for x in port.dims[1:])
        if port.kind == STATE:  # carried state: any layout of its elements, row by row
            m = np.asarray(d[port.name], np.float32)
            out[port.name] = m.reshape((m.shape[0] if m.ndim > 1 else 1,) + dims)
        else:
            out[port.name] = _as_rows(d[port.name], dims, port.name, path)
    rows = {v.shape[0] for v in out.values()}
    if len(rows) != 1:
        raise InputError(f"inputs disagree on the number of rows: {sorted(rows)}", path)
    return out


def obs_feed(spec: PolicySpec, obs, path=None) -> Dict[str, np.ndarray]:
    """Observations given in memory, checked as an observation file's are: a dict by input name (the inputs
    a feed may leave out, masks and carried state, may come with them), one array per observation (a list or tuple of arrays), or one array of
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
