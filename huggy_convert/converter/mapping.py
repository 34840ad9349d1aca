"""From an ML-Agents ``Policy`` state dict to a PolicySpec and canonical float32 tensors.

Every key is accounted for: claimed by a block (``huggy_convert.blocks``: each owns its key rules),
checked as an alias of its twin, or ignored for a stated reason. Anything else is an error that
names the key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import blocks
from .. import contract as C
from ..core.flow import InputHint
from ..core.spec import PolicySpec
from ..errors import SpecError, UnsupportedError


@dataclass
class MappedPolicy:
    spec: PolicySpec
    tensors: Dict[str, np.ndarray]  # canonical name -> float32 array
    sources: Dict[str, str]  # canonical name -> ML-Agents key
    ignored: Dict[str, str]  # ML-Agents key -> why it is not exported
    original: Dict[str, Dict[str, object]]  # canonical name -> {"dtype", "shape"} where not float32
    exact_steps: Dict[str, int]  # canonical steps name -> exact integer value (when > 2^24)
    order: List[str] = field(default_factory=list)  # the keys taken or ignored by the blocks, in claim order


def map_policy_as(sd: Dict[str, object], spec: PolicySpec, path=None) -> MappedPolicy:
    """``map_policy`` of tensors that belong to ``spec`` (a canonical file's, or one written back), told
    what the spec says and no tensor does: the vector observations' split, the fields an official ONNX
    states (``PolicySpec.stated``) and the inputs' shapes."""
    return map_policy(sd, path, obs_sizes=[n for _, n in spec.vector_obs], stated=spec.stated(),
                      inputs=spec.input_hints())


def split_shapes(obs_sizes, inputs, path=None):
    """``obs_sizes`` may give every observation's shape (``--obs-sizes 3x84x84,6``: a tuple for a
    camera, an int for a vector): the vectors' widths stay the split, each camera's shape becomes the
    hint an official ONNX's input would be (which, where there is one, must agree)."""
    if obs_sizes is None or all(isinstance(s, (int, np.integer)) for s in obs_sizes):
        return obs_sizes, inputs
    hints = dict(inputs or {})
    sizes = []
    for i, s in enumerate(obs_sizes):
        shape = (int(s),) if isinstance(s, (int, np.integer)) else tuple(int(d) for d in s)
        if len(shape) == 1:
            sizes.append(shape[0])
            continue
        have = hints.get(i)
        if have is not None and tuple(have.dims) != shape:
            raise SpecError(f"observation sizes give {C.OBS_INPUT.format(i=i)} as {'x'.join(map(str, shape))}, the official "
                            f"ONNX's input is [batch, {', '.join(map(str, have.dims))}]", path)
        hints.setdefault(i, InputHint(shape))
    return sizes, hints


def map_policy(sd: Dict[str, object], path=None, obs_sizes: Optional[Sequence[int]] = None,
               stated: Optional[Dict[str, Any]] = None,
               inputs: Optional[Dict[int, InputHint]] = None) -> MappedPolicy:
    """Infer the spec from ``sd`` (key -> torch.Tensor) and map it to canonical tensors.

    ``obs_sizes`` splits the observation width when the checkpoint cannot (``normalize: false``
    with several observations keeps no per-observation tensors); without it one observation
    of the full width is assumed. ``stated``: spec fields the official ONNX states and no tensor does
    (``converter.reference.stated_fields``), which the blocks' rules take and cross-check with the tensors.
    ``inputs`` (observation index -> ``core.flow.InputHint``: the official ONNX's inputs) says what no
    tensor holds, e.g. an entity observation's maximum entity count (``converter.reference.input_hints``).
    """
    for k in sd:
        for pat, what in C.UNSUPPORTED_PATTERNS:
            if pat.search(k):
                raise UnsupportedError(f"not supported yet: {what} (key '{k}')", path)
    obs_sizes, inputs = split_shapes(obs_sizes, inputs, path)
    r = blocks.KeyRules(sd, path, obs_sizes, inputs, stated)
    for b in blocks.compute_order():
        b.claim(r)
    for b in blocks.REGISTRY:
        b.finish(r)

    # --- leftovers: ignored for a stated reason, or an error naming the key ---------------
    for k in sorted(r.remaining):
        for pat, why in C.IGNORED_PATTERNS:
            if pat.search(k):
                r.ignored[k] = why
                break
    unknown = sorted(k for k in r.remaining if k not in r.ignored)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise r.error(f"unexpected key '{unknown[0]}'{more}")

    # --- cross-check against the constant vectors ------------------------------------------
    blocks.check_constants(r)

    spec = PolicySpec(**r.fields)
    return MappedPolicy(spec, r.tensors, r.sources, r.ignored, r.original, r.exact_steps, r.order)
