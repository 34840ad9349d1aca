"""The verification report: a tree of checks with figures, printable and JSON-serialisable."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"
_MARK = {PASS: "✓", FAIL: "✗", SKIP: "-", WARN: "!"}


@dataclass
class Check:
    """One ✓/✗ line. ``children`` are its sub-lines; a parent fails if any child fails."""

    title: str
    status: str = PASS
    summary: str = ""
    figures: Dict[str, Any] = field(default_factory=dict)
    children: List["Check"] = field(default_factory=list)
    id: str = ""  # stable id of a top-level check (see verify.engine.CHECK_IDS); titles are for people

    def add(self, child: "Check") -> "Check":
        self.children.append(child)
        if child.status == FAIL:
            self.status = FAIL
        elif child.status == WARN and self.status == PASS:
            self.status = WARN
        return child

    def failures(self, path: str = "", diagnoses: tuple = ()) -> List[str]:
        """One line per failing leaf: ``parent › leaf: summary`` plus any diagnosis an ancestor made."""
        here = f"{path} › {self.title}" if path else self.title
        if self.status != FAIL:
            return []
        if self.summary.startswith("FAILED:"):
            diagnoses = diagnoses + (self.summary[len("FAILED:"):].strip(),)
        failing = [c for c in self.children if c.status == FAIL]
        if not failing:
            extra = "".join(f" ({d})" for d in diagnoses)
            return [f"{here}: {self.summary}{extra}"]
        out: List[str] = []
        for c in failing:
            out += c.failures(here, diagnoses)
        return out

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"id": self.id} if self.id else {}
        d.update(title=self.title, status=self.status, summary=self.summary)
        if self.figures:
            d["figures"] = _clean(self.figures)
        if self.children:
            d["checks"] = [c.to_dict() for c in self.children]
        return d


def _clean(o):
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            return _clean(o.item())
        except (ValueError, AttributeError):
            return str(o)
    return o


@dataclass
class Report:
    subject: str
    checks: List[Check] = field(default_factory=list)
    environment: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    golden: Optional[bytes] = field(default=None, repr=False)  # the golden file's bytes (written by the caller)
    # what the conversion recorded: {"artifacts": {kind: {file, sha256}}, "sources": {"checkpoint"|"official":
    # {path, relative, sha256} or None}} (``verify OUT/`` reads it back from <stem>.verify.json and keeps it)
    recorded: Dict[str, Any] = field(default_factory=dict)
    # checks a re-verification could not run as the conversion did: [{"check": 1, "id", "reason", "detail"}]
    not_run: List[Dict[str, Any]] = field(default_factory=list)
    require_complete: bool = False  # an incomplete verification is a failure (verify --require-complete)

    def check(self, id: str) -> Optional[Check]:
        """The top-level check of that id, if it ran."""
        return next((c for c in self.checks if c.id == id), None)

    @property
    def complete(self) -> bool:
        """Every check the conversion ran was run again (nothing in ``not_run``)."""
        return not self.not_run

    @property
    def failed(self) -> bool:
        """A check failed (an incomplete verification is not a failed check)."""
        return any(c.status == FAIL for c in self.checks)

    @property
    def ok(self) -> bool:
        return not self.failed and (self.complete or not self.require_complete)

    def incomplete(self) -> str:
        """``checks 1-2 not run: checkpoint not found`` ('' when complete): the checks not run and why."""
        if not self.not_run:
            return ""
        nums = sorted({int(n["check"]) for n in self.not_run})
        which = f"check {nums[0]}" if len(nums) == 1 else \
            f"checks {nums[0]}-{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1)) else \
            "checks " + ", ".join(map(str, nums))
        reasons: List[str] = []
        for n in self.not_run:
            if n["reason"] not in reasons:
                reasons.append(n["reason"])
        return f"{which} not run: {', '.join(reasons)}"

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        warned = any(c.status == WARN for c in self.checks)
        if not self.complete:
            if self.require_complete:
                return f"FAIL ({self.incomplete()}; --require-complete)"
            return f"PASS ({'with warnings; ' if warned else ''}{self.incomplete()})"
        return "PASS (with warnings)" if warned else "PASS"

    def failures(self) -> List[str]:
        out: List[str] = []
        for c in self.checks:
            out += c.failures()
        if not self.failed and not self.ok:
            out.append(f"incomplete ({self.incomplete()}) and --require-complete")
        return out

    def first_failure(self) -> Optional[str]:
        f = self.failures()
        return f[0] if f else None

    def to_dict(self) -> Dict[str, Any]:
        d = {"subject": self.subject, "verdict": self.verdict, "ok": self.ok, "complete": self.complete,
             "not_run": _clean(self.not_run), "notes": self.notes, "checks": [c.to_dict() for c in self.checks],
             "environment": _clean(self.environment)}
        if self.recorded:
            d["recorded"] = _clean(self.recorded)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def render(self) -> str:
        lines = [f"verify {self.subject}"]
        for n in self.notes:
            lines.append(f"  note: {n}")

        def walk(c: Check, prefix: str, last: bool):
            branch = "└─ " if last else "├─ "
            text = f"{_MARK[c.status]} {c.title}" + (f": {c.summary}" if c.summary else "")
            lines.append(prefix + branch + text)
            ext = prefix + ("   " if last else "│  ")
            for i, ch in enumerate(c.children):
                walk(ch, ext, i == len(c.children) - 1)

        for i, c in enumerate(self.checks):
            walk(c, "", i == len(self.checks) - 1)
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)
