"""Unity's side of the contract: the ONNX tensor names Barracuda/Sentis bind to (ML-Agents'
``TensorNames``), the node scopes and initializer names ML-Agents' exporter gives, and the opsets."""
from __future__ import annotations

# --- The ONNX contract with Unity (TensorNames) -----------------------------------------
OBS_INPUT = "obs_{i}"
ACTION_MASKS = "action_masks"
RECURRENT_IN = "recurrent_in"
OUT_VERSION = "version_number"
OUT_MEMORY = "memory_size"
OUT_CONT = "continuous_actions"
OUT_CONT_SHAPE = "continuous_action_output_shape"
OUT_CONT_DET = "deterministic_continuous_actions"
OUT_DISC = "discrete_actions"
OUT_DISC_SHAPE = "discrete_action_output_shape"
OUT_DISC_DET = "deterministic_discrete_actions"
RECURRENT_OUT = "recurrent_out"
OUTPUTS = (OUT_VERSION, OUT_MEMORY, OUT_CONT, OUT_CONT_SHAPE, OUT_CONT_DET, OUT_DISC, OUT_DISC_SHAPE, OUT_DISC_DET,
           RECURRENT_OUT)  # every output an ML-Agents policy can have, in Unity's order
NOISE_INPUT = "epsilon"  # only in our --noise-input variant: the RandomNormalLike draw as an input
BATCH_DIM = "batch"
ONNX_OPSET_DEFAULT = 9  # what ML-Agents' exporter writes
ONNX_OPSETS = tuple(range(9, 16))  # what this tool rebuilds: 9..15

# --- Where each runtime takes an ONNX: the one opset story of the help texts, the README and the atc hint
# (runtime, first opset, last opset, what says so). ATC: hiascend.com "ONNX算子规格" pages of CANN 5.0.4
# (canncommercial/5046 .../atctool/atlasatc_16_0164.html) and 6.0.1 (canncommercial/601
# .../atctool/atctool_0178.html): "ONNX 1.8.0, Opset v9~v13"; CANN 7.0.0 (canncommercial/700
# .../atctool/atlasatc_16_0201.html): "ONNX 1.12.0, Opset v9~v18"; CANN 8.0's ATC --framework page:
# opset v11~v15 (8.x no longer promises 9 or 10). contract.consumers holds the same windows per consumer.
OPSET_TARGETS = (
    ("Barracuda", 9, 9, "Unity Barracuda (ML-Agents' own target): its opset-13 Clip/Slice/Squeeze forms are not for it"),
    ("Unity Sentis", 7, 15, "Sentis imports opset 7-15 (newer releases more)"),
    ("Ascend ATC, CANN 5.0/6.0", 9, 13, "ATC's ONNX operator spec: ONNX 1.8.0, opset v9-v13"),
    ("Ascend ATC, CANN 7.0", 9, 18, "ATC's ONNX operator spec: ONNX 1.12.0, opset v9-v18"),
    ("Ascend ATC, CANN 8.x", 11, 15, "ATC's --framework page of CANN 8.0: opset v11-v15"),
)


def opset_story() -> str:
    """``9 = ML-Agents/Barracuda; Unity Sentis 7-15; ...``: the opset advice every help text gives."""
    parts = [f"{lo} = ML-Agents/{name}" if lo == hi else f"{name}: {lo}-{hi}" for name, lo, hi, _ in OPSET_TARGETS]
    return "; ".join(parts)


def opset_targets(opset: int):
    """(runtime, accepts ``opset``) for every target of :data:`OPSET_TARGETS`."""
    return [(name, lo <= opset <= hi) for name, lo, hi, _ in OPSET_TARGETS]

# Node scopes of ML-Agents' export (torch.onnx names nodes by module path); our rebuilt graph uses the same.
SCOPE_NORMALIZER = "/network_body/observation_encoder/processors.{i}/normalizer"
SCOPE_OBS_ENCODER = "/network_body/observation_encoder"
SCOPE_BODY_LAYER = "/network_body/_body_endoder/seq_layers/seq_layers.{j}"
SCOPE_HYPER_LAYER = "/network_body/_body_endoder/layers.{j}"  # goal-conditioned body (ConditionalEncoder)
SCOPE_HYPER_NET = "/network_body/_body_endoder/layers.{j}/hypernet/hypernet.{k}"
SCOPE_HYPER_MARK = "/hypernet/"  # in the name of every node of a hypernetwork (goal-conditioned body)
SCOPE_BODY_MARK = "_body_endoder"  # in the name of every body Gemm
SCOPE_NETWORK_BODY = "/network_body"
SCOPE_LSTM = "/network_body/lstm"
SCOPE_LSTM_CELL = "/network_body/lstm/lstm"
SCOPE_CONTINUOUS = "/_continuous_distribution"
SCOPE_MU = "/_continuous_distribution/mu"
SCOPE_LOG_SIGMA = "/_continuous_distribution/log_sigma"
SCOPE_DISCRETE = "/_discrete_distribution"
SCOPE_BRANCH = "/_discrete_distribution/branches.{b}"
SCOPE_ENTITY = "/network_body/observation_encoder/processors.{i}"
SCOPE_ENTITY_LAYER = "/network_body/observation_encoder/processors.{i}/self_ent_encoder/seq_layers/seq_layers.{j}"
SCOPE_X_SELF_LAYER = "/network_body/observation_encoder/x_self_encoder/seq_layers/seq_layers.{j}"
SCOPE_RSA = "/network_body/observation_encoder/rsa"
SCOPE_RSA_LINEAR = "/network_body/observation_encoder/rsa/fc_{n}"
SCOPE_RSA_NORM = "/network_body/observation_encoder/rsa/{which}"  # embedding_norm, residual_norm
RSA_NORMS = ("embedding_norm", "residual_norm")
SCOPE_ATTENTION = "/network_body/observation_encoder/rsa/attention"
SCOPE_VISUAL = "/network_body/observation_encoder/processors.{i}"  # a camera's encoder (its Reshape, resnet's Relu)
SCOPE_VIS_CONV = "/network_body/observation_encoder/processors.{i}/conv_layers/conv_layers.{j}"
SCOPE_VIS_DENSE = "/network_body/observation_encoder/processors.{i}/dense/dense.{j}"
SCOPE_VIS_RESNET_DENSE = "/network_body/observation_encoder/processors.{i}/dense"
SCOPE_VIS_SEQ = "/network_body/observation_encoder/processors.{i}/sequential/sequential.{j}"
SCOPE_VIS_BLOCK = "/network_body/observation_encoder/processors.{i}/sequential/sequential.{j}/layers/layers.{k}"
SCOPE_LOG_SIGMA_MARK = "log_sigma"  # in the name of the SAC log_sigma Gemm
VERSION_INIT = "version_number.1"  # the initializer behind the version_number output (torch's name for the copy)
LSTM_INIT = "network_body.lstm.lstm.{p}"  # W, R, B: the LSTM's ONNX initializers
TRANSPOSED_INIT = "{key}.T"  # a Linear's weight transposed for a MatMul (torch names its copy onnx::MatMul_<n>)
NORM_DIVISOR_INIT = "network_body.observation_encoder.processors.{i}.normalizer.divisor"
