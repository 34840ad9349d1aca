"""The run-root ``<Behavior>.onnx``: which checkpoint it is, and its verification.

ML-Agents writes ``<Behavior>/<Behavior>-<step>.onnx`` beside every checkpoint and, at the end of
training, copies the final export to ``results/<run-id>/<Behavior>.onnx``: the file people deploy
(and the one a Hub repository's model card points to). A batch lists it and says which checkpoint
it equals by content, as the manifest's ``deployed`` entries:

1. the same bytes as a step's official ONNX (the one beside its ``.pt``): then it is that
   checkpoint's export, and that checkpoint's checks 2-3 (the rebuilt ONNX against those bytes)
   are its verification;
2. else, with verification on, checks 2-3 (``verify.engine.compare_with_official``) of each
   candidate's rebuilt ONNX, read back from OUT with its ``.safetensors``, against it: the first that
   passes is the checkpoint it equals, and those checks its verification.

Candidates are the behavior's step checkpoints in the same run: the step training_status.json names
as ``final_checkpoint`` first, then the newest, then the others, newest first. A deployed ONNX that
equals none of them is a failed verification (exit 1); one that cannot be read (a Git-LFS pointer:
``core.files.read_input_file``) an error naming it; the checkpoints go on either way.
"""
from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional

from .. import contract as C
from ..converter import load_policy
from ..converter.reference import read_onnx
from ..core.artifacts import ONNX, SAFETENSORS, SUFFIXES, sha256_bytes
from ..core.files import read_input_file
from ..errors import HuggyError, from_foreign
from ..verify.checks import check_onnx_structure
from ..verify.engine import compare_with_official
from ..verify.report import FAIL
from .manifest import DEPLOYED_FAILING as FAILING
from .manifest import ERROR, OK, UNVERIFIED, VERIFY_FAILED
from .rundir import Deployed, Item

BY_BYTES, BY_CONTENT = "bytes", "content"


def candidates(dep: Deployed, items: List[Item]) -> List[Item]:
    """The step checkpoints it may be the export of, the likeliest first."""
    cands = [it for it in items if it.sub == dep.sub and it.behavior == dep.behavior and it.kind == "step"
             and not it.missing]
    step = lambda it: it.step if it.step is not None else -1  # noqa: E731
    return sorted(cands, key=lambda it: (dep.final_step is None or it.step != dep.final_step, not it.newest,
                                         -step(it), it.rel))


def _sha(path: Path) -> Optional[str]:
    try:
        return sha256_bytes(read_input_file(path, "ONNX model"))
    except HuggyError:
        return None


def _official(it: Item) -> Path:
    return it.path.with_suffix(SUFFIXES[ONNX])


def _from_entry(entry: dict, cand: Item, cand_entry: dict, checks_by: str) -> None:
    """The deployed entry takes the verdict of the checkpoint whose official ONNX it is."""
    ce_status = cand_entry.get("status")
    v = cand_entry.get("verify")
    if v:
        entry["verify"] = {"verdict": v.get("verdict"), "checks": {k: v["checks"].get(k) for k in ("2", "3")},
                           "by": checks_by}
    if ce_status == OK:
        entry["status"] = OK
    elif ce_status == VERIFY_FAILED:
        entry.update(status=VERIFY_FAILED, error=f"{entry['source']}: the export of {cand.rel}, which failed "
                                                 f"verification: {(v or {}).get('first_failure')}")
    else:
        entry.update(status=ERROR, error=f"{entry['source']}: the export of {cand.rel}, which could not be "
                                         f"converted: {cand_entry.get('error')}")


