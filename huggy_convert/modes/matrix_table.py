"""The matrix's table: what a case is (:class:`CaseDef`: group, title, the equivalent huggy-convert
command, what it needs from the input, its check), registered in order by :func:`case` into
:data:`TABLE`; numbers (1.1, 1.2, ...) are the order within a group. A check is a function of the
running :class:`~.matrix.Matrix` (``m``: the input's sources, files and comparison helpers) returning an
:class:`Outcome`; it raises :class:`Skip` when the input lacks what it needs beyond
:data:`~.matrix.NEEDS`. The cases themselves: ``matrix_cases`` (groups 1-3), ``matrix_numerics`` (4-7),
``matrix_loops`` (8-10).

What a case needs of a policy is a trait (``modes.ports``: read off its ports, or answered by its
blocks), never a family's name; the variant fixtures and what stands in for them come from
``ports.variant_table`` (the blocks declare theirs as plain data).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..verify.compare import Comparison
from .ports import variant_table

Matrix = Any  # the running modes.matrix.Matrix: it imports this table, so the table does not import it
LATENCY_BUDGET_MS = 50.0  # p99 per call, batch <= 64, CPU: a loose bound that only a broken build misses
TAMPER = 1e-3

# The variant fixtures (fixtures/variants/<name>) and, for a user's input, which policies stand in for
# them: the input itself when it has the trait (None: only the fixture will do), and what that is.
VARIANTS: Dict[str, Tuple[Optional[str], str]] = variant_table()


class Skip(Exception):
    """A case that cannot run on this input: its message says what it needs."""


@dataclass
class Outcome:
    ok: bool
    figures: Dict[str, Any] = field(default_factory=dict)
    timings: Dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class CaseDef:
    """One row of the table: ``command(m)`` the equivalent command line, ``check(m)`` the case itself,
    ``needs`` what the input must have (see :meth:`Matrix.lacks`)."""

    group: int
    title: str
    command: Callable[[Matrix], str]
    check: Callable[[Matrix], Outcome]
    needs: Tuple[str, ...] = ()
    quick: bool = True


TABLE: List[CaseDef] = []


def case(group: int, title: str, command: Callable[[Matrix], str], needs: Sequence[str] = (), quick: bool = True):
    """Add the decorated check (or, called with it, a bound one) to :data:`TABLE`."""
    def add(check):
        TABLE.append(CaseDef(group, title, command, check, tuple(needs), quick))
        return check
    return add


def _st(c: Comparison) -> Dict[str, Any]:
    """max_abs and bitwise count of one comparison (integers: equal count)."""
    if c.shape_mismatch is not None:
        return {"shape_mismatch": c.shape_mismatch}
    if c.integer:
        return {"equal": f"{c.bitwise_equal}/{c.count}"}
    return {"max_abs": float(c.max_abs), "bitwise": f"{c.bitwise_equal}/{c.count}"}


def _sha(arrays: Dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()[:16]
