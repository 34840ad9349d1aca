"""Stable-Baselines3's side: what ``model.save("model.zip")`` and ``VecNormalize.save(...)`` write, read
from SB3 2.x (``stable_baselines3/common/save_util.py``, ``common/vec_env/vec_normalize.py``,
``common/running_mean_std.py``) and the files SB3 2.9.2 writes itself (``fixtures/sb3/``)."""
from __future__ import annotations

import re

# --- files (importers/sb3_files.py)

# model.zip: its members (save_util.save_to_zip_file)
SB3_ZIP_SUFFIX = ".zip"
SB3_DATA = "data"  # JSON text (save_util.data_to_json)
SB3_POLICY = "policy.pth"  # the policy's state dict, torch.save
SB3_VERSION = "_stable_baselines3_version"  # text, e.g. "2.9.2"
SB3_REQUIRED_MEMBERS = (SB3_DATA, SB3_POLICY)

# the data JSON: an object SB3 could not write as JSON is {":type:": ..., ":serialized:": base64 cloudpickle,
# ...}; the serialized text is never decoded here
SB3_SERIALIZED = ":serialized:"
SB3_TYPE = ":type:"
SB3_POLICY_KWARGS = "policy_kwargs"
SB3_OBSERVATION_SPACE = "observation_space"
SB3_ACTION_SPACE = "action_space"
SB3_POLICY_CLASS = "policy_class"

# VecNormalize.save: a pickle of the VecNormalize object, its venv None
SB3_VEC_NORMALIZE = "vec_normalize.pkl"
# CheckpointCallback (common/callbacks.py, ``_checkpoint_path``): ``{name_prefix}_{num_timesteps}_steps.zip``,
# and with ``save_vecnormalize=True`` ``{name_prefix}_vecnormalize_{num_timesteps}_steps.pkl`` beside it
SB3_STEP_ZIP_RE = re.compile(r"^(?P<prefix>.+)_(?P<step>[0-9]+)_steps\.zip$", re.IGNORECASE)
SB3_CALLBACK_VEC_NORMALIZE = "{prefix}_vecnormalize_{step}_steps.pkl"
# rl-baselines3-zoo's log folder logs/<algo>/<EnvName>_<n>/: <EnvName>.zip (final), best_model.zip,
# rl_model_<N>_steps.zip, and the env's VecNormalize in the subfolder named after the env
SB3_ZOO_VEC_NORMALIZE = "vecnormalize.pkl"  # <folder>/<EnvName>/vecnormalize.pkl
SB3_DATA_PROBE_BYTES = 1 << 20  # the data member read for num_timesteps while finding a batch's zips (KBs)
SB3_VEC_NORMALIZE_NAMES = (  # beside a model zip, {stem} its stem; rl-zoo: vecnormalize.pkl in the run's folder
    "{stem}_vec_normalize.pkl", "{stem}.vec_normalize.pkl", SB3_VEC_NORMALIZE, SB3_ZOO_VEC_NORMALIZE)
# the VecNormalize object's attributes read (its __dict__, set by pickle's BUILD)
VN_OBS_RMS = "obs_rms"
VN_NORM_OBS = "norm_obs"
VN_NORM_OBS_KEYS = "norm_obs_keys"
VN_CLIP_OBS = "clip_obs"
VN_EPSILON = "epsilon"
VN_OBSERVATION_SPACE = "observation_space"
RMS_MEAN = "mean"  # RunningMeanStd's attributes
RMS_VAR = "var"
RMS_COUNT = "count"
SPACE_SHAPE = "_shape"  # a gymnasium space's shape attribute

# the globals a VecNormalize pickle names, as (module, name); each becomes an inert stand-in
VN_CLASS = ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize")
RMS_CLASS = ("stable_baselines3.common.running_mean_std", "RunningMeanStd")
SPACE_CLASSES = tuple((f"{pkg}.spaces.{mod}", name) for pkg in ("gymnasium", "gym") for mod, name in (
    ("box", "Box"), ("discrete", "Discrete"), ("multi_discrete", "MultiDiscrete"),
    ("multi_binary", "MultiBinary"), ("dict", "Dict"), ("tuple", "Tuple")))
