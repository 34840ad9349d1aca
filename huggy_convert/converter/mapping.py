"""From an ML-Agents ``Policy`` state dict to a PolicySpec and canonical float32 tensors.

Every key is accounted for: mapped to a canonical name, checked as an alias of its twin,
or ignored for a stated reason. Anything else is an error that names the key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .. import contract as C
from ..errors import SpecError, UnsupportedError
from .spec import PPO, SAC, PolicySpec


@dataclass
class MappedPolicy:
    spec: PolicySpec
    tensors: Dict[str, np.ndarray]  # canonical name -> float32 array
    sources: Dict[str, str]  # canonical name -> ML-Agents key
    ignored: Dict[str, str]  # ML-Agents key -> why it is not exported
    original: Dict[str, Dict[str, object]]  # canonical name -> {"dtype", "shape"} where not float32
    exact_steps: Dict[str, int]  # canonical steps name -> exact integer value (when > 2^24)


_NORM_RE = re.compile(r"^network_body\.observation_encoder\.processors\.(\d+)\.normalizer\.(\w+)$")
_ALIAS_RE = re.compile(r"^network_body\.processors\.(\d+)\.normalizer\.(\w+)$")
_BODY_RE = re.compile(r"^network_body\._body_endoder\.seq_layers\.(\d+)\.(weight|bias)$")
_BRANCH_RE = re.compile(r"^action_model\._discrete_distribution\.branches\.(\d+)\.(weight|bias)$")


def _np(t) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def _shape(t) -> Tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def map_policy(sd: Dict[str, object], path=None, obs_sizes: Optional[Sequence[int]] = None) -> MappedPolicy:
    """Infer the spec from ``sd`` (key -> torch.Tensor) and map it to canonical tensors.

    ``obs_sizes`` splits the observation width when the checkpoint cannot (``normalize: false``
    with several observations keeps no per-observation tensors); without it one observation
    of the full width is assumed.
    """
    import torch

    keys = list(sd.keys())
    remaining = set(keys)
    tensors: Dict[str, np.ndarray] = {}
    sources: Dict[str, str] = {}
    ignored: Dict[str, str] = {}
    original: Dict[str, Dict[str, object]] = {}
    exact_steps: Dict[str, int] = {}

    for k in keys:
        for pat, what in C.UNSUPPORTED_PATTERNS:
            if pat.search(k):
                raise UnsupportedError(f"not supported yet: {what} (key '{k}')", path)

    def take(key: str, canonical: str, shape: Optional[Tuple[int, ...]] = None, finite: bool = True):
        if key not in sd:
            raise SpecError(f"missing key '{key}'", path)
        t = sd[key]
        if shape is not None and _shape(t) != tuple(shape):
            raise SpecError(f"wrong shape for '{key}': {list(_shape(t))}, expected {list(shape)}", path)
        if not (t.dtype.is_floating_point or t.dtype in (torch.int64, torch.int32)):
            raise SpecError(f"unexpected dtype {t.dtype} for '{key}'", path)
        a = _np(t.to(torch.float32)) if t.dtype in (torch.bfloat16,) else _np(t)
        if a.dtype != np.float32:
            original[canonical] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(_shape(t))}
            if a.dtype.kind == "f" and a.dtype.itemsize > 4:
                if not np.array_equal(a.astype(np.float32).astype(a.dtype), a, equal_nan=True):
                    raise SpecError(f"'{key}' is {a.dtype} and does not fit float32 exactly", path)
            a = a.astype(np.float32)
        if finite and not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            raise SpecError(f"'{key}' holds {bad} non-finite value(s) (NaN/Inf)", path)
        tensors[canonical] = np.array(a, dtype=np.float32, order="C")
        sources[canonical] = key
        remaining.discard(key)
        return a

    # --- constants --------------------------------------------------------------------------
    for k in C.CONSTANT_KEYS:
        if k not in sd:
            raise SpecError(f"missing key '{k}': not an ML-Agents actor state dict", path)
    consts = {k: take(k, C.c_const(k)) for k in C.CONSTANT_KEYS}
    version = consts[C.K_VERSION].reshape(-1)
    if version.size != 1 or int(version[0]) != C.MODEL_EXPORT_VERSION:
        raise UnsupportedError(f"not supported yet: model export version {version.tolist()} (this tool reads version {C.MODEL_EXPORT_VERSION}, ML-Agents 2.x / Release 18+)", path)

    # --- normalizers ------------------------------------------------------------------------
    norm_idx = sorted({int(m.group(1)) for k in keys if (m := _NORM_RE.match(k))})
    for k in keys:
        m = _NORM_RE.match(k)
        if m and m.group(2) not in C.NORM_FIELDS:
            raise SpecError(f"unexpected key '{k}'", path)
    if norm_idx and norm_idx != list(range(len(norm_idx))):
        raise SpecError(f"normalizer indices {norm_idx} are not 0..{len(norm_idx) - 1}", path)
    norm_sizes = []
    for i in norm_idx:
        pre = C.NORM_PREFIX.format(i=i)
        for f in C.NORM_FIELDS:
            if pre + f not in sd:
                raise SpecError(f"missing key '{pre + f}'", path)
        mean_t = sd[pre + C.NORM_MEAN]
        if len(_shape(mean_t)) != 1:
            raise SpecError(f"wrong shape for '{pre + C.NORM_MEAN}': {list(_shape(mean_t))}, expected [n]", path)
        n = _shape(mean_t)[0]
        norm_sizes.append(n)
        take(pre + C.NORM_MEAN, C.c_norm(i, C.NORM_MEAN), (n,))
        var = take(pre + C.NORM_VAR, C.c_norm(i, C.NORM_VAR), (n,))
        if np.any(var <= 0):
            j = int(np.argmax(var <= 0))
            raise SpecError(f"'{pre + C.NORM_VAR}' must be > 0 (a running sum of squares), index {j} is {var[j]!r}", path)
        steps_t = sd[pre + C.NORM_STEPS]
        if steps_t.numel() != 1:
            raise SpecError(f"wrong shape for '{pre + C.NORM_STEPS}': {list(_shape(steps_t))}, expected a scalar", path)
        steps_exact = steps_t.reshape(-1)[0].item()
        steps = take(pre + C.NORM_STEPS, C.c_norm(i, C.NORM_STEPS), _shape(steps_t))
        if not steps_exact > 0:
            raise SpecError(f"'{pre + C.NORM_STEPS}' is {steps_exact}: must be > 0 (it divides the variance)", path)
        if isinstance(steps_exact, int) and steps_exact >= C.FLOAT32_EXACT_INT_LIMIT:
            # float32 is what torch divides by anyway (int64 / float32 promotes to float32);
            # the exact count is kept in the metadata.
            exact_steps[C.c_norm(i, C.NORM_STEPS)] = int(steps_exact)
        # the alias (same module under a second name) must be the same tensors, bit for bit
        alias = C.NORM_ALIAS_PREFIX.format(i=i)
        for f in C.NORM_FIELDS:
            if alias + f in sd:
                a, b = sd[alias + f], sd[pre + f]
                if a.dtype != b.dtype or _shape(a) != _shape(b) or not torch.equal(a, b):
                    raise SpecError(f"'{alias + f}' differs from its twin '{pre + f}' (they are one module)", path)
                ignored[alias + f] = f"alias of {pre + f} (bitwise equal)"
                remaining.discard(alias + f)
        del steps
    for k in keys:
        m = _ALIAS_RE.match(k)
        if m and k in remaining:
            raise SpecError(f"unexpected key '{k}' (alias without its twin)", path)

    # --- body ------------------------------------------------------------------------------
    body_idx = sorted({int(m.group(1)) for k in keys if (m := _BODY_RE.match(k))})
    if not body_idx:
        raise SpecError("missing key 'network_body._body_endoder.seq_layers.0.weight' (no body layers)", path)
    num_layers = max(body_idx) // 2 + 1
    if any(j % 2 for j in body_idx):
        raise SpecError(f"unexpected body layer indices {body_idx}: expected Linear at 0, 2, 4... (Swish between)", path)
    w0 = sd.get(C.BODY_LAYER.format(j=0, p="weight"))
    if w0 is None or len(_shape(w0)) != 2:
        raise SpecError(f"missing key '{C.BODY_LAYER.format(j=0, p='weight')}'", path)
    hidden, in_width = _shape(w0)
    if norm_sizes:
        if sum(norm_sizes) != in_width:
            raise SpecError(f"first body layer takes {in_width} inputs but the normalizers cover {sum(norm_sizes)}", path)
        if obs_sizes is not None and list(obs_sizes) != norm_sizes:
            raise SpecError(f"observation sizes {list(obs_sizes)} disagree with the normalizers' {norm_sizes}", path)
        sizes = tuple(norm_sizes)
    elif obs_sizes is not None:
        if sum(obs_sizes) != in_width:
            raise SpecError(f"observation sizes {list(obs_sizes)} sum to {sum(obs_sizes)}, the first body layer takes {in_width}", path)
        sizes = tuple(int(s) for s in obs_sizes)
    else:
        sizes = (in_width,)
    prev = in_width
    for layer in range(num_layers):
        take(C.BODY_LAYER.format(j=2 * layer, p="weight"), C.c_body(layer, "weight"), (hidden, prev))
        take(C.BODY_LAYER.format(j=2 * layer, p="bias"), C.c_body(layer, "bias"), (hidden,))
        prev = hidden

    # --- memory ----------------------------------------------------------------------------
    memory_size = 0
    lstm_keys = [k for k in keys if k.startswith("network_body.lstm.")]
    if lstm_keys:
        whh = sd.get(C.LSTM_KEY.format(p="weight_hh"))
        if whh is None or len(_shape(whh)) != 2:
            raise SpecError(f"missing key '{C.LSTM_KEY.format(p='weight_hh')}'", path)
        hs = _shape(whh)[1]
        memory_size = 2 * hs
        shapes = {"weight_ih": (4 * hs, hidden), "weight_hh": (4 * hs, hs), "bias_ih": (4 * hs,), "bias_hh": (4 * hs,)}
        for p_ in C.LSTM_PARAMS:
            take(C.LSTM_KEY.format(p=p_), C.c_lstm(p_), shapes[p_])
        prev = hs

    # --- heads -----------------------------------------------------------------------------
    cont = 0
    algorithm = PPO
    if C.MU.format(p="weight") in sd:
        mw = sd[C.MU.format(p="weight")]
        cont = _shape(mw)[0] if len(_shape(mw)) == 2 else -1
        if cont <= 0:
            raise SpecError(f"wrong shape for '{C.MU.format(p='weight')}': {list(_shape(mw))}", path)
        take(C.MU.format(p="weight"), C.C_MU_W, (cont, prev))
        take(C.MU.format(p="bias"), C.C_MU_B, (cont,))
        if C.LOG_SIGMA in sd:
            take(C.LOG_SIGMA, C.C_LOG_SIGMA, (1, cont))
        elif C.LOG_SIGMA_LINEAR.format(p="weight") in sd:
            algorithm = SAC
            take(C.LOG_SIGMA_LINEAR.format(p="weight"), C.C_LOG_SIGMA_W, (cont, prev))
            take(C.LOG_SIGMA_LINEAR.format(p="bias"), C.C_LOG_SIGMA_B, (cont,))
        else:
            raise SpecError(f"missing key '{C.LOG_SIGMA}'", path)
    branch_idx = sorted({int(m.group(1)) for k in keys if (m := _BRANCH_RE.match(k))})
    if branch_idx and branch_idx != list(range(len(branch_idx))):
        raise SpecError(f"discrete branch indices {branch_idx} are not 0..{len(branch_idx) - 1}", path)
    branches = []
    for b in branch_idx:
        bw = sd.get(C.DISC_BRANCH.format(b=b, p="weight"))
        if bw is None or len(_shape(bw)) != 2:
            raise SpecError(f"missing key '{C.DISC_BRANCH.format(b=b, p='weight')}'", path)
        n = _shape(bw)[0]
        branches.append(n)
        take(C.DISC_BRANCH.format(b=b, p="weight"), C.c_branch(b, "weight"), (n, prev))
        take(C.DISC_BRANCH.format(b=b, p="bias"), C.c_branch(b, "bias"), (n,))
    if cont == 0 and not branches:
        raise SpecError(f"missing key '{C.MU.format(p='weight')}' (no action head at all)", path)

    # --- leftovers -------------------------------------------------------------------------
    for k in sorted(remaining):
        for pat, why in C.IGNORED_PATTERNS:
            if pat.search(k):
                ignored[k] = why
                break
    unknown = sorted(k for k in remaining if k not in ignored)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise SpecError(f"unexpected key '{unknown[0]}'{more}", path)

    # --- cross-check against the constant vectors ------------------------------------------
    def check(key: str, got, want, what: str):
        if list(np.asarray(got).reshape(-1).astype(np.int64)) != list(want):
            raise SpecError(f"'{key}' says {np.asarray(got).reshape(-1).tolist()} but the {what} says {list(want)}", path)

    check(C.K_CONT_SIZE, consts[C.K_CONT_SIZE], [cont], "mu layer")
    check(C.K_DISC_SIZES, consts[C.K_DISC_SIZES], branches, "discrete branch layers")
    check(C.K_MEMORY_SIZE, consts[C.K_MEMORY_SIZE], [memory_size], "LSTM")
    check(C.K_ACT_SIZE, consts[C.K_ACT_SIZE], [cont + sum(branches)], "action heads")
    check(C.K_IS_CONTINUOUS, consts[C.K_IS_CONTINUOUS], [1 if cont > 0 and not branches else 0], "action heads")

    spec = PolicySpec(algorithm=algorithm, obs_sizes=sizes, normalize=bool(norm_sizes), hidden_units=hidden,
                      num_layers=num_layers, continuous_size=cont, discrete_branches=tuple(branches),
                      memory_size=memory_size)
    return MappedPolicy(spec, tensors, sources, ignored, original, exact_steps)
