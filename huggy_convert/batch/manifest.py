"""The batch's manifest: ``OUT/manifest.json`` and ``manifest.csv``, one entry per checkpoint (its status,
what this run did with it, its outputs' sha256 and its verdict's key figures), the run's header
(tool, host, options, the runs found) and summary; the previous manifest read back for a rerun
(an entry whose sources and outputs are unchanged is skipped); written atomically, fsynced."""
from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..core.version import __version__
from .. import contract as C
from ..core.artifacts import SUFFIXES, sha256_bytes
from ..core.files import atomic_write_bytes, read_input_file
from ..errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, HuggyError
from ..pipeline import ConvertOptions
from .rundir import Item


MANIFEST_JSON = "manifest.json"
MANIFEST_CSV = "manifest.csv"
MANIFEST_FORMAT = "huggy-convert-batch-manifest"
MANIFEST_FORMAT_VERSION = 1
try:  # seconds between manifest rewrites during a run (0: after every checkpoint)
    MANIFEST_INTERVAL_S = float(os.environ.get("HUGGY_CONVERT_MANIFEST_INTERVAL", "1.0"))
except ValueError:
    MANIFEST_INTERVAL_S = 1.0
# entry status (what the out directory holds) and what this run did with it
OK, VERIFY_FAILED, ERROR, MISSING, SAME_AS = "ok", "verify_failed", "error", "missing", "same_as"
# the verification profile an entry got (``batch.run.batch_profiles``), as the manifest records it
PROFILE_BATCH, PROFILE_FULL = "batch", "full"
CONVERTED, SKIPPED, FAILED, CHECKED = "converted", "skipped", "failed", "checked"
UNVERIFIED = "unverified"  # a deployed ONNX (batch.deployed) not compared by content (--no-verify)
DEPLOYED_FAILING = (VERIFY_FAILED, ERROR)  # a deployed ONNX's statuses that fail the batch
KINDS = tuple(SUFFIXES.items())


def write_atomic(path: Path, data: bytes, fsync: bool = False) -> None:
    """Artifacts: temp name + rename without a per-file fsync (a torn file is found by its sha256)."""
    atomic_write_bytes(path, data, fsync=fsync)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha_file(path: Path) -> Optional[str]:
    try:
        return sha256_bytes(read_input_file(path, "output file"))
    except HuggyError:
        return None


def _iso(t: Optional[float]) -> Optional[str]:
    if t is None:
        return None
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def base_entry(item: Item) -> dict:
    return {"source": item.rel, "behavior": item.behavior, "step": item.step, "reward": item.reward,
            C.STATUS_CREATION_TIME: item.creation_time, f"{C.STATUS_CREATION_TIME}_utc": _iso(item.creation_time),
            "listed": item.listed, "kind": item.kind, "stem": item.out_stem,
            "profile": (PROFILE_FULL if item.newest else PROFILE_BATCH) if item.kind != "checkpoint" else None,
            "tool_version": __version__}


CSV_COLUMNS = ("behavior", "step", "reward", f"{C.STATUS_CREATION_TIME}_utc", "source", "source_sha256", "stem", "status", "run",
               "same_as", "profile", "verdict", "module_max_abs_cpu_float32", "outputs_bitwise", "safetensors_sha256",
               "onnx_sha256", "pt2_sha256", "report_sha256", "golden_sha256", "seconds", "error")


