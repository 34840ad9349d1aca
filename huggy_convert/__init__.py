"""huggy-convert: ML-Agents checkpoints to canonical safetensors, ONNX and torch modules, verified.

The public API (``huggy_convert.api``, docs/api.md): ``convert(source, out)``, ``verify_files(out)``,
``load_policy(path) -> Session`` (``act``/``sample`` with memory state), ``save_policy(policy, path)``,
``to_checkpoint(policy, out)``: the thing first, the destination second."""
__version__ = "0.1.0"

from .api import Actions, Session, convert, load_policy, save_policy, to_checkpoint, verify_files  # noqa: E402,F401
from .converter import Policy, PolicySpec  # noqa: E402,F401
