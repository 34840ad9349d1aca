"""Issue 3: the rebuilt ONNX equals ML-Agents' own export; the torch module matches it."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import FAMILIES, FIXTURES, GOAL_FAMILIES, HUGGY_RUN, VARIANTS, step_checkpoints, variant_names
from onnx import numpy_helper

import huggy_convert
from huggy_convert import contract as C
from huggy_convert.converter import convert_checkpoint, load_checkpoint, official_divisors
from huggy_convert.errors import DeviceError, ExportError
from huggy_convert.exporters.onnx_export import build_onnx, model_bytes, with_noise_input
from huggy_convert.exporters.torch_module import build_module, export_program
from huggy_convert.core.numerics import ieee_divisor, ulp_distance
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.verify.bounds import judge, reference_forward
from huggy_convert.runtime.feeds import make_noise, make_probes
from huggy_convert.runtime import ort_run, ort_session

CASES = [*step_checkpoints(HUGGY_RUN)] + [step_checkpoints(VARIANTS / v)[-1] for v in variant_names()]
CASES += [step_checkpoints(FAMILIES / name)[-1] for name in GOAL_FAMILIES]  # the observation families that convert
IDS = [p.stem for p in CASES]
HUGGY = step_checkpoints(HUGGY_RUN)[-1]  # Huggy-scale statistics
DET = (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_CONT_DET, C.OUT_DISC_SHAPE, C.OUT_DISC_DET, C.RECURRENT_OUT)

_cache = {}


def case(ckpt: Path):
    """(policy, rebuilt model, official model, golden dict) for one ML-Agents checkpoint."""
    if ckpt not in _cache:
        # as a conversion does: the official ONNX beside it gives the obs split and (auto) the divisor
        prep = prepare_conversion(load_checkpoint(ckpt), ckpt.with_suffix(".onnx"))
        pol, official = prep.conversion.policy, prep.official
        with np.load(ckpt.with_suffix(".golden.npz")) as z:
            golden = {k: z[k] for k in z.files}
        _cache[ckpt] = (pol, build_onnx(pol), official, golden)
    return _cache[ckpt]


def _feed(model, source):
    return {i.name: source[i.name] for i in model.graph.input if i.name in source}


@pytest.mark.parametrize("ckpt", CASES, ids=IDS)
def test_graph_structure_equals_mlagents_export(ckpt):
    pol, ours, official, _ = case(ckpt)
    onnx.checker.check_model(ours, full_check=True)
    # the same op sequence, node for node (torch 2.x's dedup Identity nodes included)
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in official.graph.node]
    # the same inputs/outputs: names, element types, static dims
    io = lambda m, xs: [(v.name, v.type.tensor_type.elem_type,  # noqa: E731
                         [d.dim_value or "?" for d in v.type.tensor_type.shape.dim]) for v in xs]
    assert io(ours, ours.graph.input) == io(official, official.graph.input)
    assert io(ours, ours.graph.output) == io(official, official.graph.output)
    assert ours.opset_import[0].version == official.opset_import[0].version == 9
    # every official initializer has a bitwise-equal counterpart
    have = {(t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in ours.graph.initializer}
    for t in official.graph.initializer:
        assert (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()) in have, t.name


@pytest.mark.parametrize("ckpt", CASES, ids=IDS)
def test_outputs_bitwise_equal_in_onnxruntime(ckpt):
    pol, ours, official, golden = case(ckpt)
    so, sr = ort_session(model_bytes(ours)), ort_session(official.SerializeToString())
    probes = make_probes(pol, 64, seed=3)
    for feed in (_feed(official, golden), probes):
        a, b = ort_run(so, feed), ort_run(sr, feed)
        for name in DET:
            if name in b:
                assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    # the golden outputs ML-Agents' file produced (stored by the generator) are reproduced too
    a = ort_run(so, _feed(official, golden))
    for name in DET:
        if name in golden:
            assert a[name].tobytes() == golden[name].tobytes(), name
    # the stochastic head, bitwise, once the noise is an input of both graphs
    if pol.spec.continuous_size:
        eps = make_noise(pol, 64, seed=3)
        no, nr = ort_session(model_bytes(with_noise_input(ours))), ort_session(with_noise_input(official).SerializeToString())
        f = dict(probes, epsilon=eps)
        assert ort_run(no, f)[C.OUT_CONT].tobytes() == ort_run(nr, f)[C.OUT_CONT].tobytes()


def test_probes_hit_both_clips_on_huggy():
    pol, ours, official, _ = case(HUGGY)
    probes = make_probes(pol, 64, seed=0)
    mean = pol.tensors[C.c_norm(0, C.NORM_MEAN)]
    z = (probes["obs_0"] - mean) / pol.divisor(0)
    assert (np.abs(z) > 5).any(axis=1).sum() >= 16  # rows beyond the normalizer's clip
    det = ort_run(ort_session(official.SerializeToString()), probes)[C.OUT_CONT_DET]
    assert (np.abs(det) == 1.0).sum() > 0  # mu beyond +-3: the action clip


# --- the divisor: IEEE, host-independent; an official one within 1 ulp is adopted ---------------------
def _exp2(q: Fraction) -> int:
    """floor(log2(q)) of a positive rational."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > q else e


