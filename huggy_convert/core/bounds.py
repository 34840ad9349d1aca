"""A float64 forward of the canonical tensors with a per-element bound on any float32 runtime's error
(and, by the same functions, on a float16 or bfloat16 runtime's: "Half formats" below).

Every float32 runtime (onnxruntime, the torch module on any device, the ``.pt2``) computes the same
function with its own kernels: other summation orders, FMA or not, approximate activations. None of
them is "the" answer; the float64 forward of the policy's own float32 tensors is (to ~1e-16), and
each float32 result must lie within a rounding-error bound of it. The bound is derived, element by
element, from the data and the policy, not tuned to a machine:

- Each float32 operation returns ``x (1 + d)`` with ``|d| <= u = 2^-24``. An inner product of
  length ``n`` (plus its bias) summed in *any* order has the error ``sum_k d_k S_k`` over its ``n``
  roundings, where each partial sum ``|S_k| <= A = sum |w_j h_j| + |b|``. Modelling the ``d_k`` as
  independent and mean-zero (Higham & Mary, "A new approach to probabilistic rounding error
  analysis", SIAM J. Sci. Comput. 41(5), 2019), Hoeffding's inequality gives
  ``|error| <= lam * u * sqrt(n + 1) * A`` except with probability ``2 exp(-lam^2 / 2)``;
  ``lam = LAMBDA = 6`` (3e-8 per inner product). The worst-case bound ``gamma_n A`` (``n u A``) holds
  always but is useless here: carried through three 512-wide layers it exceeds the actions' range.
- Errors a layer inherits are rounding errors of independent inner products: they propagate as
  ``sqrt(sum_j w_ij^2 e_j^2)`` (root-sum-square, the same model).
- Activation kernels are approximations (onnxruntime's Sigmoid and Tanh are rational functions): their
  own error is systematic, so it is carried linearly (``|W| e``). Its size, measured over 3.6e7 float32
  inputs in [-30, 30]: onnxruntime Sigmoid 2.8 u absolute, Tanh 5.4 u, Exp 1.3 u relative; torch CPU
  sigmoid 1.5 u, tanh 0.5 u. The bounds below are about three times that (``E_SIGMOID`` 8 u,
  ``E_TANH`` 16 u, ``E_EXP`` 4 u relative). Swish ``z sigmoid(z)`` is 1.0998-Lipschitz, tanh 1, sigmoid 1/4.
- Clips are 1-Lipschitz, and an element whose exact value is beyond the clip by more than its bound
  is the clip bound exactly in float32 too: its bound is 0.
- The normalizer (a subtraction, a division) adds ``2 u |q|``; inputs are float32 and exact.

``Bounded.err`` is the sum of the two channels (random, systematic). An element fails only past its
bound; the report gives observed error / bound. Integer outputs (argmax) must agree except where the
two candidates' logits are within their bounds of each other (a tie float32 cannot resolve).

Half formats. A float16 or bfloat16 runtime (the torch module built with ``dtype=``) is bounded by the
same functions and the same float64 forward, given a :class:`Precision` (``verify.bounds.Float64Policy.forward(...,
precision=FLOAT16)``; each block hands ``ReferenceFlow.precision`` on as ``p``). ``FLOAT32`` is the
model above, term for term: the half terms below are added only where ``p.stored``, so float32 bounds
are bitwise what they were.

- Unit roundoff ``u = 2^-11`` (float16: 11 significand bits) or ``2^-8`` (bfloat16: 8 bits), round to
  nearest. ``u`` takes float32's place in every operation's own rounding (``add``, ``mul``,
  ``scale``, ``tanh``, Swish, the LayerNorm, softmax and attention steps): each result is stored in
  the format.
- What is rounded before any operation: the inputs (the float32 normalizer's output, a raw vector
  observation, an image, ``recurrent_in``: ``stored``, ``u |x|``) and the weights and biases
  themselves: ``|dw| <= u |w|`` moves an inner product by at most ``u A`` (worst case, linear).
- Inner products accumulate in float32 (``U32`` = 2^-24): torch's CPU half and bfloat16 GEMM,
  GEMV and convolution kernels (oneDNN, or torch's own with a float32 ``opmath`` accumulator), cuBLAS
  with its default float32 compute type and Ascend's cube units all do; their term is float32's
  ``LAMBDA 2^-24 sqrt(n) A``. The result is stored in the format once, and once more where the bias
  is a separate Add (the LSTM's ``x W^T + b``): ``u (|z| + |z - b|)``. A kernel that accumulates
  in the half format itself is outside the model (it would need ``LAMBDA u sqrt(n) A``: through
  Huggy's three 512-wide layers that exceeds the actions' range in bfloat16, a bound that checks
  nothing); so is cuBLAS reducing split-K partial sums in the half format (torch's
  ``allow_fp16_reduced_precision_reduction``), not measured here.
- Activation kernels: torch's half and bfloat16 elementwise kernels compute in float32 (their
  ``opmath`` type, on the CPU and in CUDA) and round the result once to the format. So a kernel's
  error is the float32 kernel's (``E_SIGMOID``, ``E_TANH``, ``E_EXP``), plus that rounding where the
  function has no separate term for it: the sigmoid ``+ u`` (absolute: sigmoid < 1; Swish as Sigmoid
  + Mul stores it before the product), the exp ``+ u`` (relative); tanh's is its ``rnd(v)`` term. The
  argmax tie adds ``2 u`` relative to float32's ``TIE`` (two probabilities within ``2 u`` of each
  other can round to one value). A native half kernel less accurate than that (an NPU's) is outside
  the model and shows as a failure: measure it there before widening anything.
- Subnormals: below the normal range (float16 2^-14, bfloat16 2^-126) a rounding's error is absolute,
  at most half the subnormal spacing (``sub``: float16 2^-25, bfloat16 2^-134), added to each
  rounding (``Precision.rnd``) and per weight of an inner product (``sub (sum |x| + 1)``); the
  smallest normal is the softmax's ``tiny`` (float16 2^-14).
- Range: float16's largest value is 65504. An overflow makes the runtime's value infinite, which
  fails any finite bound, as it should: Huggy's running variance (~1e8) is why the module keeps the
  normalizer float32 in every dtype (``exporters.torch_module``: the mean and divisor are pinned
  float32 buffers, the input cast to the format after the clip), and its bound here is float32's.
- The discrete heads' masking and softmax and the continuous head's clip and ``/ 3`` run in float32
  after the cast; their bounds use the format's ``u`` all the same (an upper bound).

An argmax that differs from the reference's is within bounds exactly when the float64 margin between
the two logits is at most their two bounds plus ``TIE`` (the format's); the report prints each
flipped row's margin and bound. The half bounds are computed only when a half runtime is checked (one
forward per format and feed, the same vectorised functions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .numerics import U32

LAMBDA = 6.0
E_SIGMOID = 8 * U32  # absolute error of a float32 sigmoid kernel
E_TANH = 16 * U32  # absolute error of a float32 tanh kernel
E_EXP = 4 * U32  # relative error of a float32 exp kernel
L_SWISH = 1.0998  # max |d/dz z sigmoid(z)|
TIE = 32 * U32  # relative closeness of two logits under which softmax + argmax may pick either


@dataclass(frozen=True)
class Precision:
    """The format a runtime computes in, as the bounds see it (see "Half formats" above).

    ``u``: the unit roundoff of every operation's stored result (the inner products accumulate in
    float32 in every format: ``U32``, see :func:`accumulation`); ``stored``: the
    weights, biases and inputs are rounded to the format first (False for float32: the policy's
    float32 tensors as they are); ``sub``: the absolute error of a rounding below the normal range
    (half the spacing of the subnormals; 0 for float32, whose subnormals start at 1.2e-38 and never
    matter here, as before); ``tiny``: the smallest normal value. The kernels' errors: float32's
    (``E_SIGMOID`` 8 u, ``E_TANH`` 16 u, ``E_EXP`` 4 u, ``TIE`` 32 u), and in a half format the float32
    kernel's plus its result's rounding to the format (its properties)."""

    name: str
    u: float
    stored: bool = False
    sub: float = 0.0
    tiny: float = 2.0 ** -126

    @property
    def e_sigmoid(self) -> float:
        """Absolute: the float32 kernel's, and in a half format the sigmoid's own rounding to it (``u``:
        sigmoid < 1; Swish as Sigmoid + Mul stores it before the product)."""
        return E_SIGMOID + (self.u if self.stored else 0.0)

    @property
    def e_tanh(self) -> float:
        """Absolute: the float32 kernel's (the result's rounding is ``tanh``'s ``rnd(v)`` term)."""
        return E_TANH

    @property
    def e_exp(self) -> float:
        """Relative: the float32 kernel's, and in a half format the result's rounding to it (``u``)."""
        return E_EXP + (self.u if self.stored else 0.0)

    @property
    def tie(self) -> float:
        """Relative: float32's softmax tie, and in a half format two probabilities within ``2 u`` of
        each other that round to one value."""
        return TIE + (2 * self.u if self.stored else 0.0)

    def rnd(self, v):
        """One rounding of ``v`` to the format: ``u |v|`` (``+ sub`` below the normal range)."""
        return self.u * np.abs(v) + self.sub if self.sub else self.u * np.abs(v)


