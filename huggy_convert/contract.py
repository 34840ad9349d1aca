"""The contract with ML-Agents and Unity: every checkpoint key, every ONNX tensor name and
every canonical tensor name lives here and nowhere else.

Read from ML-Agents 1.1.0 (``mlagents/trainers/torch_entities/networks.py``, ``encoders.py``,
``distributions.py``, ``model_serialization.py`` and ``model_saver/torch_model_saver.py``).
"""
from __future__ import annotations

import re

# --- checkpoint top level (torch_model_saver: {name: module.state_dict()}) -------------
CKPT_POLICY = "Policy"
CKPT_GLOBAL_STEP = "global_step"
GLOBAL_STEP_KEY = "_GlobalSteps__global_step"
CKPT_KNOWN_PREFIXES = ("Optimizer:", "Module:")

# --- run directory (results/<run-id>/) -------------------------------------------------
STATUS_FILE = "run_logs/training_status.json"
CHECKPOINT_FILE = "checkpoint.pt"  # the newest step saved a second time
STATUS_METADATA = "metadata"
STATUS_CHECKPOINTS = "checkpoints"
STATUS_FINAL = "final_checkpoint"
STATUS_STEPS = "steps"
STATUS_REWARD = "reward"
STATUS_CREATION_TIME = "creation_time"
STATUS_FILE_PATH = "file_path"  # the .onnx
STATUS_AUX_FILES = "auxillary_file_paths"  # (sic) the .pt

# --- Policy state dict (SimpleActor) ----------------------------------------------------
K_VERSION = "version_number"
K_IS_CONTINUOUS = "is_continuous_int_deprecated"
K_CONT_SIZE = "continuous_act_size_vector"
K_DISC_SIZES = "discrete_act_size_vector"
K_ACT_SIZE = "act_size_vector_deprecated"
K_MEMORY_SIZE = "memory_size_vector"
CONSTANT_KEYS = (K_VERSION, K_IS_CONTINUOUS, K_CONT_SIZE, K_DISC_SIZES, K_ACT_SIZE, K_MEMORY_SIZE)

MODEL_EXPORT_VERSION = 3  # SimpleActor.MODEL_EXPORT_VERSION (ModelApiVersion.MLAgents2_0)

NORM_PREFIX = "network_body.observation_encoder.processors.{i}.normalizer."
NORM_ALIAS_PREFIX = "network_body.processors.{i}.normalizer."  # same module, second name
NORM_STEPS = "normalization_steps"
NORM_MEAN = "running_mean"
NORM_VAR = "running_variance"
NORM_FIELDS = (NORM_STEPS, NORM_MEAN, NORM_VAR)

BODY_LAYER = "network_body._body_endoder.seq_layers.{j}.{p}"  # (sic: endoder); j = 2*layer
LSTM_KEY = "network_body.lstm.lstm.{p}_l0"  # weight_ih, weight_hh, bias_ih, bias_hh
LSTM_PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

MU = "action_model._continuous_distribution.mu.{p}"
LOG_SIGMA = "action_model._continuous_distribution.log_sigma"  # PPO: Parameter [1, A]
LOG_SIGMA_LINEAR = "action_model._continuous_distribution.log_sigma.{p}"  # SAC: Linear
DISC_BRANCH = "action_model._discrete_distribution.branches.{b}.{p}"

# Keys that are deliberately not part of the exported actor.
IGNORED_PATTERNS = (
    (re.compile(r"^value_heads\."), "value head of a shared critic (not part of the actor)"),
)
# Families we recognise but do not support yet: (pattern, what to say).
UNSUPPORTED_PATTERNS = (
    (re.compile(r"\.conv_layers\.|\.processors\.\d+\.(conv|dense|final_flat)|visual"), "visual observations (CNN encoders)"),
    (re.compile(r"attention|entity_embedding|rsa\.|\.embedding\."), "attention / entity observations"),
    (re.compile(r"_body_endoder\.(conditional|hyper)|hypernet"), "goal-conditioned (hypernetwork) bodies"),
)

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
NOISE_INPUT = "epsilon"  # only in our --noise-input variant: the RandomNormalLike draw as an input
BATCH_DIM = "batch"
ONNX_OPSET_DEFAULT = 9
ONNX_OPSETS = tuple(range(9, 16))  # Barracuda: 9; Sentis: 7-15; Ascend ATC: 9-13 (CANN 5/6), 9-18 (CANN 7)

# --- The computation's constants --------------------------------------------------------
NORM_CLIP = 5.0
ACTION_CLIP = 3.0
SAC_LOG_SIGMA_MIN = -20.0
SAC_LOG_SIGMA_MAX = 2.0
MASK_PENALTY = 1e8
EPSILON = 1e-7

# --- Canonical tensor names in our safetensors ------------------------------------------
def c_norm(i: int, field: str) -> str:
    return f"obs.{i}.normalizer.{ {'normalization_steps': 'steps', 'running_mean': 'mean', 'running_variance': 'variance'}[field] }"


def c_divisor(i: int) -> str:
    """The folded divisor ``sqrt(variance / steps)`` the artifacts divide by (IEEE, or adopted from the
    official ONNX: see numerics.ieee_divisor and converter.reference)."""
    return f"obs.{i}.normalizer.divisor"


def c_body(layer: int, p: str) -> str:
    return f"body.{layer}.{p}"


def c_lstm(p: str) -> str:
    return f"lstm.{p}"


C_MU_W = "continuous.mu.weight"
C_MU_B = "continuous.mu.bias"
C_LOG_SIGMA = "continuous.log_sigma"  # PPO parameter [1, A]
C_LOG_SIGMA_W = "continuous.log_sigma.weight"  # SAC
C_LOG_SIGMA_B = "continuous.log_sigma.bias"


def c_branch(b: int, p: str) -> str:
    return f"discrete.{b}.{p}"


def c_const(key: str) -> str:
    return f"const.{key}"


FORMAT_NAME = "huggy-convert/policy"
FORMAT_VERSION = "2"  # 2 adds obs.{i}.normalizer.divisor and the "divisor" metadata
FORMAT_VERSIONS_READ = ("1", "2")  # a version-1 file gets the IEEE divisor when read
MD_DIVISOR = "divisor"  # metadata: where the divisor came from (JSON, see converter.reference)
ONNX_META_DIVISOR = "huggy_convert.divisor"  # the same record in the rebuilt ONNX's metadata_props
DIVISOR_MODES = ("auto", "ieee")  # auto: adopt an official divisor within 1 ulp of IEEE; ieee: never
FLOAT32_EXACT_INT_LIMIT = 2 ** 24
