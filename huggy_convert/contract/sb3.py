"""Stable-Baselines3's side: what ``model.save("model.zip")`` and ``VecNormalize.save(...)`` write, read
from SB3 2.x (``stable_baselines3/common/save_util.py``, ``common/vec_env/vec_normalize.py``,
``common/running_mean_std.py``) and the files SB3 2.9.2 writes itself (``fixtures/sb3/``)."""
from __future__ import annotations

# --- files (importers/sb3_files.py)

# model.zip: its members (save_util.save_to_zip_file)
SB3_ZIP_SUFFIX = ".zip"
SB3_DATA = "data"  # JSON text (save_util.data_to_json)
SB3_POLICY = "policy.pth"  # the policy's state dict, torch.save
SB3_VERSION = "_stable_baselines3_version"  # text, e.g. "2.9.2"
SB3_SYSTEM_INFO = "system_info.txt"
SB3_PYTORCH_VARIABLES = "pytorch_variables.pth"
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
SB3_VEC_NORMALIZE_NAMES = (  # beside a model zip, {stem} its stem; rl-zoo: vecnormalize.pkl in the run's folder
    "{stem}_vec_normalize.pkl", "{stem}.vec_normalize.pkl", SB3_VEC_NORMALIZE, "vecnormalize.pkl")
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
