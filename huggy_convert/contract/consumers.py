"""Who loads our ONNX files, and what each of them requires: the rules ``huggy-convert check`` applies,
as data. Each fact names where it was read (package, file or page, version).

ML-Agents' Unity package (com.unity.ml-agents), ``Runtime/Inference/SentisModelInfo.cs`` and
``SentisModelParamLoader.cs`` (4.0.0; 3.x the same with ``Unity.Sentis``; 2.x ``BarracudaModelParamLoader.cs``):

- the model is built on the CPU and run once with every input zero-filled, and every declared output is
  copied (``SentisModelInfo`` constructor, ``CacheOutputTensors``): an output that does not compute
  throws at load;
- every input is given as a float tensor (``GetInputTensors``: ``TensorType.FloatingPoint``), inputs
  sorted by name;
- ``version_number`` and ``memory_size`` are read as ``Tensor<float>`` (``GetTensorByNameAsInt``): an
  int64 constant throws ``InvalidCastException``; either missing: "Required constant … was not found";
- the API version must be 2..3 (``ModelApiVersion.MinSupportedVersion``/``MaxSupportedVersion``); a
  version-2 model with ``memory_size > 0`` is refused (``CheckModelVersion``);
- ``memory_size > 0`` needs a ``recurrent_in`` input and a ``recurrent_out`` output
  (``CheckInputTensorPresence``, ``CheckOutputTensorPresence``);
- continuous actions: an output whose name contains ``continuous_actions`` (``deterministic_continuous_actions``
  when Deterministic Inference is ticked) and ``continuous_action_output_shape > 0``; discrete: the
  same with ``discrete_actions``, ``discrete_action_output_shape`` summed over its elements, and an
  ``action_masks`` input; output names are matched by substring (``OutputsContainName``: ``Contains``);
- a model without the v2 names but with ``is_continuous_control``, ``action`` and
  ``action_output_shape`` is read the v1 way (``CheckSupportsContinuousAndDiscrete``).

Unity's runtime (com.unity.sentis 1.x/2.0–2.1, com.unity.ai.inference 2.2–2.3 "Inference Engine",
Sentis again from 2.4): ONNX opset 7–15 (its "Export an ONNX file from a machine learning framework"
page); external weight files beside the model are read (Sentis 2.1.1's "models over 2GB" fix);
``DequantizeLinear``, ``QuantizeLinear`` and ``DynamicQuantizeLinear`` are not imported (listed as
unsupported since 1.3.0-pre.3); before 2.4.0 "ONNX model outputs that are not connected to any inputs"
were "incorrectly pruned" (CHANGELOG 2.4.0). Barracuda (ML-Agents 2.x): opset 9, weights inside the
file. ML-Agents 2.x runs on Barracuda, 3.x on Sentis 1.x, 4.x on Inference Engine 2.2.

Ascend ATC (``atc --framework=5``), its "ONNX operator specification" pages: CANN 5.0 and 6.0 "ONNX
1.8.0, opset v9~v13"; CANN 7.0 "ONNX 1.12.0, opset v9~v18"; CANN 8.0's ``--framework`` page opset
v11~v15. onnxruntime's CANN execution provider (its "CANN Execution Provider" page): no dynamic shapes.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

from .unity import (ACTION_MASKS as _MASKS, OUT_CONT as _C, OUT_CONT_DET as _CD, OUT_CONT_SHAPE as _CS,
                    OUT_DISC as _D, OUT_DISC_DET as _DD, OUT_DISC_SHAPE as _DS, OUT_MEMORY as _M, OUT_VERSION as _V,
                    RECURRENT_IN as _RI, RECURRENT_OUT as _RO)
from .unity import OUTPUTS as _OUTPUTS

# ML-Agents' API versions (SentisModelParamLoader.ModelApiVersion)
API_VERSIONS = (2, 3)
API_V1_NAMES = ("is_continuous_control", "action", "action_output_shape")  # the v1 outputs it still reads
QUANTIZE_OPS = frozenset({"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear"})
ONNX_DOMAINS = ("", "ai.onnx")  # the standard operator set; anything else is a custom domain
DYNAMO_DOMAIN_PREFIX = "pkg.onnxscript"  # functions torch's dynamo exporter (onnxscript) leaves in a file
DYNAMO_MIN_OPSET = 18  # torch.onnx.export(dynamo=True) writes opset 18 and above
SENTIS_PRUNE_FIXED = "2.4.0"


class Consumer(NamedTuple):
    """One program that loads an ONNX. ``opsets``: the window it imports; ``external_data``: whether weights
    may live in a side file; ``denied_ops``: operators it does not import; ``prunes_unconnected``: it drops
    outputs no input reaches (Sentis before 2.4); ``mlagents``: it is ML-Agents' Unity package, whose
    loader's rules apply; ``deterministic_option``: that package has the Deterministic Inference option;
    ``fixed_shapes``: it needs every dimension fixed; ``source``: where the facts were read."""

    name: str
    title: str
    opsets: Optional[Tuple[int, int]]  # None: whatever the runtime itself loads
    external_data: bool
    denied_ops: frozenset = frozenset()
    prunes_unconnected: bool = False
    mlagents: bool = False
    deterministic_option: bool = False
    fixed_shapes: bool = False
    ascend: Optional[str] = None  # the CANN version whose ATC this is
    source: str = ""


_SENTIS_SRC = "com.unity.sentis / com.unity.ai.inference docs (opset 7-15, supported operators), CHANGELOG 2.4.0"
_MLA_SRC = "com.unity.ml-agents Runtime/Inference/SentisModelInfo.cs, SentisModelParamLoader.cs"
_ATC_SRC = "CANN {v} ATC, ONNX operator specification"

CONSUMERS = (
    Consumer("mlagents-2", "ML-Agents 2.x (Barracuda)", (9, 9), external_data=False, mlagents=True,
             source=_MLA_SRC + " (2.x: BarracudaModelParamLoader.cs); Barracuda: opset 9"),
    Consumer("mlagents-3", "ML-Agents 3.x (Sentis 1.x)", (7, 15), external_data=True, denied_ops=QUANTIZE_OPS,
             prunes_unconnected=True, mlagents=True, deterministic_option=True, source=_MLA_SRC + "; " + _SENTIS_SRC),
    Consumer("mlagents-4", "ML-Agents 4.x (Inference Engine 2.2)", (7, 15), external_data=True, denied_ops=QUANTIZE_OPS,
             prunes_unconnected=True, mlagents=True, deterministic_option=True, source=_MLA_SRC + "; " + _SENTIS_SRC),
    Consumer("sentis-1", "Unity Sentis 1.x", (7, 15), external_data=True, denied_ops=QUANTIZE_OPS,
             prunes_unconnected=True, source=_SENTIS_SRC),
    Consumer("sentis-2", "Unity Sentis 2.0-2.3 / Inference Engine", (7, 15), external_data=True,
             denied_ops=QUANTIZE_OPS, prunes_unconnected=True, source=_SENTIS_SRC),
    Consumer("barracuda", "Unity Barracuda", (9, 9), external_data=False, source="Barracuda (ML-Agents 2.x): opset 9"),
    Consumer("cann-5", "Ascend ATC, CANN 5.0", (9, 13), external_data=True, ascend="5.0", source=_ATC_SRC.format(v="5.0.4")),
    Consumer("cann-6", "Ascend ATC, CANN 6.0", (9, 13), external_data=True, ascend="6.0", source=_ATC_SRC.format(v="6.0.1")),
    Consumer("cann-7", "Ascend ATC, CANN 7.0", (9, 18), external_data=True, ascend="7.0", source=_ATC_SRC.format(v="7.0.0")),
    Consumer("cann-8", "Ascend ATC, CANN 8.x", (11, 15), external_data=True, ascend="8.0",
             source="CANN 8.0 ATC --framework page (opset v11~v15)"),
    Consumer("ort-cann", "onnxruntime CANN provider", None, external_data=True, fixed_shapes=True,
             source="onnxruntime CANN Execution Provider page (no dynamic shapes); its opsets: onnxruntime's own"),
)
BY_NAME = {c.name: c for c in CONSUMERS}
# the window every CANN >= 5, Sentis and ML-Agents share (what a file meant for all of them should use)
SHARED_WINDOW = (11, 13)

# --- What ML-Agents' loader reads, by name (SentisModelInfo.cs), for the rules in conformance/ ---------


class Head(NamedTuple):
    """One kind of action output as the loader finds it: by substring of ``sampled`` (or of
    ``deterministic`` with Deterministic Inference ticked), its size constant summed over its elements,
    and the input it needs beside it."""

    kind: str
    sampled: str
    deterministic: str
    size: str
    needs_input: Optional[str] = None


VERSION_OUTPUT = _V
STATE_SIZE, STATE_INPUT, STATE_OUTPUT = _M, _RI, _RO  # memory_size > 0 needs recurrent_in and recurrent_out
FLOAT_CONSTANTS = (_V, _M)  # read as Tensor<float> at load; missing: "Required constant ... was not found"
HEADS = (Head("continuous", _C, _CD, _CS), Head("discrete", _D, _DD, _DS, _MASKS))
V2_MARKS = (_C, _D)  # CheckSupportsContinuousAndDiscrete: an output containing either name
ACTION_OUTPUTS = (_C, _D, _CD, _DD, API_V1_NAMES[1])  # "The model does not contain any Action Output Node"
UNITY_OUTPUTS = _OUTPUTS  # every output name an ML-Agents policy has


class Target(NamedTuple):
    """What ``--target`` asks for: the opset written (ML-Agents' 9 for Unity; 13 for Ascend, in every CANN's
    window), the consumers whose rules the written file is checked against, and for Ascend the CANN
    version the printed ``atc`` command is for."""

    name: str
    opset: int
    consumers: Tuple[str, ...]
    cann: Optional[str] = None
    help: str = ""


TARGETS = (
    Target("unity", 9, ("mlagents-2", "mlagents-3", "mlagents-4"), help="ML-Agents' Unity package 2.x-4.x (opset 9, as its exporter)"),
    Target("sentis", 9, ("mlagents-3", "mlagents-4", "sentis-1", "sentis-2"), help="Unity Sentis / Inference Engine"),
    Target("barracuda", 9, ("mlagents-2", "barracuda"), help="Unity Barracuda (ML-Agents 2.x)"),
    Target("ascend", 13, ("cann-5", "cann-6", "cann-7"), cann="7.0", help="Ascend ATC, CANN 5.0-7.0"),
    Target("ascend-cann8", 13, ("cann-8",), cann="8.5", help="Ascend ATC, CANN 8.x (--precision_mode_v2)"),
)
TARGETS_BY_NAME = {t.name: t for t in TARGETS}
# CANN 8.5's ATC documents --precision_mode_v2 (fp16 its default, origin, mixed_float16, ...; not together
# with --precision_mode); --keep_dtype does nothing under origin. Before 8.5: --precision_mode.
PRECISION_V2_FROM = (8, 5)
