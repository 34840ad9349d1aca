"""A Stable-Baselines3 policy (the zip ``model.save`` writes, and ``vec_normalize.pkl`` beside it) read into the
``Policy`` state dict an ML-Agents checkpoint holds, so that it enters the one pipeline: the blocks' key
rules, the exporters (Unity's contract ONNX, the ``.pt2``, the deploy targets), the verification.

What is read, and how (``sb3_files``): the zip's ``data`` JSON for what it states in clear (the policy class,
the spaces' shapes, bounds and dtypes, ``policy_kwargs``: the net's widths and activation), never its
``:serialized:`` cloudpickle fields; ``policy.pth`` through torch's weights-only loader (``converter.checkpoint``); VecNormalize's
statistics with an allow-listing unpickler that runs no code. Anything else is one line naming it (exit 2):
an unknown policy class (a recurrent sb3-contrib policy, ``CnnPolicy``, ``MultiInputPolicy``, DQN's), a
custom features extractor, gSDE, an observation space other than a flat ``Box``.

How SB3's actor becomes the canonical one (the arithmetic is the blocks', told by the spec fields this
states, ``Checkpoint.fields``):

- the policy net (``mlp_extractor.policy_net``, SAC's ``actor.latent_pi``, TD3's ``actor.mu`` but its last
  Linear) is the body, with its activation (``tanh``, ``relu``);
- PPO/A2C's ``action_net`` + ``log_std`` is the Gaussian head (``log_std`` as ML-Agents' [1, A] parameter), its
  actions clipped to the action space (``action_rule`` ``clip``); SAC's ``actor.mu`` + ``actor.log_std`` is
  ML-Agents' SAC head, and SAC's and TD3's actions are squashed into the space (``squash``), as SB3's
  ``predict`` does; a ``Discrete``/``MultiDiscrete`` ``action_net`` is split into one branch per dimension;
- VecNormalize's float64 ``mean`` and ``sqrt(var + eps)`` are rounded once to float32 and held as ML-Agents'
  normalizer with one step (variance = divisor², which gives the divisor back bit for bit), its clip and
  epsilon stated (``norm_rule`` ``vecnorm``);
- the constant vectors Unity reads are the ones ML-Agents writes for these heads (export version 3, memory 0).

What SB3's file holds and the canonical one does not (the critic, target networks, optimizer state,
VecNormalize's reward statistics) is listed in the file's ``trained_with`` metadata, with each tensor's SB3 key.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..blocks.actor import constant_vectors
from ..converter.checkpoint import Checkpoint
from ..core.artifacts import sha256_bytes
from ..core.files import read_input_file
from ..core.numerics import one_step_variance
from ..errors import CheckpointError, InputError, UnsupportedError
from .sb3_files import Sb3Zip, VecNormStats, find_vec_normalize, read_sb3_zip, read_vec_normalize

FORMAT = "stable-baselines3"
_FUNCTION = re.compile(r"^<function (\w+)\.")
_CLASS = re.compile(r"^<class '([\w.]+)'>$")


def checkpoint_from_sb3(path, data: Optional[bytes] = None) -> Checkpoint:
    """The ``Policy`` state dict of the SB3 model zip at ``path`` (and of the ``vec_normalize.pkl`` beside it),
    with the spec fields it states and what it was (``Checkpoint.fields``, ``Checkpoint.origin``)."""
    p = Path(path)
    z = read_sb3_zip(p, data)
    m = _Model(z)
    vn_path = find_vec_normalize(p)
    vn_data = read_input_file(vn_path, "VecNormalize file") if vn_path is not None else None
    vn = read_vec_normalize(vn_path, vn_data) if vn_path is not None else None
    if vn is None and m.cls in C.SB3_ON_POLICY and z.data.get(C.SB3_LAST_ORIGINAL_OBS) is not None:
        raise InputError(f"{p.name} was trained under VecNormalize (its data's {C.SB3_LAST_ORIGINAL_OBS} is set) and no "
                         f"VecNormalize file is beside it: put the {C.SB3_VEC_NORMALIZE} SB3 saved with it beside the "
                         "zip (without it the policy would see unnormalized observations)", p)
    sd: Dict[str, Any] = {}
    keys: Dict[str, str] = {}  # ML-Agents key -> the SB3 key(s) it holds
    widths = m.body(sd, keys)
    cont, branches = m.heads(sd, keys, widths[-1])
    normalize = vn is not None and vn.norm_obs
    if normalize:
        _normalizer(sd, keys, vn, m.obs_size, vn_path)
    _constants(sd, cont, branches)
    fields: Dict[str, Any] = {"source": C.SB3_SOURCE, "algorithm": m.algorithm, "activation": m.activation}
    if len(set(widths)) > 1:  # e.g. TD3's default net_arch [400, 300]
        fields["hidden_sizes"] = widths
    if cont:
        fields.update(action_rule=C.SB3_ACTION_RULE[m.cls], action_low=m.low, action_high=m.high)
    if normalize:
        fields.update(norm_rule=C.NORM_RULE_VECNORM, norm_clip=float(vn.clip_obs), norm_eps=float(vn.epsilon))
    origin = {"format": FORMAT, "version": z.version, "policy_class": m.cls, "algorithm": m.algorithm.upper(),
              "observation_space": f"Box{list(m.obs_shape)}", "action_space": m.action_text,
              "vec_normalize": _vn_record(vn, vn_path, p, sha256_bytes(vn_data)) if vn is not None else None,
              "keys": keys, "not_held": m.not_held(z.state, keys, vn)}
    step = z.data.get(C.SB3_NUM_TIMESTEPS)
    return Checkpoint(p, z.sha256, sd, step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None,
                      list(z.members), obs_sizes=(m.obs_size,), fields=fields, origin=origin)


class _Model:
    """What the zip's ``data`` states in clear: the policy class, the algorithm, the activation, the spaces."""

    def __init__(self, z: Sb3Zip):
        self.z, self.path, d = z, z.path, z.data
        self.cls = _policy_class(d.get(C.SB3_POLICY_CLASS), z.path)
        kwargs = d.get(C.SB3_POLICY_KWARGS) or {}
        if not isinstance(kwargs, dict):
            raise CheckpointError(f"'{C.SB3_POLICY_KWARGS}' in data is not an object", z.path)
        extractor = kwargs.get(C.SB3_FEATURES_EXTRACTOR)
        if extractor is not None and _class_name(extractor) != C.SB3_FLATTEN_EXTRACTOR:
            raise UnsupportedError(f"not supported yet: the custom features extractor {_class_name(extractor)!r} "
                                   f"(an SB3 MlpPolicy flattens its observation: {C.SB3_FLATTEN_EXTRACTOR})", z.path)
        if any(d.get(k) is True or kwargs.get(k) is True for k in C.SB3_SDE_FLAGS):
            raise UnsupportedError("not supported yet: gSDE (use_sde): its actions are not a Gaussian head's", z.path)
        act = kwargs.get(C.SB3_ACTIVATION_FN)
        if act is None:
            self.activation = C.SB3_DEFAULT_ACTIVATION[self.cls]
        elif _class_name(act) in C.SB3_ACTIVATIONS:
            self.activation = C.SB3_ACTIVATIONS[_class_name(act)]
        else:
            raise UnsupportedError(f"not supported yet: the activation {_class_name(act)!r} (this tool runs "
                                   f"{', '.join(C.SB3_ACTIVATIONS)})", z.path)
        self.algorithm = C.SB3_ALGORITHM.get(self.cls) or (C.SB3_PPO if C.SB3_PPO_ONLY_FIELD in d else C.SB3_A2C)
        self.obs_shape = self._observation_space(d.get(C.SB3_OBSERVATION_SPACE))
        self.obs_size = self.obs_shape[0]
        self._action_space(d.get(C.SB3_ACTION_SPACE))

    def error(self, message: str) -> CheckpointError:
        return CheckpointError(message, self.path)

    # --- spaces ----------------------------------------------------------------------------------------
    def _observation_space(self, space) -> Tuple[int, ...]:
        kind = _space_kind(space)
        if kind != C.SB3_SPACE_BOX:
            raise UnsupportedError(f"not supported yet: a {kind or 'unstated'} observation space (this tool reads a "
                                   "flat Box: an MlpPolicy's vector)", self.path)
        shape = space.get(C.SB3_SPACE_SHAPE)
        if not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
            raise UnsupportedError(f"not supported yet: an observation space of shape {shape} (this tool reads a "
                                   "flat Box [n])", self.path)
        if space.get(C.SB3_SPACE_DTYPE) not in C.SB3_FLOAT_DTYPES:
            raise UnsupportedError(f"not supported yet: observations of dtype {space.get(C.SB3_SPACE_DTYPE)!r} "
                                   "(SB3 scales an image Box; this tool reads float vectors)", self.path)
        return (int(shape[0]),)

    def _action_space(self, space) -> None:
        kind = _space_kind(space)
        self.low: Tuple[float, ...] = ()
        self.high: Tuple[float, ...] = ()
        self.nvec: Tuple[int, ...] = ()
        if kind == C.SB3_SPACE_BOX:
            shape = space.get(C.SB3_SPACE_SHAPE)
            if not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
                raise UnsupportedError(f"not supported yet: an action space of shape {shape} (a flat Box [n])", self.path)
            lo, hi = (_numbers(space.get(k), shape[0], k, self.path) for k in (C.SB3_SPACE_LOW, C.SB3_SPACE_HIGH))
            if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
                raise UnsupportedError("not supported yet: an action space with infinite bounds (the actions Unity's "
                                       "actuators take are mapped into the Box: give it finite bounds)", self.path)
            if np.any(lo > hi):
                raise self.error("the action space's low is above its high")
            self.low, self.high = tuple(float(x) for x in lo), tuple(float(x) for x in hi)
            self.action_text = f"Box{list(shape)} [{', '.join(f'{a:g}..{b:g}' for a, b in zip(self.low, self.high))}]"
        elif kind in C.SB3_INDEX_SPACES and self.cls == C.SB3_ACTOR_CRITIC:
            key = C.SB3_INDEX_SPACES[kind]
            raw = space.get(key)
            nvec = _numbers(raw, None, key, self.path)
            start = space.get(C.SB3_SPACE_START)
            if start is not None and np.any(_numbers(start, None, C.SB3_SPACE_START, self.path) != 0):
                raise UnsupportedError(f"not supported yet: a {kind} action space that does not start at 0 ({start})",
                                       self.path)
            if nvec.size < 1 or np.any(nvec < 1) or np.any(nvec != np.round(nvec)):
                raise self.error(f"the action space's {key} is {raw!r}, not positive whole numbers")
            self.nvec = tuple(int(x) for x in nvec.reshape(-1))
            self.action_text = f"{kind}({', '.join(map(str, self.nvec))})"
        else:
            raise UnsupportedError(f"not supported yet: a {kind or 'unstated'} action space for {self.cls}", self.path)

    # --- tensors -------------------------------------------------------------------------------------
    def _linears(self, prefix: str, keys: Sequence[str]) -> List[Tuple[str, str]]:
        """(weight key, bias key) of the Linears under ``prefix`` (``<prefix><j>.weight``), in index order
        (0, 2, 4...: an activation between each)."""
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.(weight|bias)$")
        idx = sorted({int(m.group(1)) for k in keys if (m := pattern.match(k))})
        if idx and idx != list(range(0, 2 * len(idx), 2)):
            raise self.error(f"unexpected layer indices {idx} under '{prefix}': expected Linear at 0, 2, 4...")
        out = []
        for j in idx:
            w, b = (f"{prefix}{j}.{p}" for p in ("weight", "bias"))
            for k in (w, b):
                if k not in self.z.state:
                    raise self.error(f"missing key '{k}' in {C.SB3_POLICY}")
            out.append((w, b))
        return out

    def body(self, sd: Dict[str, Any], keys: Dict[str, str]) -> Tuple[int, ...]:
        """The hidden layers, as ML-Agents' body; returns each one's width."""
        state = list(self.z.state)
        layers = [lin for prefix in C.SB3_BODY[self.cls] for lin in self._linears(prefix, state)]
        if self.cls in C.SB3_HEAD_IN_BODY:
            layers = layers[:-1]  # the last Linear (then Tanh) is the head
        if not layers:
            raise UnsupportedError(f"not supported yet: {self.cls} without a hidden layer (net_arch [])", self.path)
        prev, widths = self.obs_size, []
        for n, (w, b) in enumerate(layers):
            t = self.z.state[w]
            if t.dim() != 2 or t.shape[1] != prev:
                raise self.error(f"wrong shape for '{w}': {list(t.shape)}, expected [*, {prev}]")
            prev = int(t.shape[0])
            widths.append(prev)
            for src, p in ((w, "weight"), (b, "bias")):
                _put(sd, keys, C.BODY_LAYER.format(j=2 * n, p=p), self.z.state[src], src)
        return tuple(widths)

    def heads(self, sd: Dict[str, Any], keys: Dict[str, str], width: int) -> Tuple[int, Tuple[int, ...]]:
        """The action head(s); returns (continuous actions, discrete branches)."""
        st = self.z.state
        if self.cls == C.SB3_ACTOR_CRITIC:
            w, b = (C.SB3_ACTION_NET.format(p=p) for p in ("weight", "bias"))
            for k in (w, b):
                if k not in st:
                    raise self.error(f"missing key '{k}' in {C.SB3_POLICY}")
            if self.nvec:
                total = sum(self.nvec)
                if tuple(st[w].shape) != (total, width) or tuple(st[b].shape) != (total,):
                    raise self.error(f"wrong shape for '{w}': {list(st[w].shape)}, expected [{total}, {width}] "
                                     f"(the action space's {self.action_text})")
                start = 0
                for i, n in enumerate(self.nvec):  # one branch per dimension: rows start..start+n
                    _put(sd, keys, C.DISC_BRANCH.format(b=i, p="weight"), st[w][start:start + n], f"{w}[{start}:{start + n}]")
                    _put(sd, keys, C.DISC_BRANCH.format(b=i, p="bias"), st[b][start:start + n], f"{b}[{start}:{start + n}]")
                    start += n
                return 0, self.nvec
            a = len(self.low)
            if C.SB3_LOG_STD not in st:
                raise self.error(f"missing key '{C.SB3_LOG_STD}' in {C.SB3_POLICY} (a Gaussian head's)")
            if tuple(st[C.SB3_LOG_STD].shape) != (a,):
                raise self.error(f"wrong shape for '{C.SB3_LOG_STD}': {list(st[C.SB3_LOG_STD].shape)}, expected [{a}]")
            _put(sd, keys, C.MU.format(p="weight"), st[w], w)
            _put(sd, keys, C.MU.format(p="bias"), st[b], b)
            _put(sd, keys, C.LOG_SIGMA, st[C.SB3_LOG_STD].reshape(1, a), C.SB3_LOG_STD)
            return a, ()
        if self.cls in C.SB3_LINEAR_HEADS:
            for src, dst in C.SB3_LINEAR_HEADS[self.cls]:
                for p in ("weight", "bias"):
                    if src.format(p=p) not in st:
                        raise self.error(f"missing key '{src.format(p=p)}' in {C.SB3_POLICY}")
                    _put(sd, keys, dst.format(p=p), st[src.format(p=p)], src.format(p=p))
        else:
            w, b = self._linears(C.SB3_BODY[self.cls][-1], list(st))[-1]
            _put(sd, keys, C.MU.format(p="weight"), st[w], w)
            _put(sd, keys, C.MU.format(p="bias"), st[b], b)
        a = int(sd[C.MU.format(p="weight")].shape[0])
        if a != len(self.low):
            raise self.error(f"the actor has {a} action(s), the action space {self.action_text}")
        return a, ()

    def not_held(self, state: Dict[str, Any], keys: Dict[str, str], vn: Optional[VecNormStats]) -> List[str]:
        """What the SB3 files hold that the canonical policy does not (the actor alone is deployed)."""
        used = {k.split("[")[0] for k in keys.values()}
        rest = sorted(k for k in state if k not in used)
        prefixes = sorted({k.rsplit(".", 2)[0] if "." in k else k for k in rest})
        out = [f"{C.SB3_POLICY}: {', '.join(prefixes)} (the critic and target networks: training only)"] if rest else []
        out.append("the optimizer state and the training hyperparameters (data's other fields)")
        if vn is not None:
            out.append("the VecNormalize file: the reward normalizer (ret_rms: training only)")
        return out


