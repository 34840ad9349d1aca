"""``--target``: what a conversion or an export is for (``contract.consumers.TARGETS``: Unity's package,
Sentis, Barracuda, Ascend by CANN version). A target picks the opset written, and the file written is then
checked against its consumers' rules (``check_file``); for Ascend the ``atc`` command follows the target's
CANN version and the ``--keep_dtype`` file its faster form names is written beside the model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..contract import consumers as K
from ..core.files import atomic_write_bytes
from ..errors import InputError
from ..exporters.atc import atc_plan
from . import CheckResult, check_file


def target_named(name: str) -> K.Target:
    if name not in K.TARGETS_BY_NAME:
        raise InputError(f"--target {name!r}: not a target ({', '.join(K.TARGETS_BY_NAME)})")
    return K.TARGETS_BY_NAME[name]


def target_opset(name: str, opset: Optional[int]) -> int:
    """The opset to write for target ``name``: its own when ``opset`` is None (not given), else ``opset``
    where every consumer of the target imports it (an ``InputError`` naming the window otherwise)."""
    t = target_named(name)
    if opset is None:
        return t.opset
    windows = [K.BY_NAME[c].opsets for c in t.consumers if K.BY_NAME[c].opsets]
    lo, hi = max(w[0] for w in windows), min(w[1] for w in windows)
    if not lo <= opset <= hi:
        window = f"{lo}" if lo == hi else f"{lo}-{hi}"
        raise InputError(f"--opset {opset} with --target {name}: its consumers ({', '.join(t.consumers)}) import "
                         f"opset {window}")
    return opset


@dataclass
class TargetOutcome:
    target: K.Target
    check: CheckResult
    atc: Optional[dict] = None
    keep_dtype_file: Optional[Path] = None

    @property
    def ok(self) -> bool:
        return self.check.ok

    def summary(self) -> dict:
        accepts = self.check.accepts()
        return {"target": self.target.name, "ok": self.ok, "opset": self.check.facts.opset,
                "accepted_by": [c for c, ok in accepts.items() if ok],
                "rejected_by": [c for c, ok in accepts.items() if not ok],
                "findings": [f.as_dict() for f in self.check.findings if f.rejects],
                "atc": self.atc, "keep_dtype_file": str(self.keep_dtype_file) if self.keep_dtype_file else None}

    def lines(self) -> list:
        """What the text output says of the target (the ATC block aside: ``exporters.atc.render``)."""
        s = self.summary()
        head = (f"target {self.target.name}: loads in {', '.join(s['accepted_by'])}" if self.ok else
                f"target {self.target.name}: REJECTED by {', '.join(s['rejected_by'])}")
        out = [head] + [f"  {f.line()}" for f in self.check.findings if f.rejects]
        if self.keep_dtype_file:
            out.append(f"  wrote {self.keep_dtype_file.name} (the --keep_dtype file of the faster atc command)")
        return out


def apply_target(name: str, onnx_path, spec) -> TargetOutcome:
    """The written ``onnx_path`` checked for target ``name``; for an Ascend target, its ``atc`` plan for the
    target's CANN and the ``--keep_dtype`` file written beside the model (where the policy has nodes to keep)."""
    t = target_named(name)
    path = Path(onnx_path)
    outcome = TargetOutcome(t, check_file(path, t.consumers))
    if t.cann:
        plan = atc_plan(outcome.check.facts.model, path, spec, cann=t.cann)  # the file as check read it, once
        outcome.atc = plan
        if plan["keep_dtype_file"]:
            keep = Path(plan["keep_dtype_file"])
            atomic_write_bytes(keep, plan["keep_dtype_file_content"].encode("utf-8"))
            outcome.keep_dtype_file = keep
    return outcome
