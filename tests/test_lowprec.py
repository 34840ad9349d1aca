"""Issue 23 item 1: float16 and bfloat16 runtimes judged the way float32 is, by bounds derived from the
float64 reference (core.bounds.Precision): exact conversions pass, real defects fail, an argmax flip
passes exactly when its float64 logit margin is within its bound."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import FAMILIES, HUGGY_RUN, family_step, step_checkpoints, variant_ckpt

from huggy_convert import contract as C
from huggy_convert.converter import load_checkpoint
from huggy_convert.exporters.torch_module import build_module
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime.feeds import make_noise, make_probes
from huggy_convert.runtime.base import RunnerBase
from huggy_convert.runtime.torch_runners import ModuleRunner
from huggy_convert.core.bounds import FLOAT32, PRECISIONS
from huggy_convert.verify.bounds import Float64Policy
from huggy_convert.verify import VerifyOptions
from huggy_convert.verify.runtimes import check_runtime
from huggy_convert.verify.report import FAIL, PASS

HALF = ("float16", "bfloat16")


def policy_of(ckpt, official=None):
    return prepare_conversion(load_checkpoint(ckpt), official).conversion.policy


def judged(pol, mod, dtype, feed, ref_pol=None):
    """check 4's judgement of ``mod`` (a torch module in ``dtype``) against the float64 reference of
    ``ref_pol`` (default: ``pol``) with the bounds of ``dtype``."""
    ref = Float64Policy(ref_pol or pol).forward(feed, precision=PRECISIONS[dtype])
    run = ModuleRunner(mod, dtype)
    return check_runtime(f"torch module cpu {dtype}", run, ref, feed, pinned=mod.pinned_dtypes())


class Fixed(RunnerBase):
    """A runtime that gives ``out`` whatever the feed, in ``dtype``."""

    def __init__(self, out, dtype):
        self.out, self.dtype = out, dtype

    def infer(self, feed):
        return self.out


def with_tensor(pol, name, fn):
    t = dict(pol.tensors)
    t[name] = fn(t[name].copy())
    return replace(pol, tensors=t)


EXACT = [variant_ckpt(v) for v in ("discrete", "lstm", "hybrid")] + [
    "attention", "goal_hyper", "goal_none", "visual_simple", "visual_nature_cnn", "visual_resnet", "visual_match3",
    "visual_fully_connected", "visual_vector", "attention_mlagents030", "visual_simple_mlagents030"]


@pytest.mark.parametrize("case", EXACT, ids=lambda c: c if isinstance(c, str) else c.parent.parent.name)
def test_exact_conversions_pass_in_float16_and_bfloat16(case):
    """Every exact conversion of the fixtures passes its float16 and bfloat16 module checks under the
    derived bound (no threshold), each output's error/bound printed as float32's is."""
    if isinstance(case, str):
        pt, off, _ = family_step(case)
        pol = policy_of(pt, off)
    else:
        pol = policy_of(case)
    feed = make_probes(pol, 64, 0)
    for dt in HALF:
        c = judged(pol, build_module(pol, dtype=dt), dt, feed)
        assert c.status == PASS, (dt, [(ch.title, ch.summary) for ch in c.children])
        for ch in c.children:
            if ch.figures.get("ratio") is not None:
                assert "error/bound" in ch.summary and 0 <= ch.figures["ratio"] < 1


def test_half_bounds_are_wider_than_float32_and_float32_is_the_default():
    """The default precision is float32: ``forward(feed)`` gives the same values and bounds as
    ``precision=FLOAT32``, bitwise; and with float16's precision the values are the same, each half
    format's bound at least float32's, element by element (bfloat16's at least float16's)."""
    pol = policy_of(variant_ckpt("lstm"))
    fp, feed = Float64Policy(pol), make_probes(pol, 16, 0)
    noise = make_noise(pol, 16, 0)
    base, f32 = fp.forward(feed, noise), fp.forward(feed, noise, precision=FLOAT32)
    for k in base.bounds:
        assert base.bounds[k].tobytes() == f32.bounds[k].tobytes()
        assert base.values[k].tobytes() == f32.values[k].tobytes()
    f16, bf16 = (fp.forward(feed, noise, precision=PRECISIONS[d]) for d in HALF)
    for k in base.bounds:
        assert np.array_equal(f16.values[k], base.values[k])
        assert (f16.bounds[k] >= base.bounds[k]).all() and (bf16.bounds[k] >= f16.bounds[k]).all(), k


def test_a_float16_normalizer_fails_the_float16_bound():
    """Huggy's statistics in a float16 normalizer (x - mean loses its digits; the running sums overflow
    float16) fail the float16 check: over the derived bound, with the diagnosis."""
    pol = policy_of(step_checkpoints(HUGGY_RUN)[-1])
    assert pol.tensors[C.c_norm(0, C.NORM_VAR)].max() > np.finfo(np.float16).max  # ~1e8 overflows float16
    feed = make_probes(pol, 64, 0)
    good = judged(pol, build_module(pol, dtype="float16"), "float16", feed)
    assert good.status == PASS, [(ch.title, ch.summary) for ch in good.children]
    c = judged(pol, build_module(pol, dtype="float16", normalizer_dtype="float16"), "float16", feed)
    assert c.status == FAIL and "normalizer buffer norm0_div is float16" in c.summary, c.summary
    det = next(ch for ch in c.children if ch.title == C.OUT_CONT_DET)
    assert det.status == FAIL and "OVER the bound" in det.summary and det.figures["ratio"] > 1


@pytest.mark.parametrize("offset", [0.5, 0.02])
@pytest.mark.parametrize("dtype", HALF)
def test_a_wrong_weight_fails_in_half_precision(dtype, offset):
    """One action weight off by 0.5 (a visible amount) or by 0.02 (a small one; every runtime the same):
    over the bound in float16 and in bfloat16 alike (a failure, never a bfloat16 warning)."""
    pol = policy_of(variant_ckpt("hybrid"))
    feed = make_probes(pol, 64, 0)
    bad = with_tensor(pol, C.C_MU_W, lambda w: (w.__setitem__((0, 0), w[0, 0] + offset), w)[1])
    c = judged(bad, build_module(bad, dtype=dtype), dtype, feed, ref_pol=pol)
    assert c.status == FAIL, [(ch.title, ch.summary) for ch in c.children]
    det = next(ch for ch in c.children if ch.title == C.OUT_CONT_DET)
    assert det.status == FAIL and "OVER the bound" in det.summary


def _near_tie(pol, top: float, delta: float):
    """``pol`` with branch 0's action 1 a copy of action 0, both biased to ``top`` (above every other
    logit), action 1's bias ``delta`` higher: float64 picks action 1 by the margin ``delta``."""
    w, b = C.c_branch(0, "weight"), C.c_branch(0, "bias")
    pol = with_tensor(pol, w, lambda a: (a.__setitem__(1, a[0]), a)[1])
    return with_tensor(pol, b, lambda a: (a.__setitem__(slice(0, 2), np.float32([top, top + delta])), a)[1])


