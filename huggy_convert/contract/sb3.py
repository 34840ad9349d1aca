"""Stable-Baselines3 (SB3): the names of its files and policies, and the values our spec fields take for a
policy trained with it. SB3 is the first trainer other than ML-Agents (issue 28): its actor is read from
the zip ``model.save`` writes (``importers.sb3``) and mapped onto the canonical form, where the blocks
run its arithmetic (the VecNormalize rule, Tanh/ReLU bodies, the action space's clip or squash)."""
# --- keys (importers/sb3.py: policy.pth's state dict) --------------------------------------------------
SB3_SOURCE = "sb3"  # spec field ``source`` (blocks/actor.py); ML-Agents' is the default, never written
SB3_TRAINER = "Stable-Baselines3"
SB3_A2C, SB3_TD3 = "a2c", "td3"  # spec field ``algorithm`` beside ML-Agents' ppo and sac (SB3's PPO/SAC use those)
# ActorCriticPolicy (PPO, A2C): mlp_extractor.policy_net = [Linear, act] x n; action_net; log_std [A]
SB3_POLICY_NET = "mlp_extractor.policy_net."  # + "{j}.weight": Linear at j = 0, 2, 4... (the activation between)
SB3_SHARED_NET = "mlp_extractor.shared_net."  # SB3 < 1.8's shared layers, before the policy net's
SB3_ACTION_NET = "action_net.{p}"
SB3_LOG_STD = "log_std"
SB3_CRITIC_PREFIXES = ("mlp_extractor.value_net.", "value_net.", "critic.", "critic_target.", "actor_target.")
# SACPolicy: actor.latent_pi = [Linear, act] x n; actor.mu; actor.log_std (a Linear, clamped to [-20, 2])
SB3_LATENT_PI = "actor.latent_pi."
SB3_SAC_MU = "actor.mu.{p}"
SB3_SAC_LOG_STD = "actor.log_std.{p}"
# TD3Policy: actor.mu = [Linear, act] x n + Linear + Tanh
SB3_TD3_MU = "actor.mu."
SB3_SDE_KEYS = ("actor.sde_net", "log_std_net")  # gSDE (use_sde): its noise matrix is not a Gaussian head

# the zip's data JSON: what it states in clear
SB3_NUM_TIMESTEPS = "num_timesteps"
SB3_POLICY_CLASS = "policy_class"
SB3_POLICY_KWARGS = "policy_kwargs"
SB3_OBSERVATION_SPACE, SB3_ACTION_SPACE = "observation_space", "action_space"
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
SB3_SAC_POLICY = "SACPolicy"
SB3_TD3_POLICY = "TD3Policy"
SB3_POLICY_CLASSES = (SB3_ACTOR_CRITIC, SB3_SAC_POLICY, SB3_TD3_POLICY)
SB3_PPO_ONLY_FIELD = "clip_range"  # in PPO's data, not A2C's (the zip names no algorithm class)
# activations (policy_kwargs["activation_fn"]: "<class 'torch.nn.modules.activation.ReLU'>")
SB3_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu"}
SB3_DEFAULT_ACTIVATION = {SB3_ACTOR_CRITIC: "tanh", SB3_SAC_POLICY: "relu", SB3_TD3_POLICY: "relu"}
SB3_DEFAULT_NET_ARCH = {SB3_ACTOR_CRITIC: [64, 64], SB3_SAC_POLICY: [256, 256], SB3_TD3_POLICY: [400, 300]}
SB3_FLATTEN_EXTRACTOR = "FlattenExtractor"
SB3_LOG_STD_MIN, SB3_LOG_STD_MAX = -20.0, 2.0  # sac/policies.py LOG_STD_MIN/MAX (ML-Agents' SAC clamps the same)

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
SB3_PPO, SB3_A2C_ALGORITHM = TRAINER_PPO, SB3_A2C
SB3_BODY = {SB3_ACTOR_CRITIC: (SB3_SHARED_NET, SB3_POLICY_NET), SB3_SAC_POLICY: (SB3_LATENT_PI,),
            SB3_TD3_POLICY: (SB3_TD3_MU,)}
SB3_HEAD_IN_BODY = (SB3_TD3_POLICY,)  # its body prefix's last Linear is the head (then Tanh)
SB3_LINEAR_HEADS = {SB3_SAC_POLICY: ((SB3_SAC_MU, MU), (SB3_SAC_LOG_STD, LOG_SIGMA_LINEAR))}  # SB3 key -> ML-Agents key
SB3_ACTION_RULE = {SB3_ACTOR_CRITIC: ACTION_RULE_CLIP, SB3_SAC_POLICY: ACTION_RULE_SQUASH, SB3_TD3_POLICY: ACTION_RULE_SQUASH}