def _put(sd: Dict[str, Any], keys: Dict[str, str], key: str, t, src: str) -> None:
    """``t`` (from ``policy.pth``, a view where a branch's rows are sliced) under ML-Agents' ``key``; the key
    rules copy it into the canonical float32 array (``KeyRules.take``)."""
    sd[key] = t.detach()
    keys[key] = src


def _normalizer(sd, keys, vn: VecNormStats, n: int, path) -> None:
    """VecNormalize's float64 statistics as ML-Agents' normalizer of one step: mean rounded to float32;
    variance = D² (float32) for the float32 divisor D = sqrt(var + eps) rounded once, which the IEEE divisor
    sqrt(variance / 1) gives back bit for bit where D² is a normal float32 (``core.numerics.one_step_variance``)."""
    import torch

    mean, var = np.asarray(vn.mean, np.float64).reshape(-1), np.asarray(vn.var, np.float64).reshape(-1)
    if mean.shape != (n,) or var.shape != (n,):
        raise CheckpointError(f"VecNormalize's statistics have {mean.size} elements, the observation {n}", path)
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0)):
        raise CheckpointError("VecNormalize's obs_rms holds a non-finite mean or a negative variance", path)
    div = np.sqrt(var + float(vn.epsilon)).astype(np.float32)
    var32, bad = one_step_variance(div)
    if bad.any():
        j = int(np.argmax(bad))
        raise UnsupportedError(f"not supported yet: VecNormalize's divisor sqrt(var + eps)[{j}] = {float(div[j])!r}, "
                               "whose square is not a normal float32", path)
    pre = C.NORM_PREFIX.format(i=0)
    sd[pre + C.NORM_STEPS] = torch.tensor(1, dtype=torch.int64)
    sd[pre + C.NORM_MEAN] = torch.from_numpy(mean.astype(np.float32))
    sd[pre + C.NORM_VAR] = torch.from_numpy(var32)
    name = Path(path).name
    keys.update({pre + C.NORM_STEPS: f"{name}: 1 (the divisor below holds the statistics)",
                 pre + C.NORM_MEAN: f"{name}: obs_rms.mean (float64, rounded to float32)",
                 pre + C.NORM_VAR: f"{name}: sqrt(obs_rms.var + epsilon) rounded to float32, squared"})


