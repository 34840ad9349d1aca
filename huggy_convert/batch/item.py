"""One checkpoint of a batch (``batch.run``): its conversion through ``pipeline.convert_one``
(:func:`convert_item`, the workers' tasks), skipped when the manifest already has it; its manifest entry's
key figures; the verification profiles a batch gives its checkpoints (:func:`batch_profiles`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional

from .. import contract as C
from ..converter import load_checkpoint
from ..converter.reference import describe as describe_divisor
from ..converter.reference import divisor_record
from ..core import torchcompat
from ..core.artifacts import sha256_bytes
from ..core.files import read_input_file
from ..core.version import __version__
from ..errors import one_line
from ..importers.sb3 import checkpoint_from_sb3
from ..exporters import onnx_export, torch_module  # noqa: F401 (warm_up: imported before the workers fork)
from ..exporters.pt2 import EXPORT_GATE, ProgramWriter
from ..pipeline import ConvertOptions, InBatch, convert_one, default_reference, prepare_conversion
from ..runtime import ort  # noqa: F401 (warm_up)
from ..verify import VerifyOptions
from ..verify.engine import CHECK_IDS
from .alias import check_alias
from .manifest import (CONVERTED, ERROR, FAILED, OK, PROFILE_FULL, SKIPPED, VERIFY_FAILED, base_entry, sha_file)
from .rundir import Item
from .workers import shared


BATCH_ROWS = 16
BATCH_FINGERPRINT_STEPS = (16,)


def _key_figures(rep_dict: dict) -> dict:
    """The numbers worth a glance: per-check status, bitwise counts, module max abs, fingerprints."""
    out: dict = {"checks": {}}
    for c in rep_dict.get("checks", []):
        num = str(CHECK_IDS.index(c["id"]) + 1) if c.get("id") in CHECK_IDS else c["title"].split(" ", 1)[0]
        out["checks"][num] = c["status"]
        kids = c.get("checks", [])
        if num == "1" and c.get("figures"):
            out["safetensors_bitwise"] = [c["figures"].get("bitwise_equal"), c["figures"].get("tensors")]
        elif num == "2":
            for k in kids:
                f = k.get("figures") or {}
                if k["title"] == "initializers" and "paired" in f:
                    out["onnx_initializers_bitwise"] = [f["paired"] - len(f.get("differences", [])), f["paired"]]
        elif num == "3":
            eq = sum((k.get("figures") or {}).get("bitwise_equal", 0) for k in kids)
            n = sum((k.get("figures") or {}).get("count", 0) for k in kids)
            out["outputs_bitwise"] = [eq, n] if n else None
        elif num == "4":
            mx = {}
            for k in kids:
                vals = [(g.get("figures") or {}).get("max_abs") for g in k.get("checks", [])]
                vals = [v for v in vals if isinstance(v, (int, float))]
                mx[k["title"].split(" (")[0].replace("torch module ", "")] = max(vals) if vals else None
            out["module_max_abs"] = mx
            out["max_bound_ratio"] = (c.get("figures") or {}).get("max_bound_ratio")
        elif num == "5":
            fps = (c.get("figures") or {}).get("fingerprints", {})
            out["fingerprints"] = {str(s): v.get("reference") for s, v in fps.items()}
        elif num == "6":
            out["files"] = {k["title"]: k["status"] for k in kids}
    return out


@dataclass
class _Context:
    out: Path
    options: ConvertOptions
    light: object  # VerifyOptions
    full: object
    previous: Dict[str, dict]
    force: bool
    writer: ProgramWriter


def _outputs_intact(out: Path, prev: dict) -> bool:
    outs = prev.get("outputs") or {}
    if not outs:
        return False
    for a in outs.values():
        p = out / a["file"]
        if sha_file(p) != a.get("sha256"):
            return False
    return True


def _can_skip(prev: Optional[dict], sha: str, item: Item, ctx: _Context) -> bool:
    if ctx.force or not prev or prev.get("status") != OK:
        return False
    if prev.get("source_sha256") != sha or prev.get("tool_version") != __version__ or prev.get("stem") != item.out_stem:
        return False
    if item.newest and ctx.options.verify and prev.get("profile") != PROFILE_FULL:
        return False
    return _outputs_intact(ctx.out, prev)


def _skipped(entry: dict, prev: dict) -> dict:
    keep = {k: prev.get(k) for k in ("source_sha256", "source_bytes", C.CKPT_GLOBAL_STEP, "spec", "reference", "outputs",
                                     "verify", "profile", "seconds", "same_as", "same_as_sha256", "trained_with")}
    entry.update({k: v for k, v in keep.items() if v is not None})
    entry.update(status=prev["status"], run=SKIPPED)
    return entry


def load_item(item: Item, data: Optional[bytes] = None, sha: Optional[str] = None):
    """The checkpoint of an item: an ML-Agents ``.pt`` through the one loader, another trainer's file (an
    SB3 model zip: ``Item.foreign``) through its importer, from ``data`` where its bytes are already read."""
    if item.foreign:
        return checkpoint_from_sb3(item.path, data)
    return load_checkpoint(item.path, data=data, sha256=sha, quiet_warnings=False)


def convert_item(item: Item, ctx: _Context, ckpt=None) -> dict:
    """One checkpoint through ``pipeline.convert_one`` (``ckpt``: already loaded); returns its manifest
    entry (nothing else is kept)."""
    t0 = time.perf_counter()
    entry = base_entry(item)
    try:
        if ckpt is None:
            data = read_input_file(item.path)
            sha = sha256_bytes(data)
            entry.update(source_sha256=sha, source_bytes=len(data))
            prev = ctx.previous.get(item.rel)
            if _can_skip(prev, sha, item, ctx):
                entry = _skipped(entry, prev)
                entry["seconds_this_run"] = round(time.perf_counter() - t0, 3)
                return entry
            # the bytes already read and hashed: the file is read once (torch's warnings are silenced
            # for the whole batch by run_batch: catch_warnings is not thread-safe)
            ckpt = load_item(item, data, sha)
            data = None
        else:
            entry.update(source_sha256=ckpt.sha256, source_bytes=item.path.stat().st_size)
        entry[C.CKPT_GLOBAL_STEP] = ckpt.global_step
        if ckpt.origin is not None:  # another trainer's file: what it was, and the VecNormalize file paired with it
            vn = ckpt.origin.get("vec_normalize") or {}
            entry["trained_with"] = {"format": ckpt.origin.get("format"), "version": ckpt.origin.get("version"),
                                     "algorithm": ckpt.origin.get("algorithm"), "vec_normalize": vn.get("file")}
        res = convert_one(item.path, ctx.out / item.sub, ctx.options, profile=ctx.full if item.newest else ctx.light,
                          batch=InBatch(ckpt, ctx.writer, item.stem, [NEWEST_NOTE if item.newest else profile_note(ctx.light)],
                                        fsync=False, suggest_reference=False, check_tolerances=False))
        s = res.summary()
        decision = divisor_record(res.conversion.policy)  # (summary()'s is None without a normalizer)
        entry["spec"] = s["spec"]
        entry["reference"] = res.reference.name if res.reference else None
        entry["divisor"] = dict(decision, summary=describe_divisor(decision))
        entry["outputs"] = {k: dict(a, file=f"{item.sub}/{a['file']}" if item.sub else a["file"])
                            for k, a in res.outputs().items()}  # paths below OUT
        entry["status"] = OK
        rep = res.report
        if rep is not None:
            v = dict(s["verify"])  # verdict, ok, first_failure
            v.update(_key_figures(rep.to_dict()))
            entry["verify"] = v
            if not v["ok"]:
                entry["status"] = VERIFY_FAILED
                entry["error"] = f"verification failed: {v['first_failure']}"
        entry["run"] = CONVERTED if entry["status"] == OK else FAILED
    except Exception as exc:  # one bad checkpoint never stops the others
        entry.update(status=ERROR, run=FAILED, error=one_line(exc, item.path))
    entry["seconds"] = round(time.perf_counter() - t0, 3)
    return entry


def _convert_task(item: Item):
    """A worker's task: ``convert_item`` with the context the parent set before forking; returns the
    entry and the ``.pt2`` writer's notes (both plain data)."""
    ctx = shared()["ctx"]
    with EXPORT_GATE.shared():  # threads: torch.export runs alone (a process has one thread)
        return convert_item(item, ctx), list(ctx.writer.notes)