def _csv_bytes(entries: List[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for e in entries:
        v = e.get("verify") or {}
        mx = (v.get("module_max_abs") or {}).get("cpu float32")
        ob = v.get("outputs_bitwise")
        row = {"verdict": v.get("verdict"), "module_max_abs_cpu_float32": "" if mx is None else f"{mx:.3g}",
               "outputs_bitwise": f"{ob[0]}/{ob[1]}" if ob else ""}
        for kind, _ in KINDS:
            row[f"{kind}_sha256"] = ((e.get("outputs") or {}).get(kind) or {}).get("sha256")
        w.writerow(["" if row.get(c, e.get(c)) is None else row.get(c, e.get(c)) for c in CSV_COLUMNS])
    return buf.getvalue().encode()


def best_entry(entries: List[dict]) -> Optional[dict]:
    """The converted entry with the highest reward (the later step on a tie)."""
    rewarded = [e for e in entries if e.get("status") == OK and isinstance(e.get("reward"), (int, float))]
    return max(rewarded, key=lambda e: (e["reward"], e.get("step") or -1), default=None)


def summarize(entries: List[dict], seconds: float, jobs: int, deployed: List[dict] = ()) -> dict:
    n = len(entries)
    converted = sum(1 for e in entries if e.get("run") == CONVERTED)
    skipped = sum(1 for e in entries if e.get("run") == SKIPPED)
    failed = [e for e in entries if e.get("status") in (ERROR, MISSING, VERIFY_FAILED)]
    same = sum(1 for e in entries if e.get("status") == SAME_AS)
    have = sum(1 for e in entries if e.get("status") in (OK, VERIFY_FAILED))
    best = best_entry(entries)
    deployed_failed = [d for d in deployed if d.get("status") in DEPLOYED_FAILING]
    if not failed and not deployed_failed:
        code = EXIT_OK
    elif have == 0:
        code = EXIT_BAD_INPUT
    else:
        code = EXIT_VERIFY_FAILED
    return {"checkpoints": n, "converted": converted, "skipped": skipped, "failed": len(failed), "same_as": same,
            "verification_failed": sum(1 for e in entries if e.get("status") == VERIFY_FAILED),
            "best_reward": best["reward"] if best else None, "best_step": best.get("step") if best else None,
            "best_stem": best["stem"] if best else None,
            "failures": [{"source": e["source"], "error": e.get("error")} for e in failed],
            "deployed": [{k: d.get(k) for k in ("source", "status", "same_as", "same_as_source", "equal_by", "error")}
                         for d in deployed],
            "seconds": round(seconds, 3), "ms_per_checkpoint": round(1000 * seconds / n, 1) if n else None,
            "jobs": jobs, "tool_version": __version__, "ok": code == EXIT_OK, "exit_code": code}


class Manifest:
    def __init__(self, out: Path, header: dict):
        self.out = out
        self.header = header
        self.entries: Dict[str, dict] = {}
        self.deployed: List[dict] = []  # the run-root <Behavior>.onnx files (batch.deployed)
        self.order: Dict[str, int] = {}
        self._last = 0.0

    def sorted_entries(self) -> List[dict]:
        return [self.entries[k] for k in sorted(self.entries, key=lambda k: self.order[k])]

    def document(self, summary: Optional[dict]) -> dict:
        doc = dict(self.header)
        doc["checkpoints"] = self.sorted_entries()
        doc["deployed"] = self.deployed
        doc["summary"] = summary
        return doc

    def write(self, summary: Optional[dict] = None, csv_too: bool = False, final: bool = True) -> None:
        """The manifest; the ones written along the way are compact (json's C encoder: an indented
        dump runs the pure-Python encoder, ~10x slower, holding the interpreter lock the workers
        need), the final one indented for people."""
        doc = self.document(summary)
        text = (json.dumps(doc, indent=2) if final else json.dumps(doc, separators=(",", ":"))) + "\n"
        if csv_too:
            write_atomic(self.out / MANIFEST_CSV, _csv_bytes(self.sorted_entries()), fsync=True)
        write_atomic(self.out / MANIFEST_JSON, text.encode(), fsync=True)
        _fsync_dir(self.out)
        self._last = time.monotonic()

    def maybe_write(self) -> None:
        if time.monotonic() - self._last >= MANIFEST_INTERVAL_S:
            self.write(final=False)


def read_previous(out: Path, header: dict) -> Tuple[Dict[str, dict], Optional[str]]:
    p = out / MANIFEST_JSON
    if not p.is_file():
        return {}, None
    try:
        doc = json.loads(p.read_text())
        if doc.get("format") != MANIFEST_FORMAT or doc.get("format_version") != MANIFEST_FORMAT_VERSION:
            return {}, f"{p}: not a batch manifest of this version; redoing every checkpoint"
    except (OSError, ValueError) as exc:
        return {}, f"{p}: unreadable ({type(exc).__name__}); redoing every checkpoint"
    if doc.get("options") != header["options"]:
        return {}, f"{p}: made with other options; redoing every checkpoint"
    return {e["source"]: e for e in doc.get("checkpoints", []) if isinstance(e, dict) and "source" in e}, None


def options_record(o: ConvertOptions, light, full) -> dict:
    """Everything that changes the outputs; a manifest made with other options is not reused."""
    def vo(v):
        d = {k: (list(x) if isinstance(x, tuple) else x) for k, x in asdict(v).items()}
        d["devices"] = list(v.devices) if v.devices else None
        return json.loads(json.dumps(d, sort_keys=True))

    rec = {"opset": o.opset, "obs_sizes": list(o.obs_sizes) if o.obs_sizes else None, "program": o.program,
           "divisor": o.divisor,
           "verify": o.verify, "verify_batch": vo(light) if o.verify else None,
           "verify_newest": vo(full) if o.verify else None}
    if o.targets:  # the deploy targets written beside them (--targets; absent: none, as before)
        rec["targets"] = list(o.targets)
    return rec


def recorded_profiles(out: Path) -> Dict[str, str]:
    """``<stem path below OUT>`` -> the profile its batch gave it (``PROFILE_BATCH`` / ``PROFILE_FULL``), from
    ``OUT/manifest.json`` when a batch wrote one (else empty: every set gets the full profile)."""
    p = out / MANIFEST_JSON
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return {}
    return {e["stem"]: e["profile"] for e in doc.get("checkpoints", [])
            if isinstance(e, dict) and isinstance(e.get("stem"), str) and e.get("profile") in (PROFILE_BATCH, PROFILE_FULL)}