def _constants(sd, cont: int, branches: Tuple[int, ...]) -> None:
    """The constant vectors ML-Agents' SimpleActor registers for these heads (what Unity's loader reads)."""
    import torch

    sd.update({k: torch.from_numpy(v) for k, v in constant_vectors(cont, branches, 0).items()})


def _vn_record(vn: VecNormStats, path, zip_path: Path, sha256: str) -> Dict[str, Any]:
    """The VecNormalize file (its path from the zip's folder: ``vec_normalize.pkl``, rl-zoo's
    ``<EnvName>/vecnormalize.pkl``) and its settings."""
    try:
        name = Path(path).relative_to(zip_path.parent).as_posix()
    except ValueError:
        name = Path(path).name
    return {"file": name, "sha256": sha256, "clip_obs": float(vn.clip_obs), "epsilon": float(vn.epsilon),
            "count": float(vn.count), "norm_obs": bool(vn.norm_obs)}


def _policy_class(pc, path) -> str:
    """The policy class the ``data`` JSON names in clear (its functions' qualified names), checked."""
    name = None
    if isinstance(pc, dict):
        for k in ("__init__",) + tuple(sorted(pc)):
            v = pc.get(k)
            if isinstance(v, str) and (m := _FUNCTION.match(v)):
                name = m.group(1)
                break
    if name is None:
        raise CheckpointError("the policy class is not stated in clear in data (policy_class); "
                              "this tool never unpickles its ':serialized:' form", path)
    if name not in C.SB3_POLICY_CLASSES:
        raise UnsupportedError(f"not supported yet: the SB3 policy class {name!r} (this tool reads the MlpPolicy "
                               f"classes {', '.join(C.SB3_POLICY_CLASSES)})", path)
    return name


