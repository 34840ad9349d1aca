"""ML-Agents' side of the contract: checkpoint keys (with their compiled patterns), run-directory
names and the computation's constants.

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
RUN_LOGS = "run_logs"
STATUS_NAME = "training_status.json"
STATUS_FILE = f"{RUN_LOGS}/{STATUS_NAME}"  # per behavior: its checkpoints, steps, rewards
RUN_CONFIGURATION = "configuration.yaml"  # written at the run root when training starts
DEPLOYED_ONNX = "{behavior}.onnx"  # at the run root: ModelSerializer's final export, copied there
CHECKPOINT_FILE = "checkpoint.pt"  # the newest step saved a second time
STATUS_METADATA = "metadata"
STATUS_CHECKPOINTS = "checkpoints"
STATUS_FINAL = "final_checkpoint"
STATUS_STEPS = "steps"
STATUS_REWARD = "reward"
STATUS_CREATION_TIME = "creation_time"
STATUS_FILE_PATH = "file_path"  # the .onnx
STATUS_AUX_FILES = "auxillary_file_paths"  # (sic) the .pt
STATUS_AUX_FILES_FIXED = "auxiliary_file_paths"  # the spelling a later ML-Agents may use
CHECKPOINT_SUFFIX = ".pt"
STEP_CHECKPOINT_RE = re.compile(r"^(?P<behavior>.+)-(?P<step>\d+)\.pt$")  # <Behavior>-<step>.pt
RESULTS_DIR = "results"  # mlagents-learn --results-dir default
LEARN_COMMAND = "mlagents-learn"
LEARN_INITIALIZE_FROM = "--initialize-from"  # reads results/<run-id>/<Behavior>/checkpoint.pt
LEARN_RUN_ID = "--run-id"
SETTING_INIT_PATH = "init_path"  # behaviors.<Behavior>.init_path: a checkpoint file to initialize from

# --- Policy state dict (SimpleActor) ----------------------------------------------------
K_VERSION = "version_number"
K_IS_CONTINUOUS = "is_continuous_int_deprecated"
K_CONT_SIZE = "continuous_act_size_vector"
K_DISC_SIZES = "discrete_act_size_vector"
K_ACT_SIZE = "act_size_vector_deprecated"
K_MEMORY_SIZE = "memory_size_vector"
CONSTANT_KEYS = (K_VERSION, K_IS_CONTINUOUS, K_CONT_SIZE, K_DISC_SIZES, K_ACT_SIZE, K_MEMORY_SIZE)

# trainer_type values whose actor this tool reads (POCA's actor has PPO's layout)
TRAINER_PPO = "ppo"
TRAINER_SAC = "sac"  # conditional log_sigma (a Linear) and a tanh squash

MODEL_EXPORT_VERSION = 3  # SimpleActor.MODEL_EXPORT_VERSION (ModelApiVersion.MLAgents2_0)

NORM_PREFIX = "network_body.observation_encoder.processors.{i}.normalizer."
NORM_ALIAS_PREFIX = "network_body.processors.{i}.normalizer."  # same module, second name
NORM_STEPS = "normalization_steps"
NORM_MEAN = "running_mean"
NORM_VAR = "running_variance"
NORM_FIELDS = (NORM_STEPS, NORM_MEAN, NORM_VAR)  # in the order Normalizer registers its buffers
NORM_STEPS_DTYPE = "int64"  # register_buffer("normalization_steps", torch.tensor(1)): a 0-d int64
GLOBAL_STEP_DTYPE = "int64"  # GlobalSteps: nn.Parameter(torch.Tensor([0]).to(torch.int64)), shape [1]

BODY_LAYER = "network_body._body_endoder.seq_layers.{j}.{p}"  # (sic: endoder); j = 2*layer
# goal_conditioning_type: hyper (ConditionalEncoder): regular layers are linear_layers under
# layers.{j}; the last one (num_conditional_layers = 1) is a HyperNetwork: its own bias and the
# hypernet Sequential (Linear 0, Swish 1, Linear 2, Swish 3, LayerNorm 4, Linear 5) of num_layers = 2
GOAL_NONE, GOAL_HYPER = "none", "hyper"  # ConditioningType (goal_conditioning_type)
HYPER_LAYER = "network_body._body_endoder.layers.{j}.{p}"  # j = 2*layer (Swish between)
HYPER_NET = "network_body._body_endoder.layers.{j}.hypernet.{k}.{p}"  # k in HYPER_NET_LINEARS
HYPER_NET_LINEARS = (0, 2, 5)
LAYER_NORM_EPS = 1e-5  # layers.LayerNorm: (x - mean) / sqrt(var + 1e-5)
LSTM_KEY = "network_body.lstm.lstm.{p}_l0"  # weight_ih, weight_hh, bias_ih, bias_hh
LSTM_PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
LSTM_W_IH, LSTM_W_HH, LSTM_B_IH, LSTM_B_HH = LSTM_PARAMS

MU = "action_model._continuous_distribution.mu.{p}"
LOG_SIGMA = "action_model._continuous_distribution.log_sigma"  # PPO: Parameter [1, A]
LOG_SIGMA_LINEAR = "action_model._continuous_distribution.log_sigma.{p}"  # SAC: Linear
DISC_BRANCH = "action_model._discrete_distribution.branches.{b}.{p}"

# Variable-length observations (ObservationEncoder with an EntityEmbedding per such observation and
# one ResidualSelfAttention over all of them: attention.py, utils.py create_residual_self_attention)
ENTITY_ENCODER = "network_body.observation_encoder.processors.{i}.self_ent_encoder.seq_layers.0.{p}"
ENTITY_ENCODER_PARAMS = ("seq_layers.0.weight", "seq_layers.0.bias")  # what a self_ent_encoder holds (one Linear)
ENTITY_ENCODER_ALIAS = "network_body.processors.{i}.self_ent_encoder.seq_layers.0.{p}"  # same module
X_SELF_ENCODER = "network_body.observation_encoder.x_self_encoder.seq_layers.0.{p}"  # the self embedding
RSA_LINEAR = "network_body.observation_encoder.rsa.fc_{n}.{p}"
RSA_LINEARS = ("q", "k", "v", "out")

# Keys that are deliberately not part of the exported actor.
IGNORED_PATTERNS = (
    (re.compile(r"^value_heads\."), "value head of a shared critic (not part of the actor)"),
)
# Families we recognise but do not support yet: (pattern, what to say).
UNSUPPORTED_PATTERNS = (
    (re.compile(r"\.conv_layers\.|\.processors\.\d+\.(conv|dense|final_flat)|visual"), "visual observations (CNN encoders)"),
)

# Compiled patterns of the keys above (converter.mapping accounts for every key with them).
NORM_RE = re.compile(r"^network_body\.observation_encoder\.processors\.(\d+)\.normalizer\.(\w+)$")
NORM_ALIAS_RE = re.compile(r"^network_body\.processors\.(\d+)\.normalizer\.(\w+)$")
BODY_RE = re.compile(r"^network_body\._body_endoder\.seq_layers\.(\d+)\.(weight|bias)$")
HYPER_RE = re.compile(r"^network_body\._body_endoder\.layers\.(\d+)\.(weight|bias|hypernet\.\d+\.(?:weight|bias))$")
HYPER_GOAL_WEIGHT_RE = re.compile(r"^network_body\._body_endoder\.layers\.\d+\.hypernet\.0\.weight$")  # takes the goal
BRANCH_RE = re.compile(r"^action_model\._discrete_distribution\.branches\.(\d+)\.(weight|bias)$")
ENTITY_RE = re.compile(r"^network_body\.observation_encoder\.processors\.(\d+)\.self_ent_encoder\.(.+)$")
ENTITY_ALIAS_RE = re.compile(r"^network_body\.processors\.(\d+)\.self_ent_encoder\.(.+)$")
ATTENTION_RE = re.compile(r"^network_body\.observation_encoder\.(rsa|x_self_encoder)\.")
LSTM_PREFIX = "network_body.lstm."
NORMALIZER_INFIX = ".normalizer."  # in every normalizer key (a checkpoint with normalize: false has none)

# --- The computation's constants --------------------------------------------------------
NORM_CLIP = 5.0
ACTION_CLIP = 3.0
SAC_LOG_SIGMA_MIN = -20.0
SAC_LOG_SIGMA_MAX = 2.0
MASK_PENALTY = 1e8
EPSILON = 1e-7
# attention (networks.py ObservationEncoder, attention.py)
ATTENTION_EMBEDDING_SIZE = 128  # ObservationEncoder.ATTENTION_EMBEDDING_SIZE: fixed
ATTENTION_HEADS = 4  # ResidualSelfAttention's num_heads default (the only one ObservationEncoder uses)
ENTITY_MASK_BELOW = 0.01  # get_zero_entities_mask: an entity is padding when sum(features^2) < 0.01
ATTENTION_NEG_INF = -1e6  # MultiHeadAttention.NEG_INF: a masked key's logit
LAYER_NORM_EPS = 1e-5  # layers.LayerNorm: (x - mean) / sqrt(var + 1e-5), no gamma/beta
POOL_EPSILON = 1e-7  # ResidualSelfAttention.EPSILON: the masked mean's denominator
# Which ML-Agents export of the attention a policy's ONNX mirrors: 1.1.0's, or 0.30.0's (Release 20,
# torch 1.x, for Barracuda), which transposes and reshapes each entity input before use
# (``x.transpose(2, 1).reshape(-1, max_entities, size)``: a different function of the input) and,
# without torch 2.x's common-subexpression elimination, computes LayerNorm's ``x - mean`` and the
# pooling's ``1 - mask`` twice, with Pow's exponent an initializer
ATTENTION_EXPORT_110, ATTENTION_EXPORT_030 = "1.1", "0.30"
ATTENTION_EXPORTS = (ATTENTION_EXPORT_110, ATTENTION_EXPORT_030)
