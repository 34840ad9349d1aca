"""Check 4 of the verification: every runtime (a ``runtime.Runner``: onnxruntime on the rebuilt and
official files, the torch module on every device and dtype, the ``.pt2`` through ``torch.export.load``)
against the float64 reference of the canonical tensors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .. import contract as C
from ..core.artifacts import PT2, ArtifactSet
from ..core.bounds import PRECISIONS
from ..errors import HuggyError, describe
from ..exporters.devices import NPU, resolve_device, torch_npu_installed
from ..exporters.onnx_export import model_bytes
from ..exporters.pt2 import EXPORT_GATE
from ..exporters.torch_module import build_module
from ..runtime import ModuleRunner, OrtRunner, ProgramRunner, cann_available
from ..runtime.base import Runner
from .bounds import judge
from .compare import DEFAULT_TOLERANCES, Tolerance, array_stats, stats_text
from .report import FAIL, PASS, SKIP, WARN, Check
from .targets import check_targets


def _diagnose(outputs: Dict[str, np.ndarray], zero_outputs: Dict[str, np.ndarray], normalizer_dtypes: Dict[str, str]) -> str:
    hints = []
    for k, v in normalizer_dtypes.items():
        if v != "float32":
            hints.append(f"normalizer buffer {k} is {v} (must stay float32: Huggy-scale sums overflow fp16)")
    for name, v in outputs.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            hints.append(f"{name} has inf/NaN")
        elif name in zero_outputs and v.shape[0] > 1 and np.all(v == v[:1]) and np.array_equal(v[:1], zero_outputs[name][:1]):
            hints.append(f"{name} is the same for every observation (observations zeroed: normalizer overflow?)")
    return "; ".join(hints)


def _margins(flips: List[Dict], within: bool, most: int = 3) -> str:
    """The flipped rows' float64 margins against their bounds (the first ``most``)."""
    sel = [f for f in flips if (f["margin"] <= f["bound"]) == within]
    txt = ", ".join(f"{f['index']}: {f['expected']}->{f['got']}, margin {f['margin']:.3g} "
                    f"{'<=' if within else '>'} bound {f['bound']:.3g}" for f in sel[:most])
    return txt + (f" (+{len(sel) - most} more)" if len(sel) > most else "")


def _bound_text(j: Dict, dtype: str = "float32") -> str:
    if "shape_mismatch" in j:
        return f"shape {j['shape_mismatch'][1]} != expected {j['shape_mismatch'][0]}"
    if "equal" in j:  # argmax: a flip passes when the float64 margin of its two logits is within their bound
        flips = j.get("flips", [])
        return (f"{j['equal']}/{j['count']} equal"
                + (f", {j['ties']} {dtype} tie(s) (float64 logit margin within the bound: {_margins(flips, True)})"
                   if j["ties"] else "")
                + (f"; {j['mismatches']} flip(s) OVER the bound ({_margins(flips, False)})" if j["mismatches"] and flips
                   else (f"; {j['mismatches']} element(s) OVER the bound, first {j['first_failure']}"
                         if j["mismatches"] else "")))
    return (f"max_abs={j['max_abs']:.3g}, error/bound {j['ratio']:.3g} (median bound {j['median_bound']:.2g})"
            + (f"; {j['unbounded']} element(s) without a finite {dtype} bound" if j.get("unbounded") else "")
            + ("" if j["ok"] else f"; {j['over']} element(s) OVER the bound, first {j['first_failure']}"))


@dataclass(frozen=True)
class Noised:
    """A runtime's injected noise (``Runner.sample(feed, seed, noise)``) and the float64 reference with it."""

    noise: np.ndarray
    seed: int
    reference: object


