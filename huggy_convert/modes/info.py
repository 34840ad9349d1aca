"""``info``: spec, parameter counts, normalizer summary, checkpoint inventory, environment."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import contract as C
from ..blocks import encoders, onnx_weight_ops
from ..conformance import check_file
from ..exporters.devices import resolve_device
from ..importers.from_onnx import describe_recovered, recovered_record
from ..runtime import ort_providers
from ..verify.engine import environment as report_environment
from .common import ModeResult, g
from .outdir import is_output_dir, out_info
from .sources import KIND_ONNX, Source, devices_present, display_path, load_source, run_inventory

# A dimension whose per-step variance (running_variance / steps) is below this is "constant":
# the normalizer divides by sqrt of it (< 0.01), so any change in it hits the +-5 clip at once.
CONSTANT_VAR = 1e-4


def environment() -> Dict[str, object]:
    """A verification report's environment (``verify.engine.environment``: versions, threads, host) on
    the devices present, and onnxruntime's execution providers."""
    env = report_environment(devices_present())
    env["onnxruntime_providers"] = ort_providers()
    return env


def spec_dict(spec) -> Dict[str, object]:
    """The spec's one summary (``PolicySpec.summary``: the same in convert --json and the manifest)."""
    return spec.summary()


def counted_parameters(src: Source) -> Dict[str, int]:
    """Parameter counts from the spec's formula and, independently, from the tensors themselves."""
    if src.kind == KIND_ONNX:
        lin, total = src.onnx_view.parameter_counts()
        return {"linear": lin, C.P_WITH_LOG_SIGMA: total, "counted_from": f"ONNX initializers ({'/'.join(onnx_weight_ops() + ('Add',))})"}
    spec, T = src.spec, src.policy.tensors
    sig = sum(int(v.size) for k, v in T.items() if k.startswith(C.C_LOG_SIGMA))
    norm = {C.c_norm(i, f) for i, _ in spec.vector_obs for f in C.NORM_FIELDS} | {C.c_divisor(i) for i, _ in spec.vector_obs}
    lin = sum(int(v.size) for k, v in T.items()  # every tensor but the constants, normalizers and log sigma
              if not k.startswith((C.c_const(""), C.C_LOG_SIGMA)) and k not in norm)
    return {"linear": spec.parameter_count(include_log_sigma=False),
            C.P_WITH_LOG_SIGMA: spec.parameter_count(include_log_sigma=True),
            "tensors_linear": lin, C.P_TENSORS_WITH_LOG_SIGMA: lin + sig,
            "counted_from": "spec formula and canonical tensors"}


def normalizer_summary(src: Source) -> List[Dict[str, object]]:
    out = []
    if not src.spec.normalize:
        return out
    for i, (mean, div) in enumerate(src.obs_scale()):
        if src.spec.obs_kind(i) != "vector":  # only vector observations have a normalizer
            continue
        d: Dict[str, object] = {"input": C.OBS_INPUT.format(i=i), "size": int(mean.size),
                                "mean_range": [float(mean.min()), float(mean.max())],
                                "divisor_range": [float(div.min()), float(div.max())]}
        if src.policy is not None and recovered_record(src.policy):
            d["steps"] = None  # folded into the ONNX it was recovered from (steps = 1, variance = divisor^2)
            const = np.flatnonzero(div.astype(np.float64) ** 2 < CONSTANT_VAR)
        elif src.policy is not None:
            T = src.policy.tensors
            var = T[C.c_norm(i, C.NORM_VAR)].astype(np.float64)
            steps = float(T[C.c_norm(i, C.NORM_STEPS)].reshape(-1)[0])
            exact = src.policy.exact_steps.get(C.c_norm(i, C.NORM_STEPS))
            per_step = var / steps
            d.update(steps=int(exact) if exact is not None else int(round(steps)),
                     variance_range=[float(var.min()), float(var.max())],
                     variance_per_step_range=[float(per_step.min()), float(per_step.max())])
            const = np.flatnonzero(per_step < CONSTANT_VAR)
        else:
            d["steps"] = None  # folded into the divisor in an ONNX
            const = np.flatnonzero(div.astype(np.float64) ** 2 < CONSTANT_VAR)
        d["constant_dims"] = [int(j) for j in const]
        d["constant_rule"] = f"{C.NORM_VAR} / steps < {CONSTANT_VAR:g} (divisor < {np.sqrt(CONSTANT_VAR):g})"
        d["fp16_overflow"] = bool(src.policy is not None and float(src.policy.tensors[C.c_norm(i, C.NORM_VAR)].max()) > 65504.0)
        out.append(d)
    return out