def _alias_task(item: Item, candidates):
    ctx = shared()["ctx"]
    with EXPORT_GATE.shared():
        return check_alias(item, ctx, candidates, convert_item), list(ctx.writer.notes)


def warm_up(items: List[Item], ctx: _Context) -> None:
    """In the parent, before the workers fork: the third-party modules the work imports (the package's
    are this module's imports), and the ``.pt2`` template of the first checkpoint's architecture traced (``torch._dynamo``'s import and the trace
    are then paid once, not once per worker). A checkpoint that does not load is left to its task."""
    import onnxruntime  # noqa: F401
    import safetensors.torch  # noqa: F401

    if not ctx.options.program or not items:
        return
    try:
        it = items[0]
        ckpt = load_item(it)  # (its sha256 is not needed here)
        prep = prepare_conversion(ckpt, default_reference(it.path), ctx.options.obs_sizes, ctx.options.divisor)
        ctx.writer.program_bytes(prep.conversion.policy)
        torchcompat.preload_export()  # what torch.export.load needs too
    except Exception:  # noqa: BLE001 - its task reports it
        pass


NEWEST_NOTE = "batch: newest checkpoint of its behavior, full verification profile"


def profile_note(light) -> str:
    """The batch profile (``batch_profiles``' first) in words: the note of every report it verified
    (a batch's, and ``verify OUT/``'s where the manifest records it)."""
    return (f"batch verification profile: checks 1-3 in full ({light.rows} probe rows), module "
            f"{'/'.join(light.dtypes)} on {', '.join(light.devices) if light.devices else 'every device present'}, "
            f"fingerprints of {'/'.join(map(str, light.fingerprint_steps))} steps, no torch.export.load of the "
            ".pt2 (check 6 compares its bytes); float16/bfloat16 and 128-step fingerprints on the newest "
            "checkpoint only")


def batch_profiles(options: ConvertOptions):
    """(batch profile, full profile) of VerifyOptions for a run directory."""
    full = options.verify_options or VerifyOptions()
    dts = ("float32",) if "float32" in full.dtypes else tuple(full.dtypes)[:1]
    light = replace(full, rows=min(full.rows, BATCH_ROWS), dtypes=dts, fingerprint_steps=BATCH_FINGERPRINT_STEPS,
                    program_load=False)
    return light, full