def check_runtime(title: str, runner: Runner, ref, feed: Dict[str, np.ndarray], tolerances=None,
                  pinned: Optional[Dict[str, str]] = None, noised: Optional[Noised] = None) -> Check:
    """One runtime (``runner.infer(feed)``, in ``runner.dtype``) against the float64 reference ``ref``
    (bounds.Reference, its bounds derived for the runner's dtype: ``ref.precision``): every element within
    its derived bound, one rule for float32, float16 and bfloat16 (bounds.judge; over the bound
    fails). An output named in ``--atol``/``--rtol``/``--cosine`` (``tolerances``: its ``atol``, ``rtol``,
    ``cosine`` dicts, as ``VerifyOptions``) is judged by that rule instead (over it: a failure, or for
    bfloat16 a warning, as the user's threshold always was). A reference derived for another format than
    the runner's (none given for it) falls back to the ``DEFAULT_TOLERANCES`` thresholds. ``pinned``: the
    dtypes of the buffers the runtime keeps float32 (a torch module's, a program's): a failure then says
    why it may be so, after a run on zeros. ``noised`` adds ``continuous_actions`` with injected noise."""
    c, dtype = Check(title), runner.dtype
    try:
        got = runner.infer(feed)
    except Exception as exc:  # a device or artifact that cannot run is a failed check, not a crash
        c.status, c.summary = FAIL, f"could not run: {describe(exc)}"
        return c
    user = {k: dict(getattr(tolerances, k, None) or {}) for k in ("atol", "cosine", "rtol")}
    ratios, worst, ties = [], [], 0
    items = [(name, got[name], ref) for name in ref.values if name in got and name != C.OUT_CONT]
    if noised is not None:
        try:
            items.append((C.OUT_CONT, runner.sample(feed, noised.seed, noised.noise)[C.OUT_CONT], noised.reference))
        except Exception as exc:
            c.add(Check(f"{C.OUT_CONT} (injected noise)", FAIL, f"could not run: {describe(exc, 160)}"))
    for name, arr, r in items:
        label = name + (" (injected noise)" if name == C.OUT_CONT else "")
        if r.precision.name == dtype and not any(name in d or "*" in d for d in user.values()):
            j = judge(r, name, arr)
            c.add(Check(label, PASS if j["ok"] else FAIL, _bound_text(j, dtype), figures=j))
            ties += j.get("ties", 0)
            if "ratio" in j:
                ratios.append(j["ratio"])
                worst.append(j["max_abs"])
            continue
        sub = _tolerance_check(label, (name, r.values[name], arr), dtype, user)
        c.add(sub)
        worst.append(sub.figures.get("max_abs", 0.0))
    if c.status == FAIL:
        zero = runner.infer({k: np.zeros_like(v) for k, v in feed.items()}) if pinned is not None else {}
        why = _diagnose(got, zero, pinned or {})
        c.summary = "FAILED" + (f": {why}" if why else "")
    else:
        c.summary = (f"max_abs {max(worst) if worst else 0:.3g}" + (f", error/bound {max(ratios):.3g}" if ratios else "")
                     + (f", {ties} argmax flip(s) within their float64 margin" if ties else "")
                     + (" (not for production)" if c.status == WARN else ""))
    c.figures = {"dtype": dtype, "max_bound_ratio": max(ratios) if ratios else None}
    return c


def _tolerance_check(label: str, arrays, dtype: str, user: Dict[str, Dict[str, float]]) -> Check:
    """One output (``arrays``: its name, the reference's values, the runtime's) by a tolerance: the user's
    (``user``: atol/cosine/rtol by output or ``*``), else ``DEFAULT_TOLERANCES[dtype]``."""
    name, want, arr = arrays
    named = any(name in d or "*" in d for d in user.values())
    base = DEFAULT_TOLERANCES[dtype]
    atol, cos, rtol = user["atol"], user["cosine"], user["rtol"]
    tol = Tolerance(atol=atol.get(name, atol.get("*", base.atol)), cosine=cos.get(name, cos.get("*", base.cosine)),
                    rtol=rtol.get(name, rtol.get("*", base.rtol)))
    ref32 = want.astype(np.float32) if want.dtype.kind == "f" else want
    s = array_stats(ref32, arr)
    ok = tol.passes(s, ref32, arr)
    warn = dtype == "bfloat16" and named  # the user's own bf16 threshold: reported, as it always was
    status = PASS if ok else (WARN if warn else FAIL)
    rule = f"atol {tol.atol:g}" + (f" or rtol {tol.rtol:g}" if tol.rtol is not None else "") + f", cosine {tol.cosine}"
    if ok:
        extra = f" (within {rule})"
    elif warn:
        extra = " over the bf16 threshold: not for production"
    else:
        n = tol.violations(ref32, arr) if s.get("mismatches") is None else s["mismatches"]
        extra = f" over tolerance ({rule}; {n} element(s))"
    return Check(label, status, stats_text(s) + extra, figures=dict(s, atol=tol.atol, rtol=tol.rtol, min_cosine=tol.cosine))


