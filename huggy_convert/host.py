"""What machine a result was computed on: CPU, ISA flags, torch / MKL / onnxruntime, ``MKL_CBWR``.

Recorded in ``verify.json``, ``golden.npz`` and the batch manifest, so that a result read on another
machine says where it came from (``verify OUT/`` compares the golden file's host with its own).
"""
from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from typing import Dict

import numpy as np

_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def _cpu() -> Dict[str, object]:
    model, flags = platform.processor() or "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model or platform.machine(), "isa": [f for f in _ISA_FLAGS if f in flags]}


@lru_cache(maxsize=1)
def _static() -> Dict[str, object]:
    import onnxruntime
    import torch

    mkl = next((m.group(1).strip() for m in re.finditer(r"Math Kernel Library Version ([^\n]+?) for", torch.__config__.show())),
               None)
    d: Dict[str, object] = {"machine": platform.machine(), "system": platform.system()}
    d.update(_cpu())
    d.update({
        "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": mkl if torch.backends.mkl.is_available() else None,
        "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
    })
    return d


def host_info() -> Dict[str, object]:
    """The host record (MKL_CBWR as set now: it selects MKL's code path)."""
    return dict(_static(), mkl_cbwr=os.environ.get("MKL_CBWR"))


def same_arithmetic(a: Dict[str, object], b: Dict[str, object]) -> bool:
    """Whether two host records describe the same float32 kernels (CPU, ISA, library versions, MKL path)."""
    keys = ("cpu", "isa", "machine", "torch", "onnxruntime", "mkl", "mkl_cbwr")
    return all(a.get(k) == b.get(k) for k in keys)


def describe(h: Dict[str, object]) -> str:
    isa = "/".join(h.get("isa") or []) or "?"
    return (f"{h.get('cpu')} ({h.get('machine')}, {isa}), torch {h.get('torch')}, onnxruntime {h.get('onnxruntime')}"
            + (f", MKL_CBWR={h['mkl_cbwr']}" if h.get("mkl_cbwr") else ""))
