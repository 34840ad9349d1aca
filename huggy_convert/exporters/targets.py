"""Deploy targets beyond ONNX and torch (issue 27), each with its official converter, each an optional extra.

``TARGET_EXPORTERS[target](policy, opset, writer) -> {suffix: bytes}`` (the files of one artifact: OpenVINO's
IR is an ``.xml`` and a ``.bin``; LiteRT's a ``.tflite``; ExecuTorch's a ``.pte``), the signature of
``registry.EXPORTERS`` with the suffixes made explicit:

- OpenVINO: ``openvino.convert_model`` of the rebuilt ONNX (``onnx_export.build_onnx``: Unity's graph and
  names), ``save_model`` with ``compress_to_fp16=False`` (its default halves the weights);
- LiteRT: ``litert_torch.convert`` of the torch module (``torch_module.PolicyModule``) at batch 1, the
  ``.tflite`` flatbuffer it serializes;
- ExecuTorch: the ``.pt2``'s ``torch.export`` program (``torch_module.export_program``, a batch dimension of
  at most ``EXECUTORCH_MAX_BATCH``: ExecuTorch plans its memory for the upper bound),
  ``to_edge_transform_and_lower`` with the XNNPACK partitioner, ``to_executorch``, its buffer.

A target's modules are imported only inside the function that needs them; ``missing(target)`` is the one
line saying what to install when they are not there (``require`` raises it). A converter's failure on a
policy becomes one ``UnsupportedError`` line naming the operator the target lacks (``refusal``)."""
from __future__ import annotations

import importlib.util
import io
import os
import re
import tempfile
from typing import Callable, Dict, Optional

from .. import contract as C
from ..contract import targets as T
from ..core.policy import Policy
from ..errors import UnsupportedError, describe
from .onnx_export import build_onnx, model_bytes
from .torch_module import build_module, example_inputs

EXECUTORCH_MAX_BATCH = 1024  # the .pte's batch upper bound (its memory plan is sized for it; torch.export's range
# constraints may narrow it: the runner reads the planned bound and runs a larger feed in slices)
LITERT_BATCH = 1  # the .tflite's batch: litert-torch converts static shapes
EXECUTORCH_PROBE_BATCH = 3  # the batch a dynamic .pte must run before it is kept (traced at 2)


class MissingExtra(UnsupportedError):
    """A target whose optional extra is not installed (the message says what to install)."""