class _Runs:
    """Check 4's runs on one feed of the context (``ctx``: ``context.Context``): its feed, its injected
    noise and the float64 references each runner is judged by."""

    def __init__(self, ctx, feed_name: str):
        self.ctx, self.name = ctx, feed_name
        self.feed, self.noise = ctx.feeds[feed_name], ctx.noises.get(feed_name)

    def check(self, title: str, runner: Runner, role: str = "ours", noised: bool = True, pinned=None) -> Check:
        """``runner`` against the reference of ``role`` with the bounds of its dtype (float16/bfloat16:
        only when such a runtime is checked); with ``noised``, its sampled outputs on the injected noise."""
        ctx, dt = self.ctx, runner.dtype
        ref = ctx.reference(role, self.name, dtype=dt) if dt in PRECISIONS else ctx.reference(role, self.name)
        nz = None
        if noised and self.noise is not None:
            nz = Noised(self.noise, ctx.o.seed, ctx.reference(role, self.name, True, dt))
        return check_runtime(title, runner, ref, self.feed, ctx.o, pinned, nz)


def check_runtimes(ctx, artifacts: ArtifactSet, devices: Sequence[str], extra_modules: Sequence = (),
                   program: Optional[bytes] = None, targets: Optional[Dict[str, bytes]] = None):
    """Check 4: every float32 runtime (onnxruntime on the rebuilt and official files: ``ctx``'s runners,
    their runs shared with check 3; the torch module on every device and dtype; the ``.pt2`` through
    ``torch.export.load``: ``program``, its bytes already read; the deploy targets' files, ``targets``: kind ->
    bytes, ``verify.targets``) against the float64 reference of the canonical tensors; returns (the check,
    the cpu float32 module's runner for check 5)."""
    feed_name = next(iter(ctx.feeds))
    runs = _Runs(ctx, feed_name)
    c4 = Check("4 runtimes vs the float64 reference", id="runtimes")
    c4.add(runs.check("onnxruntime: rebuilt ONNX (cpu float32)", ctx.ours))
    if ctx.official is not None and ctx.ref is not None:
        c4.add(runs.check(f"onnxruntime: {ctx.ref_name} (cpu float32)", ctx.ref, "official"))
    cpu32 = _device_checks(c4, runs, devices)
    for title, mod in extra_modules:
        runner = ModuleRunner(mod, carry=False)
        c4.add(runs.check(title, runner, noised=False, pinned=runner.pinned()))
    pt2_path = artifacts.path(PT2)
    if ctx.o.program_load and pt2_path.is_file():
        try:
            spec = ctx.policy.spec
            with EXPORT_GATE.exclusive():  # torch.export.load is not thread-safe
                prog = ProgramRunner(pt2_path, spec.input_names(), spec.deterministic_output_names(), data=program)
            c4.add(runs.check(f"saved program {pt2_path.name} (cpu)", prog, noised=False, pinned=prog.pinned()))
        except HuggyError as exc:  # refused before torch.export.load (see exporters.pt2.unsafe_reason)
            c4.add(Check(f"saved program {pt2_path.name}", FAIL, exc.message))
        except Exception as exc:
            c4.add(Check(f"saved program {pt2_path.name}", FAIL,
                         f"does not load with torch.export.load: {describe(exc)}"))
    for c in check_targets(runs, artifacts, targets or {}):
        c4.add(c)
    _summarize(c4, feed_name, runs.feed)
    return c4, cpu32