def test_a_near_tie_flipped_by_float16_passes_with_its_margin():
    """A probe row whose top two float64 logits differ by less than the float16 bound, where float16
    cannot tell them apart (the two biases 32 and 32 + 2^-16 are one float16, 32, and the weights are
    the same row) and picks the first: PASS, the margin printed."""
    pol = policy_of(variant_ckpt("discrete"))
    feed = make_probes(pol, 64, 0)
    feed[C.ACTION_MASKS] = np.ones_like(feed[C.ACTION_MASKS])
    tie = _near_tie(pol, 32.0, 2.0 ** -16)
    ref = Float64Policy(tie).forward(feed, precision=PRECISIONS["float16"])
    assert (ref.values[C.OUT_DISC_DET][:, 0] == 1).all()
    mod = build_module(tie, dtype="float16")
    got = ModuleRunner(mod).infer(feed)[C.OUT_DISC_DET]
    assert (got[:, 0] == 0).all()  # float16: equal logits, the first is picked
    c = judged(tie, mod, "float16", feed)
    ch = next(ch for ch in c.children if ch.title == C.OUT_DISC_DET)
    assert ch.status == PASS and "float16 tie(s)" in ch.summary and "margin 1.53e-05 <= bound" in ch.summary, ch.summary
    assert len(ch.figures["flips"]) == 64
    for f in ch.figures["flips"]:
        assert abs(f["margin"] - 2.0 ** -16) < 1e-12 and f["margin"] <= f["bound"]
    # float32 tells them apart: the same policy in float32 picks action 1 everywhere and passes
    c32 = judged(tie, build_module(tie), "float32", feed)
    assert c32.status == PASS


