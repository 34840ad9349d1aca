"""What a verification is asked to do (:class:`VerifyOptions`) and the per-output tolerance options'
check against the policies' outputs."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..errors import InputError


@dataclass
class VerifyOptions:
    rows: int = 64
    seed: int = 0
    devices: Optional[Sequence[str]] = None  # None: every device present
    dtypes: Sequence[str] = ("float32", "float16", "bfloat16")
    atol: Dict[str, float] = field(default_factory=dict)
    cosine: Dict[str, float] = field(default_factory=dict)
    rtol: Dict[str, float] = field(default_factory=dict)
    fingerprint_steps: Sequence[int] = (64, 128)
    include_npu: Optional[bool] = None  # None: NPUs where torch_npu is installed
    program_load: bool = True  # run the .pt2 through torch.export.load (False: check 6 compares its bytes only)


TOLERANCE_OPTIONS = (("--atol", "atol"), ("--rtol", "rtol"), ("--cosine", "cosine"))


def named_tolerances(o: Optional[VerifyOptions]) -> List[tuple]:
    """(option, output, value) of each per-output ``--atol/--rtol/--cosine OUTPUT:VALUE`` (``*`` left out)."""
    if o is None:
        return []
    return [(opt, name, v) for opt, attr in TOLERANCE_OPTIONS for name, v in (getattr(o, attr, None) or {}).items()
            if name != "*"]


def check_tolerance_outputs(o: Optional[VerifyOptions], policies: Sequence[tuple]) -> List[str]:
    """Every output a tolerance option names (``--atol/--rtol/--cosine OUTPUT:VALUE``) is an output of at
    least one of ``policies`` ((subject, PolicySpec) pairs: their ``io_signature`` gives the names), else an
    ``InputError`` (exit 2) naming the outputs there are; ``*`` is every output. One policy (a conversion):
    a name that is not its own is refused, whatever other policies have; several (a batch, ``verify OUT/``):
    refused when it names an output of none of them. The callers run it before anything is written.
    Returns a warning for each name that is an output of some of the policies only, saying which not."""
    named = named_tolerances(o)
    if not named or not policies:
        return []
    groups: Dict[tuple, List[str]] = {}
    for subject, spec in policies:
        groups.setdefault(tuple(spec.output_names()), []).append(str(subject))
    known = [n for outs in groups for n in outs]
    bad = [(opt, name, v) for opt, name, v in named if name not in known]
    if not bad:
        warn = []
        for opt, name, _ in named:
            without = [sub for outs, subs in groups.items() if name not in outs for sub in subs]
            if without:
                warn.append(f"{opt} {name}: an output of {len(policies) - len(without)} of the {len(policies)} "
                            f"policies, not of {', '.join(without[:3])}{' …' if len(without) > 3 else ''}: "
                            "applied where it is one")
        return warn
    opt, name, v = bad[0]
    close = difflib.get_close_matches(name, list(dict.fromkeys(known)), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""

    def who(subjects):
        return subjects[0] + (f" and {len(subjects) - 1} more" if len(subjects) > 1 else "")

    if len(policies) == 1:
        what = f"not an output of {policies[0][0]}{hint}; its outputs: {', '.join(known)}"
    else:
        listed = "; ".join(f"{', '.join(outs)} ({who(subs)})" for outs, subs in groups.items())
        what = f"an output of none of the {len(policies)} policies{hint}; their outputs: {listed}"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise InputError(f"{opt} {name}:{v:g}{more}: {what}, or * for all")
