"""huggy-convert: ML-Agents checkpoints to canonical safetensors, ONNX and torch modules, verified."""
__version__ = "0.1.0"

from .converter import Policy, PolicySpec, convert_checkpoint, load_policy, save_policy  # noqa: E402,F401