def info(path, device: str = "auto", dtype: str = "float32", src: Optional[Source] = None) -> ModeResult:
    p = Path(path)
    if src is None and is_output_dir(p):  # OUT/: the sets written there
        return out_info(p)
    src = src or load_source(p)
    r = ModeResult("info")
    spec = src.spec
    params = counted_parameters(src)
    norm = normalizer_summary(src)
    env = environment()

    try:
        resolved = resolve_device(device) if src.kind != KIND_ONNX else None
    except Exception as exc:  # report, do not fail: info describes what is here
        resolved = f"unavailable ({exc})"
    d: Dict[str, object] = {"source": display_path(p), "kind": "run directory" if p.is_dir() else src.kind,
                            "file": src.label, "spec": spec_dict(spec), "parameters": params,
                            "encoders": encoders(spec),
                            "normalizer": norm, "environment": env, "device": {"asked": device, "torch": resolved,
                                                                               "dtype": dtype}}
    recovered = recovered_record(src.policy) if src.policy is not None else {}
    if src.checkpoint is not None and not recovered:
        d["checkpoint"] = {"sha256": src.checkpoint.sha256, "training_step": src.checkpoint.global_step,
                           "top_level_keys": src.checkpoint.top_keys}
    if src.kind == KIND_ONNX or recovered:
        d["recovered_from"] = recovered or None
        if src.unrecovered:
            d["not_recovered_because"] = src.unrecovered
    if src.policy is not None and src.policy.metadata:
        md = src.policy.metadata
        d["policy_file"] = {"source_file": md.get("source_file"), "source_sha256": md.get("source_sha256"),
                            "training_step": md.get("training_step")}
    if src.kind == KIND_ONNX:
        v = src.onnx_view
        d["onnx"] = {"opset": v.opset, "producer": f"{src.model.producer_name} {src.model.producer_version}".strip(),
                     "inputs": {n: s for n, s in v.inputs}, "outputs": v.outputs, "nodes": len(src.model.graph.node)}
        d["onnx"]["consumers"] = _consumers(src.path)
    run_dir = p if p.is_dir() else None
    if run_dir is not None:
        d["inventory"] = run_inventory(run_dir)
    r.data = d
    _render(r, src, recovered, run_dir is not None)
    return r


def _consumers(path) -> Dict[str, object]:
    """Which consumers load the ONNX file (``conformance.check_file``: each loader's rules)."""
    r = check_file(path)
    return {"accept": [c for c, ok in r.accepts().items() if ok], "reject": [c for c, ok in r.accepts().items() if not ok],
            "dynamo_export": r.dynamo}


def _render(r: ModeResult, src: Source, recovered, run_dir: bool) -> None:
    d, L, spec = r.data, r.lines, src.spec
    params, norm, env, inv = d["parameters"], d["normalizer"], d["environment"], d.get("inventory")
    L.append(f"{d['source']}  ({d['kind']}{', newest checkpoint ' + src.label if run_dir else ''})")
    L.append(f"  spec: {spec.family}")
    L.append(f"  parameters: {params['linear']:,} in the linear layers, {params[C.P_WITH_LOG_SIGMA]:,} with the log sigma"
             f"  ({params['counted_from']})")
    for e in d["encoders"]:
        if e["kind"] != "vector":  # the vectors' encoders: the normalizer lines below
            L.append(f"  encoder {', '.join(e['inputs'])} ({e['kind']}, {' + '.join('x'.join(map(str, s)) for s in e['shape'])}): "
                     f"{e['encoder']}; {e['width']} wide, {e['parameters']:,} parameters")
    if recovered:
        L.append(f"  {describe_recovered(recovered)}")
    elif src.unrecovered:
        L.append(f"  canonical tensors: not recovered ({src.unrecovered}); onnxruntime runs it as it is")
    if "checkpoint" in d:
        L.append(f"  checkpoint: step {src.checkpoint.global_step}, sha256 {src.checkpoint.sha256[:16]}…, "
                 f"top-level keys {', '.join(src.checkpoint.top_keys)}")
    if "onnx" in d:
        o = d["onnx"]
        L.append(f"  onnx: opset {o['opset']}, {o['nodes']} nodes, producer {o['producer'] or '?'}, inputs "
                 + ", ".join(f"{k}{v}" for k, v in o["inputs"].items()))
        cons = o["consumers"]
        L.append(f"  loads in: {', '.join(cons['accept']) or 'none'}"
                 + (f"; not in: {', '.join(cons['reject'])} (huggy-convert check says why)" if cons["reject"] else ""))
    if not norm:
        L.append("  normalizer: none (normalize: false)")
    for n in norm:
        steps = "steps folded into the ONNX" if n["steps"] is None else f"{n['steps']:,} steps"
        L.append(f"  normalizer {n['input']} [{n['size']}]: {steps}, mean {g(n['mean_range'][0], 4)}..{g(n['mean_range'][1], 4)}"
                 + (f", variance {g(n['variance_range'][0], 4)}..{g(n['variance_range'][1], 4)}" if "variance_range" in n else "")
                 + f", divisor {g(n['divisor_range'][0], 4)}..{g(n['divisor_range'][1], 4)}")
        L.append(f"    constant dims: {n['constant_dims'] or 'none'} ({n['constant_rule']})"
                 + (f"; {C.NORM_VAR} exceeds fp16's 65504: the normalizer must stay float32" if n["fp16_overflow"] else ""))
    if inv is not None:
        for beh, b in inv["behaviors"].items():
            L.append(f"  behavior {beh}: {len(b['checkpoints'])} checkpoint(s)")
            for ck in b["checkpoints"]:
                pts = ck.get("pt")
                pts = ", ".join(pts) if isinstance(pts, list) else pts
                present = "present" if ck.get("pt_present") and ck.get("onnx_present", True) else "MISSING files"
                reward = ck.get("reward")
                L.append(f"    step {ck['steps']}: reward {g(reward, 6) if reward is not None else '?'}, "
                         f"{ck.get('onnx') or ''} {pts or ''} ({present}){', newest' if ck.get('newest') else ''}")
            if b.get("checkpoint_pt"):
                L.append(f"    {b['checkpoint_pt']}")
    L.append(f"  environment: torch {env['torch']}, onnx {env['onnx']}, onnxruntime {env['onnxruntime']}, "
             f"python {env['python']}")
    L.append("  devices: " + ", ".join(f"{k} ({v})" for k, v in env["devices"].items())
             + f"; onnxruntime providers: {', '.join(env['onnxruntime_providers'])}")
