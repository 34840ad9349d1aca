"""Devices and dtypes for the torch module. torch_npu is imported only where it is installed: for ``npu``,
or to list the NPUs verification checks (see ``available_devices``)."""
from __future__ import annotations

from typing import List, Optional

import importlib.util
import platform

from ..core.bounds import PRECISIONS
from ..errors import DeviceError

DTYPES = tuple(PRECISIONS)  # float32, float16, bfloat16: the formats whose bounds core.bounds derives
NPU = "npu"  # an Ascend NPU: torch_npu for torch, onnxruntime-cann for onnxruntime


def torch_npu_installed() -> bool:
    """Whether torch_npu is installed (looked up, not imported)."""
    return importlib.util.find_spec("torch_npu") is not None


def torch_dtype(name: str):
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise DeviceError(f"unknown dtype '{name}': choose float32, float16 or bfloat16")
    return table[name]


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401  (registers the 'npu' device with torch)
    except Exception:
        return False
    import torch

    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def strict_float32() -> None:
    """float32 on CUDA means float32: TF32 off for cuDNN convolutions (on by default in torch: a 10-bit
    mantissa, errors ~1e-3, far past the derived bounds of a camera's encoder) and for matmuls (off by
    default; set explicitly). Process-wide torch flags, set wherever a CUDA device is resolved."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def resolve_device(name: str) -> str:
    """``cpu``, ``cuda[:i]``, ``npu[:i]`` or ``auto`` (npu, then cuda, then cpu) -> a torch device string."""
    import torch

    base = name.split(":")[0]
    if name == "auto":
        if _npu_available():
            return "npu"
        if torch.cuda.is_available():
            strict_float32()
            return "cuda"
        return "cpu"
    if base == "cpu":
        return name
    if base == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("device 'cuda' asked for, but torch sees no CUDA device here")
        strict_float32()
        return name
    if base == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise DeviceError("device 'npu' asked for, but torch_npu is not installed "
                              "(pip install torch-npu beside it, the build matching your torch and CANN)") from None
        if not torch.npu.is_available():
            raise DeviceError("device 'npu' asked for, but torch_npu sees no Ascend NPU")
        return name
    raise DeviceError(f"unknown device '{name[:40]}': choose cpu, cuda, npu or auto")


def available_devices(include_npu: Optional[bool] = None) -> List[str]:
    """Every device index present: cpu always, each CUDA device, and each NPU. ``include_npu=None``
    looks for NPUs only where torch_npu is installed (on such a machine ``import torch`` loads it
    anyway, since torch 2.5); elsewhere torch_npu is never imported."""
    import torch

    if include_npu is None:
        include_npu = torch_npu_installed()
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if include_npu and _npu_available():
        out += [f"npu:{i}" for i in range(torch.npu.device_count())]
    return out


def device_name(dev: str) -> str:
    import torch

    if dev.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(dev))
    if dev.split(":")[0] == NPU:
        if not torch_npu_installed():  # asked for through onnxruntime's CANN execution provider only
            return "Ascend NPU (no torch_npu here)"
        return torch.npu.get_device_name(torch.device(dev))
    return platform.processor() or platform.machine()