def _rn32(q: Fraction) -> Fraction:
    """Round a positive rational to the nearest float32 (ties to even), in exact integer arithmetic."""
    scale = Fraction(2) ** (23 - _exp2(q))  # 24 significant bits
    m = q * scale
    lo = m.numerator // m.denominator
    rest = m - lo
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and lo % 2):
        lo += 1
    return Fraction(lo) / scale


def _sqrt_rn32(q: Fraction) -> Fraction:
    """The float32 nearest to sqrt(q): isqrt at 60 extra bits, then a correctly rounded decision."""
    k = 200
    n = (q.numerator << (2 * k)) // q.denominator
    r = math.isqrt(n)  # floor(sqrt(q) * 2^k), within 1 of it
    approx = Fraction(r, 1 << k)
    cand = _rn32(approx)
    # the nearest float32 to sqrt(q) is cand unless sqrt(q) lies across a midpoint from approx
    ulp = Fraction(2) ** (_exp2(cand) - 23)
    for c in (cand - 2 * ulp, cand - ulp, cand, cand + ulp, cand + 2 * ulp):
        lo, hi = c - ulp / 2, c + ulp / 2
        if lo * lo <= q <= hi * hi:
            return c
    return cand


def _oracle(var: np.ndarray, steps) -> np.ndarray:
    s = Fraction(float(np.float32(steps)))
    return np.array([float(_sqrt_rn32(_rn32(Fraction(float(v)) / s))) for v in var], np.float32)


def test_ieee_divisor_equals_an_exact_rational_oracle():
    """Every fixture's divisor, and 2,000 log-uniform pairs, against correctly rounded float32 division
    then sqrt computed in integers (no floating point, no library kernel)."""
    for ck in CASES:
        pol = case(ck)[0]
        for i in range(len(pol.spec.obs_sizes)) if pol.spec.normalize else ():
            var, steps = pol.tensors[C.c_norm(i, C.NORM_VAR)], pol.tensors[C.c_norm(i, C.NORM_STEPS)]
            assert ieee_divisor(var, steps).tobytes() == _oracle(var, steps).tobytes(), ck.stem
    rng = np.random.default_rng(11)
    var = np.exp(rng.uniform(-20, 25, 2000)).astype(np.float32)
    for steps in (np.float32(1), np.float32(2000068), np.float32(3.0e7)):
        assert ieee_divisor(var, steps).tobytes() == _oracle(var, steps).tobytes()


