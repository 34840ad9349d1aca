"""What an ML-Agents-shaped ONNX says about itself (a mode's ONNX input): its I/O, its constants, its
folded normalizer, its parameter counts."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import contract as C
from ..blocks import onnx_weight_ops
from ..converter.reference import read_onnx


# --- ONNX reading ------------------------------------------------------------------------
def load_onnx(path):
    """An ML-Agents policy ONNX, read and validated (``converter.reference.read_onnx``)."""
    return read_onnx(path)[0]


class OnnxView:
    """What an ML-Agents-shaped ONNX says about itself: I/O, constants, folded normalizer."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.model = model
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.alias: Dict[str, str] = {}
        for n in g.node:
            if n.op_type == "Identity" and n.input[0] in self.inits:
                self.alias[n.output[0]] = n.input[0]
        self.consumers: Dict[str, List] = {}
        for n in g.node:
            for x in n.input:
                self.consumers.setdefault(x, []).append(n)
        self.producer = {o: n for n in g.node for o in n.output}
        self._np = numpy_helper.to_array
        init_names = set(self.inits)
        self.inputs = [(i.name, [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim])
                       for i in g.input if i.name not in init_names]
        self.outputs = [o.name for o in g.output]
        self.opset = {o.domain or "": o.version for o in model.opset_import}.get("", 0)

    def tensor(self, name: str) -> Optional[np.ndarray]:
        name = self.alias.get(name, name)
        t = self.inits.get(name)
        if t is not None:
            return self._np(t)
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return self._np(a.t)
        return None

    def output_constant(self, out: str) -> Optional[np.ndarray]:
        n = self.producer.get(out)
        if n is not None and n.op_type == "Identity":
            return self.tensor(n.input[0])
        return None

    def obs_scale(self, i: int) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(running_mean, folded divisor) of observation ``i``: Sub(obs_i, mean) -> Div(., D)."""
        name = C.OBS_INPUT.format(i=i)
        for n in self.consumers.get(name, []):
            if n.op_type == "Sub" and n.input[0] == name:
                mean = self.tensor(n.input[1])
                for d in self.consumers.get(n.output[0], []):
                    if d.op_type == "Div":
                        return mean, self.tensor(d.input[1])
        return None, None

    def parameter_counts(self) -> Tuple[int, int]:
        """(linear layers incl. the recurrent and convolution layers, + log_sigma) from the initializers of the
        graph's weight ops (``blocks.onnx_weight_ops``) and Adds (a Linear on a 3-D input is a MatMul
        and an Add of its bias; the other Add of an initializer is PPO's log_sigma; the 0-d exponents of
        0.30's Pow are no parameters)."""
        lin, sig = 0, 0
        weight_ops = onnx_weight_ops()
        for n in self.model.graph.node:
            if n.op_type in weight_ops:
                size = sum(int(t.size) for t in (self.tensor(x) for x in n.input[1:4] if x) if t is not None)
                if C.SCOPE_LOG_SIGMA_MARK in n.name or (n.op_type == "Gemm" and C.SCOPE_LOG_SIGMA_MARK in n.input[1]):
                    sig += size
                else:
                    lin += size
            elif n.op_type == "Add":
                after_matmul = any(getattr(self.producer.get(x), "op_type", "") == "MatMul" for x in n.input)
                for x in n.input:
                    t = self.tensor(x) if (self.alias.get(x, x) in self.inits) else None
                    if t is not None and (after_matmul or C.SCOPE_BODY_MARK in n.name):
                        lin += int(t.size)  # a Linear's bias on a 3-D input; a generated layer's (goal)
                    elif t is not None:
                        sig += int(t.size)
        return lin, lin + sig