def missing(target: str) -> Optional[str]:
    """None where ``target``'s modules import; else the one line saying what to install."""
    absent = [m for m in T.MODULES[target] if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (f"the {target} target needs {', '.join(absent)} (not installed): {T.EXTRA_INSTALL[target]} "
            f"(or pip install {' '.join(T.PIP_PACKAGES[target])})")


def require(target: str) -> None:
    """Raise :class:`MissingExtra` where ``target``'s extra is not installed."""
    line = missing(target)
    if line:
        raise MissingExtra(line)


def _operator(text: str) -> Optional[str]:
    """The operator a converter's error names, where it names one."""
    for pat in (r"[Nn]o (?:conversion rule|lowering|converter|kernel) (?:found )?for (?:operation |op(?:erator)? )?['\"]?([\w.:]+)",
                r"[Oo]p(?:erator)? ['\"]?([\w.:]+)['\"]? (?:is )?not (?:supported|implemented)",
                r"[Uu]nsupported (?:op(?:erator)?|operation)s?[:\s]+['\"]?([\w.:]+)",
                r"(aten[.:][\w.]+)"):
        m = re.search(pat, text)
        if m:
            return m.group(1)
    return None


def refusal(target: str, exc: BaseException) -> UnsupportedError:
    """One line: ``target`` cannot take this policy, naming the operator it lacks where the error does."""
    text = describe(exc)
    op = _operator(text)
    what = f"lacks the operator {op}" if op else "cannot convert it"
    return UnsupportedError(f"the {target} target {what} ({type(exc).__name__}: {text})")


def _lacking(target: str, ops) -> Optional[str]:
    """The first operator of ``ops`` that ``target`` is known to lack (contract.targets.LACKS)."""
    known = T.LACKS[target]
    return next((o for o in ops if o in known), None)


def _refuse_known(target: str, policy: Policy, opset: int) -> None:
    if not T.LACKS[target]:
        return
    ops = [n.op_type for n in build_onnx(policy, opset).graph.node]
    op = _lacking(target, ops)
    if op:
        raise UnsupportedError(f"the {target} target lacks the operator {op} ({T.LACKS[target][op]})")


# --- OpenVINO ------------------------------------------------------------------------------------------

def openvino_model(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT):
    """The policy's rebuilt ONNX converted by ``openvino.convert_model`` (an ``openvino.Model``)."""
    require(T.OPENVINO)
    _refuse_known(T.OPENVINO, policy, opset)
    import openvino as ov

    try:
        model = ov.convert_model(io.BytesIO(model_bytes(build_onnx(policy, opset))))
    except Exception as exc:  # the converter's own errors: one line naming the operator
        raise refusal(T.OPENVINO, exc) from exc
    _stable_names(model)
    return model


def _stable_names(model) -> None:
    """The nodes OpenVINO names itself (``<Type>_<n>``, n from a process-wide counter that reading or compiling
    another model advances too; a folded constant keeps the counted name of the op it came from) renamed by
    their place in the graph, so the same policy gives the same ``.xml`` bytes in any process, on any call."""
    for i, op in enumerate(model.get_ordered_ops()):
        if op.get_type_name() in ("Parameter", "Result"):  # the policy's inputs and outputs keep their names
            continue
        # ``<Type>_<n>`` of any type: a constant folded from a Reshape or a Concat keeps that op's counted name
        m = re.fullmatch(r"([A-Z][A-Za-z0-9]*)_\d+", op.get_friendly_name())
        if m:
            op.set_friendly_name(f"{m.group(1)}_{i}")


def openvino_files(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, writer=None) -> Dict[str, bytes]:
    """The IR (``.xml`` graph, ``.bin`` float32 weights) that ``openvino.save_model`` writes for the policy."""
    model = openvino_model(policy, opset)
    import openvino as ov

    with tempfile.TemporaryDirectory(prefix="huggy-ov-") as tmp:
        xml = os.path.join(tmp, "model" + T.OPENVINO_XML)
        ov.save_model(model, xml, compress_to_fp16=T.OV_COMPRESS_TO_FP16)
        with open(xml, "rb") as f:
            graph = f.read()
        with open(os.path.join(tmp, "model" + T.OPENVINO_BIN), "rb") as f:
            weights = f.read()
    return {T.OPENVINO_XML: graph, T.OPENVINO_BIN: weights}


# --- LiteRT --------------------------------------------------------------------------------------------

def litert_bytes(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, writer=None) -> bytes:
    """The ``.tflite`` flatbuffer litert-torch converts the policy's torch module into (batch ``LITERT_BATCH``)."""
    require(T.LITERT)
    _refuse_known(T.LITERT, policy, opset)
    import litert_torch
    import torch

    module = build_module(policy)
    args = example_inputs(policy.spec, LITERT_BATCH)
    try:
        with torch.no_grad():
            edge = litert_torch.convert(module, args)
        return bytes(edge.model_content())
    except Exception as exc:
        raise refusal(T.LITERT, exc) from exc


# --- ExecuTorch ----------------------------------------------------------------------------------------

def executorch_bytes(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, writer=None) -> bytes:
    """The ``.pte`` program: the policy's ``torch.export`` program lowered to XNNPACK, with a batch dimension
    of 1 to ``EXECUTORCH_MAX_BATCH``; where ExecuTorch's edge lowering specializes that dimension (it does
    for the recurrent cell: every tensor planned at the traced batch), a program of batch 1 instead, which
    :class:`runtime.targets.ExecuTorchRunner` runs row by row."""
    require(T.EXECUTORCH)
    _refuse_known(T.EXECUTORCH, policy, opset)
    module = build_module(policy)
    try:
        edge = _executorch_edge(module, policy.spec, dynamic=True)
        if _batch_is_symbolic(edge.exported_program()):
            data = bytes(edge.to_executorch().buffer)
            if _runs_at(data, policy.spec, EXECUTORCH_PROBE_BATCH):
                return data
        return bytes(_executorch_edge(module, policy.spec, dynamic=False).to_executorch().buffer)
    except Exception as exc:
        raise refusal(T.EXECUTORCH, exc) from exc


def _runs_at(data: bytes, spec, rows: int) -> bool:
    """Whether the program runs a batch of ``rows`` (neither the traced batch nor 1): the recurrent cell's
    edge lowering plans every tensor at the traced batch although its outputs' shapes stay symbolic."""
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(data).load_method(T.EXECUTORCH_METHOD)
    try:
        with torch.no_grad():
            out = method.execute(list(example_inputs(spec, rows)))
    except RuntimeError:
        return False
    return all(o.shape[0] == rows for o in out)


def _executorch_edge(module, spec, dynamic: bool):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ins = example_inputs(spec, 2 if dynamic else 1)
    batch = torch.export.Dim("batch", min=1, max=EXECUTORCH_MAX_BATCH)
    with torch.no_grad():
        ep = torch.export.export(module, ins, dynamic_shapes=(tuple({0: batch} for _ in ins),) if dynamic else None)
    for node in ep.graph.nodes:
        node.meta.pop("stack_trace", None)
    _addmm_as_linear(ep)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])


