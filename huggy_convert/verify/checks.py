"""Checks 1 and 3 of the verification (checks 2, 4 and 5: :mod:`.structure`, :mod:`.runtimes`,
:mod:`.fingerprints`; 6: :mod:`.record`).

1. safetensors vs checkpoint: every tensor bitwise equal to its source key.
2. rebuilt ONNX vs official: I/O (names, dtypes, dims), opset, op sequence, initializers bitwise.
3. outputs: onnxruntime rebuilt vs onnxruntime official on seeded probes (+ golden inputs):
   deterministic and constant outputs bitwise, the stochastic heads bitwise with injected noise
   (an integer one: valid and unmasked).
4. the runtimes (onnxruntime, the torch module on every device and dtype, the saved .pt2) against
   the float64 reference.
5. determinism: sha256 fingerprints of seeded 64- and 128-step action sequences.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from .. import contract as C
from ..converter import Checkpoint
from ..converter.reference import compare_divisor, divisor_record, policy_ieee_divisors, ulp_problem
from ..core.flow import MASK, SAMPLED, IOSignature
from ..core.policy import Policy
from ..errors import describe
from ..runtime.base import Runner
from .compare import array_stats, first_diff_text, stats_text
from .fingerprints import fingerprint, reference_fingerprint  # noqa: F401 (their home before the split)
from .report import FAIL, PASS, SKIP, Check
from .structure import check_onnx_structure, op_sequence  # noqa: F401 (their home before the split)

STOCHASTIC_OUTPUTS = (C.OUT_CONT, C.OUT_DISC)

__all__ = ["check_safetensors", "check_divisor_tensors", "check_outputs", "STOCHASTIC_OUTPUTS",
           "check_onnx_structure", "op_sequence", "fingerprint", "reference_fingerprint"]


# --- 1 ---------------------------------------------------------------------------------------
def check_safetensors(policy: Policy, ckpt: Optional[Checkpoint], path_name: str) -> Check:
    c = Check("1 safetensors vs checkpoint", id="safetensors")
    if ckpt is None:
        c.status, c.summary = SKIP, "no checkpoint given"
        return c
    import torch

    equal, bad = 0, []
    derived = {C.c_divisor(i) for i, _ in policy.spec.vector_obs} if policy.spec.normalize else set()
    div_line = check_divisor_tensors(policy, bad)
    for name, arr in sorted(policy.tensors.items()):
        if name in derived:
            continue
        key = policy.sources.get(name)
        if key is None or key not in ckpt.policy:
            bad.append(f"{name}: source key {key!r} not in {ckpt.path.name}")
            continue
        src = ckpt.policy[key].detach().cpu()
        want = src.to(torch.float32).numpy() if src.dtype != torch.float32 else src.numpy()
        if src.dtype == torch.int64 and src.numel() == 1 and abs(int(src.reshape(-1)[0])) >= C.FLOAT32_EXACT_INT_LIMIT:
            exact = policy.exact_steps.get(name)
            if exact != int(src.reshape(-1)[0]):
                bad.append(f"{name}: exact step count {exact} != checkpoint {int(src.reshape(-1)[0])}")
                continue
        if want.shape != arr.shape or want.dtype != arr.dtype or want.tobytes() != arr.tobytes():
            s = array_stats(want.reshape(arr.shape) if want.size == arr.size else want, arr)
            bad.append(f"{name} (from {key}) differs{first_diff_text(name, s)}")
        else:
            equal += 1
    n = len(policy.tensors) - len(derived)
    c.figures = {"tensors": n, "bitwise_equal": equal, "file": path_name, "checkpoint_sha256": ckpt.sha256,
                 "divisor": div_line}
    whose = f"the tensors recovered from {ckpt.path.name}" if ckpt.recovered else "their checkpoint keys"
    c.summary = f"{equal}/{n} tensors bitwise equal to {whose}" + (f"; divisor {div_line}" if div_line else "")
    if bad:
        c.status = FAIL
        c.summary += "; " + bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
        c.figures["differences"] = bad
    return c


def check_divisor_tensors(policy: Policy, bad: List[str]) -> str:
    """The stored divisors against ``sqrt(variance / steps)`` recomputed IEEE-exactly: equal, or (when the
    metadata says adopted from the official ONNX) within 1 ulp; appends what is wrong to ``bad``."""
    if not policy.spec.normalize:
        return ""
    adopted = divisor_record(policy).get("source") == "official"
    ieee = policy_ieee_divisors(policy)
    differs = 0
    for i, want in ieee.items():
        got = policy.tensors.get(C.c_divisor(i))
        if got is None or got.shape != want.shape:
            bad.append(f"{C.c_divisor(i)}: missing or of the wrong shape")
            continue
        cmp = compare_divisor(got, want)
        differs += cmp["differs"]
        p = ulp_problem(cmp, C.c_divisor(i), "IEEE sqrt(variance/steps)", 1 if adopted else 0,
                        "" if adopted else "the metadata says IEEE")
        if p:
            bad.append(p)
    if adopted:
        return f"adopted from the official ONNX ({differs} element(s) 1 ulp from IEEE)"
    return "IEEE (recomputed: bitwise equal)" if not differs else "NOT the IEEE value"


# --- 3 ---------------------------------------------------------------------------------------
def _levels_valid(actions: np.ndarray, masks: Optional[np.ndarray], levels: Sequence[int]) -> Optional[str]:
    """Why integer ``actions`` are not valid choices (``Port.levels``: each column's count of choices),
    or choose a choice ``masks`` rules out (the mask input: one column per choice, in column order)."""
    start = 0
    for b, n in enumerate(levels):
        a = actions[:, b]
        if np.any(a < 0) or np.any(a >= n):
            return f"branch {b} action outside 0..{n - 1}"
        if masks is not None and np.any(masks[np.arange(len(a)), start + a] == 0):
            return f"branch {b} chose a masked action"
        start += n
    return None


def _mask_of(sig: IOSignature, feed: Dict[str, np.ndarray], levels: Sequence[int]) -> Optional[np.ndarray]:
    """The feed's mask input of an integer output with ``levels`` (one column per choice), if any."""
    port = next((p for p in sig.inputs if p.kind == MASK and p.width == sum(levels)), None)
    return None if port is None else feed.get(port.name)


def check_outputs(ours: Runner, ref: Runner, feeds: Dict[str, Dict[str, np.ndarray]],
                  noise: Dict[str, np.ndarray], policy: Policy, ref_name: str, fallback=None) -> Check:
    """onnxruntime on the rebuilt ONNX (``ours``) vs the reference (``ref``: onnxruntime on the official
    file, or the golden outputs it wrote earlier): deterministic and constant outputs bitwise; with the
    injected ``noise`` of a feed (``Runner.sample``), the outputs it enters bitwise too.

    ``fallback``: where bitwise equality is not expected — the divisors differ by 1 ulp by request
    (``--divisor ieee``), or the golden outputs were written on another host — ``(reason,
    judge(feed_name, feed, output, ours, ref) -> figures)`` judges a float output by the derived
    bound instead (``bounds.within_both``)."""
    c = Check(f"3 outputs: rebuilt vs {ref_name}", id="outputs")
    sig = policy.spec.io_signature()
    constants = {p.name for p in sig.constant_outputs()}
    verdict = _verdict(fallback, constants)
    per_output: Dict[str, List[Dict]] = {}
    for feed_name, feed in feeds.items():
        try:
            ro, rr = ours.infer(feed), ref.infer(feed)
        except Exception as exc:
            c.add(Check(f"[{feed_name}]", FAIL, f"could not run: {describe(exc)}"))
            continue
        for name in rr:
            if name not in ro:
                c.add(Check(f"{name} [{feed_name}]", FAIL, "missing from the rebuilt model"))
                continue
            port = sig.port(name) if name in sig.output_names() else None
            if port is not None and port.kind == SAMPLED:
                if port.levels:
                    why = _levels_valid(ro[name], _mask_of(sig, feed, port.levels), port.levels)
                    c.add(Check(f"{name} [{feed_name}]", FAIL if why else PASS,
                                why or "sampled actions valid and unmasked (Multinomial has no seed: not bitwise)"))
                continue
            s = array_stats(rr[name], ro[name])
            per_output.setdefault(name, []).append(s)
            c.add(verdict(name, feed_name, feed, ro[name], rr[name], s))
        if feed_name in noise:
            _check_noised(c, (ours, ref), (feed_name, feed, noise[feed_name]), verdict, per_output)
    c.figures = {"feeds": {k: int(next(iter(v.values())).shape[0]) for k, v in feeds.items()}}
    c.summary = ", ".join(f"{k}: {sum(x['bitwise_equal'] for x in v)}/{sum(x['count'] for x in v)} bitwise"
                          for k, v in per_output.items())
    return c


def _verdict(fallback, constants):
    """check_outputs' judge of one output: bitwise, else (``fallback``) a float output by the derived bound."""
    def verdict(name: str, feed_name: str, feed, a, b, s) -> Check:
        ok = s["bitwise_equal"] == s["count"] and "shape_mismatch" not in s and a.dtype == b.dtype
        if ok:
            return Check(f"{name} [{feed_name}]", PASS, "bitwise " + stats_text(s), figures=s)
        if fallback is not None and "shape_mismatch" not in s and a.dtype == b.dtype and a.dtype.kind == "f" \
                and name not in constants:
            reason, judge = fallback
            j = judge(feed_name, feed, name, a, b)
            fig = dict(s, bound_ratio=j["ratio"], over_bound=j["over"])
            return Check(f"{name} [{feed_name}]", PASS if j["ok"] else FAIL,
                         f"not bitwise ({reason}): {stats_text(s)}; {'within' if j['ok'] else 'OVER'} the derived bound "
                         f"(max error/bound {j['ratio']:.3g}" + ("" if j["ok"] else f", {j['over']} element(s) over") + ")",
                         figures=fig)
        return Check(f"{name} [{feed_name}]", FAIL, "NOT bitwise: " + stats_text(s) + first_diff_text(name, s), figures=s)
    return verdict


def _check_noised(c: Check, pair, fed, verdict, per_output) -> None:
    """The outputs the injected noise enters, ours (``pair[0]``) against the reference's, on ``fed``:
    (feed name, feed, noise)."""
    (ours, ref), (feed_name, feed, noise) = pair, fed
    f2 = dict(feed, **{C.NOISE_INPUT: noise})
    try:
        a, b = ours.sample(feed, noise=noise)[C.OUT_CONT], ref.sample(feed, noise=noise)[C.OUT_CONT]
    except Exception as exc:
        c.add(Check(f"{C.OUT_CONT} with injected noise [{feed_name}]", FAIL, f"could not run: {describe(exc)}"))
        return
    s = array_stats(b, a)
    per_output.setdefault(C.OUT_CONT + " (injected noise)", []).append(s)
    ch = verdict(C.OUT_CONT, feed_name, f2, a, b, s)
    ch.title = f"{C.OUT_CONT} with injected noise [{feed_name}]"
    c.add(ch)
