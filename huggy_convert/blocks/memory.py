"""Memory: one LSTM cell after the body (``network_body.lstm``), one step per call. The state comes in
as ``recurrent_in`` [batch, 1, memory_size] = (h, c) and goes out as ``recurrent_out``; the heads
read ``h`` (memory_size / 2 features). ONNX's LSTM wants the gates as i, o, f, c (torch: i, f, g, o)."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .. import contract as C
from ..core.bounds import Bounded, Linear, add, affine, concat, f64, mul, sigmoid, stored, tanh
from ..core.flow import STATE, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.spec import MAX_WIDTH, SpecField, check_count
from ..errors import SpecError
from .base import ENCODE, Block, KeyRules


def _check_memory(spec) -> None:
    check_count("memory_size", spec.memory_size, 0, MAX_WIDTH)
    if spec.memory_size % 2:
        raise SpecError(f"spec field 'memory_size' is {spec.memory_size}: an LSTM memory is even (cell + hidden)")


def onnx_gates(a: np.ndarray, hs: int) -> np.ndarray:
    """torch's gate blocks (i, f, g, o) along axis 0 in ONNX's order (i, o, f, c)."""
    return np.concatenate([a[0:hs], a[3 * hs:4 * hs], a[hs:2 * hs], a[2 * hs:3 * hs]])


def torch_gates(a: np.ndarray, hs: int) -> np.ndarray:
    """The inverse of :func:`onnx_gates`: ONNX's (i, o, f, c) back to torch's (i, f, g, o)."""
    return np.concatenate([a[0:hs], a[2 * hs:3 * hs], a[3 * hs:4 * hs], a[hs:2 * hs]])


class Memory(Block):
    name = "memory"
    stage = ENCODE
    row_as_vector = False  # the state is [batch, 1, memory_size]
    spec_fields = (SpecField("memory_size", 80, 0, check=_check_memory),)  # 0: no LSTM
    # the features the heads read: the LSTM's h, else the body's
    spec_derived = {"encoding_size": lambda s: s.memory_size // 2 if s.memory_size else s.hidden_units}
    onnx_inputs = (C.RECURRENT_IN,)

    def active(self, spec) -> bool:
        return bool(spec.memory_size)

    def describe(self, spec):
        return [("body", f", LSTM memory {spec.memory_size}")] if spec.memory_size else []

    def onnx_detect(self, g, found):
        """The memory from its input's dims; the body's width is what the LSTM takes (its W is [1, 4h, width])."""
        if C.RECURRENT_IN not in g.inputs:
            return {}
        d = g.inputs[C.RECURRENT_IN]
        if len(d) != 3 or d[1] != 1 or not d[2]:
            raise g.error(f"input {C.RECURRENT_IN!r} has the dims {d}, not [batch, 1, memory]")
        lstm = next((n for n in g.nodes if n.op_type == "LSTM"), None)
        w = g.constant(lstm.input[1]) if lstm is not None and len(lstm.input) > 1 else None
        if w is None or w.ndim != 3:
            raise g.error(f"{C.RECURRENT_IN!r} is an input but no LSTM reads a weight initializer")
        return {"memory_size": int(d[2]), "hidden_units": int(w.shape[2])}

    def claim(self, r: KeyRules) -> None:
        memory_size = 0
        if any(k.startswith(C.LSTM_PREFIX) for k in r.keys):
            hidden = r.state["width"]
            hs = r.shape(r.matrix(C.LSTM_KEY.format(p=C.LSTM_W_HH)))[1]
            memory_size = 2 * hs
            # weight_ih, weight_hh, bias_ih, bias_hh
            shapes = ((4 * hs, hidden), (4 * hs, hs), (4 * hs,), (4 * hs,))
            for p_, shape in zip(C.LSTM_PARAMS, shapes):
                r.take(C.LSTM_KEY.format(p=p_), C.c_lstm(p_), shape)
            r.state["width"] = hs
        r.fields["memory_size"] = memory_size

    def constant_checks(self, r: KeyRules):
        return [(C.K_MEMORY_SIZE, [r.fields["memory_size"]], "LSTM")]

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        hs = spec.memory_size // 2
        return 4 * hs * (spec.hidden_units + hs) + 8 * hs

    def inputs(self, spec) -> List[Port]:
        return [Port(C.RECURRENT_IN, (C.BATCH_DIM, 1, spec.memory_size), kind=STATE, fill=0.0)]

    def outputs(self, spec) -> List[Port]:
        return [Port(C.RECURRENT_OUT, (C.BATCH_DIM, 1, spec.memory_size), kind=STATE, feeds=C.RECURRENT_IN)]

    def onnx_dims(self, spec) -> Dict[str, str]:
        return {C.RECURRENT_OUT: f"Transpose{C.RECURRENT_OUT}_dim_0"}

    def onnx_encode(self, f: OnnxFlow) -> None:
        g, spec = f.g, f.spec
        hs = spec.memory_size // 2
        sc, lstm, cell = C.SCOPE_NETWORK_BODY, C.SCOPE_LSTM, C.SCOPE_LSTM_CELL
        x = g.node("Reshape", [f.h, g.const([-1, 1, spec.hidden_units], sc, np.int64)], sc)
        mem_t = g.node("Transpose", [C.RECURRENT_IN], lstm, perm=[1, 0, 2])
        h0 = g.slice(mem_t, 0, hs, 2, lstm)
        c0 = g.slice(mem_t, hs, np.iinfo(np.int64).max, 2, lstm)
        x = g.node("Transpose", [x], cell, perm=[1, 0, 2])
        reorder = lambda a: onnx_gates(a, hs)  # noqa: E731
        T = f.policy.tensors
        W = g.init(C.LSTM_INIT.format(p="W"), reorder(T[C.c_lstm(C.LSTM_W_IH)])[None])
        R = g.init(C.LSTM_INIT.format(p="R"), reorder(T[C.c_lstm(C.LSTM_W_HH)])[None])
        B = g.init(C.LSTM_INIT.format(p="B"), np.concatenate([reorder(T[C.c_lstm(C.LSTM_B_IH)]),
                                                              reorder(T[C.c_lstm(C.LSTM_B_HH)])])[None])
        y, yh, yc = g.node("LSTM", [x, W, R, B, "", h0, c0], cell, n_out=3, hidden_size=hs)
        y = g.squeeze(y, 1, cell)
        y = g.node("Transpose", [y], cell, perm=[1, 0, 2])
        cat = g.node("Concat", [yh, yc], lstm, axis=-1)
        g.node("Transpose", [cat], lstm, out=C.RECURRENT_OUT, perm=[1, 0, 2])
        f.h = g.node("Reshape", [y, g.const([-1, hs], sc, np.int64)], sc)

    def state_template(self, spec):
        if not spec.memory_size:
            return {}
        hs = spec.memory_size // 2
        shapes = ((4 * hs, spec.hidden_units), (4 * hs, hs), (4 * hs,), (4 * hs,))
        return {C.LSTM_KEY.format(p=p_): np.zeros(s, np.float32) for p_, s in zip(C.LSTM_PARAMS, shapes)}

    def onnx_recover(self, spec, found, sd) -> None:
        """ONNX's W [1, 4h, in], R [1, 4h, h], B [1, 8h] (gates i, o, f, c; B = input then hidden bias)
        back to torch's weight_ih, weight_hh, bias_ih, bias_hh (gates i, f, g, o)."""
        if not spec.memory_size:
            return
        hs = spec.memory_size // 2
        w, r, b = (found.pop(C.LSTM_INIT.format(p=k)) for k in ("W", "R", "B"))
        for k, a in zip(C.LSTM_PARAMS, (w[0], r[0], b[0, :4 * hs], b[0, 4 * hs:])):
            sd[C.LSTM_KEY.format(p=k)] = torch_gates(a, hs)

    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        if not self.active(policy.spec):
            return
        for p in C.LSTM_PARAMS:  # lstm_weight_ih, ... (the .pt2's parameter names)
            setattr(module, f"lstm_{p}", module.frozen(policy.tensors[C.c_lstm(p)]))

    def torch_encode(self, f: TorchFlow) -> None:
        import torch

        mod = f.module
        hs = mod.spec.memory_size // 2
        m = f.feed[C.RECURRENT_IN].to(mod.compute_dtype)[:, 0, :]
        h0, c0 = m[:, :hs], m[:, hs:]
        gates = (f.h @ mod.lstm_weight_ih.t() + mod.lstm_bias_ih) + (h0 @ mod.lstm_weight_hh.t() + mod.lstm_bias_hh)
        i_g, f_g, g_g, o_g = gates.chunk(4, dim=1)
        c1 = torch.sigmoid(f_g) * c0 + torch.sigmoid(i_g) * torch.tanh(g_g)
        h1 = torch.sigmoid(o_g) * torch.tanh(c1)
        f.state[C.RECURRENT_OUT] = torch.cat([h1, c1], dim=1).unsqueeze(1).to(torch.float32)
        f.h = h1

    def torch_output(self, f: TorchFlow) -> list:
        return [] if f.sampling is not None else [f.state[C.RECURRENT_OUT]]

    def reference_init(self, policy):
        T = policy.tensors
        return (Linear(T[C.c_lstm(C.LSTM_W_IH)], T[C.c_lstm(C.LSTM_B_IH)]),
                Linear(T[C.c_lstm(C.LSTM_W_HH)], T[C.c_lstm(C.LSTM_B_HH)]), policy.spec.memory_size // 2)

    def reference_encode(self, r: ReferenceFlow, w) -> None:
        ih, hh, hs = w
        p = r.precision
        m = f64(r.feed[C.RECURRENT_IN])[:, 0, :]
        h0, c0 = Bounded.exact(m[:, :hs]), Bounded.exact(m[:, hs:])
        if r.bounds:  # a half runtime reads the state in its format (torch_encode: .to(compute_dtype))
            h0, c0 = stored(h0, p), stored(c0, p)
        g = add(affine(r.h, ih, r.bounds, p=p), affine(h0, hh, r.bounds, p=p), p)
        i_g, f_g, g_g, o_g = (g.cols(k * hs, (k + 1) * hs) for k in range(4))  # torch's order: i, f, g, o
        c1 = add(mul(sigmoid(f_g, p), c0, p), mul(sigmoid(i_g, p), tanh(g_g, p), p), p)
        h1 = mul(sigmoid(o_g, p), tanh(c1, p), p)
        r.h = h1
        r.state[C.RECURRENT_OUT] = concat([h1, c1])

    def reference_output(self, r: ReferenceFlow, w) -> None:
        mem = r.state[C.RECURRENT_OUT]
        r.values[C.RECURRENT_OUT], r.errs[C.RECURRENT_OUT] = mem.v[:, None, :], mem.err[:, None, :]

    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        return {C.RECURRENT_IN: rng.standard_normal((rows, 1, policy.spec.memory_size)).astype(np.float32)}

    # --- the run modes ----------------------------------------------------------------------
    traits_described = {"carried_state": "a policy with memory (LSTM)"}
    variants = {"lstm": "carried_state"}
    onnx_weight_ops = ("LSTM",)