def _device_checks(c4: Check, runs: _Runs, devices: Sequence[str]) -> Optional[Runner]:
    """The torch module on every device and dtype (and on an NPU, the rebuilt ONNX through onnxruntime's
    CANN execution provider); returns the cpu float32 module's runner."""
    ctx, cpu32 = runs.ctx, None
    cann = any(d.split(":")[0] == NPU for d in devices) and cann_available()
    for dev in devices:
        on_npu = dev.split(":")[0] == NPU
        if on_npu and cann:  # the same file on the NPU, through onnxruntime-cann (no ATC)
            data = ctx.onnx_data if ctx.onnx_data is not None else model_bytes(ctx.rebuilt)
            title = (f"onnxruntime: rebuilt ONNX ({dev} {C.CANN_EP}, {C.CANN_OPT_PRECISION}="
                     f"{C.CANN_EP_PRECISION_DEFAULT})")
            try:  # a failure to start is this check's failure
                c4.add(runs.check(title, OrtRunner(data, dev, ctx.policy.spec,
                                                   precision_mode=C.CANN_EP_PRECISION_DEFAULT), noised=False))
            except Exception as exc:
                c4.add(Check(title, FAIL, f"could not run: {describe(exc)}"))
        if on_npu and not torch_npu_installed():
            c4.add(Check(f"torch module {dev}", SKIP, "torch_npu is not installed: the NPU runs the ONNX through "
                         "onnxruntime's CANN execution provider only"))
            continue
        for dt in ctx.o.dtypes:
            try:
                runner = ModuleRunner(build_module(ctx.policy, device=dev, dtype=dt), dt, carry=False)
            except Exception as exc:
                c4.add(Check(f"torch module {dev} {dt}", FAIL, f"could not build: {exc}"))
                continue
            c4.add(runs.check(f"torch module {dev} {dt}", runner, pinned=runner.pinned()))
            if dev == "cpu" and dt == "float32":
                cpu32 = runner
    return cpu32


def _summarize(c4: Check, feed_name: str, feed) -> None:
    """Check 4's summary and figures: the runs within bounds, the worst error/bound per dtype."""
    nfail = sum(1 for ch in c4.children if ch.status == FAIL)
    by_dtype: Dict[str, List[float]] = {}
    for ch in c4.children:
        if ch.figures.get("max_bound_ratio") is not None:
            by_dtype.setdefault(ch.figures.get("dtype", "float32"), []).append(ch.figures["max_bound_ratio"])
    ratios = by_dtype.get("float32", [])
    halves = {dt: max(v) for dt, v in by_dtype.items() if dt != "float32"}
    c4.summary = (f"{len(c4.children) - nfail}/{len(c4.children)} runs within bounds"
                  + (f"; float32 worst error/bound {max(ratios):.3g}" if ratios else "")
                  + "".join(f", {dt} {r:.3g}" for dt, r in halves.items())
                  + f" ({feed_name}, {int(next(iter(feed.values())).shape[0])} rows)")
    c4.figures = {"feed": feed_name, "max_bound_ratio": max(ratios) if ratios else None}
    if halves:
        c4.figures["max_bound_ratio_half"] = halves


def check_devices(names) -> None:
    """Every device asked for (``--verify-device``) is here, else a ``DeviceError``, before anything is
    written: torch's (``exporters.devices.resolve_device``), or for ``npu[:i]`` onnxruntime's CANN
    execution provider where onnxruntime-cann is installed (the NPU then runs the ONNX only)."""
    for name in names or ():
        name = str(name)
        if name.split(":")[0] == NPU and cann_available():
            continue
        resolve_device(name)