@pytest.mark.parametrize("ckpt", [c for c in CASES if case(c)[0].spec.normalize], ids=lambda p: p.stem)
def test_official_divisor_is_ieee_or_one_ulp_and_is_adopted(ckpt):
    """ML-Agents folded each official divisor with torch on this project's CPU (MKL's generic sqrt
    path): within 1 ulp of IEEE; the rebuilt ONNX adopts it (auto) and says so in metadata_props."""
    pol, ours, official, _ = case(ckpt)
    found, rebuilt = official_divisors(official), official_divisors(ours)
    for i in range(len(pol.spec.obs_sizes)):
        ieee = ieee_divisor(pol.tensors[C.c_norm(i, C.NORM_VAR)], pol.tensors[C.c_norm(i, C.NORM_STEPS)])
        assert ulp_distance(found[i], ieee).max() <= 1
        assert rebuilt[i].tobytes() == found[i].tobytes() == pol.divisor(i).tobytes()
    meta = {p.key: p.value for p in ours.metadata_props}
    rec = json.loads(meta[C.ONNX_META_DIVISOR])
    differs = sum(v["differs"] for v in rec["observations"].values())
    assert rec["source"] == ("official" if differs else "ieee") and rec["mode"] == "auto"


def test_divisor_comparison_equals_the_generators_record():
    """For every official ONNX, the elements 1 ulp from IEEE are the ones fixtures/generate.py recorded
    in the manifest (its own code, without this package): MKL's generic sqrt path on this project's CPU."""
    from huggy_convert.converter.reference import compare_divisor

    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    families = json.loads((FAMILIES / "manifest.json").read_text())
    seen = 0
    for run in manifest["runs"] + [r for r in families["runs"] if r["name"] in GOAL_FAMILIES]:
        for onnx_rel, per_obs in run.get("divisor_vs_ieee", {}).items():
            official = onnx.load(str(FIXTURES / onnx_rel))
            for obs, rec in per_obs.items():
                ck = load_checkpoint(FIXTURES / rec["checkpoint"])
                pol = prepare_conversion(ck, None).conversion.policy
                i = int(obs.split("_")[1])
                cmp = compare_divisor(official_divisors(official)[i], pol.divisor(i))
                assert (cmp["differs"], cmp["indices"], cmp["max_ulp"]) == \
                    (rec["n_differ"], rec["indices"], rec["max_ulp"]), (onnx_rel, obs)
                seen += 1
    assert seen >= 12 + 12  # the core fixtures, and the goal families (2 runs x 3 ONNX x 2 observations)


def test_ieee_mode_gives_the_same_outputs_within_the_bound_not_bitwise():
    """--divisor ieee: the rebuilt ONNX keeps IEEE; its outputs differ from the official's only within
    the derived bound of the two references (bounds.within_both), and bitwise where no divisor differs."""
    from huggy_convert.verify.bounds import within_both

    prep = prepare_conversion(load_checkpoint(HUGGY), HUGGY.with_suffix(".onnx"), divisor="ieee")
    pol = prep.conversion.policy
    assert json.loads(pol.metadata["divisor"])["source"] == "ieee"
    ours = build_onnx(pol)
    official = prep.official
    feed = make_probes(pol, 64, seed=3)
    a = ort_run(ort_session(model_bytes(ours)), feed)[C.OUT_CONT_DET]
    b = ort_run(ort_session(official.SerializeToString()), feed)[C.OUT_CONT_DET]
    assert a.tobytes() != b.tobytes()
    off_pol = case(HUGGY)[0]
    j = within_both(reference_forward(pol, feed), reference_forward(off_pol, feed), C.OUT_CONT_DET, a, b)
    assert j["ok"] and j["ratio"] < 1, j


def _artifact_bytes(ckpt: Path):
    from huggy_convert.converter import policy_bytes
    from huggy_convert.exporters.pt2 import ProgramWriter

    pol = convert_checkpoint(ckpt).policy  # no reference: IEEE
    mod = build_module(pol)
    state = b"".join(v.numpy().tobytes() for v in mod.state_dict().values())
    program = ProgramWriter().program_bytes(pol)  # its own trace
    return policy_bytes(pol.tensors, pol.metadata), model_bytes(build_onnx(pol)), state, program


