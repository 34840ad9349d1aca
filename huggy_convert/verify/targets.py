"""Check 4's runs of the deploy targets (issue 27: OpenVINO, LiteRT, ExecuTorch) a set holds: each target's
files through its runtime (``runtime.targets.target_runner``, on ``VERIFY_THREADS``, float32) against the float64
reference with the derived float32 bound, as the ``.pt2``; and, where the runtime is deterministic (all three
are, measured: docs/targets.md), a second run of the same feed bitwise equal to the first."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..contract import targets as T
from ..core.artifacts import TARGET_KINDS, TARGET_OF, ArtifactSet
from ..errors import describe
from ..exporters.targets import missing
from ..runtime.targets import target_runner
from ..runtime.threads import VERIFY_THREADS
from .report import FAIL, PASS, SKIP, Check


def target_files(files: Dict[str, bytes]) -> Dict[str, Dict[str, str]]:
    """target -> {kind: suffix} of the deploy targets with a file among ``files`` (kind -> bytes)."""
    return {t: TARGET_KINDS[t] for t in dict.fromkeys(TARGET_OF[k] for k in files if k in TARGET_OF)}


def check_targets(runs, artifacts: ArtifactSet, files: Dict[str, bytes]) -> List[Check]:
    """One check per deploy target with a file in ``files`` (``runs``: check 4's ``runtimes._Runs``)."""
    out = []
    for target, kinds in target_files(files).items():
        names = " + ".join(artifacts.name(k) for k in kinds)
        title = f"{target}: {names} (cpu)"
        absent = [artifacts.name(k) for k in kinds if k not in files]
        line = missing(target)
        if absent:
            out.append(Check(title, FAIL, f"cannot run: {', '.join(absent)} missing or unreadable"))
            continue
        if line:
            out.append(Check(title, SKIP, f"not run: {line}"))
            continue
        try:
            runner = target_runner(target, {s: files[k] for k, s in kinds.items()}, runs.ctx.policy.spec,
                                   VERIFY_THREADS)
        except Exception as exc:  # a file its runtime does not load: this check's failure
            out.append(Check(title, FAIL, f"does not load: {describe(exc)}"))
            continue
        c = runs.check(f"{title}, {runner.dtype}", runner, noised=False)
        if c.status != FAIL and target in T.DETERMINISTIC:
            c.add(_repeat(runner, runs.feed))
        out.append(c)
    return out


def _repeat(runner, feed) -> Check:
    """Two runs of ``feed``: every deterministic output bitwise the same."""
    names = list(runner.spec.deterministic_output_names())
    try:
        a, b = runner.infer(feed), runner.infer(feed)
    except Exception as exc:
        return Check("two runs bitwise", FAIL, f"could not run: {describe(exc)}")
    differ = [n for n in names if n in a and not (a[n].shape == b[n].shape and
                                                  np.asarray(a[n]).tobytes() == np.asarray(b[n]).tobytes())]
    return Check("two runs bitwise", FAIL if differ else PASS,
                 f"{', '.join(differ)} differ between two runs of the same feed" if differ else
                 f"{len([n for n in names if n in a])} outputs bitwise the same in two runs")


def not_installed(files: Dict[str, bytes]) -> List[Dict[str, object]]:
    """``Report.not_run`` entries for the deploy targets with files here whose extra is not installed (a
    re-verification elsewhere than the conversion: their runs of check 4 cannot be made again; exit 4)."""
    return [{"check": 4, "id": "runtimes", "reason": f"{t} not installed", "detail": line}
            for t in target_files(files) for line in [missing(t)] if line]