def check_deployed(dep: Deployed, items: List[Item], results: Dict[str, dict], out: Path, verify: bool,
                   profile=None) -> dict:
    """The manifest entry of a deployed ONNX (``results``: the batch's entries by source)."""
    t0 = time.perf_counter()
    entry: dict = {"source": dep.rel, "behavior": dep.behavior, "kind": "deployed", "final_step": dep.final_step}
    try:
        data = read_input_file(dep.path, "ONNX model")
        sha = sha256_bytes(data)
        entry.update(sha256=sha, bytes=len(data))
        data = None
        cands = candidates(dep, items)
        if not cands:
            entry.update(status=ERROR, error=f"{dep.rel}: no step checkpoint of {dep.behavior} beside it to compare "
                                             "it with")
            return entry
        match = next((c for c in cands if _official(c).is_file() and _official(c).stat().st_size == entry["bytes"]
                      and _sha(_official(c)) == sha), None)
        if match is not None:
            equal_to = str(PurePosixPath(match.rel).with_suffix(SUFFIXES[ONNX]))
            entry.update(same_as=match.out_stem, same_as_source=match.rel, step=match.step, equal_by=BY_BYTES,
                         equal_to=equal_to)
            _from_entry(entry, match, results.get(match.rel, {}),
                        f"checks 2-3 of {match.out_stem} against {equal_to}, the same bytes")
        elif not verify:
            entry.update(status=UNVERIFIED, equal_by=None,
                         note="not the bytes of any step's official ONNX; not compared by content (--no-verify)")
        else:
            _by_content(entry, dep, cands, results, out, profile)
    except Exception as exc:  # one unreadable file never stops the batch (as a checkpoint's failure)
        entry.update(status=ERROR, error=from_foreign(exc, dep.path).one_line())
    finally:
        entry["seconds"] = round(time.perf_counter() - t0, 3)
    if entry.get("step") is not None and dep.final_step is not None and entry["step"] != dep.final_step:
        entry["note"] = (f"{C.STATUS_NAME} names step {dep.final_step} as the final checkpoint; this file is "
                         f"the export of step {entry['step']}")
    return entry


def _by_content(entry: dict, dep: Deployed, cands: List[Item], results: Dict[str, dict], out: Path,
                profile) -> None:
    """Checks 2-3 of each candidate's rebuilt ONNX (read back from OUT) against the deployed file."""
    model = read_onnx(dep.path, "deployed ONNX")[0]
    tried, first_failure = 0, None
    for cand in cands:
        ce = results.get(cand.rel) or {}
        outs = ce.get("outputs") or {}
        if ce.get("status") not in (OK, VERIFY_FAILED) or SAFETENSORS not in outs or ONNX not in outs:
            continue
        tried += 1
        policy = load_policy(out / outs[SAFETENSORS]["file"])
        rebuilt = read_onnx(out / outs[ONNX]["file"], "rebuilt ONNX")[0]
        structure = check_onnx_structure(rebuilt, model, outs[ONNX]["file"], dep.rel, policy=policy)
        checks = [structure] if structure.status == FAIL else \
            compare_with_official(policy, rebuilt, model, dep.path, profile, subject=outs[ONNX]["file"])
        failures = [f for c in checks for f in c.failures()]
        if failures:
            first_failure = first_failure or f"{cand.out_stem}: {failures[0]}"
            continue
        entry.update(same_as=cand.out_stem, same_as_source=cand.rel, step=cand.step, equal_by=BY_CONTENT,
                     equal_to=outs[ONNX]["file"], status=OK,
                     verify={"verdict": "PASS", "checks": {str(i + 2): c.status for i, c in enumerate(checks)},
                             "by": f"checks 2-3 of {cand.out_stem}'s rebuilt ONNX against it"})
        return
    if not tried:
        entry.update(status=ERROR, error=f"{dep.rel}: cannot be verified: none of the {len(cands)} checkpoints of "
                                         f"{dep.behavior} beside it was converted")
        return
    entry.update(status=VERIFY_FAILED, equal_by=None,
                 error=f"{dep.rel}: the export of none of the {dep.behavior} checkpoints beside it ({tried} compared: "
                       f"not the bytes of their official ONNX, and checks 2-3 fail against each one's rebuilt ONNX; "
                       f"first {first_failure})")


def describe(entry: dict) -> str:
    """One line for the batch's text output."""
    head = f"deployed {entry['source']}"
    if entry.get("status") in FAILING:
        return f"{head}: {'error' if entry['status'] == ERROR else 'verification failed'} (see above)"
    if entry.get("equal_by") == BY_BYTES:
        what = f"{entry['equal_to']} (same bytes): the export of {entry['same_as_source']}"
    elif entry.get("equal_by") == BY_CONTENT:
        what = f"the export of {entry['same_as_source']} (same content: checks 2-3 against its rebuilt ONNX)"
    else:
        return f"{head}: {entry.get('note')}"
    verdict = (entry.get("verify") or {}).get("verdict") or "not verified"
    return f"{head} = {what}, {verdict}" + (f" ({entry['note']})" if entry.get("note") else "")
