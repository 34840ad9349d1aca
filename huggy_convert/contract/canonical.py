"""Our own side: canonical tensor names in the safetensors policy and the format's metadata."""
from __future__ import annotations

def c_norm(i: int, field: str) -> str:
    return f"obs.{i}.normalizer.{ {'normalization_steps': 'steps', 'running_mean': 'mean', 'running_variance': 'variance'}[field] }"


def c_divisor(i: int) -> str:
    """The folded divisor ``sqrt(variance / steps)`` the artifacts divide by (IEEE, or adopted from the
    official ONNX: see core.numerics.ieee_divisor and converter.reference)."""
    return f"obs.{i}.normalizer.divisor"


def c_body(layer: int, p: str) -> str:
    return f"body.{layer}.{p}"


def c_hyper(k: int, p: str) -> str:
    """The goal-conditioned layer's hypernetwork: its Linear ``k`` (0, 2, 5 as ML-Agents numbers them)."""
    return f"body.hyper.{k}.{p}"


C_HYPER_BIAS = "body.hyper.bias"  # the generated layer's own bias (the hypernetwork makes only its weight)


def c_lstm(p: str) -> str:
    return f"lstm.{p}"


C_MU_W = "continuous.mu.weight"
C_MU_B = "continuous.mu.bias"
C_LOG_SIGMA = "continuous.log_sigma"  # PPO parameter [1, A]
C_LOG_SIGMA_W = "continuous.log_sigma.weight"  # SAC
C_LOG_SIGMA_B = "continuous.log_sigma.bias"


def c_branch(b: int, p: str) -> str:
    return f"discrete.{b}.{p}"


def c_entity(i: int, p: str) -> str:
    """Observation ``i``'s entity embedding (ML-Agents' ``self_ent_encoder``: one Linear + Swish)."""
    return f"obs.{i}.entity_embedding.{p}"


def c_visual_conv(i: int, n: int, p: str) -> str:
    """Camera observation ``i``'s convolution ``n`` (0, 1, ...; simple, nature_cnn, match3: ML-Agents'
    ``conv_layers.{2n}``; resnet: the stacks' and blocks' convolutions in forward order)."""
    return f"obs.{i}.visual.conv.{n}.{p}"


def c_visual_dense(i: int, p: str) -> str:
    """Camera observation ``i``'s dense layer (ML-Agents' ``dense.0``, resnet's ``dense``)."""
    return f"obs.{i}.visual.dense.{p}"


C_ATT_SELF_W = "attention.self_encoder.weight"  # ML-Agents' x_self_encoder (Linear + Swish)
C_ATT_SELF_B = "attention.self_encoder.bias"


def c_attention(n: str, p: str) -> str:
    """The residual self-attention's Linear ``n`` (q, k, v, out)."""
    return f"attention.{n}.{p}"


def c_const(key: str) -> str:
    return f"const.{key}"


FORMAT_NAME = "huggy-convert/policy"
FORMAT_VERSION = "2"  # 2 adds obs.{i}.normalizer.divisor and the "divisor" metadata
FORMAT_VERSIONS_READ = ("1", "2")  # a version-1 file gets the IEEE divisor when read
MD_DIVISOR = "divisor"  # metadata: where the divisor came from (JSON, see converter.reference)
MD_ORIGIN = "trained_with"  # metadata: another trainer's file a policy was read from (JSON, see importers.sb3)
MD_RECOVERED = "recovered_from"  # metadata: the ONNX a policy was recovered from (JSON, see importers.from_onnx)
ONNX_META_DIVISOR = "huggy_convert.divisor"  # the same record in the rebuilt ONNX's metadata_props
DIVISOR_MODES = ("auto", "ieee")  # auto: adopt an official divisor within 1 ulp of IEEE; ieee: never
FLOAT32_EXACT_INT_LIMIT = 2 ** 24


# Keys of our own JSON output named after what ML-Agents calls the thing they count or carry
P_WITH_LOG_SIGMA = "with_log_sigma"  # info/matrix parameter counts: the linear layers plus log_sigma
P_TENSORS_WITH_LOG_SIGMA = "tensors_with_log_sigma"
