"""Camera observations (``(C, H, W)``, channels first as ML-Agents 1.x states them and Unity feeds
them: the ONNX input is NCHW ``[batch, C, H, W]``) through ML-Agents' visual encoders
(``encoders.py``; one ``vis_encode_type`` for every camera of a policy; the encoding is
``hidden_units`` wide):

- ``simple`` (SimpleVisualEncoder): Conv 8x8 stride 4 (16), LeakyReLU, Conv 4x4/2 (32), LeakyReLU;
- ``nature_cnn`` (NatureVisualEncoder): Conv 8x8/4 (32), Conv 4x4/2 (64), Conv 3x3/1 (64), each + LeakyReLU;
- ``match3`` (SmallVisualEncoder): Conv 3x3/1 (35), Conv 3x3/1 (144), each + LeakyReLU (no padding);
- each of those then flattens (``reshape(-1, final_flat)``) into ``dense.0`` (Linear) + LeakyReLU;
- ``fully_connected`` (FullyConnectedVisualEncoder): the image flattened, ``dense.0`` + LeakyReLU;
- ``resnet`` (ResNetVisualEncoder): per stack of 16, 32, 32 channels a Conv 3x3/1 with padding 1, a
  MaxPool 3x3/2 (no padding, floor) and two ResNetBlocks (``x + Conv(Swish(Conv(Swish(x))))``); then a
  Swish, the flatten, ``dense`` (a bare Linear) and ReLU.

LeakyReLU is ``nn.LeakyReLU()``: slope 0.01 (the ONNX attribute is its float32). No encoder has a
normalizer: images go in as they are (Unity sends [0, 1]). Each encoder has a minimum side
(``MIN_RESOLUTION_FOR_ENCODER``: 20, 36, 15, 5, 1). The image's height and width are in no tensor
when the dense layer's input does not fix them (``32 * h' * w'`` fits many images): they come from the
official ONNX's input (``core.flow.InputHint``) or ``--obs-sizes CxHxW``, and are cross-checked with the
dense layer's width; the channels are the first convolution's (fully_connected: the hint's).

Every backend interprets one op list (:func:`plan`): the ONNX nodes (ML-Agents' opset-9 sequence,
node for node), the torch module (``F.conv2d``...; TF32 is switched off on CUDA by
``exporters.devices.strict_float32``), the float64 reference (a convolution is an inner product of
length ``C k k + 1`` per output element, bounded as :func:`core.bounds.affine` bounds a Linear)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import Bounded, Linear, add, affine, conv2d, leaky_relu, max_pool, relu, stored, swish
from ..core.flow import OBSERVATION, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.spec import SpecField
from ..errors import SpecError
from .base import OBSERVE, Block, Choices, KeyRules

W, B = "weight", "bias"
OBS_VISUAL = "visual"  # the kind of a rank-3 observation (spec.obs_kind)


def cameras(spec):
    """``(index, (C, H, W))`` of every visual observation, in observation order."""
    return spec.observations(OBS_VISUAL)


@dataclass(frozen=True)
class Conv:
    """One Conv2d of an encoder: its ML-Agents key (``{p}`` for weight/bias), channels, kernel, stride, padding."""

    key: str
    cin: int
    cout: int
    k: int
    stride: int
    pad: int


@dataclass(frozen=True)
class Plan:
    """A camera's encoder: its convolutions (canonical index = position), the dense layer's key and
    input width, and the op list every backend runs: ``(op, scope, arg)`` with op one of conv (arg: the
    conv's index), leaky, pool, swish, save (push the current tensor), add (the pushed one + the
    current), flatten, dense, relu."""

    convs: Tuple[Conv, ...]
    dense_key: str
    flat: int
    ops: Tuple[Tuple[str, str, int], ...]


def _out(h: int, k: int, s: int, pad: int = 0) -> int:
    return (h + 2 * pad - k) // s + 1  # encoders.conv_output_shape (dilation 1)


def plan(vtype: str, i: int, shape: Tuple[int, int, int]) -> Plan:
    """The encoder ``vtype`` of camera ``i`` of ``shape`` (C, H, W), as ML-Agents builds it."""
    c, h, w = shape
    pre = C.VIS_PREFIX.format(i=i)
    convs: List[Conv] = []
    ops: List[Tuple[str, str, int]] = []
    vis = C.SCOPE_VISUAL.format(i=i)
    if vtype == C.VIS_RESNET:
        j = 0
        k_pool, s_pool = C.VIS_POOL
        for ch in C.VIS_RESNET_CHANNELS:
            convs.append(Conv(pre + C.VIS_RESNET_CONV.format(j=j, p="{p}"), c, ch, 3, 1, 1))
            ops += [("conv", C.SCOPE_VIS_SEQ.format(i=i, j=j), len(convs) - 1), ("pool", C.SCOPE_VIS_SEQ.format(i=i, j=j + 1), 0)]
            h, w = _out(h, k_pool, s_pool), _out(w, k_pool, s_pool)  # encoders.pool_out_shape
            for b in range(C.VIS_RESNET_BLOCKS):
                jb = j + 2 + b
                ops.append(("save", "", 0))
                for n, k in enumerate(C.VIS_RESNET_BLOCK_CONVS):
                    convs.append(Conv(pre + C.VIS_RESNET_BLOCK_CONV.format(j=jb, k=k, p="{p}"), ch, ch, 3, 1, 1))
                    ops += [("swish", C.SCOPE_VIS_BLOCK.format(i=i, j=jb, k=k - 1), 0),
                            ("conv", C.SCOPE_VIS_BLOCK.format(i=i, j=jb, k=k), len(convs) - 1)]
                ops.append(("add", C.SCOPE_VIS_SEQ.format(i=i, j=jb), 0))
            j += 2 + C.VIS_RESNET_BLOCKS
            c = ch
        ops += [("swish", C.SCOPE_VIS_SEQ.format(i=i, j=j), 0), ("flatten", vis, 0),
                ("dense", C.SCOPE_VIS_RESNET_DENSE.format(i=i), 0), ("relu", vis, 0)]
        return Plan(tuple(convs), pre + C.VIS_RESNET_DENSE, c * h * w, tuple(ops))
    for n, (cout, k, s) in enumerate(C.VIS_CONVS[vtype]):
        convs.append(Conv(pre + C.VIS_CONV.format(j=2 * n, p="{p}"), c, cout, k, s, 0))
        ops += [("conv", C.SCOPE_VIS_CONV.format(i=i, j=2 * n), n), ("leaky", C.SCOPE_VIS_CONV.format(i=i, j=2 * n + 1), 0)]
        c, h, w = cout, _out(h, k, s), _out(w, k, s)
    ops += [("flatten", vis, 0), ("dense", C.SCOPE_VIS_DENSE.format(i=i, j=0), 0),
            ("leaky", C.SCOPE_VIS_DENSE.format(i=i, j=1), 0)]
    return Plan(tuple(convs), pre + C.VIS_DENSE, c * h * w, tuple(ops))


def _describe(vtype: str, shape, hidden: int) -> str:
    p = plan(vtype, 0, shape)
    if vtype == C.VIS_RESNET:
        return (f"resnet: 3 stacks of Conv 3x3/1 pad 1 ({', '.join(map(str, C.VIS_RESNET_CHANNELS))} channels), "
                f"MaxPool 3x3/2 and {C.VIS_RESNET_BLOCKS} residual blocks (Swish, Conv, Swish, Conv); Swish, "
                f"flatten {p.flat}, dense {hidden}, ReLU")
    convs = ", ".join(f"Conv {c.k}x{c.k}/{c.stride} ({c.cout}) LeakyReLU" for c in p.convs)
    return f"{vtype}: {convs + ', ' if convs else ''}flatten {p.flat}, dense {hidden} LeakyReLU"


def _leaky_slope() -> float:
    """The slope as the runtimes multiply by it (the ONNX attribute is a float32)."""
    return float(np.float32(C.LEAKY_RELU_SLOPE))


def _check_vis_encode_type(spec) -> None:
    """One encoder for every camera (ML-Agents' ``network_settings.vis_encode_type``), empty without a
    camera; each camera's height and width at least its minimum (``MIN_RESOLUTION_FOR_ENCODER``)."""
    found, vtype = cameras(spec), spec.vis_encode_type
    if found and vtype not in C.VIS_ENCODE_TYPES:
        raise SpecError(f"spec field 'vis_encode_type' is {str(vtype)[:40]!r}, not one of {', '.join(C.VIS_ENCODE_TYPES)}")
    if not found and vtype != "":
        raise SpecError(f"spec field 'vis_encode_type' is {str(vtype)[:40]!r} without a visual observation")
    for i, (_, h, w) in found:
        low = C.VIS_MIN_RESOLUTION[vtype]
        if min(h, w) < low:
            raise SpecError(f"spec field 'obs_shapes' entry {i}: a {h}x{w} image is smaller than the "
                            f"{vtype} encoder's minimum {low}x{low}")


def _camera_encoders(g, i: int) -> List[str]:
    """ML-Agents' visual encoders, the likeliest first for the node that reads camera ``i`` of an ONNX: a
    Reshape (fully_connected), a Conv 8x8 (simple, nature_cnn), 3x3 padded (resnet) or not (match3)."""
    first = g.first_reader(C.OBS_INPUT.format(i=i))
    order = []
    if first is not None and first.op_type == "Reshape":
        order = [C.VIS_FULLY_CONNECTED]
    elif first is not None and first.op_type == "Conv":
        a = g.attrs(first)
        k, pads = list(a.get("kernel_shape", [])), list(a.get("pads", [0]))
        order = [t for t in (C.VIS_SIMPLE, C.VIS_NATURE, C.VIS_MATCH3) if [C.VIS_CONVS[t][0][1]] * 2 == k and not any(pads)]
        order += [C.VIS_RESNET] if k == [3, 3] and any(pads) else []
    return order + [t for t in C.VIS_ENCODE_TYPES if t not in order]


class Visual(Block):
    name = "visual"
    stage = OBSERVE
    row_as_vector = False  # convolutions need the batch axis
    obs_rank, obs_kind, obs_dims = 3, OBS_VISUAL, "[batch, C, H, W] (a camera)"
    # the cameras' encoder (``simple``, ``nature_cnn``, ``resnet``, ``match3``, ``fully_connected``); "" without one
    spec_fields = (SpecField("vis_encode_type", 120, "", check=_check_vis_encode_type, used=bool),)

    def active(self, spec) -> bool:
        return bool(cameras(spec))

    def describe(self, spec):
        return [("obs", f" ({spec.vis_encode_type} visual encoder)")] if spec.vis_encode_type else []

    def onnx_detect(self, g, found):
        """The encoder: the one of ML-Agents' five whose graph is the input's (the likeliest first)."""
        idx = [i for i, s in enumerate(g.obs) if len(s) == 3]
        if not idx:
            return {}
        return {"vis_encode_type": Choices(tuple(_camera_encoders(g, idx[0])), "visual encoder of ML-Agents",
                                           f"for the camera {C.OBS_INPUT.format(i=idx[0])}")}

    # --- checkpoint ------------------------------------------------------------------------
    @staticmethod
    def _encoder_type(r: KeyRules, i: int) -> str:
        """Which encoder observation ``i``'s keys are (its layout and first kernel)."""
        pre = C.VIS_PREFIX.format(i=i)
        mine = [k[len(pre):] for k in r.keys if k.startswith(pre) and C.VISUAL_RE.match(k)]
        if any(k.startswith(C.VIS_RESNET_CONV.split(".")[0] + ".") for k in mine):
            return C.VIS_RESNET
        convs = sorted({int(k.split(".")[1]) for k in mine if k.startswith(C.VIS_CONV.split(".")[0] + ".")})
        if not convs:
            return C.VIS_FULLY_CONNECTED
        for vtype in (C.VIS_SIMPLE, C.VIS_NATURE, C.VIS_MATCH3):
            want = C.VIS_CONVS[vtype]
            if convs == [2 * n for n in range(len(want))]:
                w = r.sd.get(pre + C.VIS_CONV.format(j=0, p=W))
                if w is not None and len(r.shape(w)) == 4 and r.shape(w)[0] == want[0][0] and r.shape(w)[2] == want[0][1]:
                    return vtype
        w = r.sd.get(pre + C.VIS_CONV.format(j=0, p=W))
        raise r.error(f"observation {i}'s convolutions ({len(convs)} at {convs}, the first "
                      f"{list(r.shape(w)) if w is not None else 'missing'}) are none of ML-Agents' visual encoders "
                      f"({', '.join(C.VIS_ENCODE_TYPES)})")

    @staticmethod
    def _shape(r: KeyRules, i: int, vtype: str, channels: Optional[int]) -> Tuple[int, int, int]:
        """Camera ``i``'s (C, H, W): from the official ONNX's input (or ``--obs-sizes CxHxW``)."""
        name = C.OBS_INPUT.format(i=i)
        hint = r.inputs.get(i)
        what = f"{name} is a camera observation (a {vtype} encoder" + (f" of {channels} channels)" if channels else ")")
        if hint is None:
            raise r.error(f"{what}, and the checkpoint does not say its height and width: give the official ONNX "
                          "ML-Agents wrote with it (--reference), whose input states it, or --obs-sizes CxHxW "
                          "(e.g. 3x84x84)")
        dims = tuple(hint.dims)
        if len(dims) != 3 or not all(isinstance(d, int) and d > 0 for d in dims):
            raise r.error(f"{what}: the official ONNX's input {name} is [batch, {', '.join(map(str, dims))}], not "
                          "[batch, C, H, W] (NCHW, as Unity feeds a camera)")
        if channels is not None and dims[0] != channels:
            raise r.error(f"{what}: its input {name} is [batch, {', '.join(map(str, dims))}], whose {dims[0]} channels "
                          f"are not the first convolution's {channels} (an HWC shape where NCHW belongs?)")
        low = C.VIS_MIN_RESOLUTION[vtype]
        if min(dims[1:]) < low:
            raise r.error(f"{what}: a {dims[1]}x{dims[2]} image is smaller than the {vtype} encoder's minimum {low}x{low}")
        return dims

    def claim(self, r: KeyRules) -> None:
        idx = r.indices(C.VISUAL_RE)
        if not idx:
            for m in r.matching(C.VISUAL_ALIAS_RE):
                raise r.error(f"unexpected key '{m.group(0)}' (alias without its twin)")
            return
        found = r.state.setdefault("observations", {})
        types = {}
        for i in idx:
            vtype = self._encoder_type(r, i)
            pre = C.VIS_PREFIX.format(i=i)
            if i in found:
                raise r.error(f"observation {i} has a visual encoder ('{pre}...') and another encoder")
            first = r.sd.get(pre + C.VIS_CONV.format(j=0, p=W)) if vtype != C.VIS_RESNET else \
                r.sd.get(pre + C.VIS_RESNET_CONV.format(j=0, p=W))
            channels = r.shape(first)[1] if first is not None and len(r.shape(first)) == 4 else None
            if vtype != C.VIS_FULLY_CONNECTED and channels is None:
                raise r.error(f"wrong shape for the first convolution of observation {i}: expected [out, C, k, k]")
            shape = self._shape(r, i, vtype, channels)
            p = plan(vtype, i, shape)
            dense_w = r.matrix(p.dense_key.format(p=W))
            hidden = r.shape(dense_w)[0]
            taken = []

            def take_dense():
                r.take(p.dense_key.format(p=W), C.c_visual_dense(i, W), (hidden, p.flat))
                r.take(p.dense_key.format(p=B), C.c_visual_dense(i, B), (hidden,))
                taken.extend(p.dense_key.format(p=x) for x in (W, B))

            if r.shape(dense_w)[1] != p.flat:
                raise r.error(f"wrong shape for '{p.dense_key.format(p=W)}': {list(r.shape(dense_w))}, expected "
                              f"[{hidden}, {p.flat}] for the {vtype} encoder of a {'x'.join(map(str, shape))} image "
                              f"({C.OBS_INPUT.format(i=i)})")
            if vtype == C.VIS_RESNET:
                take_dense()  # ResNetVisualEncoder registers dense before sequential
            for n, cv in enumerate(p.convs):
                r.take(cv.key.format(p=W), C.c_visual_conv(i, n, W), (cv.cout, cv.cin, cv.k, cv.k))
                r.take(cv.key.format(p=B), C.c_visual_conv(i, n, B), (cv.cout,))
                taken.extend(cv.key.format(p=x) for x in (W, B))
            if vtype != C.VIS_RESNET:
                take_dense()
            for key in taken:
                r.twin(C.VIS_ALIAS_PREFIX.format(i=i) + key[len(pre):], key)
            extra = [k for k in r.keys if k in r.remaining and k.startswith(pre) and C.VISUAL_RE.match(k)]
            if extra:
                raise r.error(f"unexpected key '{extra[0]}' (not part of a {vtype} encoder)")
            found[i] = (shape, hidden)
            types[i] = vtype
        for m in r.matching(C.VISUAL_ALIAS_RE):
            if m.group(0) in r.remaining:
                raise r.error(f"unexpected key '{m.group(0)}' (alias without its twin)")
        if len(set(types.values())) > 1:
            raise r.error(f"the cameras have different encoders ({', '.join(f'{C.OBS_INPUT.format(i=i)}: {t}' for i, t in types.items())}): "
                          "ML-Agents builds every camera with the one vis_encode_type")
        r.fields["vis_encode_type"] = next(iter(types.values()))
        r.state[self.name] = {i: found[i][1] for i in idx}

    def finish(self, r: KeyRules) -> None:
        widths = r.state.get(self.name)
        hidden = r.fields.get("hidden_units")
        for i, width in (widths or {}).items():
            if hidden is not None and width != hidden:
                raise r.error(f"'{C.VIS_PREFIX.format(i=i)}...dense' gives {width} features, but the body is {hidden} "
                              "wide (ML-Agents' visual encoders give hidden_units)")

    def restore(self, policy, sd) -> None:
        """The alias keys: the same tensors again under ``network_body.processors.{i}``."""
        for i, _ in cameras(policy.spec):
            pre = C.VIS_PREFIX.format(i=i)
            for key in [k for k in sd if k.startswith(pre) and C.VISUAL_RE.match(k)]:
                sd[C.VIS_ALIAS_PREFIX.format(i=i) + key[len(pre):]] = sd[key]

    def state_template(self, spec):
        out = {}
        for i, shape in cameras(spec):
            p = plan(spec.vis_encode_type, i, shape)
            dense = {p.dense_key.format(p=W): np.zeros((spec.hidden_units, p.flat), np.float32),
                     p.dense_key.format(p=B): np.zeros(spec.hidden_units, np.float32)}
            if spec.vis_encode_type == C.VIS_RESNET:
                out.update(dense)
            for cv in p.convs:
                out[cv.key.format(p=W)] = np.zeros((cv.cout, cv.cin, cv.k, cv.k), np.float32)
                out[cv.key.format(p=B)] = np.zeros(cv.cout, np.float32)
            out.update(dense)
        return out

    # --- spec ------------------------------------------------------------------------------
    def _count(self, spec, shape) -> int:
        p = plan(spec.vis_encode_type, 0, shape)
        return sum(cv.cout * cv.cin * cv.k * cv.k + cv.cout for cv in p.convs) + p.flat * spec.hidden_units + spec.hidden_units

    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        return sum(self._count(spec, shape) for _, shape in cameras(spec))

    def inputs(self, spec) -> List[Port]:
        return [Port(C.OBS_INPUT.format(i=i), (C.BATCH_DIM,) + tuple(shape), kind=OBSERVATION) for i, shape in cameras(spec)]

    def encoded_width(self, spec) -> int:
        return spec.hidden_units * len(cameras(spec))

    def encoders(self, spec) -> List[Dict[str, object]]:
        return [{"inputs": [C.OBS_INPUT.format(i=i)], "kind": "visual", "shape": [list(shape)],
                 "encoder": _describe(spec.vis_encode_type, shape, spec.hidden_units) + "; NCHW input",
                 "width": spec.hidden_units, "parameters": self._count(spec, shape)} for i, shape in cameras(spec)]

    # --- ONNX --------------------------------------------------------------------------------
    def onnx_observe(self, f: OnnxFlow) -> None:
        """ML-Agents' node sequence (opset 9, torch's legacy exporter): the same at every opset (Conv,
        LeakyRelu, MaxPool, Sigmoid, Mul, Add, Reshape, Gemm and Relu keep their forms through 15)."""
        g, spec = f.g, f.spec
        for i, shape in f.observing(cameras(spec)):
            p = plan(spec.vis_encode_type, i, shape)
            h, saved = C.OBS_INPUT.format(i=i), []
            for op, scope, n in p.ops:
                if op == "conv":
                    cv = p.convs[n]
                    h = g.node("Conv", [h, f.init(C.c_visual_conv(i, n, W)), f.init(C.c_visual_conv(i, n, B))], scope,
                               dilations=[1, 1], group=1, kernel_shape=[cv.k, cv.k], pads=[cv.pad] * 4,
                               strides=[cv.stride, cv.stride])
                elif op == "leaky":
                    h = g.node("LeakyRelu", [h], scope, alpha=_leaky_slope())
                elif op == "pool":
                    k, s = C.VIS_POOL
                    h = g.node("MaxPool", [h], scope, kernel_shape=[k, k], pads=[0, 0, 0, 0], strides=[s, s])
                elif op == "swish":
                    h = g.node("Mul", [h, g.node("Sigmoid", [h], scope)], scope)
                elif op == "save":
                    saved.append(h)
                elif op == "add":
                    h = g.node("Add", [saved.pop(), h], scope)
                elif op == "flatten":
                    h = g.node("Reshape", [h, g.const([-1, p.flat], scope, np.int64)], scope)
                elif op == "dense":
                    h = f.gemm(h, C.c_visual_dense(i, W), C.c_visual_dense(i, B), scope)
                elif op == "relu":
                    h = g.node("Relu", [h], scope)
            f.encoded[i] = h

    # --- torch -------------------------------------------------------------------------------
    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        from torch import nn

        spec = policy.spec
        if not self.active(spec):
            return
        T = policy.tensors
        convs, dense, plans = [], [], []
        for i, shape in cameras(spec):
            p = plan(spec.vis_encode_type, i, shape)
            convs.append(nn.ParameterList([module.frozen(T[C.c_visual_conv(i, n, x)]) for n in range(len(p.convs))
                                           for x in (W, B)]))
            dense.append(module.affine(T[C.c_visual_dense(i, W)], T[C.c_visual_dense(i, B)]))
            plans.append((i, C.OBS_INPUT.format(i=i), p))
        module.visual_convs = nn.ModuleList(convs)
        module.visual_dense = nn.ModuleList(dense)
        module.fast[self.name] = tuple(plans)

    def torch_observe(self, f: TorchFlow) -> None:
        """ML-Agents' forward, op for op (``F.silu`` for Swish: one kernel, inside the same bound)."""
        import torch
        from torch.nn import functional as F

        mod = f.module
        cdt = mod.compute_dtype
        for (i, name, p), convs, dense in zip(mod.fast[self.name], mod.visual_convs, mod.visual_dense):
            h = f.feed[name]
            if h.dtype != cdt:
                h = h.to(cdt)
            saved = []
            for op, _, n in p.ops:
                if op == "conv":
                    cv = p.convs[n]
                    h = F.conv2d(h, convs[2 * n], convs[2 * n + 1], stride=cv.stride, padding=cv.pad)
                elif op == "leaky":
                    h = F.leaky_relu(h, C.LEAKY_RELU_SLOPE)
                elif op == "pool":
                    h = F.max_pool2d(h, C.VIS_POOL[0], C.VIS_POOL[1])
                elif op == "swish":
                    h = F.silu(h)
                elif op == "save":
                    saved.append(h)
                elif op == "add":
                    h = saved.pop() + h
                elif op == "flatten":
                    h = h.reshape(-1, p.flat)
                elif op == "dense":
                    pd = torchcompat.module_params(dense)
                    h = F.linear(h, pd["weight"], pd["bias"])
                elif op == "relu":
                    h = torch.relu(h)
            f.encoded[i] = h

    # --- the float64 reference with bounds ---------------------------------------------------
    def reference_init(self, policy):
        spec, T = policy.spec, policy.tensors
        out = []
        for i, shape in cameras(spec):
            p = plan(spec.vis_encode_type, i, shape)
            lins = [Linear(T[C.c_visual_conv(i, n, W)].reshape(cv.cout, -1), T[C.c_visual_conv(i, n, B)])
                    for n, cv in enumerate(p.convs)]
            out.append((i, p, lins, Linear(T[C.c_visual_dense(i, W)], T[C.c_visual_dense(i, B)])))
        return out

    def reference_observe(self, r: ReferenceFlow, w) -> None:
        """The images are float32 and exact; each op's bound is ``core.bounds``' (``conv2d``,
        ``max_pool``, ``leaky_relu``, ``relu``, ``swish``, ``add``, ``affine``)."""
        b, pr = r.bounds, r.precision
        for i, p, lins, dense in w:
            h = Bounded.exact(r.feed[C.OBS_INPUT.format(i=i)])
            if b:  # a half runtime casts the image to its format
                h = stored(h, pr)
            saved = []
            for op, _, n in p.ops:
                if op == "conv":
                    cv = p.convs[n]
                    h = conv2d(h, lins[n], cv.k, cv.stride, cv.pad, b, pr)
                elif op == "leaky":
                    h = leaky_relu(h, _leaky_slope(), pr)
                elif op == "pool":
                    h = max_pool(h, *C.VIS_POOL)
                elif op == "swish":
                    h = swish(h, pr)
                elif op == "save":
                    saved.append(h)
                elif op == "add":
                    h = add(saved.pop(), h, pr)
                elif op == "flatten":
                    h = Bounded(h.v.reshape(h.v.shape[0], -1), h.err.reshape(h.err.shape[0], -1))
                elif op == "dense":
                    h = affine(h, dense, b, p=pr)
                elif op == "relu":
                    h = relu(h)
            r.encoded[i] = h if b else Bounded(h.v, np.zeros_like(h.v))

    # --- probes ------------------------------------------------------------------------------
    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Images in [0, 1], as Unity sends a camera: uniform pixels; every eighth row (from the fourth)
        binary pixels (0 or 1, a grid sensor's look); one row all zeros and one all ones."""
        feed = {}
        for i, shape in cameras(policy.spec):
            x = rng.random((rows,) + tuple(shape))
            binary = np.arange(rows) % 8 == 3
            x[binary] = rng.random((int(binary.sum()),) + tuple(shape)) < 0.5
            if rows >= 4:
                x[-1], x[-2] = 0.0, 1.0
            feed[C.OBS_INPUT.format(i=i)] = x.astype(np.float32)
        return feed

    # --- the run modes ----------------------------------------------------------------------
    onnx_weight_ops = ("Conv",)

    def describe_input(self, spec, i: int, given=None) -> str:
        """A camera: channels, pixels, NCHW, its encoder; ``given`` in HWC (or another image size) is named."""
        c, h, w = spec.obs_shape(i)
        hint = ""
        if given is not None and tuple(given[-3:]) == (h, w, c) and (h, w, c) != (c, h, w):
            hint = ": this one is HWC (channels last), transpose it to NCHW, e.g. x.transpose(0, 3, 1, 2)"
        elif given is not None and len(given) in (3, 4) and tuple(given[-3:]) != (c, h, w):
            hint = f": a {'x'.join(map(str, given[-3:]))} image is not this policy's {c}x{h}x{w}"
        return (f"a camera of {c} channels, {h}x{w} pixels, fed channels first (NCHW) as Unity feeds it, "
                f"to a {spec.vis_encode_type} encoder{hint}")
