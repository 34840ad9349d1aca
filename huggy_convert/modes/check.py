"""``huggy-convert check FILE.onnx``: which consumers take the file, and why the others do not
(``conformance.check_file``), rendered as a table of consumers, one line per rule that rejects it, the
notes, and the way back when the file is a torch dynamo export."""
from __future__ import annotations

from typing import Optional, Sequence

from ..conformance import check_file
from .common import ModeResult

MARKS = {True: "\u2713", False: "\u2717"}  # the console prints them as its fallback where it must


def check(path, consumers: Optional[Sequence[str]] = None) -> ModeResult:
    """The check of the ONNX file ``path`` for ``consumers`` (every one when none): ``ok`` when every one
    of them takes it (the command exits 1 otherwise)."""
    r = check_file(path, consumers)
    accepts = r.accepts()
    f = r.facts
    lines = [f"{path}: ONNX opset {f.opset}, {len(f.inputs)} inputs, {len(f.outputs)} outputs"
             + (f", external data {', '.join(f.external)}" if f.external else "")]
    width = max(len(c.name) for c in r.consumers)
    for c in r.consumers:
        lines.append(f"  {MARKS[accepts[c.name]]} {c.name:<{width}}  {c.title}")
    rejects = [x for x in r.findings if x.rejects]
    notes = [x for x in r.findings if not x.rejects]
    lines += [x.line() for x in rejects] + [x.line() for x in notes]
    if r.dynamo:
        lines.append(f"a torch dynamo export ({'; '.join(r.dynamo)}): {r.recovery}")
    elif rejects:
        lines.append(f"the way back: {r.recovery}")
    data = {"file": str(path), "opset": f.opset, "external_data": f.external,
            "consumers": [{"name": c.name, "title": c.title, "accepts": accepts[c.name], "source": c.source}
                          for c in r.consumers],
            "findings": [x.as_dict() for x in r.findings],
            "dynamo_export": r.dynamo, "recovery": r.recovery}
    return ModeResult("check", data=data, lines=lines, ok=r.ok)
