"""Stage 1: checkpoint -> PolicySpec + canonical tensors -> safetensors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from ..core.policy import Policy
from .checkpoint import Checkpoint, load_checkpoint
from .mapping import MappedPolicy, map_policy, map_policy_as  # noqa: F401
from .policy_file import build_metadata, load_policy, policy_bytes, save_policy  # noqa: F401
from .reference import input_hints, keep_divisors, official_divisors, reconcile_divisors  # noqa: F401


@dataclass
class Conversion:
    policy: Policy
    checkpoint: Checkpoint
    mapped: MappedPolicy


def policy_from_checkpoint(ckpt: Checkpoint, obs_sizes: Optional[Sequence[int]] = None, official=None,
                           divisor: str = "auto", reference_name: Optional[str] = None,
                           reference_sha256: Optional[str] = None, stated: Optional[Dict[str, Any]] = None,
                           hints_from=None) -> Conversion:
    """The canonical policy of ``ckpt``; its divisors are IEEE, or adopted from ``official`` (the
    official ONNX) as :func:`reference.reconcile_divisors` decides; what no tensor says (an observation's
    shape) is read from ``official``'s inputs (or, without one, ``hints_from``'s: an ML-Agents ONNX of the
    same run that is not the reference); ``stated``: the spec fields an official ONNX states
    (:func:`reference.stated_fields`). A canonical file read back (``ckpt.stated``, ``importers.own``)
    states them itself, and keeps its own divisors where no ONNX is beside it."""
    own = ckpt.stated.spec if ckpt.stated is not None else None
    if own is not None:  # a canonical file: its spec states what no tensor says, as its ONNX would
        mapped = map_policy_as(ckpt.policy, own, ckpt.path)
    else:
        if ckpt.fields:  # another trainer's file states its rules itself
            stated = {**(stated or {}), **ckpt.fields}
        mapped = map_policy(ckpt.policy, ckpt.path, obs_sizes=obs_sizes if obs_sizes is not None else ckpt.obs_sizes,
                            stated=stated, inputs=input_hints(official if official is not None else hints_from))
    md = build_metadata(mapped, source_name=ckpt.path.name, source_sha256=ckpt.sha256, step=ckpt.global_step,
                        recovered=ckpt.recovered, origin=ckpt.origin)
    policy, _ = reconcile_divisors(Policy(mapped.spec, mapped.tensors, mapped.sources, md), official, divisor,
                                   reference_name, reference_sha256)
    if own is not None and official is None and divisor == "auto":  # no ONNX beside a canonical file
        policy = keep_divisors(policy, ckpt.stated)
    return Conversion(policy, ckpt, mapped)


def convert_checkpoint(path, obs_sizes: Optional[Sequence[int]] = None) -> Conversion:
    """Read an ML-Agents ``.pt`` checkpoint into a canonical :class:`Policy` (nothing is written)."""
    return policy_from_checkpoint(load_checkpoint(path), obs_sizes=obs_sizes)
