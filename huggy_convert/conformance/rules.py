"""The consumers' rules (``contract.consumers``) applied to a file's facts: one :class:`Finding` for each
rule that would reject the file (or, ``rejects=False``, a note the user should know), naming the consumer,
the rule, what was found and what to do. Each rule cites where its consumer says so (``contract.consumers``'
docstring has the sources)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..contract import consumers as K
from .facts import FLOAT, ModelFacts

RECONVERT = "huggy-convert CHECKPOINT OUT/ writes a file every Unity consumer takes (from the checkpoint, or from an ML-Agents ONNX)"


@dataclass(frozen=True)
class Finding:
    consumer: str
    rule: str
    found: str
    fix: str
    rejects: bool = True

    def line(self) -> str:
        mark = "rejects" if self.rejects else "note"
        return f"{self.consumer}: {mark}: {self.rule}: {self.found}; {self.fix}"

    def as_dict(self) -> dict:
        return {"consumer": self.consumer, "rule": self.rule, "found": self.found, "fix": self.fix,
                "rejects": self.rejects}


Result = Optional[Tuple[str, str]]  # (found, fix), or None: the rule holds


def _opset(f: ModelFacts, c: K.Consumer) -> Result:
    if c.opsets is None or c.opsets[0] <= f.opset <= c.opsets[1]:
        return None
    lo, hi = c.opsets
    want = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"ONNX opset {f.opset}, it imports {want}", f"write it at opset {want}: huggy-convert CHECKPOINT OUT/ --opset {hi}"


def _domains(f: ModelFacts, c: K.Consumer) -> Result:
    if not f.custom_domains or c.name.startswith("ort-"):
        return None
    return (f"operators of the custom domain(s) {', '.join(f.custom_domains)} (not the standard ONNX set)",
            "export without custom functions: " + RECONVERT)


def _external(f: ModelFacts, c: K.Consumer) -> Result:
    if f.missing_external:
        return (f"its weights are in {', '.join(f.missing_external)}, which is not beside the file",
                "put the side file next to the model (or rewrite it as one file: " + RECONVERT + ")")
    if f.external and not c.external_data:
        return f"weights in a side file ({', '.join(f.external)})", "it reads weights from the model file only: " + RECONVERT
    return None


def _ops(f: ModelFacts, c: K.Consumer) -> Result:
    bad = sorted(set(f.ops) & c.denied_ops)
    return (f"operator(s) it does not import: {', '.join(bad)}", "use a float32 model without quantize nodes") if bad else None


def _pruned(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.prunes_unconnected or not f.unconnected:
        return None
    return (f"output(s) {', '.join(f.unconnected)} depend on no input: its importer before "
            f"{K.SENTIS_PRUNE_FIXED} drops them", f"update Sentis to {K.SENTIS_PRUNE_FIXED}+, or " + RECONVERT)


def _fixed(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.fixed_shapes:
        return None
    free = [t.name for t in f.inputs if not t.fixed]
    return (f"input(s) {', '.join(free)} have unfixed dimensions (the batch): the provider takes fixed shapes",
            "fix the batch when you build the session (or run it on the CPU provider)") if free else None


# --- ML-Agents' Unity package (SentisModelInfo.cs, SentisModelParamLoader.cs) -------------------------
def _v2(f: ModelFacts) -> bool:
    """The model names its actions the v2 way (``CheckSupportsContinuousAndDiscrete``)."""
    return any(f.outputs_containing(n) for n in K.V2_MARKS)


def _constant_value(f: ModelFacts, name: str) -> Tuple[Optional[np.ndarray], Optional[str]]:
    """(value, problem) of a constant output ML-Agents reads as ``Tensor<float>``."""
    t = f.output(name)
    if t is None:
        return None, f"no '{name}' output (Required constant \"{name}\" was not found)"
    if t.elem_type != FLOAT:
        return None, f"'{name}' is not float (element type {t.elem_type}): reading it as Tensor<float> throws InvalidCastException"
    v = f.constant(name)
    if v is None:
        return None, f"'{name}' could not be computed at load ({f.zero_run_error or 'no value'})"
    return np.asarray(v, np.float64).reshape(-1), None


def _constants(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.mlagents:
        return None
    for name in K.FLOAT_CONSTANTS:
        _, problem = _constant_value(f, name)
        if problem:
            return problem, RECONVERT
    return None


def _version(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.mlagents:
        return None
    v, problem = _constant_value(f, K.VERSION_OUTPUT)
    if problem or v.size < 1:
        return None  # the constants rule says it
    version = int(v[0])
    lo, hi = K.API_VERSIONS
    if not lo <= version <= hi:
        return f"{K.VERSION_OUTPUT} {version}: it loads API versions {lo}..{hi}", RECONVERT
    size, _ = _constant_value(f, K.STATE_SIZE)
    if version == lo and size is not None and size.size and size[0] > 0:
        return (f"a version-{lo} model with {K.STATE_SIZE} {int(size[0])}: its 1.x state handling is refused",
                "re-export with ML-Agents 2.0+ (API version 3)")
    return None


def _actions(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.mlagents or any(f.outputs_containing(n) for n in K.ACTION_OUTPUTS):
        return None
    return "no action output (The model does not contain any Action Output Node)", RECONVERT


def _head(f: ModelFacts, c: K.Consumer, h: K.Head) -> Result:
    if not c.mlagents or not _v2(f) or not f.outputs_containing(h.sampled):
        return None
    v, problem = _constant_value(f, h.size)
    if problem:
        return problem, RECONVERT
    if not v.size or v.sum() <= 0:
        return f"'{h.size}' is {v.tolist()}: its {h.kind} action size must be above 0", RECONVERT
    if c.deterministic_option and not f.outputs_containing(h.deterministic):
        return (f"no '{h.deterministic}' output: with Deterministic Inference ticked the model does not load",
                "untick Deterministic Inference, or " + RECONVERT)
    if h.needs_input and f.input(h.needs_input) is None:
        return f"{h.kind} actions without an '{h.needs_input}' input", RECONVERT
    return None


def _heads(f: ModelFacts, c: K.Consumer) -> Result:
    for h in K.HEADS:
        found = _head(f, c, h)
        if found:
            return found
    return None


def _state(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.mlagents:
        return None
    size, problem = _constant_value(f, K.STATE_SIZE)
    if problem or not size.size or size[0] <= 0:
        return None
    if f.input(K.STATE_INPUT) is None:
        return f"{K.STATE_SIZE} {int(size[0])} without a '{K.STATE_INPUT}' input", RECONVERT
    if f.output(K.STATE_OUTPUT) is None:
        return f"{K.STATE_SIZE} {int(size[0])} without a '{K.STATE_OUTPUT}' output", RECONVERT
    return None


def _float_inputs(f: ModelFacts, c: K.Consumer) -> Result:
    bad = [t.name for t in f.inputs if t.elem_type != FLOAT]
    if not c.mlagents or not bad:
        return None
    return f"input(s) {', '.join(bad)} are not float: the package feeds every input as a float tensor", RECONVERT


def _dropped(f: ModelFacts, c: K.Consumer) -> Result:
    if not f.not_computed or not (c.mlagents or c.prunes_unconnected or c.name == "barracuda"):
        return None
    return (f"declared output(s) {', '.join(f.not_computed)} that nothing computes: its importer drops them "
            "(onnxruntime refuses such a file)", "nothing to do for Unity; other runtimes need them removed")


def _computes(f: ModelFacts, c: K.Consumer) -> Result:
    if not c.mlagents or f.missing_external or not f.zero_run_error:
        return None
    return (f"the model does not run on zero inputs, as the package runs it once at load ({f.zero_run_error})",
            RECONVERT)


RULES: Tuple[Tuple[str, Callable[[ModelFacts, K.Consumer], Result], bool], ...] = (
    # (rule id, the check, whether a finding rejects the file)
    ("opset", _opset, True),
    ("custom-domain", _domains, True),
    ("external-data", _external, True),
    ("operators", _ops, True),
    ("pruned-outputs", _pruned, True),
    ("fixed-shapes", _fixed, False),
    ("constants", _constants, True),
    ("api-version", _version, True),
    ("action-output", _actions, True),
    ("action-heads", _heads, True),
    ("carried-state", _state, True),
    ("float-inputs", _float_inputs, True),
    ("dropped-outputs", _dropped, False),
    ("runs-at-load", _computes, True),
)


def apply(facts: ModelFacts, consumers: List[K.Consumer]) -> List[Finding]:
    """Every rule that does not hold, consumer by consumer, in the order of ``consumers`` and :data:`RULES`."""
    out = []
    for c in consumers:
        for rule, check, rejects in RULES:
            r = check(facts, c)
            if r is not None:
                out.append(Finding(c.name, rule, r[0], r[1], rejects))
    return out