def _batch_is_symbolic(ep) -> bool:
    """Whether the lowered program's every output kept the symbolic batch dimension (the edge lowering of
    some graphs keeps it on the inputs and specializes every tensor after them to the traced batch)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    out = next(n for n in ep.graph.nodes if n.op == "output")
    vals = [a.meta.get("val") for a in out.args[0] if hasattr(a, "meta")]
    return bool(vals) and all(v is not None and len(v.shape) and not is_concrete_int(v.shape[0]) for v in vals)


def _addmm_as_linear(ep) -> int:
    """``addmm(b, x, t(W))`` and ``matmul(x, t(W))`` (the module's dense layers) as ``linear(x, W[, b])``, the
    same products: XNNPACK's partitioner takes a GEMM whose weight is a parameter, not a transpose node (the
    portable kernels it leaves an ``addmm`` to are ~20x slower), and its ``matmul`` of a transpose loses the
    dynamic batch (a static intermediate: any batch but the traced one fails). Returns how many it rewrote."""
    import torch

    aten = torch.ops.aten
    g = ep.graph
    n_done = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target == aten.addmm.default and len(node.args) == 3:
            bias, x, wt = node.args
        elif node.target == aten.matmul.default and len(node.args) == 2:
            (x, wt), bias = node.args, None
        else:
            continue
        if getattr(wt, "target", None) != aten.t.default:
            continue
        with g.inserting_before(node):
            lin = g.call_function(aten.linear.default, (x, wt.args[0]) + ((bias,) if bias is not None else ()))
        lin.meta.update(node.meta)
        node.replace_all_uses_with(lin)
        g.erase_node(node)
        if not wt.users:
            g.erase_node(wt)
        n_done += 1
    if n_done:
        g.lint()
        ep.graph_module.recompile()
    return n_done


def _single(fn: Callable[..., bytes], suffix: str) -> Callable[..., Dict[str, bytes]]:
    def files(policy: Policy, opset: int = C.ONNX_OPSET_DEFAULT, writer=None) -> Dict[str, bytes]:
        return {suffix: fn(policy, opset, writer)}

    files.__name__ = fn.__name__.replace("_bytes", "_files")
    files.__doc__ = fn.__doc__
    return files


litert_files = _single(litert_bytes, T.LITERT_SUFFIX)
executorch_files = _single(executorch_bytes, T.EXECUTORCH_SUFFIX)

TARGET_EXPORTERS: Dict[str, Callable[..., Dict[str, bytes]]] = {
    T.OPENVINO: openvino_files, T.LITERT: litert_files, T.EXECUTORCH: executorch_files}