def _class_name(v) -> str:
    """``"<class 'torch.nn.modules.activation.ReLU'>"`` -> ``ReLU`` (a string that is no class: itself)."""
    if isinstance(v, dict):
        v = v.get(":type:", "")
    m = _CLASS.match(str(v))
    return m.group(1).rsplit(".", 1)[-1] if m else str(v)[:60]


def _space_kind(space) -> Optional[str]:
    if not isinstance(space, dict):
        return None
    m = _CLASS.match(str(space.get(":type:", "")))
    return m.group(1).rsplit(".", 1)[-1] if m else None


def _numbers(v, n: Optional[int], what: str, path) -> np.ndarray:
    """A space's numbers as ``data`` states them: numpy's repr of an array (``'[-2. 2.]'``) or a scalar."""
    text = str(v).strip() if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None
    if text is None or "..." in text:
        raise CheckpointError(f"the space's {what} is not stated in clear in data ({str(v)[:40]!r})", path)
    try:
        a = np.array([float(x) for x in text.strip("[]").replace(",", " ").split()], np.float64)
    except ValueError:
        raise CheckpointError(f"the space's {what} is not numbers ({text[:40]!r})", path) from None
    if n is not None and a.size != n:
        raise CheckpointError(f"the space's {what} has {a.size} numbers, its shape {n}", path)
    return a.astype(np.float32) if n is not None else a