def test_artifacts_do_not_use_torchs_cpu_sqrt(monkeypatch):
    """A CPU whose torch.sqrt rounds differently (as MKL's AVX-512 and generic paths do) changes no byte:
    simulated by a torch.sqrt that is 1 ulp off everywhere."""
    small = step_checkpoints(VARIANTS / "small")[-1]
    before = _artifact_bytes(small)
    real = torch.sqrt

    def other_cpu(x, *a, **k):
        y = real(x, *a, **k)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if y.dtype == torch.float32 else y

    monkeypatch.setattr(torch, "sqrt", other_cpu)
    monkeypatch.setattr(torch.Tensor, "sqrt", lambda self: other_cpu(self))
    assert _artifact_bytes(small) == before


@pytest.mark.slow
def test_same_artifacts_under_every_mkl_path(tmp_path):
    """The same checkpoint, no reference: byte-identical .safetensors / .onnx / .pt2 under MKL_CBWR
    unset, AVX2, COMPATIBLE and AVX512 (where the CPU lacks a path, MKL falls back: still identical)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "Huggy-245828.pt").write_bytes(HUGGY.read_bytes())  # no official ONNX beside it
    digests = {}
    for path in ("", "AVX2", "COMPATIBLE", "AVX512"):
        out = tmp_path / (path or "default")
        r = subprocess.run([sys.executable, "-m", "huggy_convert.cli", str(src / "Huggy-245828.pt"), str(out),
                            "--no-verify"], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, MKL_CBWR=path) if path else {k: v for k, v in os.environ.items()
                                                                              if k != "MKL_CBWR"})
        assert r.returncode == 0, r.stderr
        digests[path] = {p.suffix: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}
    assert len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1, digests
    assert set(digests[""]) == {".safetensors", ".onnx", ".pt2"}


@pytest.mark.parametrize("opset", [11, 12, 13, 14, 15])
@pytest.mark.parametrize("ckpt", [HUGGY] + [step_checkpoints(VARIANTS / v)[-1]
                                  for v in ("hybrid", "lstm", "sac")], ids=lambda p: getattr(p, "stem", p))
def test_other_opsets_same_outputs(ckpt, opset):
    pol, ours9, official, golden = case(ckpt)
    m = build_onnx(pol, opset=opset)
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version == opset
    clips = [n for n in m.graph.node if n.op_type == "Clip"]
    assert clips and all(len(n.input) == 3 and not n.attribute for n in clips)  # bounds as inputs from opset 11
    feed = make_probes(pol, 32, seed=5)
    a, b = ort_run(ort_session(model_bytes(m)), feed), ort_run(ort_session(official.SerializeToString()), feed)
    assert [o.name for o in m.graph.output] == [o.name for o in official.graph.output]
    for name in DET:
        if name in b:
            assert np.array_equal(a[name], b[name]), name


def test_unsupported_opset_is_a_clear_error():
    pol = case(CASES[0])[0]
    with pytest.raises(ExportError, match="opset 8 is not supported"):
        build_onnx(pol, opset=8)


# --- the torch module -------------------------------------------------------------------------
def _run(module, feed):
    xs = [torch.from_numpy(feed[n]) for n in module.input_names]
    with torch.no_grad():
        return dict(zip(module.output_names, [o.numpy() for o in module(*xs)]))


@pytest.mark.parametrize("ckpt", CASES, ids=IDS)
def test_module_fp32_cpu_and_official_onnx_within_the_derived_bound(ckpt):
    """The torch module and onnxruntime on ML-Agents' file, each against the float64 reference of the
    canonical tensors: every element within its derived bound (verify.bounds), on a batch (addmm) and
    on single rows (the eager GEMV path); argmax outputs equal."""
    pol, _, official, golden = case(ckpt)
    mod = build_module(pol)
    sr = ort_session(official.SerializeToString())
    golden_feed = _feed(official, golden)
    rows = [{k: v[i:i + 1] for k, v in golden_feed.items()} for i in range(min(16, len(next(iter(golden_feed.values())))))]
    for feed in (golden_feed, make_probes(pol, 64, seed=1), *rows):
        ref = reference_forward(pol, feed)
        for runtime, got in (("torch", _run(mod, feed)), ("onnxruntime", ort_run(sr, feed))):
            for name in ref.values:
                j = judge(ref, name, got[name])
                assert j["ok"], (runtime, name, j)
                if name == C.OUT_DISC_DET:
                    assert j["equal"] == j["count"], (runtime, j)  # no float32 tie on these inputs


def test_the_bound_catches_wrong_weights():
    """The derived bound is far above float32 rounding but below real mistakes: weights rounded to
    bfloat16, one first-layer weight off by 1e-2, or one action bias off by 1e-3 all fail it."""
    from dataclasses import replace

    pol = case(HUGGY)[0]
    feed = make_probes(pol, 64, seed=1)
    ref = reference_forward(pol, feed)

    def broken(edit):
        T = dict(pol.tensors)
        edit(T)
        return judge(ref, C.OUT_CONT_DET, _run(build_module(replace(pol, tensors=T)), feed)[C.OUT_CONT_DET])

    def bf16(T):
        for k in [k for k in T if k.startswith("body.")]:
            T[k] = torch.from_numpy(T[k]).bfloat16().float().numpy()

    def weight(T):
        T[C.c_body(0, "weight")] = T[C.c_body(0, "weight")].copy()
        T[C.c_body(0, "weight")][7, 3] += 1e-2

    def bias(T):
        T[C.C_MU_B] = T[C.C_MU_B].copy()
        T[C.C_MU_B][0] += 1e-3

    for edit in (bf16, weight, bias):
        j = broken(edit)
        assert not j["ok"] and j["over"] > 0 and j["ratio"] > 1, (edit.__name__, j)
    assert judge(ref, C.OUT_CONT_DET, _run(build_module(pol), feed)[C.OUT_CONT_DET])["ok"]


@pytest.mark.parametrize("ckpt", CASES, ids=IDS)
def test_sample_draws_noise_on_cpu_from_the_seed(ckpt):
    pol, _, official, _ = case(ckpt)
    mod = build_module(pol)
    feed = make_probes(pol, 16, seed=2)
    xs = [torch.from_numpy(feed[n]) for n in mod.input_names]
    a, b, c = mod.sample(*xs, seed=7), mod.sample(*xs, seed=7), mod.sample(*xs, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(not torch.equal(x, y) for x, y in zip(a, c))
    if pol.spec.continuous_size:  # equals ML-Agents' graph fed the same noise
        eps, _ = mod.draw_noise(16, 7)
        ref = ort_run(ort_session(with_noise_input(official).SerializeToString()), dict(feed, epsilon=eps.numpy()))
        r64 = reference_forward(pol, feed, eps.numpy())
        assert judge(r64, C.OUT_CONT, a[0].numpy())["ok"] and judge(r64, C.OUT_CONT, ref[C.OUT_CONT])["ok"]
    if pol.spec.discrete_branches:  # sampled actions respect the masks
        d = a[-1].numpy()
        start = 0
        for bi, n in enumerate(pol.spec.discrete_branches):
            assert feed[C.ACTION_MASKS][np.arange(16), start + d[:, bi]].all()
            start += n


def test_module_compiles_with_full_graph():
    for ck in (HUGGY, step_checkpoints(VARIANTS / "hybrid")[-1],
               step_checkpoints(VARIANTS / "lstm")[-1]):
        pol = case(ck)[0]
        mod = build_module(pol)
        feed = make_probes(pol, 8, seed=4)
        xs = [torch.from_numpy(feed[n]) for n in mod.input_names]
        compiled = torch.compile(mod, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            for x, y in zip(compiled(*xs), mod(*xs)):
                assert torch.equal(x, y)


def test_one_row_gives_the_same_bits_in_every_grad_mode_within_the_bound():
    """Huggy's shape at batch 1 (a Unity-style call: one row, eager): autograd off, under
    inference_mode and out of place with autograd on give the same bits, row after row; and every row
    is within the derived bound of the float64 reference."""
    pol = case(HUGGY)[0]
    mod = build_module(pol)
    feed = make_probes(pol, 16, seed=8)
    x = torch.from_numpy(feed["obs_0"])
    with torch.no_grad():
        fast = [mod(x[i:i + 1])[0] for i in range(16)]
    with torch.inference_mode():
        assert all(torch.equal(mod(x[i:i + 1])[0], fast[i]) for i in range(16))
    with torch.enable_grad():  # out of place, autograd on: the same numbers again
        assert all(torch.equal(mod(x[i:i + 1])[0].detach(), fast[i]) for i in range(16))
    assert all(f.shape == (1, pol.spec.continuous_size) for f in fast)
    ref = reference_forward(pol, feed)
    rows = np.concatenate([r.numpy() for r in fast])
    assert judge(ref, C.OUT_CONT_DET, rows)["ok"]


def test_one_row_of_a_copied_or_cast_module_reads_its_own_weights():
    """A deep copy whose weights are then changed answers one row with its weights, the original with
    its own; a module moved with ``.to(float64)`` computes in float64 with its normalizer kept float32
    and answers float32, as every head does (the one-row path reads the module it is called on, never
    what it was built from)."""
    import copy

    pol = case(HUGGY)[0]
    mod = build_module(pol)
    x = torch.from_numpy(make_probes(pol, 1, seed=3)["obs_0"])
    with torch.inference_mode():
        before = mod(x)[0].clone()
        twin = copy.deepcopy(mod)
        twin.mu.bias.add_(1.0)
        twin.body[0].weight.mul_(0.5)
        assert torch.equal(mod(x)[0], before)
        assert not torch.equal(twin(x)[0], before)
    with torch.enable_grad():  # the flow (out of place) on the copy: the same numbers as its one-row path
        assert torch.equal(twin(x)[0].detach(), torch.inference_mode()(lambda: twin(x)[0])())
    export_program(twin)  # torch.export swaps fakes into the module while it traces: one row after it is real again
    with torch.inference_mode():
        after = twin(x)[0]
    assert type(after) is torch.Tensor and torch.equal(after, torch.inference_mode()(lambda: twin(x)[0])())
    assert not torch.equal(after, before)
    wide = copy.deepcopy(mod).to(torch.float64)
    with torch.inference_mode():
        out = wide(x.double())[0]
    assert wide.compute_dtype == torch.float64 and wide.body[0].weight.dtype == torch.float64
    assert out.dtype == torch.float32 and wide.pinned_dtypes() == {"norm0_mean": "float32", "norm0_div": "float32"}
    assert float((out - before.double()).abs().max()) < 1e-5


def test_autograd_path_equals_the_in_place_path_and_backpropagates():
    """forward works in place only with autograd off; with it on, the same numbers and a gradient."""
    for ck in (HUGGY, step_checkpoints(VARIANTS / "hybrid")[-1], step_checkpoints(VARIANTS / "twoobs")[-1]):
        pol = case(ck)[0]
        mod = build_module(pol)
        feed = make_probes(pol, 8, seed=6)
        with torch.inference_mode():
            fast = mod(*[torch.from_numpy(feed[n]) for n in mod.input_names])
        xs = [torch.from_numpy(feed[n]).requires_grad_(n.startswith("obs_")) for n in mod.input_names]
        slow = mod(*xs)
        for a, b in zip(fast, slow):
            assert torch.equal(a, b.detach())
        if pol.spec.continuous_size:
            slow[0].sum().backward()
            g = xs[0].grad
            assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


def test_fp16_keeps_the_normalizer_float32_where_a_naive_cast_breaks():
    pol, _, official, _ = case(HUGGY)  # Huggy-scale statistics
    feed = make_probes(pol, 64, seed=0)
    ref = ort_run(ort_session(official.SerializeToString()), feed)[C.OUT_CONT_DET]
    ours = build_module(pol, dtype="float16")
    assert ours.pinned_dtypes() and set(ours.pinned_dtypes().values()) == {"float32"}
    ours.half()  # a whole-module cast does not reach the pinned statistics either
    assert ours.pinned_dtypes() and set(ours.pinned_dtypes().values()) == {"float32"}
    assert {str(b.dtype) for _, b in ours.named_buffers()} == {"torch.float32"}
    got = _run(ours, feed)[C.OUT_CONT_DET]
    cos = float(np.dot(got.ravel(), ref.ravel()) / np.linalg.norm(got) / np.linalg.norm(ref))
    assert np.isfinite(got).all() and cos >= 0.999 and np.abs(got - ref).max() <= 1e-2
    # the trap of a whole-model .half() of ML-Agents' normalizer: the running sums and the step count
    # overflow fp16, so the observation becomes 0 (or NaN)
    var16 = torch.from_numpy(pol.tensors[C.c_norm(0, C.NORM_VAR)]).half()
    steps16 = torch.from_numpy(pol.tensors[C.c_norm(0, C.NORM_STEPS)]).half()
    x = torch.from_numpy(feed["obs_0"]).half()
    mean16 = torch.from_numpy(pol.tensors[C.c_norm(0, C.NORM_MEAN)]).half()
    normalized = torch.clamp((x - mean16) / torch.sqrt(var16 / steps16), -5, 5)
    assert torch.isinf(var16).any() and torch.isinf(steps16)
    bad = ~torch.isfinite(normalized) | (normalized == 0)
    assert bad.float().mean() > 0.5
    # even the folded divisor in fp16 (which fits) breaks the fp16 threshold: x - mean loses its digits
    naive = build_module(pol, dtype="float16", normalizer_dtype="float16")
    naive_out = _run(naive, feed)[C.OUT_CONT_DET]
    assert not np.isfinite(naive_out).all() or np.abs(naive_out - ref).max() > 1e-2


def test_saved_program_loads_with_plain_torch_and_reproduces(tmp_path):
    pol = case(HUGGY)[0]
    mod = build_module(pol)
    from huggy_convert.exporters.torch_module import save_program

    ep = export_program(mod)
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "aten.addmm.default" in ops and "aten.addmv.default" not in ops, ops  # one form for every batch
    assert not [o for o in ops if o.split(".")[1].endswith("_")], ops  # functional: the eager path's in-place ops stay out
    save_program(ep, tmp_path / "p.pt2")
    # reproducible wherever the package lives: no source path or line numbers in the archive
    src = str(Path(huggy_convert.__file__).parent)
    with zipfile.ZipFile(tmp_path / "p.pt2") as z:
        assert not any(src.encode() in z.read(n) for n in z.namelist())
    feed = make_probes(pol, 5, seed=9)
    np.save(tmp_path / "x.npy", feed["obs_0"])
    expected = _run(mod, feed)[C.OUT_CONT_DET]
    code = ("import sys\n"
            "class Block:  # this package is not there for the loader\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'huggy_convert': raise ImportError('blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import numpy as np, torch\n"
            "ep = torch.export.load(sys.argv[1])\n"
            "y = ep.module()(torch.from_numpy(np.load(sys.argv[2])))[0]\n"
            "np.save(sys.argv[3], y.detach().numpy())\n"
            "assert not any(m.startswith('huggy_convert') for m in sys.modules)\n")
    r = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "p.pt2"), str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "y.npy").tobytes() == expected.tobytes()


def test_devices_without_their_runtime_are_clear_errors():
    pol = case(CASES[0])[0]
    with pytest.raises(DeviceError, match="torch_npu is not installed"):
        build_module(pol, device="npu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):
            build_module(pol, device="cuda")
    with pytest.raises(DeviceError, match="unknown device"):
        build_module(pol, device="tpu")
    assert "torch_npu" not in sys.modules
