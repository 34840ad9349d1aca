"""The actor's frame (ML-Agents' ``SimpleActor``): its constant vectors, the export version it
must carry, the two header outputs Unity reads first, and the rules across the heads."""
from __future__ import annotations

from typing import List

import numpy as np

from .. import contract as C
from ..core.flow import CONSTANT, Port
from ..core.spec import SpecField
from ..errors import SpecError, UnsupportedError
from .base import FRAME, Block, KeyRules

MLAGENTS = "mlagents"  # the trainer a policy comes from when its spec names none (never written)
SOURCES = (MLAGENTS, C.SB3_SOURCE)


def _check_source(spec) -> None:
    if spec.source not in SOURCES:
        raise SpecError(f"spec field 'source' is {str(spec.source)[:40]!r}, not one of {', '.join(SOURCES)}")


class Actor(Block):
    name = "actor"
    stage = FRAME
    # ``source``: the trainer whose file the policy was read from (its importer states it: ``importers.sb3``);
    # the actor's frame (constants, header outputs) is Unity's contract whatever the trainer
    spec_fields = (SpecField("source", 501, MLAGENTS, check=_check_source, used=lambda v: v != MLAGENTS, stated=True),)

    def describe(self, spec):
        return [("trainer", C.SB3_TRAINER + " ")] if spec.source == C.SB3_SOURCE else []

    def claim(self, r: KeyRules) -> None:
        for k in C.CONSTANT_KEYS:
            r.require(k, f"missing key '{k}': not an ML-Agents actor state dict")
        r.state["constants"] = consts = {k: r.take(k, C.c_const(k)) for k in C.CONSTANT_KEYS}
        version = consts[C.K_VERSION].reshape(-1)
        if version.size == 1 and not float(version[0]).is_integer():  # NaN, Inf, 3.5: contradicts itself
            raise r.error(f"'{C.K_VERSION}' is {version.tolist()}: an export version is an integer")
        r.fields["source"] = r.stated.get("source", MLAGENTS)
        if version.size != 1 or float(version[0]) != C.MODEL_EXPORT_VERSION:
            raise UnsupportedError(f"not supported yet: model export version {version.tolist()} (this tool reads "
                                   f"version {C.MODEL_EXPORT_VERSION}, ML-Agents 2.x / Release 18+)", r.path)

    def check_spec(self, spec) -> None:
        if not spec.continuous_size and not spec.discrete_branches:
            raise SpecError("spec has no action head (continuous_size 0, no discrete branches)")

    def finish(self, r: KeyRules) -> None:
        if not r.fields.get("continuous_size") and not r.fields.get("discrete_branches"):
            raise r.error(f"missing key '{C.MU.format(p='weight')}' (no action head at all)")

    def constant_checks(self, r: KeyRules):
        cont, branches = r.fields.get("continuous_size", 0), list(r.fields.get("discrete_branches", ()))
        return [(C.K_ACT_SIZE, [cont + sum(branches)], "action heads"),
                (C.K_IS_CONTINUOUS, [1 if cont > 0 and not branches else 0], "action heads")]

    def state_template(self, spec):
        """The constant vectors ``SimpleActor`` registers, their values fixed by the spec (an ONNX keeps
        only those behind an output; the others come from here)."""
        return constant_vectors(spec.continuous_size, spec.discrete_branches, spec.memory_size)

    def onnx_recover(self, spec, found, sd) -> None:
        if C.VERSION_INIT in found:  # torch names the exported copy of version_number differently
            sd[C.K_VERSION] = found.pop(C.VERSION_INIT)

    def outputs(self, spec) -> List[Port]:
        return [Port(C.OUT_VERSION, (1,), kind=CONSTANT, tensor=C.c_const(C.K_VERSION), init=C.VERSION_INIT),
                Port(C.OUT_MEMORY, (1,), kind=CONSTANT, tensor=C.c_const(C.K_MEMORY_SIZE), init=C.K_MEMORY_SIZE)]


def constant_vectors(cont: int, branches, memory: int):
    """The constant vectors ML-Agents' ``SimpleActor`` registers for these heads and memory (float32 arrays):
    what Unity's loader reads, and what another trainer's importer states for its actor (``importers.sb3``)."""
    branches = [float(b) for b in branches]
    vec = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
    return {C.K_VERSION: vec(C.MODEL_EXPORT_VERSION), C.K_IS_CONTINUOUS: vec(1.0 if cont and not branches else 0.0),
            C.K_CONT_SIZE: vec(cont), C.K_DISC_SIZES: np.array(branches, np.float32).reshape(1, len(branches)),
            C.K_ACT_SIZE: vec(cont + sum(branches)), C.K_MEMORY_SIZE: vec(memory)}


def check_constants(r: KeyRules, checks) -> None:
    """Each (constant key, expected, what says so) in ``checks`` must hold: the constant vectors say
    what the tensors say (stricter than ML-Agents, which ignores them)."""
    consts = r.state["constants"]
    for key, want, what in checks:
        got = consts[key]
        if np.asarray(got, dtype=np.float64).reshape(-1).tolist() != [float(w) for w in want]:
            raise r.error(f"'{key}' says {np.asarray(got).reshape(-1).tolist()} but the {what} says {list(want)}")
