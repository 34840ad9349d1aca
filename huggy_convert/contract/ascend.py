"""Ascend's side: the ``atc`` command line (ATC, the offline model compiler of CANN) and the precision
modes ATC and onnxruntime's CANN execution provider share. Read from Huawei's ATC parameter reference
(``--framework``, ``--input_shape``, ``--dynamic_batch_size``, ``--out_nodes``, ``--precision_mode``,
``--keep_dtype``) and onnxruntime's CANN execution provider page (``device_id``, ``precision_mode``)."""
from __future__ import annotations

ATC = "atc"
ATC_FRAMEWORK_ONNX = 5  # --framework=5: an ONNX model
ATC_SOC_PLACEHOLDER = "<SOC_VERSION>"  # the chip, e.g. Ascend310P3 (npu-smi info names it): the user fills it in
ATC_BATCH_PROFILES = (1, 2, 4, 8, 16, 32, 64)  # --dynamic_batch_size: 2..100 profiles, each 1..2048
ATC_DYNAMIC_DIM = -1  # the batch axis in --input_shape with --dynamic_batch_size (first axis only)
ATC_KEEP_DTYPE_SUFFIX = ".keep_dtype.cfg"  # our name for the --keep_dtype file: one node name per line

# --precision_mode values (ATC and the CANN execution provider)
PRECISION_FORCE_FP16 = "force_fp16"  # ATC's inference default: fp16 wherever an op has it, the normalizer too
PRECISION_ALLOW_FP32_TO_FP16 = "allow_fp32_to_fp16"  # matrix ops fp16; vector ops keep fp32 where they can
PRECISION_ALLOW_MIX = "allow_mix_precision"  # a built-in list decides, op by op
PRECISION_KEEP_ORIGIN = "must_keep_origin_dtype"  # the graph's own dtypes (fp32); --keep_dtype has no effect
PRECISION_MODES = (PRECISION_FORCE_FP16, PRECISION_ALLOW_FP32_TO_FP16, PRECISION_ALLOW_MIX, PRECISION_KEEP_ORIGIN)
ATC_PRECISION_DEFAULT = PRECISION_FORCE_FP16
CANN_EP_PRECISION_DEFAULT = PRECISION_KEEP_ORIGIN  # what verification asks the CANN execution provider for
KEEP_DTYPE_OPS = ("Sub", "Div", "Clip")  # the normalizer's ONNX nodes --keep_dtype keeps float32

# --precision_mode_v2 (CANN 8.5+; not together with --precision_mode): its values
PRECISION_V2_ORIGIN = "origin"  # the graph's own dtypes (fp32); --keep_dtype has no effect
PRECISION_V2_MIXED = "mixed_float16"  # a built-in list decides, op by op; --keep_dtype keeps the nodes it names
PRECISION_V2_DEFAULT = "fp16"

# onnxruntime's CANN execution provider
CANN_EP = "CANNExecutionProvider"
EP_OPT_DEVICE_ID = "device_id"  # CUDA's and CANN's provider option alike
CANN_OPT_PRECISION = "precision_mode"
