"""huggy-convert: ML-Agents checkpoints to canonical safetensors, ONNX and torch modules, verified."""
from .converter import convert_checkpoint, load_policy, save_policy  # noqa: F401
from .core.policy import Policy  # noqa: F401
from .core.spec import PolicySpec  # noqa: F401
from .core.version import __version__  # noqa: F401