def test_a_flip_far_above_its_bound_fails_with_its_margin():
    """A runtime that picks a clearly worse action (its float64 margin far above the bound) fails, in
    float16 and in bfloat16, the margin and the bound printed."""
    pol = policy_of(variant_ckpt("discrete"))
    feed = make_probes(pol, 64, 0)
    feed[C.ACTION_MASKS] = np.ones_like(feed[C.ACTION_MASKS])
    for dt in HALF:
        ref = Float64Policy(pol).forward(feed, precision=PRECISIONS[dt])
        lg = ref.logits[0]
        worst = np.argmin(lg.v, axis=1)
        margins = lg.v[np.arange(len(worst)), ref.values[C.OUT_DISC_DET][:, 0]] - lg.v[np.arange(len(worst)), worst]
        row = int(np.argmax(margins / (lg.err.max(axis=1) + 1e-300)))
        out = ref.values[C.OUT_DISC_DET].copy()
        out[row, 0] = worst[row]
        c = check_runtime(f"a wrong runtime {dt}", Fixed({C.OUT_DISC_DET: out}, dt), ref, feed)
        ch = next(ch for ch in c.children if ch.title == C.OUT_DISC_DET)
        assert ch.status == FAIL and "OVER the bound" in ch.summary and "margin" in ch.summary, ch.summary
        f = ch.figures["first_failure"]
        assert f["margin"] > f["bound"]


def test_user_tolerance_still_takes_precedence_in_half_precision():
    """``--atol OUTPUT:value`` judges that output by the user's rule, as before (bfloat16 over it: a
    warning, the user's threshold)."""
    pol = policy_of(variant_ckpt("hybrid"))
    feed = make_probes(pol, 16, 0)
    mod = build_module(pol, dtype="float16")
    ref = Float64Policy(pol).forward(feed, precision=PRECISIONS["float16"])
    c = check_runtime("m", ModuleRunner(mod, "float16"), ref, feed, VerifyOptions(atol={C.OUT_CONT_DET: 1e-12}))
    ch = next(ch for ch in c.children if ch.title == C.OUT_CONT_DET)
    assert ch.status == FAIL and "over tolerance (atol 1e-12" in ch.summary


def test_a_batch_and_verify_out_give_the_single_conversions_half_verdicts(tmp_path):
    """The LSTM run: the single conversion, the batch (its newest checkpoint: the full profile) and
    ``verify OUT/`` judge the float16 and bfloat16 modules alike, by the derived bound (recurrent_out
    included), and pass."""
    import json

    from click.testing import CliRunner

    from huggy_convert.cli import main
    from huggy_convert.pipeline import ConvertOptions, convert_one

    ck = variant_ckpt("lstm")
    single = convert_one(ck, tmp_path / "one", ConvertOptions(program=False))
    assert single.report.ok

    def half_rows(checks):
        c4 = next(c for c in checks if c["id"] == "runtimes")
        return {c["title"]: (c["status"], "error/bound" in c["summary"]) for c in c4["checks"]
                if c["title"].endswith(HALF)}

    want = half_rows(single.report.to_dict()["checks"])
    assert want == {"torch module cpu float16": ("pass", True), "torch module cpu bfloat16": ("pass", True)}
    r = CliRunner().invoke(main, [str(ck.parent.parent), str(tmp_path / "batch"), "--no-program"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "batch" / f"{ck.stem}.verify.json").read_text())
    assert half_rows(doc["checks"]) == want
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "batch")])
    assert r.exit_code == 0 and "PASS" in r.output, r.output
