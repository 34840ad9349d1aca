"""The ``atc`` command that compiles a written ONNX into an Ascend offline model (``.om``), read off the
file itself: its inputs with a dynamic batch (``--input_shape`` with -1 on the batch axis and
``--dynamic_batch_size`` profiles), its deterministic outputs as ``--out_nodes`` (the producing node
and output index: the ``RandomNormalLike`` branch of the sampled actions is then not compiled), and a
precision mode that keeps the normalizer float32.

ATC's inference default, ``force_fp16``, casts the normalizer too: Huggy's statistics (running sums
past fp16's range, ~2e6 steps) are folded into the divisor, but the subtraction and division of the
observation still run in fp16 and the actions drift past the fp16 bound (``huggy-convert precision``
measures each mode). So the command uses ``must_keep_origin_dtype`` (the graph's float32), and a faster
alternative gives ``allow_fp32_to_fp16`` (the Gemms in fp16) with the normalizer's Sub/Div/Clip nodes in
``--keep_dtype`` (which ``must_keep_origin_dtype`` ignores). ``--soc_version`` is left for the user.

CANN 8.5's ATC documents ``--precision_mode_v2`` (not together with ``--precision_mode``): the same two
commands are then ``--precision_mode_v2=origin`` and ``--precision_mode_v2=mixed_float16`` with the
``--keep_dtype`` file (which ``origin`` ignores). ``cann``: the CANN version the plan is for (None: both
forms, the older first).
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List, Optional

from .. import blocks, contract as C
from ..contract.consumers import PRECISION_V2_FROM


def _input_shape(spec) -> str:
    dims = lambda p: ",".join(str(C.ATC_DYNAMIC_DIM) if d == C.BATCH_DIM else str(d) for d in p.dims)  # noqa: E731
    return ";".join(f"{p.name}:{dims(p)}" for p in spec.io_signature().inputs)


def out_nodes(model, spec) -> List[str]:
    """``node:index`` of every deterministic output (actions, then the memory), as ``--out_nodes`` takes them."""
    producer = {o: (n.name, list(n.output).index(o)) for n in model.graph.node for o in n.output}
    return [f"{producer[name][0]}:{producer[name][1]}" for name in spec.deterministic_output_names()]


def normalizer_nodes(model, spec) -> List[str]:
    """The names of the nodes ``--keep_dtype`` keeps float32: the normalizers' Sub, Div and Clip, and
    what each block says must stay float32 (``Block.onnx_float32_nodes``: an attention's masking)."""
    rules = [r for b in blocks.active(spec) for r in b.onnx_float32_nodes(spec)]
    return [n.name for n in model.graph.node if any(n.name.startswith(s) and n.op_type in ops for s, ops in rules)]


def _precision_v2(cann: Optional[str]) -> bool:
    """Whether the ATC of CANN ``cann`` takes ``--precision_mode_v2`` (8.5 and later)."""
    if not cann:
        return False
    parts = tuple(int(x) for x in cann.split(".")[:2] if x.isdigit())
    return parts + (0,) * (2 - len(parts)) >= PRECISION_V2_FROM


def _precision_flags(v2: bool) -> Dict[str, str]:
    if v2:
        return {"exact": f"--precision_mode_v2={C.PRECISION_V2_ORIGIN}", "faster": f"--precision_mode_v2={C.PRECISION_V2_MIXED}",
                "default": f"--precision_mode_v2={C.PRECISION_V2_DEFAULT}"}
    return {"exact": f"--precision_mode={C.PRECISION_KEEP_ORIGIN}", "faster": f"--precision_mode={C.PRECISION_ALLOW_FP32_TO_FP16}",
            "default": f"--precision_mode={C.ATC_PRECISION_DEFAULT}"}


def atc_plan(model, onnx_path, spec, cann: Optional[str] = None) -> Dict[str, object]:
    """What to run to compile ``onnx_path`` (the file ``model`` was read from) with ATC: the command (a
    string to paste and its argv), the faster alternative with its ``--keep_dtype`` file's content, and
    which CANN versions take the file's opset; for CANN ``cann`` (None: before 8.5, and the 8.5+ form
    beside it)."""
    path = Path(onnx_path)
    stem = path.with_suffix("")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    common = [C.ATC, f"--model={path}", f"--framework={C.ATC_FRAMEWORK_ONNX}", f"--output={stem}",
              f"--soc_version={C.ATC_SOC_PLACEHOLDER}", f"--input_shape={_input_shape(spec)}",
              f"--dynamic_batch_size={','.join(map(str, C.ATC_BATCH_PROFILES))}",
              f"--out_nodes={';'.join(out_nodes(model, spec))}"]
    v2 = _precision_v2(cann)
    flags = _precision_flags(v2)
    exact = common + [flags["exact"]]
    keep = normalizer_nodes(model, spec)
    keep_file = f"{stem}{C.ATC_KEEP_DTYPE_SUFFIX}"
    faster = common + [flags["faster"]] + ([f"--keep_dtype={keep_file}"] if keep else [])
    targets = [{"target": name, "accepts": ok} for name, ok in C.opset_targets(opset) if C.ATC in name.lower()]
    plan = {
        "cann": cann, "command": shlex.join(exact), "argv": exact, "precision_mode": flags["exact"].split("=", 1)[1],
        "precision_flag": flags["exact"],
        "faster_command": shlex.join(faster), "faster_argv": faster, "faster_precision_mode": flags["faster"].split("=", 1)[1],
        "faster_precision_flag": flags["faster"],
        "keep_dtype_file": keep_file if keep else None, "keep_dtype_nodes": keep,
        "keep_dtype_file_content": "".join(f"{n}\n" for n in keep),
        "out_nodes": out_nodes(model, spec), "opset": opset, "opset_accepted_by": targets,
        "soc_version": f"{C.ATC_SOC_PLACEHOLDER}: your chip (e.g. Ascend310P3; npu-smi info names it)",
        "avoid": f"ATC's inference default {flags['default']}: it casts the normalizer to fp16 too",
    }
    if not cann:
        plan["cann_8_5_precision_flag"] = _precision_flags(True)["exact"]
    return plan


def render(plan: Dict[str, object], indent: str = "  ") -> List[str]:
    """The plan as text lines (what convert and export print)."""
    ok = ", ".join(f"{t['target'].split(', ')[-1]} {'takes' if t['accepts'] else 'refuses'} it"
                   for t in plan["opset_accepted_by"])
    for_cann = f"CANN {plan['cann']}, " if plan.get("cann") else ""
    lines = [f"{indent}Ascend ATC ({for_cann}opset {plan['opset']}: {ok}; fill in --soc_version):",
             f"{indent}  {plan['command']}"]
    if plan.get("cann_8_5_precision_flag"):
        lines.append(f"{indent}  CANN 8.5 and later: {plan['cann_8_5_precision_flag']} instead of {plan['precision_flag']}")
    if plan["keep_dtype_nodes"]:
        lines.append(f"{indent}  faster, the normalizer still float32: {plan['faster_precision_flag']} "
                     f"--keep_dtype={plan['keep_dtype_file']}, that file holding one node name per line:")
        lines += [f"{indent}    {n}" for n in plan["keep_dtype_nodes"]]
    else:
        lines.append(f"{indent}  faster (no normalizer to keep): {plan['faster_precision_flag']}")
    lines.append(f"{indent}  avoid {plan['avoid']} (`huggy-convert precision` emulates each mode in fp16)")
    return lines
