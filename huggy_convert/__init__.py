"""huggy-convert: ML-Agents checkpoints to canonical safetensors, ONNX and torch modules, verified.

The public API (``huggy_convert.api``, docs/api.md): ``convert(source, out)``, ``verify_files(out)``,
``load_policy(path) -> Session`` (``act``/``sample`` with memory state), ``save_policy(policy, path)``,
``to_checkpoint(policy, out)``: the thing first, the destination second. Those names are imported on
first use (PEP 562), so that ``import huggy_convert`` and the numpy-only paths (the spec, the canonical
file's metadata) stay free of torch and onnx."""
from . import blocks  # noqa: F401  (the block registry binds the spec to itself: core.spec.bind_architecture)
from .core.policy import Policy  # noqa: F401
from .core.spec import PolicySpec  # noqa: F401
from .core.version import __version__  # noqa: F401

API = ("Actions", "Session", "convert", "load_policy", "save_policy", "to_checkpoint", "verify_files")
__all__ = ["Policy", "PolicySpec", "__version__", *API]


def __getattr__(name: str):
    if name in API:
        from . import api  # the root's lazy public API (tests/test_layers.py names this one exemption)

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
