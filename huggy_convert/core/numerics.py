"""Host-independent float32 arithmetic: the normalizer's divisor, ulp distances, bitwise equality.

torch's float32 ``sqrt`` on the CPU goes through MKL's vector math, whose result depends on the
CPU (exact on MKL's AVX2 path, 1 ulp off on ~0.67 % of elements on its AVX-512 path, ~17 % on its
generic path, which is what MKL takes on many non-Intel CPUs). Nothing in this package computes
an artifact's number with it: the divisor is computed here, IEEE-exactly, once for every exporter.

Why float64 gives the IEEE float32 result: for +, -, x, / and sqrt, rounding first to a format of
p' >= 2p + 2 bits and then to p bits equals rounding once to p bits (Figueroa, "When is double
rounding innocuous?", 1995). float64 has p' = 53 >= 2*24 + 2, and float64 division, sqrt and the
float64 -> float32 cast are correctly rounded on every IEEE 754 machine (no library kernel is
involved), so the result is the same bits on every CPU.
"""
from __future__ import annotations

import numpy as np

U32 = 2.0 ** -24  # unit roundoff of float32 (round to nearest)


def ieee_divisor(variance: np.ndarray, steps) -> np.ndarray:
    """``sqrt(running_variance / normalization_steps)`` in float32, each step correctly rounded
    (what an IEEE 754 machine computes for float32 division, then float32 sqrt).

    ``steps`` is the float32 count (ML-Agents' int64 count promotes to float32 when divided)."""
    v = np.asarray(variance, dtype=np.float32).astype(np.float64)
    s = np.float64(np.float32(np.asarray(steps, dtype=np.float32).reshape(-1)[0]))
    q = (v / s).astype(np.float32)  # correctly rounded float32 division
    return np.sqrt(q.astype(np.float64)).astype(np.float32)  # correctly rounded float32 sqrt


def one_step_variance(divisor: np.ndarray):
    """The float32 variance that, with one normalization step, gives ``divisor`` back as its IEEE divisor:
    ``(variance, bad)`` with variance = D² correctly rounded to float32 and ``bad`` the elements where that
    fails (D not positive or not finite, or D² no normal float32). In binary floating point
    ``fl(sqrt(fl(D * D))) == D`` for every D whose square is a normal float32 (1.09e-19 <= D <= 1.84e19;
    checked exhaustively over the float32 significands in tests/test_from_onnx.py). An ONNX's folded
    divisor (``blocks.normalizer.onnx_recover``) and VecNormalize's ``sqrt(var + eps)`` (``importers.sb3``)
    are held this way."""
    d = np.asarray(divisor, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        var = (d.astype(np.float64) ** 2).astype(np.float32)
    bad = ~(np.isfinite(d) & (d > 0))
    bad |= ~bad & (ieee_divisor(var, 1) != d)
    return var, bad


def ordered_int(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns mapped onto a monotonic integer line (adjacent floats differ by 1)."""
    i = np.ascontiguousarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (0 for bitwise equal)."""
    return np.abs(ordered_int(a) - ordered_int(b))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes (bit for bit: -0.0 is not 0.0, a NaN equals its own bits)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_arrays(a, b) -> bool:
    """Two name -> array maps with the same names and every array ``same_bits``."""
    return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