U16 = 2.0 ** -11  # unit roundoff of IEEE binary16 (10 stored significand bits, round to nearest)
UBF16 = 2.0 ** -8  # unit roundoff of bfloat16 (7 stored significand bits, round to nearest)
FLOAT32 = Precision("float32", U32)
FLOAT16 = Precision("float16", U16, stored=True, sub=2.0 ** -25, tiny=2.0 ** -14)
BFLOAT16 = Precision("bfloat16", UBF16, stored=True, sub=2.0 ** -134)
PRECISIONS = {p.name: p for p in (FLOAT32, FLOAT16, BFLOAT16)}


@dataclass
class Bounded:
    """float64 values ``v`` and a bound ``err`` on a float32 runtime's error in each element."""

    v: np.ndarray
    err: np.ndarray

    @classmethod
    def exact(cls, v) -> "Bounded":
        v = np.asarray(v, np.float64)
        return cls(v, np.zeros_like(v))

    def cols(self, lo: int, hi: int) -> "Bounded":
        return Bounded(self.v[:, lo:hi], self.err[:, lo:hi])


def f64(a) -> np.ndarray:
    """``a`` as float32 (what every float32 runtime reads), then exactly in float64."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


SLACK = 1 + 2.0 ** -10  # the bound's own sums run in float32 (relative error < 2^-10 for n < 2^13 terms)


def _mm(x: np.ndarray, wt) -> np.ndarray:
    """``x @ wt`` through torch's CPU GEMM, on torch's thread setting (a batch's workers run one thread
    each; numpy's BLAS would start threads of its own and oversubscribe the cores)."""
    import torch

    return (torch.from_numpy(np.ascontiguousarray(x, dtype=wt.numpy().dtype)) @ wt).numpy()


class Linear:
    """A layer's float32 weights in float64 for the values; |W| and W^2 (float32: the bound is an upper
    estimate, computed with ``SLACK``) made on first use."""

    def __init__(self, W, b=None):
        import torch

        self.W32 = torch.from_numpy(np.array(W, dtype=np.float32, order="C"))
        self.WT = self.W32.to(torch.float64).t()
        self.b = f64(b) if b is not None else np.zeros(self.W32.shape[0])
        self.n = self.W32.shape[1] + (1 if b is not None else 0)
        self._aWT = self._W2T = None

    @property
    def aWT(self):
        if self._aWT is None:
            self._aWT = self.W32.abs().t()
        return self._aWT

    @property
    def W2T(self):
        if self._W2T is None:
            self._W2T = self.W32.square().t()
        return self._W2T


def affine(x: Bounded, lin: Linear, bounds: bool = True, correlated: bool = False, p: Precision = FLOAT32) -> Bounded:
    """``x W^T + b`` (Gemm / addmm / addmv; on the last axis of any rank, MatMul + Add): inherited
    errors root-sum-square, plus its own roundings. ``correlated``: the inputs' errors share a common
    cause (a LayerNorm's divisor, a softmax's normalisation), so they add up linearly (``|W| e``), the
    worst case, instead. In a half format (``p.stored``) the weights and bias are rounded to it first:
    ``|dW| <= u |W|`` (``sub`` below its normal range), which adds at most ``u A + sub (sum |x| + 1)``."""
    z = _mm(x.v, lin.WT) + lin.b
    if not bounds:
        return Bounded(z, np.zeros_like(z))
    A = _mm(np.abs(x.v) + x.err, lin.aWT).astype(np.float64) * SLACK + np.abs(lin.b)
    if correlated:
        inherited = _mm(x.err, lin.aWT).astype(np.float64) * SLACK
    else:
        inherited = np.sqrt(_mm(x.err ** 2, lin.W2T).astype(np.float64) * SLACK)
    err = inherited + LAMBDA * U32 * np.sqrt(lin.n) * A
    if p.stored:
        err = err + p.u * A + p.sub * ((np.abs(x.v) + x.err).sum(axis=-1, keepdims=True) + 1)
        # the result stored in the format, and the product before its bias where the bias is a separate Add
        err = err + p.u * (np.abs(z) + np.abs(z - lin.b) + 2 * err) + 2 * p.sub
    return Bounded(z, err)


def accumulation(n: int) -> float:
    """The relative bound on the rounding error of a sum of ``n`` terms (or an inner product of length
    ``n``) in any order, accumulated in float32 in every format (each operation's unit roundoff
    ``u = U32``), against the sum of the terms' magnitudes: the deterministic
    ``gamma_n = n u / (1 - n u)`` (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1) or
    the probabilistic ``LAMBDA u sqrt(n)`` of the model above, whichever is smaller (short sums: the deterministic one)."""
    u = U32
    return min(n * u / (1 - n * u), LAMBDA * u * np.sqrt(n)) if n * u < 1 else LAMBDA * u * np.sqrt(n)


def clip(x: Bounded, lo: float, hi: float) -> Bounded:
    exact = (x.v - x.err > hi) | (x.v + x.err < lo)  # beyond the clip even with the error: exactly lo/hi
    exact |= np.isinf(x.v)  # float64 overflowed (exp of a huge log_sigma): float32, with less range, did too
    return Bounded(np.clip(x.v, lo, hi), np.where(exact, 0.0, x.err))


def scale(x: Bounded, c: float, p: Precision = FLOAT32) -> Bounded:
    """``x * c`` by a constant (ML-Agents' ``/ 3``): one rounding."""
    v = x.v * c
    return Bounded(v, np.abs(c) * x.err + p.rnd(v))


def sigmoid(x: Bounded, p: Precision = FLOAT32) -> Bounded:
    return Bounded(1.0 / (1.0 + np.exp(-x.v)), 0.25 * x.err + p.e_sigmoid)


def tanh(x: Bounded, p: Precision = FLOAT32) -> Bounded:
    v = np.tanh(x.v)
    return Bounded(v, x.err + p.e_tanh + p.rnd(v))


def exp(x: Bounded, p: Precision = FLOAT32) -> Bounded:
    v = np.exp(x.v)
    hi = np.exp(x.v + x.err)  # increasing: |exp(x + e) - exp(x)| <= exp(x + |e|) - exp(x)
    # hi == v: exact, or both inf (not inf - inf)
    return Bounded(v, np.where(hi == v, 0.0, hi - v) + p.e_exp * hi + p.sub)


def mul(a: Bounded, b: Bounded, p: Precision = FLOAT32) -> Bounded:
    v = a.v * b.v
    return Bounded(v, (np.abs(a.v) + a.err) * b.err + np.abs(b.v) * a.err + p.rnd(v))


def add(a: Bounded, b: Bounded, p: Precision = FLOAT32) -> Bounded:
    v = a.v + b.v
    return Bounded(v, a.err + b.err + p.rnd(v))


def swish(z: Bounded, p: Precision = FLOAT32) -> Bounded:
    """``z * sigmoid(z)`` (ML-Agents' Swish, exported as Sigmoid + Mul)."""
    v = z.v / (1.0 + np.exp(-z.v))
    return Bounded(v, L_SWISH * z.err + (np.abs(z.v) + z.err) * p.e_sigmoid + p.rnd(v))


def stored(x: Bounded, p: Precision) -> Bounded:
    """``x`` (float32 values: an input, the float32 normalizer's output) cast to the format ``p``: one
    rounding when it is a half format, nothing in float32."""
    return Bounded(x.v, x.err + p.rnd(x.v)) if p.stored else x


def matmul(a: Bounded, b: Bounded, p: Precision = FLOAT32) -> Bounded:
    """``a @ b`` over the last axis of ``a`` and the second-to-last of ``b`` (batched MatMul; both
    inexact): each term's inherited error ``|a| e_b + e_a (|b| + e_b)``, root-sum-square over the ``k``
    terms (independent errors, as for :func:`affine`), plus the product's own roundings
    ``accumulation(k) (|a| + e_a) (|b| + e_b)``."""
    v = a.v @ b.v
    k = a.v.shape[-1]
    A = (np.abs(a.v) + a.err) @ (np.abs(b.v) + b.err)
    # sum_k (|a| e_b + e_a (|b| + e_b))^2, expanded into three products
    bb = np.abs(b.v) + b.err
    sq = (a.v ** 2) @ (b.err ** 2) + 2 * (np.abs(a.v) * a.err) @ (b.err * bb) + (a.err ** 2) @ (bb ** 2)
    err = np.sqrt(sq) + accumulation(k) * A * (1 + U32)
    if p.stored:
        err = err + p.u * (np.abs(v) + err) + p.sub  # the result stored in the format
    return Bounded(v, err)


def minus_plus_one(x: Bounded, p: Precision = FLOAT32) -> Bounded:
    """``(x - 1) + 1`` in float32 (ML-Agents' MultiHeadAttention does it to the keys, a workaround for
    Sentis): the same value, two roundings, ``u |x - 1|`` then ``u |x|``, each on the perturbed value."""
    e1 = x.err + p.u * (np.abs(x.v - 1.0) + x.err)
    return Bounded(x.v, e1 + p.u * (np.abs(x.v) + e1))


def layer_norm(x: Bounded, eps: float, p: Precision = FLOAT32) -> Bounded:
    """``(x - mean) / sqrt(mean((x - mean)^2) + eps)`` over the last axis of width ``d`` (ML-Agents'
    parameter-free LayerNorm; ``eps`` the float32 constant the runtimes add), computed in two passes.

    Derivation. Let ``c = x - mean(x)``, ``s = s(c) = sqrt(mean(c^2) + eps)``, ``y = c / s``; every
    perturbation of ``c`` is collected in ``t`` (elementwise bounds):

    - inherited: ``dc_j = dx_j - mean(dx)``; ``|mean(dx)| <= min(mean(e), LAMBDA sqrt(sum e^2) / d)``
      (the worst case, or Hoeffding's bound on a sum of independent errors, as in :func:`affine`);
    - the float32 mean: its sum ``accumulation(d) mean(|x| + e)`` (+ ``u |mean|`` for the scaling);
      the subtraction rounds once more: ``u (|c_j| + t_j)``.

    The divisor: ``s(c + t)^2 - s^2 = 2 mean(c t) + mean(t^2)`` and ``s(c + t) + s >= 2 s - rms(t)``
    (``s(.)`` is a Euclidean norm of ``(c / sqrt(d), sqrt(eps))``: the triangle inequality), so
    ``|s(c + t) - s| <= rho = (2 M + mean(t^2)) / (2 s - rms(t))`` with ``|mean(c t)| <= M =
    min(mean(|c| t), LAMBDA sqrt(sum c^2 t^2) / d)``. Then, exactly, ``|(c + t) / s(c + t) - y| <=
    (t + |y| rho) / (s - rho)``. The float32 divisor ``s^`` is that norm computed: the squares, their
    mean (positive terms: relative ``2 u + accumulation(d)``), ``+ eps`` (``u``) and the sqrt (which
    halves the relative error, and adds 1 ulp = ``2 u`` of its own: MKL's float32 sqrt is faithful, not
    always correctly rounded): ``s^ = s(c + t) (1 + eta)``; the division rounds once (``u``):
    ``|y^ - y~| <= |y~| (u + eta) / (1 - eta)``."""
    v = x.v
    d = v.shape[-1]
    mu = v.mean(axis=-1, keepdims=True)
    c = v - mu
    var = (c * c).mean(axis=-1, keepdims=True)
    s = np.sqrt(var + eps)
    y = c / s
    e = x.err
    me = np.minimum(e.mean(axis=-1, keepdims=True), LAMBDA * np.sqrt((e * e).sum(axis=-1, keepdims=True)) / d)
    e_mu = accumulation(d) * (np.abs(v) + e).mean(axis=-1, keepdims=True) + p.u * np.abs(mu)
    t = e + me + e_mu
    t = t + p.u * (np.abs(c) + t)
    rms_t = np.sqrt((t * t).mean(axis=-1, keepdims=True))
    M = np.minimum((np.abs(c) * t).mean(axis=-1, keepdims=True),
                   LAMBDA * np.sqrt((c * c * t * t).sum(axis=-1, keepdims=True)) / d)
    cs = np.abs(c) + t  # an upper bound of |c + t|, for the divisor's own rounding
    var_t = (cs * cs).mean(axis=-1, keepdims=True)
    r_v = (2 * p.u + accumulation(d)) * (1 + p.u) * var_t / (var_t + eps) + p.u
    eta = r_v / (2 - r_v) + 2 * p.u * (1 + r_v)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(2 * s > rms_t, (2 * M + rms_t ** 2) / (2 * s - rms_t), np.inf)
        near = np.where(s > rho, (t + np.abs(y) * rho) / (s - rho), np.inf)
    return Bounded(y, near + (np.abs(y) + near) * (p.u + eta) / (1 - eta))


def softmax(z: Bounded, axis: int = -1, prec: Precision = FLOAT32) -> Bounded:
    """``exp(z - max) / sum(exp(z - max))`` along ``axis`` (ONNX Softmax, torch.softmax).

    Derivation. Inherited: with ``|dz_i| <= e_i`` and ``E = max_j e_j`` over the row,
    ``p'_i / p_i = exp(dz_i) / sum_j p_j exp(dz_j)`` lies in ``[exp(-e_i - E), exp(e_i + E)]``, so
    ``|p'_i - p_i| <= p_i (exp(e_i + E) - 1)``, exactly. Own roundings, relative to ``p'_i``: the
    subtraction of the max (``u |z_i - max|``, which the exp turns into a relative
    ``exp(u |z_i - max|) - 1``) and the exp kernel (``E_EXP``) give each term ``alpha_i``; the sum of
    positive terms ``max alpha + accumulation(n)``, plus what a term the exp flushes to zero leaves
    (``n 2^-126`` against a sum >= 1); the final division (or multiplication by the reciprocal,
    ``2 u``). A term whose exact value is below ``2^-126`` stays below it (relative bounds are
    meaningless there): its bound is ``2^-126`` plus the inherited part."""
    v = z.v
    m = v.max(axis=axis, keepdims=True)
    ex = np.exp(v - m)
    p = ex / ex.sum(axis=axis, keepdims=True)
    n = v.shape[axis]
    tiny = prec.tiny
    E = z.err.max(axis=axis, keepdims=True)
    grow = np.expm1(z.err + E)
    dist = np.abs(v - m) + z.err + E
    with np.errstate(over="ignore"):
        alpha = np.where(ex * np.exp(-z.err - E) > tiny, np.expm1(prec.u * dist) * (1 + prec.e_exp) + prec.e_exp, 0.0)
    a_sum = alpha.max(axis=axis, keepdims=True) + accumulation(n) * (1 + alpha.max(axis=axis, keepdims=True)) + n * tiny
    own = (1 + alpha) * (1 + 2 * prec.u) / (1 - a_sum) - 1
    err = p * grow + p * (1 + grow) * own
    return Bounded(p, np.where(alpha > 0, err, p * grow + tiny))


def masked_mean(y: Bounded, keep: np.ndarray, eps: float, p: Precision = FLOAT32) -> Bounded:
    """``sum_n keep_n y_n / (sum_n keep_n + eps)`` over axis 1 of ``y`` [B, N, d] (ML-Agents'
    attention pooling; ``keep`` [B, N] exactly 0 or 1, ``eps`` its float32 constant).

    Derivation. Multiplying by 0 or 1 is exact, so the masked terms are exact zeros; the numerator
    inherits ``sum keep e`` (linearly: the rows' errors share the attention's common causes) and its
    own ``accumulation(N) sum keep (|y| + e)``. The count is an exact integer; ``+ eps`` rounds once
    (``u``). The quotient of two inexact values: ``(e_num + |q| e_den) / (den - e_den)``, plus its own
    rounding ``u |q|``. An all-padded set gives ``0 / eps = 0`` exactly, and its bound is 0."""
    k = keep[:, :, None].astype(np.float64)
    num = (y.v * k).sum(axis=1)
    n = y.v.shape[1]
    kept = keep[:, :, None]  # (an infinite bound of a padded entity stays out: inf * 0 would be NaN)
    e_num = (np.where(kept, y.err, 0.0).sum(axis=1)
             + accumulation(n) * np.where(kept, np.abs(y.v) + y.err, 0.0).sum(axis=1))
    den = keep.astype(np.float64).sum(axis=1, keepdims=True) + eps
    if p.stored:  # the numerator stored in the format before the division
        e_num = e_num + p.u * (np.abs(num) + e_num) + p.sub
    e_den = p.u * den
    q = num / den
    return Bounded(q, (e_num + np.abs(q) * e_den) / (den - e_den) + p.u * (np.abs(q) + (e_num + np.abs(q) * e_den) / (den - e_den)))


def conv2d(x: Bounded, lin: Linear, k: int, stride: int, pad: int, bounds: bool = True,
           p: Precision = FLOAT32) -> Bounded:
    """A Conv2d (NCHW, square kernel ``k``, ``stride``, zero padding ``pad``, dilation 1, one group):
    each output element is an inner product of length ``C k k`` plus its bias over the input patch,
    in any order and any algorithm that sums those products (im2col + GEMM, direct): bounded as
    :func:`affine` bounds a Linear (``lin``: the weight viewed [out, C k k]). The padding is exact
    zeros."""
    v, e = x.v, x.err
    if pad:
        widths = ((0, 0), (0, 0), (pad, pad), (pad, pad))
        v, e = np.pad(v, widths), np.pad(e, widths)
    rows, ch, h, w = v.shape
    ho, wo = (h - k) // stride + 1, (w - k) // stride + 1

    def patches(a):
        win = np.lib.stride_tricks.sliding_window_view(a, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        return np.array(win[:, :, :ho, :wo].transpose(0, 2, 3, 1, 4, 5), order="C").reshape(rows, ho * wo, ch * k * k)

    out = affine(Bounded(patches(v), patches(e)), lin, bounds, p=p)
    return Bounded(*(np.ascontiguousarray(a.reshape(rows, ho, wo, -1).transpose(0, 3, 1, 2)) for a in (out.v, out.err)))


def max_pool(x: Bounded, k: int, stride: int) -> Bounded:
    """MaxPool2d (no padding, floor): exact on its inputs; ``|max(a + da) - max(a)| <= max |da|`` over
    the window."""
    def pool(a):
        win = np.lib.stride_tricks.sliding_window_view(a, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        return win.max(axis=(4, 5))

    return Bounded(pool(x.v), pool(x.err))


def leaky_relu(x: Bounded, slope: float, p: Precision = FLOAT32) -> Bounded:
    """``x`` or ``slope x`` (slope < 1: 1-Lipschitz); the product rounds once (``u |v|``, and as much
    again for a kernel whose slope is 0.01 rounded otherwise than the ONNX attribute's float32)."""
    v = np.where(x.v >= 0, x.v, slope * x.v)
    return Bounded(v, x.err + 2 * p.u * np.abs(np.minimum(v, 0)) + 2 * p.sub)


def relu(x: Bounded) -> Bounded:
    """1-Lipschitz and exact."""
    return Bounded(np.maximum(x.v, 0.0), x.err)


def concat(parts) -> Bounded:
    return Bounded(np.concatenate([p.v for p in parts], axis=1), np.concatenate([p.err for p in parts], axis=1))
