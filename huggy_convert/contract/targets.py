"""Deploy targets beyond ONNX and torch (issue 27): the names of OpenVINO, LiteRT and ExecuTorch.

Each target is an optional extra of the package (``pip install huggy-convert[<extra>]``): its Python
modules, its artifact suffixes, the precision it must be told to run in, and the operators of a policy
it lacks (a family it then refuses in one line, naming that operator). Read from OpenVINO's
``convert_model`` / ``save_model`` / ``Core.compile_model`` reference and its ``INFERENCE_PRECISION_HINT``
property, litert-torch's ``convert`` and ai-edge-litert's ``Interpreter``, and ExecuTorch's
``to_edge_transform_and_lower`` with its ``XnnpackPartitioner`` and ``executorch.runtime.Runtime``."""
from __future__ import annotations

# the kinds (artifact names, ``--targets`` words)
OPENVINO = "openvino"
LITERT = "litert"
EXECUTORCH = "executorch"
TARGETS = (OPENVINO, LITERT, EXECUTORCH)

# what each kind writes: suffix -> file (OpenVINO's IR is two files: the graph and the weights)
OPENVINO_XML = ".xml"
OPENVINO_BIN = ".bin"
LITERT_SUFFIX = ".tflite"
EXECUTORCH_SUFFIX = ".pte"
SUFFIXES = {OPENVINO: (OPENVINO_XML, OPENVINO_BIN), LITERT: (LITERT_SUFFIX,), EXECUTORCH: (EXECUTORCH_SUFFIX,)}
# each file as an artifact kind of a set (``core.artifacts.SUFFIXES``, the keys a report records): the
# target's name for its first file, ``<target>_<ext>`` for a second one
FILE_KINDS = {t: {(t if i == 0 else f"{t}_{s.lstrip('.')}"): s for i, s in enumerate(SUFFIXES[t])} for t in TARGETS}
# the kinds ``--targets`` names beside the deploy targets (``.safetensors`` is always written; the ``.onnx``
# too: the verification reads it), and the default set
CORE_TARGETS = ("onnx", "pt2")
DEFAULT_TARGETS = CORE_TARGETS

# measured (docs/targets.md): the runtimes whose two runs of a feed give the same bytes (check 4 runs them twice),
# and the converters whose files are the same bytes in any process (``verify OUT/`` regenerates and compares them;
# the others: their outputs are checked)
DETERMINISTIC = frozenset(TARGETS)
REPRODUCIBLE = frozenset(TARGETS)

# the module each needs importable (converter and runtime), and what to install where it is not
MODULES = {
    OPENVINO: ("openvino",),
    LITERT: ("litert_torch", "ai_edge_litert"),
    EXECUTORCH: ("executorch",),
}
EXTRA_INSTALL = {t: f"pip install 'huggy-convert[{t}]'" for t in TARGETS}
PIP_PACKAGES = {
    OPENVINO: ("openvino",),
    LITERT: ("litert-torch", "ai-edge-litert"),
    EXECUTORCH: ("executorch",),
}

# OpenVINO: the CPU plugin picks bf16 (AMX / AVX512-BF16) or fp16 unless told f32: the fp32 artifact runs in fp32
OV_DEVICE_CPU = "CPU"
OV_PRECISION_HINT = "INFERENCE_PRECISION_HINT"
OV_PRECISION_F32 = "f32"
OV_NUM_STREAMS = "NUM_STREAMS"
OV_THREADS = "INFERENCE_NUM_THREADS"
OV_COMPRESS_TO_FP16 = False  # save_model's compress_to_fp16 defaults to True: our IR keeps float32 weights

# LiteRT: the interpreter's default delegate (XNNPACK) may run fp16 where asked; we ask for nothing but fp32
LITERT_SIGNATURE = "serving_default"

# ExecuTorch
EXECUTORCH_METHOD = "forward"
EXECUTORCH_BACKEND = "XnnpackBackend"

# operators a target lacks, by the ONNX / aten name of the policy's part that needs it: a family whose
# graph holds one is refused in one line naming it (measured: docs/targets.md)
LACKS = {
    OPENVINO: {},
    LITERT: {},
    EXECUTORCH: {},
}
