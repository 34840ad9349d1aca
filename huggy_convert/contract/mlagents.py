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

# Visual observations (ObservationEncoder: one visual encoder per camera observation, ``h_size`` =
# hidden_units; encoders.py, utils.py ModelUtils.get_encoder_for_type / MIN_RESOLUTION_FOR_ENCODER)
VIS_SIMPLE, VIS_NATURE, VIS_RESNET, VIS_MATCH3, VIS_FULLY_CONNECTED = (
    "simple", "nature_cnn", "resnet", "match3", "fully_connected")  # network_settings.vis_encode_type
VIS_ENCODE_TYPES = (VIS_SIMPLE, VIS_NATURE, VIS_RESNET, VIS_MATCH3, VIS_FULLY_CONNECTED)
VIS_MIN_RESOLUTION = {VIS_FULLY_CONNECTED: 1, VIS_MATCH3: 5, VIS_SIMPLE: 20, VIS_NATURE: 36, VIS_RESNET: 15}
# (out channels, kernel, stride) of each Conv2d of conv_layers (a LeakyReLU after each: Sequential index 2*n)
VIS_CONVS = {VIS_SIMPLE: ((16, 8, 4), (32, 4, 2)),  # SimpleVisualEncoder
             VIS_NATURE: ((32, 8, 4), (64, 4, 2), (64, 3, 1)),  # NatureVisualEncoder
             VIS_MATCH3: ((35, 3, 1), (144, 3, 1)),  # SmallVisualEncoder (King's Candy Crush net)
             VIS_FULLY_CONNECTED: ()}  # FullyConnectedVisualEncoder: flatten + dense
# ResNetVisualEncoder: per stack Conv2d(3x3, pad 1), MaxPool2d(3, 2), n_blocks ResNetBlocks (Swish, Conv,
# Swish, Conv, plus the input); after the stacks a Swish, the dense Linear, ReLU
VIS_RESNET_CHANNELS = (16, 32, 32)
VIS_RESNET_BLOCKS = 2
VIS_RESNET_BLOCK_CONVS = (1, 3)  # ResNetBlock.layers indices of its two Conv2d (Swish at 0 and 2)
VIS_POOL = (3, 2)  # MaxPool2d kernel, stride; no padding, floor
LEAKY_RELU_SLOPE = 0.01  # nn.LeakyReLU() default negative_slope
VIS_PREFIX = "network_body.observation_encoder.processors.{i}."
VIS_ALIAS_PREFIX = "network_body.processors.{i}."  # the same module under a second name
VIS_CONV = "conv_layers.{j}.{p}"  # j = 2*conv
VIS_DENSE = "dense.0.{p}"  # Sequential(linear_layer, LeakyReLU)
VIS_RESNET_DENSE = "dense.{p}"  # a bare linear_layer, ReLU'd in forward
VIS_RESNET_CONV = "sequential.{j}.{p}"
VIS_RESNET_BLOCK_CONV = "sequential.{j}.layers.{k}.{p}"
VISUAL_RE = re.compile(r"^network_body\.observation_encoder\.processors\.(\d+)\.(conv_layers|dense|sequential)\.(.+)$")
VISUAL_ALIAS_RE = re.compile(r"^network_body\.processors\.(\d+)\.(conv_layers|dense|sequential)\.(.+)$")

# Keys that are deliberately not part of the exported actor.
IGNORED_PATTERNS = (
    (re.compile(r"^value_heads\."), "value head of a shared critic (not part of the actor)"),
)
# Families we recognise but do not support yet: (pattern, what to say). None left: every ML-Agents
# actor family (vector, visual, variable-length, goal-conditioned, LSTM) has its block.
UNSUPPORTED_PATTERNS: tuple = ()

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
SAC_LOG_SIGMA_MIN = -20.0  # Stable-Baselines3's SAC clamps its log_std the same (sac/policies.py LOG_STD_MIN/MAX)
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
