"""What the run modes read off a policy: its ports (``core.flow``: kinds, ``levels``, ``noise``,
``fill``, ``feeds``) and what its blocks answer (``blocks.traits``, ``blocks.described_traits``,
``blocks.variants``), never the family behind them.

A *trait* is what a matrix case needs of a policy: the port-derived ones here (``normal_sample``: a
sampled output with normal noise; ``integer_output``: an output with ``levels``; ``integer_and_real``:
one with levels and a real-valued action beside it; ``carried_state``: an output fed back as an
input; ``normalizer`` / ``no_normalizer``; ``several_vectors``), the others from the blocks.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from .. import blocks
from ..core.flow import DETERMINISTIC, SAMPLED, Port

# the variant fixtures no block owns: name -> (the trait that lets a user's policy stand in, what it is)
GENERIC_VARIANTS: Dict[str, Tuple[Optional[str], str]] = {
    "nonorm": ("no_normalizer", "a policy without a normalizer (normalize: false)"),
    "small": (None, "the fixture variant 'small'"),
    "twoobs": ("several_vectors", "a policy with several vector observations"),
}
GENERIC_TRAITS = {"normalizer": "a normalizer (normalize: true)"}


def actions(spec, kind: str = DETERMINISTIC) -> List[Port]:
    """The action outputs of ``kind`` (deterministic or sampled), in output order."""
    return [p for p in spec.io_signature().outputs if p.kind == kind]


def real_actions(spec, kind: str = DETERMINISTIC) -> List[Port]:
    """The real-valued action outputs of ``kind`` (no ``levels``)."""
    return [p for p in actions(spec, kind) if not p.levels]


def integer_actions(spec, kind: str = DETERMINISTIC) -> List[Port]:
    """The integer action outputs of ``kind`` (each column one of ``levels``)."""
    return [p for p in actions(spec, kind) if p.levels]


def action_pairs(spec) -> List[Tuple[Port, Port]]:
    """(sampled, deterministic) action outputs side by side: the i-th sampled output is the i-th
    deterministic one drawn (the same block's)."""
    sampled, det = actions(spec, SAMPLED), actions(spec, DETERMINISTIC)
    return list(zip(sampled, det)) if len(sampled) == len(det) else [(p, p) for p in det]


def main_output(spec) -> str:
    """The deterministic output a case looks at: the first action output (a real-valued one where
    the policy has one, as the blocks come in output order)."""
    real = real_actions(spec)
    return (real or actions(spec))[0].name


def normal_noise_names(spec) -> List[str]:
    """The sampled outputs whose noise is one standard normal per column."""
    return [p.name for p in spec.io_signature().noise_outputs() if p.noise == "normal"]


def traits(spec) -> Set[str]:
    """Every trait ``spec`` has: the port-derived ones and the blocks' (``blocks.traits``)."""
    sig = spec.io_signature()
    found = set(blocks.traits(spec))
    if normal_noise_names(spec):
        found.add("normal_sample")
    if integer_actions(spec):
        found.add("integer_output")
        if real_actions(spec):
            found.add("integer_and_real")
    if sig.feedback():
        found.add("carried_state")
    found.add("normalizer" if spec.normalize else "no_normalizer")
    if len(spec.obs_sizes) > 1 and not spec.obs_shapes:
        found.add("several_vectors")
    return found


def described(trait: str) -> str:
    """What a policy with ``trait`` is, in the words the modes print."""
    return (blocks.described_traits() | GENERIC_TRAITS).get(trait, trait.replace("_", " "))


def variant_table() -> Dict[str, Tuple[Optional[str], str]]:
    """Every fixture variant (fixtures/variants/<name>), sorted by name: (the trait a user's policy needs
    to stand in for it, None where only the fixture will do; what it is)."""
    table = dict(GENERIC_VARIANTS)
    table.update({name: (t, described(t)) for name, t in blocks.variants().items()})
    return dict(sorted(table.items()))


def variant_with(trait: str) -> str:
    """The fixture variant that stands for ``trait``."""
    return next(name for name, (t, _) in variant_table().items() if t == trait)
