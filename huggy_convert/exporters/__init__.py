"""Stage 2: artifacts built from a canonical policy: the Unity ONNX and torch modules."""
from .onnx_export import build_onnx, model_bytes, with_noise_input  # noqa: F401
