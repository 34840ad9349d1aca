"""Variable-length observations (a buffer sensor: ``DimensionProperty.VARIABLE_SIZE``, shape
``(max_entities, entity_size)``) through ML-Agents' attention (``networks.py`` ObservationEncoder,
``attention.py``, ``utils.py create_residual_self_attention``):

- the padding mask: an entity is padding when ``sum(features^2) < 0.01`` (``get_zero_entities_mask``);
- the self embedding: the other observations' encodings, concatenated, through ``x_self_encoder``
  (Linear + Swish, 128 wide), repeated for every entity and put before its features (none when the
  entities are the only observations);
- each entity observation's embedding ``self_ent_encoder`` (Linear + Swish, 128 wide); the
  embeddings of every entity observation are concatenated along the entity axis (``N`` entities in all);
- ``ResidualSelfAttention``: a parameter-free LayerNorm, ``fc_q``/``fc_k``/``fc_v``, 4 heads of 32
  (logits ``(1 - mask) q k / sqrt(128) + mask * -1e6``, the keys first put through ``(k - 1) + 1``),
  ``fc_out`` plus the residual, a second LayerNorm, and the mean over the entities that are not padding
  (``sum / (count + 1e-7)``);
- the result (128 wide) is appended AFTER every other observation's encoding (``onnx_append``).

ML-Agents' ONNX has the Linears on 3-D inputs as MatMul with a transposed copy of the weight
(``onnx::MatMul_<n>``) and an Add with the bias first; the rebuilt graph has the same nodes, its copies
named ``<key>.T``, bitwise the checkpoint's weight transposed (verification pairs every initializer by
its node and input slot and compares the bytes)."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .. import contract as C
from ..core import torchcompat
from ..core.bounds import (Bounded, Linear, affine, f64, layer_norm, masked_mean, matmul, minus_plus_one, softmax,
                           stored, swish)
from ..core.flow import OBSERVATION, InputHint, OnnxFlow, Port, ReferenceFlow, TorchFlow
from ..core.numerics import U32
from ..core.spec import SpecField
from ..errors import SpecError
from .base import OBSERVE, Block, KeyRules

LINEAR_WEIGHT, LINEAR_BIAS = "weight", "bias"
POW_EXPONENT = "/Pow.exponent_"  # the 0.30 export's exponent initializers: f"{scope}{POW_EXPONENT}{n}"
OBS_ENTITY = "entity"  # the kind of a rank-2 observation (spec.obs_kind)


def entities(spec):
    """``(index, (max_entities, entity_size))`` of every variable-length observation, in observation order."""
    return spec.observations(OBS_ENTITY)


def _f32(x: float) -> float:
    """A constant as the float32 the runtimes compute with."""
    return float(np.float32(x))


def _check_export(spec) -> None:
    v = spec.attention_export
    if v not in C.ATTENTION_EXPORTS:
        raise SpecError(f"spec field 'attention_export' is {str(v)[:40]!r}, not one of {', '.join(C.ATTENTION_EXPORTS)}")
    if v != C.ATTENTION_EXPORT_110 and not entities(spec):
        raise SpecError(f"spec field 'attention_export' is {v!r} without an entity observation")


class Attention(Block):
    name = "attention"
    stage = OBSERVE
    row_as_vector = False  # it needs the batch axis (entities are [batch, N, features])
    obs_rank, obs_kind, obs_dims = 2, OBS_ENTITY, "[batch, entities, features]"
    # which ML-Agents export of the attention the ONNX mirrors and the modules compute (``1.1``; ``0.30``
    # transposes and reshapes each entity input first)
    spec_fields = (SpecField("attention_export", 110, C.ATTENTION_EXPORT_110, check=_check_export,
                             used=lambda v: v != C.ATTENTION_EXPORT_110),)

    def active(self, spec) -> bool:
        return bool(entities(spec))

    def describe(self, spec):
        v = spec.attention_export
        return [("obs", f" (attention as ML-Agents {v} exports it)")] if v != C.ATTENTION_EXPORT_110 else []

    def spec_hints(self, spec, hints) -> None:
        if spec.attention_export == C.ATTENTION_EXPORT_030:
            for i, shape in entities(spec):
                hints[i] = InputHint(shape, True)

    def onnx_detect(self, g, found):
        """0.30's export: a Transpose of its last two axes reads an entity input."""
        return {"attention_export": C.ATTENTION_EXPORT_030} if any(h.transposed for h in g.hints.values()) else {}

    # --- checkpoint ------------------------------------------------------------------------
    def claim(self, r: KeyRules) -> None:
        idx = r.indices(C.ENTITY_RE)
        others = [k for k in r.keys if C.ATTENTION_RE.match(k)]
        if not idx:
            if others:
                raise r.error(f"'{others[0]}' belongs to an attention over variable-length observations, but "
                              "no observation has an entity embedding")
            return
        for m in r.matching(C.ENTITY_RE):
            if m.group(2) not in C.ENTITY_ENCODER_PARAMS:
                raise r.error(f"unexpected key '{m.group(0)}'")
        d = C.ATTENTION_EMBEDDING_SIZE
        for n in C.RSA_LINEARS:
            r.linear(C.RSA_LINEAR.format(n=n, p="{p}"), C.c_attention(n, LINEAR_WEIGHT), C.c_attention(n, LINEAR_BIAS), d, d)
        x_self = C.X_SELF_ENCODER.format(p=LINEAR_WEIGHT)
        self_width = r.shape(r.matrix(x_self))[1] if x_self in r.sd else 0
        if self_width:
            r.linear(C.X_SELF_ENCODER.format(p="{p}"), C.C_ATT_SELF_W, C.C_ATT_SELF_B, d, self_width)
        found = r.state.setdefault("observations", {})
        transposed = []
        for n, i in enumerate(idx):
            key = C.ENTITY_ENCODER.format(i=i, p="{p}")
            if i in found:
                raise r.error(f"observation {i} has an entity embedding ('{key.format(p=LINEAR_WEIGHT)}') and "
                              "another encoder")
            width = r.shape(r.matrix(key.format(p=LINEAR_WEIGHT)))[1]
            size = width - (d if self_width else 0)
            if size < 1:
                raise r.error(f"'{key.format(p=LINEAR_WEIGHT)}' takes {width} inputs: with the self embedding "
                              f"({d}) that leaves no entity features")
            r.linear(key, C.c_entity(i, LINEAR_WEIGHT), C.c_entity(i, LINEAR_BIAS), d, width)
            for p in (LINEAR_WEIGHT, LINEAR_BIAS):
                r.twin(C.ENTITY_ENCODER_ALIAS.format(i=i, p=p), key.format(p=p))
            found[i] = ((self._max_entities(r, i, size), size), d if n == 0 else 0)  # the attention's width, once
            transposed.append(r.inputs[i].transposed)
        for m in r.matching(C.ENTITY_ALIAS_RE):
            if m.group(0) in r.remaining:
                raise r.error(f"unexpected key '{m.group(0)}' (alias without its twin)")
        r.state[self.name] = self_width
        if len(set(transposed)) > 1:
            raise r.error("the official ONNX transposes some entity inputs and not others: not an ML-Agents export")
        if transposed[0]:
            r.fields["attention_export"] = C.ATTENTION_EXPORT_030

    def restore(self, policy, sd) -> None:
        """The entity embeddings' alias keys: the same tensors again under ``network_body.processors.{i}``."""
        for i, _ in entities(policy.spec):
            for p in (LINEAR_WEIGHT, LINEAR_BIAS):
                sd[C.ENTITY_ENCODER_ALIAS.format(i=i, p=p)] = sd[C.ENTITY_ENCODER.format(i=i, p=p)]

    def state_template(self, spec):
        d, z = C.ATTENTION_EMBEDDING_SIZE, lambda *s: np.zeros(s, np.float32)  # noqa: E731
        others = spec.encoded_width - d  # the other observations' encodings: the self embedding's input
        out = {}
        for n in C.RSA_LINEARS:
            out[C.RSA_LINEAR.format(n=n, p=LINEAR_WEIGHT)], out[C.RSA_LINEAR.format(n=n, p=LINEAR_BIAS)] = z(d, d), z(d)
        if others:
            out[C.X_SELF_ENCODER.format(p=LINEAR_WEIGHT)], out[C.X_SELF_ENCODER.format(p=LINEAR_BIAS)] = z(d, others), z(d)
        for i, (_, size) in entities(spec):
            out[C.ENTITY_ENCODER.format(i=i, p=LINEAR_WEIGHT)] = z(d, size + (d if others else 0))
            out[C.ENTITY_ENCODER.format(i=i, p=LINEAR_BIAS)] = z(d)
        return out

    def onnx_recover(self, spec, found, sd) -> None:
        """The MatMul weights are the Linears' weights transposed (``_onnx_linear``); the 0.30 export's
        exponents of 2 are initializers of no key (the final comparison checks their value)."""
        for name in list(found):
            for key in list(sd):
                if name == C.TRANSPOSED_INIT.format(key=key):
                    sd[key] = np.ascontiguousarray(found.pop(name).T)
            if name in found and POW_EXPONENT in name:
                found.pop(name)

    @staticmethod
    def _max_entities(r: KeyRules, i: int, size: int) -> int:
        """No tensor holds how many entities observation ``i`` takes: the official ONNX's input does."""
        name = C.OBS_INPUT.format(i=i)
        hint = r.inputs.get(i)
        dims = hint.dims if hint is not None else None
        if dims is None:
            raise r.error(f"{name} is a variable-length observation (entities of {size} features), and the checkpoint "
                          "does not say its maximum number of entities: give the official ONNX ML-Agents wrote with "
                          "it (--reference), whose input states it")
        if len(dims) != 2 or dims[1] != size or not isinstance(dims[0], int) or dims[0] < 1:
            raise r.error(f"the official ONNX's input {name} is [batch, {', '.join(map(str, dims))}]: this checkpoint's "
                          f"entity embedding takes [batch, max_entities, {size}]")
        return int(dims[0])

    def finish(self, r: KeyRules) -> None:
        if self.name not in r.state:
            return
        self_width = r.state[self.name]
        shapes = r.fields.get("obs_shapes") or [(n,) for n in r.fields.get("obs_sizes", ())]
        others = [i for i, s in enumerate(shapes) if len(s) != 2]
        body = r.tensors.get(C.c_body(0, LINEAR_WEIGHT))  # (a goal-conditioned body has other first layers)
        want = body.shape[1] - C.ATTENTION_EMBEDDING_SIZE if body is not None else self_width  # the others' encodings
        if bool(others) != bool(self_width) or (self_width and self_width != want):
            raise r.error(f"'{C.X_SELF_ENCODER.format(p=LINEAR_WEIGHT)}' takes {self_width or 'nothing (absent)'}, "
                          f"but the observations beside the entities ({', '.join(C.OBS_INPUT.format(i=i) for i in others) or 'none'}) "
                          f"encode to {want}")

    # --- spec ------------------------------------------------------------------------------
    def parameter_count(self, spec, include_log_sigma: bool = True) -> int:
        d = C.ATTENTION_EMBEDDING_SIZE
        others = spec.encoded_width - d
        n = len(C.RSA_LINEARS) * (d * d + d) + (others * d + d if others else 0)
        return n + sum(((d if others else 0) + size) * d + d for _, (_, size) in entities(spec))

    def inputs(self, spec) -> List[Port]:
        return [Port(C.OBS_INPUT.format(i=i), (C.BATCH_DIM, m, size), kind=OBSERVATION) for i, (m, size) in entities(spec)]

    def encoded_width(self, spec) -> int:
        return C.ATTENTION_EMBEDDING_SIZE

    def encoders(self, spec) -> List[Dict[str, object]]:
        d, ents = C.ATTENTION_EMBEDDING_SIZE, entities(spec)
        self_part = (f"the other observations' encodings ({spec.encoded_width - d}) through a Linear + Swish ({d}) "
                     "put before every entity, " if spec.encoded_width > d else "")
        legacy = (f"; the entity inputs transposed and reshaped first, as ML-Agents {spec.attention_export} exports it"
                  if spec.attention_export != C.ATTENTION_EXPORT_110 else "")
        return [{"inputs": [C.OBS_INPUT.format(i=i) for i, _ in ents], "kind": "entity",
                 "shape": [list(s) for _, s in ents],
                 "encoder": (f"attention over {sum(m for _, (m, _) in ents)} entities: {self_part}an entity embedding "
                             f"(Linear + Swish, {d}) per observation, residual self-attention ({C.ATTENTION_HEADS} heads "
                             f"of {d // C.ATTENTION_HEADS}, LayerNorm without parameters), the mean over the entities "
                             f"that are not padding (squared sum >= {C.ENTITY_MASK_BELOW}); appended after the other "
                             f"encodings{legacy}"),
                 "width": d, "parameters": self.parameter_count(spec)}]

    # --- ONNX --------------------------------------------------------------------------------
    def onnx_float32_nodes(self, spec):
        """The padding mask (squares summed, compared with 0.01), the LayerNorms' statistics, the masked
        logits (-1e6 is -inf in fp16: an all-padded set would be 0/0), the softmax and the pooling's sums."""
        return [(C.SCOPE_OBS_ENCODER + "/", ("Pow", "ReduceSum", "Less", "ReduceMean", "Sqrt", "Softmax")),
                (C.SCOPE_ATTENTION + "/", ("Sub", "Mul", "Div", "Add"))]

    def onnx_append(self, f: OnnxFlow) -> Optional[str]:
        """ML-Agents' node sequence (opset 9, torch's legacy exporter): the masks, the self embedding,
        each entity observation's embedding, the residual self-attention, the pooling."""
        g, spec, sc = f.g, f.spec, C.SCOPE_OBS_ENCODER
        ents = entities(spec)
        d, heads = C.ATTENTION_EMBEDDING_SIZE, C.ATTENTION_HEADS
        total = sum(m for _, (m, _) in ents)
        legacy = spec.attention_export == C.ATTENTION_EXPORT_030  # torch 1.x: no CSE, Pow's exponent an initializer
        pow2 = (lambda s: g.init(f"{s}{POW_EXPONENT}{len(g.inits)}", np.array(2.0, np.float32))) if legacy else \
            (lambda s: g.const(2.0, s))

        def entity_input(i: int, m: int, size: int, scope: str) -> str:
            x = C.OBS_INPUT.format(i=i)
            if legacy:  # 0.30: x.transpose(2, 1).reshape(-1, m, size), for Barracuda
                x = g.node("Reshape", [g.node("Transpose", [x], scope, perm=[0, 2, 1]),
                                       g.const([-1, m, size], scope, np.int64)], scope)
            return x

        sq = [entity_input(i, m, size, sc) for i, (m, size) in ents]
        masks = []
        for x in sq:
            below = g.node("Less", [g.reduce_sum(g.node("Pow", [x, pow2(sc)], sc), 2, 0, sc),
                                    g.const(C.ENTITY_MASK_BELOW, sc)], sc)
            masks.append(g.node("Cast", [below], sc, to=1))  # TensorProto.FLOAT
        s = None
        if f.h is not None:
            s = self._onnx_swish(g, f.gemm(f.h, C.C_ATT_SELF_W, C.C_ATT_SELF_B, C.SCOPE_X_SELF_LAYER.format(j=0)),
                                 C.SCOPE_X_SELF_LAYER.format(j=1))
        rep = None
        embedded = []
        for i, (m, size) in ents:
            esc = C.SCOPE_ENTITY.format(i=i)
            x = entity_input(i, m, size, esc)
            if s is not None:
                if rep is None or legacy:  # torch 2.x's CSE leaves one Reshape, in the first processor's scope
                    rep = g.node("Reshape", [s, g.const([-1, 1, d], esc, np.int64)], esc)
                x = g.node("Concat", [g.node("Concat", [rep] * m, esc, axis=1), x], esc, axis=2)
            z = self._onnx_linear(f, x, C.c_entity(i, LINEAR_WEIGHT), C.c_entity(i, LINEAR_BIAS),
                                  C.SCOPE_ENTITY_LAYER.format(i=i, j=0))
            embedded.append(self._onnx_swish(g, z, C.SCOPE_ENTITY_LAYER.format(i=i, j=1)))
        qkv = g.node("Concat", embedded, sc, axis=1)
        mask = g.node("Concat", masks, C.SCOPE_RSA, axis=1)
        y = self._onnx_layer_norm(g, qkv, C.RSA_NORMS[0], legacy, pow2)
        q, k, v = (self._onnx_linear(f, y, C.c_attention(n, LINEAR_WEIGHT), C.c_attention(n, LINEAR_BIAS),
                                     C.SCOPE_RSA_LINEAR.format(n=n)) for n in C.RSA_LINEARS[:3])
        a = C.SCOPE_ATTENTION
        q, k, v = (g.node("Reshape", [t, g.const([-1, total, heads, d // heads], a, np.int64)], a) for t in (q, k, v))
        qt = g.node("Transpose", [q], a, perm=[0, 2, 1, 3])
        kt = g.node("Transpose", [k], a, perm=[0, 2, 1, 3])
        kt = g.node("Add", [g.node("Sub", [kt, g.const(1.0, a)], a), g.const(1.0, a)], a)
        qk = g.node("MatMul", [qt, g.node("Transpose", [kt], a, perm=[0, 1, 3, 2])], a)
        mr = g.node("Reshape", [mask, g.const([-1, 1, 1, total], a, np.int64)], a)
        logits = g.node("Mul", [g.node("Sub", [g.const(1.0, a), mr], a), qk], a)
        logits = g.node("Div", [logits, g.const(_f32(d ** 0.5), a)], a)
        logits = g.node("Add", [logits, g.node("Mul", [mr, g.const(C.ATTENTION_NEG_INF, a)], a)], a)
        att = g.node("Softmax", [logits], a, axis=3)
        o = g.node("MatMul", [att, g.node("Transpose", [v], a, perm=[0, 2, 1, 3])], a)
        o = g.node("Reshape", [g.node("Transpose", [o], a, perm=[0, 2, 1, 3]), g.const([-1, total, d], a, np.int64)], a)
        o = self._onnx_linear(f, o, C.c_attention("out", LINEAR_WEIGHT), C.c_attention("out", LINEAR_BIAS),
                              C.SCOPE_RSA_LINEAR.format(n="out"))
        o = self._onnx_layer_norm(g, g.node("Add", [o, y], C.SCOPE_RSA), C.RSA_NORMS[1], legacy, pow2)
        r = C.SCOPE_RSA
        keep = g.node("Sub", [g.const(1.0, r), mask], r)
        num = g.node("Mul", [o, g.node("Reshape", [keep, g.const([-1, total, 1], r, np.int64)], r)], r)
        num = g.reduce_sum(num, 1, 0, r)
        if legacy:
            keep = g.node("Sub", [g.const(1.0, r), mask], r)
        den = g.node("Add", [g.reduce_sum(keep, 1, 1, r), g.const(C.POOL_EPSILON, r)], r)
        return g.node("Div", [num, den], r)

    @staticmethod
    def _onnx_swish(g, z: str, scope: str) -> str:
        return g.node("Mul", [z, g.node("Sigmoid", [z], scope)], scope)

    @staticmethod
    def _onnx_linear(f: OnnxFlow, x: str, w: str, b: str, scope: str) -> str:
        """A Linear on a 3-D input as torch exports it: MatMul with the weight's transposed copy, then
        Add with the bias first."""
        key = f.policy.sources.get(w, w)
        wt = f.g.init(C.TRANSPOSED_INIT.format(key=key), np.ascontiguousarray(f.policy.tensors[w].T))
        return f.g.node("Add", [f.init(b), f.g.node("MatMul", [x, wt], scope)], scope)

    @staticmethod
    def _onnx_layer_norm(g, x: str, which: str, legacy: bool, pow2) -> str:
        s = C.SCOPE_RSA_NORM.format(which=which)
        mean = g.node("ReduceMean", [x], s, axes=[-1], keepdims=1)
        c = g.node("Sub", [x, mean], s)
        var = g.node("ReduceMean", [g.node("Pow", [c, pow2(s)], s)], s, axes=[-1], keepdims=1)
        if legacy:  # torch 1.x writes (x - mean) a second time
            c = g.node("Sub", [x, mean], s)
        return g.node("Div", [c, g.node("Sqrt", [g.node("Add", [var, g.const(C.LAYER_NORM_EPS, s)], s)], s)], s)

    # --- torch -------------------------------------------------------------------------------
    def torch_init(self, module, policy, dtype, normalizer_dtype) -> None:
        import torch
        from torch import nn

        spec = policy.spec
        if not self.active(spec):
            return
        T = policy.tensors
        ents = entities(spec)
        if C.C_ATT_SELF_W in T:
            module.attention_self = module.affine(T[C.C_ATT_SELF_W], T[C.C_ATT_SELF_B])
        module.entity_embeddings = nn.ModuleList(module.affine(T[C.c_entity(i, LINEAR_WEIGHT)], T[C.c_entity(i, LINEAR_BIAS)])
                                                 for i, _ in ents)
        module.attention = nn.ModuleList(module.affine(T[C.c_attention(n, LINEAR_WEIGHT)], T[C.c_attention(n, LINEAR_BIAS)])
                                         for n in C.RSA_LINEARS)
        module.fast[self.name] = (tuple((C.OBS_INPUT.format(i=i), m, size) for i, (m, size) in ents),
                                  sum(m for _, (m, _) in ents), C.C_ATT_SELF_W in T, torch.nn.functional.silu,
                                  spec.attention_export == C.ATTENTION_EXPORT_030)

    def torch_append(self, f: TorchFlow):
        """ML-Agents' forward, op for op (float32 masks; the logits' masking and the softmax in float32
        whatever the weights' dtype: -1e6 is -inf in float16)."""
        import torch
        from torch.nn.functional import linear

        mod = f.module
        ents, total, has_self, silu, legacy = mod.fast[self.name]
        cdt, d, heads = mod.compute_dtype, C.ATTENTION_EMBEDDING_SIZE, C.ATTENTION_HEADS
        masks, embedded = [], []
        s = None
        if has_self:
            p = torchcompat.module_params(mod.attention_self)
            s = silu(linear(f.h, p["weight"], p["bias"]))[:, None, :]
        for (name, m, size), lin in zip(ents, mod.entity_embeddings):
            x = f.feed[name]
            if legacy:  # what ML-Agents 0.30's ONNX does to an entity input
                x = x.transpose(1, 2).reshape(-1, m, size)
            masks.append(((x.float() ** 2).sum(2) < C.ENTITY_MASK_BELOW).float())
            x = x.to(cdt)
            if s is not None:
                x = torch.cat([s.expand(-1, m, -1), x], dim=2)
            p = torchcompat.module_params(lin)
            embedded.append(silu(linear(x, p["weight"], p["bias"])))
        qkv = torch.cat(embedded, dim=1) if len(embedded) > 1 else embedded[0]
        mask = torch.cat(masks, dim=1) if len(masks) > 1 else masks[0]
        fq, fk, fv, fo = (torchcompat.module_params(lin) for lin in mod.attention)
        y = _layer_norm(qkv)
        q, k, v = (linear(y, p["weight"], p["bias"]).reshape(-1, total, heads, d // heads).permute(0, 2, 1, 3)
                   for p in (fq, fk, fv))
        k = ((k - 1) + 1).transpose(2, 3)
        qk = torch.matmul(q, k).float()
        mr = mask.reshape(-1, 1, 1, total)
        logits = (1 - mr) * qk / _f32(d ** 0.5) + mr * C.ATTENTION_NEG_INF
        att = torch.softmax(logits, dim=3).to(cdt)
        o = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(-1, total, d)
        o = _layer_norm(linear(o, fo["weight"], fo["bias"]) + y)
        keep = 1 - mask
        num = (o * keep.reshape(-1, total, 1).to(cdt)).sum(dim=1)
        return (num / (keep.sum(dim=1, keepdim=True) + C.POOL_EPSILON)).to(cdt)

    # --- the float64 reference with bounds ---------------------------------------------------
    def reference_init(self, policy):
        T = policy.tensors
        ents = entities(policy.spec)
        self_lin = Linear(T[C.C_ATT_SELF_W], T[C.C_ATT_SELF_B]) if C.C_ATT_SELF_W in T else None
        return (ents, self_lin, [Linear(T[C.c_entity(i, LINEAR_WEIGHT)], T[C.c_entity(i, LINEAR_BIAS)]) for i, _ in ents],
                [Linear(T[C.c_attention(n, LINEAR_WEIGHT)], T[C.c_attention(n, LINEAR_BIAS)]) for n in C.RSA_LINEARS],
                policy.spec.attention_export == C.ATTENTION_EXPORT_030)

    def reference_append(self, r: ReferenceFlow, w):
        """The float64 forward with the bounds of ``verify.bounds`` (LayerNorm, softmax, the masked mean
        derived there). The affine layers after a LayerNorm or the softmax carry their inputs' errors
        linearly (``correlated``: those errors share the normalisation). An entity whose squared sum is
        within float32's rounding of 0.01 may be padding or not to a float32 runtime: its row's bounds
        are infinite (the probes keep clear of it)."""
        ents, self_lin, ent_lins, (fq, fk, fv, fo), legacy = w
        d, heads = C.ATTENTION_EMBEDDING_SIZE, C.ATTENTION_HEADS
        hs = d // heads
        b, p = r.bounds, r.precision
        s = swish(affine(r.h, self_lin, b, p=p), p) if self_lin is not None else None
        masks, embedded, unsure = [], [], []
        for (i, (m, size)), lin in zip(ents, ent_lins):
            x = f64(r.feed[C.OBS_INPUT.format(i=i)])
            if legacy:
                x = x.transpose(0, 2, 1).reshape(-1, m, size)
            sq = (x * x).sum(axis=2)
            masks.append(sq < _f32(C.ENTITY_MASK_BELOW))
            unsure.append(np.abs(sq - _f32(C.ENTITY_MASK_BELOW)) <= 2 * (size + 1) * U32 * sq + 1e-30)
            xb = stored(Bounded.exact(x), p) if b else Bounded.exact(x)  # cast to the weights' format
            if s is not None:
                rows = x.shape[0]
                xb = Bounded(np.concatenate([np.broadcast_to(s.v[:, None, :], (rows, m, d)), x], axis=2),
                             np.concatenate([np.broadcast_to(s.err[:, None, :], (rows, m, d)), xb.err], axis=2))
            embedded.append(swish(affine(xb, lin, b, p=p), p))
        qkv = Bounded(np.concatenate([e.v for e in embedded], axis=1), np.concatenate([e.err for e in embedded], axis=1))
        mask = np.concatenate(masks, axis=1)
        rows, total = mask.shape
        y = layer_norm(qkv, _f32(C.LAYER_NORM_EPS), p)

        def split(t: Bounded) -> Bounded:  # (rows, N, d) -> (rows, heads, N, hs)
            return Bounded(*(a.reshape(rows, total, heads, hs).transpose(0, 2, 1, 3) for a in (t.v, t.err)))

        q, k, v = (split(affine(y, lin, b, p=p)) for lin in (fq, fk, fv))
        k = minus_plus_one(k, p)
        qk = matmul(q, Bounded(k.v.swapaxes(2, 3), k.err.swapaxes(2, 3)), p)
        scale = _f32(d ** 0.5)
        mr = mask[:, None, None, :]
        z = qk.v / scale
        logits = Bounded(np.where(mr, C.ATTENTION_NEG_INF, z), np.where(mr, 0.0, qk.err / scale + p.u * np.abs(z)))
        o = matmul(softmax(logits, axis=3, prec=p), v, p)
        o = Bounded(*(a.transpose(0, 2, 1, 3).reshape(rows, total, d) for a in (o.v, o.err)))
        o = affine(o, fo, b, p=p)
        res = Bounded(o.v + y.v, o.err + y.err + p.rnd(o.v + y.v))
        out = masked_mean(layer_norm(res, _f32(C.LAYER_NORM_EPS), p), ~mask, _f32(C.POOL_EPSILON), p)
        if not b:
            return Bounded(out.v, np.zeros_like(out.v))
        bad = np.concatenate(unsure, axis=1).any(axis=1)
        return Bounded(out.v, np.where(bad[:, None], np.inf, out.err))

    # --- probes ------------------------------------------------------------------------------
    def probe(self, policy, rng: np.random.Generator, rows: int) -> Dict[str, np.ndarray]:
        """Entity sets, row by row in a cycle of eight: every entity real; the first k real, the rest
        padded (all zeros); real ones scattered among padded ones; every entity padded; one real;
        "padding" that is not zero (squared sum 0.001-0.005: ML-Agents masks it) beside faint real
        entities (squared sum 0.02-0.05); large features (N(0, 20), some +-100); k real in random
        places. Real features are N(0, 2) with a few at +-20 (entities have no normalizer). No
        entity's squared sum comes near the 0.01 threshold (real ones: >= 0.02)."""
        feed = {}
        kind = np.arange(rows) % 8
        for i, (m, size) in entities(policy.spec):
            x = rng.normal(scale=2.0, size=(rows, m, size))
            x = np.where(rng.random(x.shape) < 0.05, rng.choice([-20.0, 20.0], size=x.shape), x)
            big = kind == 6
            x[big] = rng.normal(scale=20.0, size=(int(big.sum()), m, size))
            x[big] = np.where(rng.random(x[big].shape) < 0.1, rng.choice([-100.0, 100.0], size=x[big].shape), x[big])
            unit = rng.normal(size=(rows, m, size))
            unit /= np.maximum(np.sqrt((unit * unit).sum(axis=2, keepdims=True)), 1e-12)
            sq = (x * x).sum(axis=2, keepdims=True)
            x = np.where(sq < 0.1, unit * np.sqrt(0.1), x)  # real entities: squared sum >= 0.1 ...
            faint = kind == 5
            x[faint] = unit[faint] * np.sqrt(rng.uniform(0.02, 0.05, size=(int(faint.sum()), m, 1)))  # ... or 0.02-0.05
            pad = np.zeros_like(x)
            pad[faint] = -unit[faint] * np.sqrt(rng.uniform(0.001, 0.005, size=(int(faint.sum()), m, 1)))
            k = rng.integers(1, max(m, 2), rows)
            first_k = np.arange(m)[None, :] < k[:, None]
            scattered = rng.random((rows, m)) < 0.5
            scattered[np.arange(rows), rng.integers(0, m, rows)] = True
            single = np.arange(m)[None, :] == rng.integers(0, m, rows)[:, None]
            real = np.ones((rows, m), bool)
            for want, pattern in ((1, first_k), (2, scattered), (3, False), (4, single), (5, scattered),
                                  (7, rng.permuted(first_k, axis=1))):
                real = np.where((kind == want)[:, None], pattern, real)
            feed[C.OBS_INPUT.format(i=i)] = np.where(real[:, :, None], x, pad).astype(np.float32)
        return feed

    # --- the run modes ----------------------------------------------------------------------
    def describe_input(self, spec, i: int, given=None) -> str:
        m, size = spec.obs_shape(i)
        return (f"a variable-length observation: up to {m} entities of {size} features; an entity "
                f"whose squared features sum below {C.ENTITY_MASK_BELOW} is padding")


def _layer_norm(x):
    """ML-Agents' LayerNorm (layers.py), the same ops: two passes, no gamma/beta."""
    import torch

    c = x - x.mean(dim=-1, keepdim=True)
    return c / torch.sqrt((c ** 2).mean(dim=-1, keepdim=True) + C.LAYER_NORM_EPS)
