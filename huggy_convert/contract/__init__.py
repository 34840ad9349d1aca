"""The contract with ML-Agents and Unity: every checkpoint key, run-directory name, ONNX tensor name,
node scope and canonical tensor name lives in this package and nowhere else.

- ``mlagents``: checkpoint keys and their patterns, run-directory names, the computation's constants
- ``unity``: the ONNX I/O names Unity binds to, node scopes, opsets
- ``canonical``: our safetensors' tensor names and format
- ``ascend``: the ``atc`` command line and the precision modes of ATC and onnxruntime's CANN provider
- ``hub``: what a Hugging Face Hub clone adds (``.gitattributes``, Git-LFS pointer files)
- ``sb3``: what Stable-Baselines3 writes (``model.zip``'s members and ``data`` keys, ``vec_normalize.pkl``'s globals)

Everything is re-exported here: ``from huggy_convert import contract as C; C.OBS_INPUT``.
"""
from .ascend import *  # noqa: F401,F403
from .canonical import *  # noqa: F401,F403
from .hub import *  # noqa: F401,F403
from .mlagents import *  # noqa: F401,F403
from .sb3 import *  # noqa: F401,F403
from .unity import *  # noqa: F401,F403
