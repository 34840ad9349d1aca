"""The golden file: the probes, the reference's outputs on them and the injected noise with what it
gave (``<stem>.golden.npz``, written at conversion, the reference of check 3 without an official ONNX)."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from .. import contract as C
from ..core.files import load_npz
from ..errors import InputError
from ..host import host_info
from ..runtime.base import STOCHASTIC
from ..runtime.feeds import injected

GOLDEN_IN, GOLDEN_OUT, GOLDEN_NOISE, GOLDEN_NOISED = "in.", "out.", "noise", "noised." + C.OUT_CONT
GOLDEN_HOST = "host"  # JSON of host.host_info() where the golden outputs were computed


def load_golden(path, spec=None, data: Optional[bytes] = None) -> Dict[str, Dict[str, np.ndarray]]:
    """A golden file's arrays (``core.files.load_npz``: no pickle, bounded; ``InputError``; ``data``: its
    bytes, already read), holding what check 3 reads from it for ``spec``'s policy: each input in its
    shape, one row count, the deterministic outputs, and where a sampled output takes injected noise
    (``runtime.feeds.injected``) that noise and the outputs it gave, both or neither, each of shape
    (rows, the noise's columns). An empty ``.npz``,
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
        width = sum(p.width for p in injected(spec))  # the noise ports': Port.noise "normal"
        if width:
            want = [next(iter(rows)), width]
            for name, arr in ((GOLDEN_NOISE, g["noise"]), (GOLDEN_NOISED, g["noised"])):
                if not arr:
                    raise InputError(f"golden file holds no {name!r} array (a sampled output with injected noise: the "
                                     f"noise and its outputs, {GOLDEN_NOISE!r} and {GOLDEN_NOISED!r}, go together)",
                                     path)
                if list(arr["probes"].shape) != want or arr["probes"].dtype.kind != "f":
                    raise InputError(f"golden {name!r} is {arr['probes'].dtype} of shape {list(arr['probes'].shape)},"
                                     f" not float of {want}", path)
    return g


def golden_bytes(feed, outputs, noise=None, noised=None) -> bytes:
    arrays = {GOLDEN_IN + k: v for k, v in sorted(feed.items())}
    arrays.update({GOLDEN_OUT + k: v for k, v in sorted(outputs.items()) if k not in STOCHASTIC})
    if noise is not None:
        arrays[GOLDEN_NOISE] = noise
        arrays[GOLDEN_NOISED] = noised
    arrays[GOLDEN_HOST] = np.array(json.dumps(host_info(), sort_keys=True))  # a str array: no pickle
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def ml_agents_golden(official_path: Optional[Path]) -> Optional[Dict[str, np.ndarray]]:
    """Golden inputs written beside an official ONNX (``<stem>.golden.npz``: inputs under their names)."""
    if official_path is None:
        return None
    p = official_path.with_suffix(".golden.npz")
    if not p.is_file():
        return None
    return load_npz(p, "golden file")
