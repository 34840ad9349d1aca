"""Will a consumer accept this ONNX? ML-Agents' Unity package, Unity's runtimes (Barracuda, Sentis),
Ascend's ATC by CANN version and onnxruntime's CANN provider, each with its rules as data
(``contract.consumers``) applied to the file's facts (:mod:`.facts`) by :mod:`.rules`: a stage that
returns data (:class:`CheckResult`); ``modes.check`` and the CLI render it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..contract import consumers as K
from ..errors import InputError
from .facts import ModelFacts, read_facts
from .rules import RECONVERT, Finding, apply

__all__ = ["CheckResult", "Finding", "check_file", "consumers_named", "dynamo_signs", "read_facts"]


@dataclass
class CheckResult:
    facts: ModelFacts
    consumers: List[K.Consumer]
    findings: List[Finding]
    dynamo: List[str] = field(default_factory=list)  # the signs of a torch dynamo export (empty: none)
    recovery: Optional[str] = None

    def accepts(self) -> Dict[str, bool]:
        """consumer -> whether it takes the file (no finding of it rejects)."""
        bad = {f.consumer for f in self.findings if f.rejects}
        return {c.name: c.name not in bad for c in self.consumers}

    @property
    def ok(self) -> bool:
        return all(self.accepts().values())


def consumers_named(names: Optional[Sequence[str]]) -> List[K.Consumer]:
    """The consumers asked for (every one when none), in ``contract.consumers.CONSUMERS`` order; an unknown
    name is an ``InputError`` that lists the known ones."""
    if not names:
        return list(K.CONSUMERS)
    unknown = [n for n in names if n not in K.BY_NAME]
    if unknown:
        raise InputError(f"--for {unknown[0]!r}: not a consumer this tool knows ({', '.join(K.BY_NAME)})")
    return [c for c in K.CONSUMERS if c.name in set(names)]


def dynamo_signs(f: ModelFacts) -> List[str]:
    """Why the file looks like torch's dynamo exporter wrote it (``torch.onnx.export(dynamo=True)``, the
    default from torch 2.9, forced through ML-Agents' exporter): opset 18 or newer together with one of
    external data, onnxscript functions, constant outputs without ML-Agents' ``Identity``, or output
    names Unity does not bind."""
    if f.opset < K.DYNAMO_MIN_OPSET:
        return []
    signs = []
    if f.external:
        signs.append(f"weights in {', '.join(f.external)}")
    if any(d.startswith(K.DYNAMO_DOMAIN_PREFIX) for d in f.custom_domains):
        signs.append("onnxscript functions")
    if f.bare_constants:
        signs.append(f"constant outputs with no node ({', '.join(f.bare_constants)})")
    renamed = [t.name for t in f.outputs if t.name not in K.UNITY_OUTPUTS]
    if renamed:
        signs.append(f"outputs Unity does not bind ({', '.join(renamed)})")
    return [f"opset {f.opset}"] + signs if signs else []


def _recovery(path: Path) -> str:
    """What to run: the checkpoint beside the file when there is one (ML-Agents writes ``<Behavior>-<step>.pt``
    next to ``<Behavior>-<step>.onnx``)."""
    beside = path.with_suffix(".pt")
    if beside.is_file():
        return f"huggy-convert {beside} OUT/ rewrites it as ML-Agents' exporter does (opset 9, every Unity consumer)"
    return ("convert its checkpoint instead: huggy-convert <its .pt checkpoint> OUT/ writes ML-Agents' own "
            "export (opset 9, every Unity consumer)")


def check_file(path, names: Optional[Sequence[str]] = None, run: bool = True) -> CheckResult:
    """Each asked-for consumer's rules on the ONNX file ``path`` (every consumer when ``names`` is empty)."""
    consumers = consumers_named(names)
    facts = read_facts(path, run=run)
    findings = apply(facts, consumers)
    signs = dynamo_signs(facts)
    rejected = any(f.rejects for f in findings)
    recovery = _recovery(Path(path)) if signs else (RECONVERT if rejected else None)
    return CheckResult(facts, consumers, findings, signs, recovery)