DICT_SPACE_NAME = "Dict"  # a dict observation space (norm_obs_keys): not supported
NUMPY_RANDOM_CLASSES = (  # a space's generator (_np_random): stand-ins, never the real constructors
    ("numpy.random._pickle", "__generator_ctor"), ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._pcg64", "PCG64"), ("numpy.random._pcg64", "PCG64DXSM"), ("numpy.random._mt19937", "MT19937"),
    ("numpy.random._philox", "Philox"), ("numpy.random._sfc64", "SFC64"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"), ("numpy.random.bit_generator", "SeedSequence"),
    ("numpy.random._generator", "Generator"), ("numpy.random.mtrand", "RandomState"))
# numpy's arrays, dtypes and scalars, rebuilt by our own code from their pickled state (numpy 2: _core; 1: core)
NP_RECONSTRUCT = (("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"))
NP_SCALAR = (("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"))
NP_FROMBUFFER = (("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"))  # protocol 5
NP_NDARRAY = ("numpy", "ndarray")
NP_DTYPE = ("numpy", "dtype")

# --- keys (importers/sb3.py: policy.pth's state dict) --------------------------------------------------
SB3_SOURCE = "sb3"  # spec field ``source`` (blocks/actor.py); ML-Agents' is the default, never written
SB3_TRAINER = "Stable-Baselines3"
SB3_A2C, SB3_TD3 = "a2c", "td3"  # spec field ``algorithm`` beside ML-Agents' ppo and sac (SB3's PPO/SAC use those)
# ActorCriticPolicy (PPO, A2C): mlp_extractor.policy_net = [Linear, act] x n; action_net; log_std [A]
SB3_POLICY_NET = "mlp_extractor.policy_net."  # + "{j}.weight": Linear at j = 0, 2, 4... (the activation between)
SB3_SHARED_NET = "mlp_extractor.shared_net."  # SB3 < 1.8's shared layers, before the policy net's
SB3_ACTION_NET = "action_net.{p}"
SB3_LOG_STD = "log_std"
# SACPolicy: actor.latent_pi = [Linear, act] x n; actor.mu; actor.log_std (a Linear, clamped to [-20, 2])
SB3_LATENT_PI = "actor.latent_pi."
SB3_SAC_MU = "actor.mu.{p}"
SB3_SAC_LOG_STD = "actor.log_std.{p}"
# TD3Policy: actor.mu = [Linear, act] x n + Linear + Tanh
SB3_TD3_MU = "actor.mu."

# the zip's data JSON: what it states in clear
SB3_NUM_TIMESTEPS = "num_timesteps"
SB3_FEATURES_EXTRACTOR = "features_extractor_class"
SB3_ACTIVATION_FN = "activation_fn"
SB3_SDE_FLAGS = ("use_sde", "squash_output")  # gSDE: in data or policy_kwargs
SB3_SPACE_SHAPE, SB3_SPACE_DTYPE = "_shape", "dtype"
SB3_SPACE_LOW, SB3_SPACE_HIGH = "low", "high"
SB3_SPACE_START = "start"
SB3_SPACE_BOX = "Box"
SB3_INDEX_SPACES = {"Discrete": "n", "MultiDiscrete": "nvec"}  # space class -> the field holding its sizes
SB3_FLOAT_DTYPES = ("float32", "float64", "float16")

# policy classes (``data["policy_class"]``: the class's ``__init__`` as text names it)
SB3_ACTOR_CRITIC = "ActorCriticPolicy"  # PPO / A2C MlpPolicy
SB3_ON_POLICY = (SB3_ACTOR_CRITIC,)  # whose data's _last_original_obs tells VecNormalize's use (SB3_LAST_ORIGINAL_OBS)
SB3_SAC_POLICY = "SACPolicy"
SB3_TD3_POLICY = "TD3Policy"
SB3_POLICY_CLASSES = (SB3_ACTOR_CRITIC, SB3_SAC_POLICY, SB3_TD3_POLICY)
SB3_LAST_ORIGINAL_OBS = "_last_original_obs"  # set (an array) when VecNormalize wrapped the env; an
# on-policy algorithm leaves it None otherwise (off-policy ones set it for their replay buffer either way)
SB3_PPO_ONLY_FIELD = "clip_range"  # in PPO's data, not A2C's (the zip names no algorithm class)
# activations (policy_kwargs["activation_fn"]: "<class 'torch.nn.modules.activation.ReLU'>")
SB3_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu"}
SB3_DEFAULT_ACTIVATION = {SB3_ACTOR_CRITIC: "tanh", SB3_SAC_POLICY: "relu", SB3_TD3_POLICY: "relu"}
SB3_FLATTEN_EXTRACTOR = "FlattenExtractor"

# --- the values our spec fields take for an SB3 policy (blocks/normalizer.py, blocks/continuous.py) ------
NORM_RULE_MLAGENTS, NORM_RULE_VECNORM = "mlagents", "vecnorm"
ACTION_RULE_MLAGENTS = "mlagents"  # clamp(mu, -3, 3) / 3 (PPO), raw mu / tanh sample (SAC)
ACTION_RULE_CLIP = "clip"  # SB3's predict: np.clip(action, low, high)
ACTION_RULE_SQUASH = "squash"  # SB3's unscale_action: low + 0.5 * (tanh(.) + 1) * (high - low)
ACTION_RULES = (ACTION_RULE_MLAGENTS, ACTION_RULE_CLIP, ACTION_RULE_SQUASH)
# ONNX initializers of the action space's bounds (our graphs only: ML-Agents' have none)
ACTION_LOW_INIT, ACTION_HIGH_INIT, ACTION_RANGE_INIT = "action_low", "action_high", "action_range"

# what each policy class's actor is made of (importers/sb3.py reads these tables, never a class by name)
from .mlagents import LOG_SIGMA_LINEAR, MU, TRAINER_PPO, TRAINER_SAC  # noqa: E402
SB3_ALGORITHM = {SB3_SAC_POLICY: TRAINER_SAC, SB3_TD3_POLICY: SB3_TD3}  # ActorCriticPolicy: PPO or A2C (clip_range)
SB3_PPO = TRAINER_PPO
SB3_BODY = {SB3_ACTOR_CRITIC: (SB3_SHARED_NET, SB3_POLICY_NET), SB3_SAC_POLICY: (SB3_LATENT_PI,),
            SB3_TD3_POLICY: (SB3_TD3_MU,)}
SB3_HEAD_IN_BODY = (SB3_TD3_POLICY,)  # its body prefix's last Linear is the head (then Tanh)
SB3_LINEAR_HEADS = {SB3_SAC_POLICY: ((SB3_SAC_MU, MU), (SB3_SAC_LOG_STD, LOG_SIGMA_LINEAR))}  # SB3 key -> ML-Agents key
SB3_ACTION_RULE = {SB3_ACTOR_CRITIC: ACTION_RULE_CLIP, SB3_SAC_POLICY: ACTION_RULE_SQUASH, SB3_TD3_POLICY: ACTION_RULE_SQUASH}
