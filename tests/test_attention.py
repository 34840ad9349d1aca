"""Issue 12, attention: a variable-length observation (entities) beside vector observations, against
the files ML-Agents' own code wrote (fixtures/families/attention: mlagents 1.1.0, torch 2.x;
fixtures/families/attention_mlagents030: mlagents 0.30.0, torch 1.11)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import (FIXTURES, assert_back_to_the_checkpoint, assert_rebuilt_outputs_bitwise, family_step,
                      load_families)
from onnx import numpy_helper

from huggy_convert import contract as C
from huggy_convert.converter import load_checkpoint
from huggy_convert.converter.policy_file import dumps, loads
from huggy_convert.errors import InputError, SpecError
from huggy_convert.exporters.onnx_export import build_onnx
from huggy_convert.exporters.torch_module import build_module
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime import OrtRunner, make_probes
from huggy_convert.core import bounds as core_bounds
from huggy_convert.verify import bounds
from huggy_convert.verify.checks import check_onnx_structure

FAMILIES = FIXTURES / "families"
RUNS = {r["name"]: r for r in json.loads((FAMILIES / "manifest.json").read_text())["runs"]}
NAMES = ("attention", "attention_mlagents030")
DET = (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_CONT_DET)


_step = family_step


@pytest.fixture(scope="module")
def fx():
    """name -> (checkpoint, official ONNX, golden inputs, the canonical policy)."""
    return load_families(NAMES)


def test_spec_inferred_and_every_key_accounted_for(fx):
    ckpt, _, _, pol = fx["attention"]
    spec = pol.spec
    assert spec.obs_shapes == ((6,), (6, 5), (3,)) and spec.obs_sizes == (6, 30, 3)
    assert spec.attention_export == C.ATTENTION_EXPORT_110 and fx["attention_mlagents030"][3].spec.attention_export == "0.30"
    assert [spec.obs_kind(i) for i in range(3)] == ["vector", "entity", "vector"]
    assert spec.encoded_width == 6 + 3 + 128
    # every Policy key: a canonical tensor's source, or an alias checked bitwise equal to its twin
    sources = set(pol.sources.values())
    ignored = json.loads(pol.metadata["ignored_keys"])
    assert set(ckpt.policy) == sources | set(ignored)
    assert all(k.startswith("network_body.processors.") for k in ignored)
    assert {C.ENTITY_ENCODER.format(i=1, p="weight"), C.X_SELF_ENCODER.format(p="weight"),
            C.RSA_LINEAR.format(n="out", p="bias")} <= sources
    # the parameter count: every trainable tensor of the actor, counted from the checkpoint itself
    trainable = sum(t.numel() for k, t in ckpt.policy.items()
                    if k not in C.CONSTANT_KEYS and C.NORMALIZER_INFIX not in k and k not in ignored)
    consts = sum(ckpt.policy[k].numel() for k in C.CONSTANT_KEYS)  # the generator counts the constant vectors too
    assert spec.parameter_count() == trainable == RUNS["attention"]["facts"]["policy_parameters"] - consts
    # an all-vector spec's JSON is unchanged by the new field; this one states its shapes
    assert "attention_export" not in spec.to_json() and '"obs_shapes":[[6],[6,5],[3]]' in spec.to_json()
    assert '"attention_export":"0.30"' in fx["attention_mlagents030"][3].spec.to_json()


def test_canonical_file_round_trips(fx):
    for name in NAMES:
        pol = fx[name][3]
        back = loads(dumps(pol))
        assert back.spec == pol.spec
        assert all(np.array_equal(back.tensors[k], v) for k, v in pol.tensors.items())


@pytest.mark.parametrize("name", NAMES)
def test_onnx_mirrors_the_official_node_for_node(fx, name):
    """Opset 9: the same op sequence and attributes, and every initializer paired by (node, input slot)
    with a bitwise-equal official one."""
    _, off, _, pol = fx[name]
    ours = build_onnx(pol, 9)
    c = check_onnx_structure(ours, off, "rebuilt", "official", pol)
    assert c.status == "pass", [(s.title, s.summary) for s in c.children]
    assert [n.op_type for n in off.graph.node if n.op_type != "Identity"] == \
        [n.op_type for n in ours.graph.node if n.op_type != "Identity"]
    assert len([n for n in off.graph.node if n.op_type != "Identity"]) == (114 if name == "attention" else 121)


@pytest.mark.parametrize("name", NAMES)
def test_official_matmul_weights_are_the_checkpoints_transposed(fx, name):
    """How the transposed copies are matched: ML-Agents' MatMul initializers (onnx::MatMul_<n>) are the
    checkpoint's Linear weights transposed, bit for bit; ours are too, and check 2 pairs them by node."""
    ckpt, off, _, pol = fx[name]
    inits = {t.name: numpy_helper.to_array(t) for t in off.graph.initializer}
    mats = [n for n in off.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    keys = [C.ENTITY_ENCODER.format(i=1, p="weight")] + [C.RSA_LINEAR.format(n=n, p="weight") for n in C.RSA_LINEARS]
    assert len(mats) == len(keys)
    for node, key in zip(mats, keys):
        want = ckpt.policy[key].numpy().T
        assert inits[node.input[1]].tobytes() == np.ascontiguousarray(want).tobytes(), key
    ours = build_onnx(pol, 9)
    our_inits = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    ours_mats = [n for n in ours.graph.node if n.op_type == "MatMul" and n.input[1] in our_inits]
    assert [our_inits[n.input[1]].tobytes() for n in ours_mats] == [inits[n.input[1]].tobytes() for n in mats]


def _feeds(fx, name):
    _, _, golden, pol = fx[name]
    return {"golden": golden, **{f"probes{s}": make_probes(pol, rows=64, seed=s) for s in (0, 1)}}


@pytest.mark.parametrize("name", NAMES)
def test_outputs_bitwise_equal_to_the_official_at_every_opset(fx, name):
    """Deterministic and constant outputs in onnxruntime: the rebuilt ONNX (opsets 9-15) and the official
    file, bitwise, on ML-Agents' golden inputs and on seeded probes (padded entities, all-padded sets)."""
    _, off, _, pol = fx[name]
    feeds = _feeds(fx, name)
    ours = assert_rebuilt_outputs_bitwise(off, pol, feeds, DET)
    # the golden outputs ML-Agents' generator recorded from the official file
    golden = dict(np.load(_step(name)[2]))
    assert ours.infer(feeds["golden"])[C.OUT_CONT_DET].tobytes() == golden[C.OUT_CONT_DET].tobytes()


def test_probes_pad_and_vary_the_entity_sets(fx):
    pol = fx["attention"][3]
    x = make_probes(pol, rows=64, seed=0)[C.OBS_INPUT.format(i=1)]
    assert x.shape == (64, 6, 5) and x.dtype == np.float32
    sq = (x.astype(np.float64) ** 2).sum(axis=2)
    real = sq >= C.ENTITY_MASK_BELOW
    counts = real.sum(axis=1)
    assert (counts == 0).any() and (counts == 6).any() and len(set(counts.tolist())) >= 5  # all-padded, full, varying
    assert (~real & (sq > 0)).any()  # padding that is not zero (squared sum < 0.01)
    padded_inside = [r for r in range(64) if not real[r].all() and real[r].any()
                     and not (real[r][:counts[r]].all())]
    assert padded_inside  # real entities after padded ones
    assert not ((sq > 0.005) & (sq < 0.02)).any()  # no entity float32 could put on either side of 0.01


@pytest.mark.parametrize("name", NAMES)
def test_module_within_the_derived_bound(fx, name):
    """float32 torch module and onnxruntime on the official file: every element within its derived bound
    of the float64 reference (the .pt2: the conversion test below)."""
    _, off, _, pol = fx[name]
    ref = bounds.Float64Policy(pol)
    m = build_module(pol)
    runners = {"module": lambda f: m(*[torch.from_numpy(f[n]) for n in pol.spec.input_names()])[0].numpy(),
               "official": lambda f: OrtRunner(off).infer(f)[C.OUT_CONT_DET]}
    for k, f in _feeds(fx, name).items():
        r = ref.forward(f)
        assert np.isfinite(r.bounds[C.OUT_CONT_DET]).all()
        for what, run in runners.items():
            with torch.no_grad():
                j = bounds.judge(r, C.OUT_CONT_DET, run(f))
            assert j["ok"] and 0 < j["ratio"] < 1, (k, what, j)


def test_the_bound_catches_a_wrong_attention(fx, monkeypatch):
    """The bound is tight enough to fail a module that ignores the padding mask."""
    from huggy_convert.blocks import attention

    _, _, golden, pol = fx["attention"]
    r = bounds.Float64Policy(pol).forward(golden)
    monkeypatch.setattr(C, "ENTITY_MASK_BELOW", -1.0)  # nothing is padding
    m = build_module(pol)
    with torch.no_grad():
        got = m(*[torch.from_numpy(golden[n]) for n in pol.spec.input_names()])[0].numpy()
    assert not bounds.judge(r, C.OUT_CONT_DET, got)["ok"]
    assert attention  # the block read the patched constant


def test_half_precision_keeps_the_normalizer_float32(fx):
    _, _, golden, pol = fx["attention"]
    for dtype in ("float16", "bfloat16"):
        m = build_module(pol, dtype=dtype)
        assert set(m.pinned_dtypes().values()) == {"float32"}
        with torch.no_grad():
            got = m(*[torch.from_numpy(golden[n]) for n in pol.spec.input_names()])[0].float().numpy()
        # every row finite, the all-padded sets included (-1e6 would be -inf in float16)
        assert np.isfinite(got).all()
        want = bounds.Float64Policy(pol).forward(golden, bounds=False).values[C.OUT_CONT_DET]
        assert np.abs(got - want).max() < (0.01 if dtype == "float16" else 0.05)


def _bounded(rng, shape, scale=1.0):
    v = rng.normal(scale=scale, size=shape).astype(np.float32).astype(np.float64)
    e = np.abs(v) * 4 * 2.0 ** -24 + 1e-9
    return core_bounds.Bounded(v, e)


def test_layer_norm_softmax_and_masked_mean_bounds_hold_for_float32():
    """Each derived bound against float32 evaluations of the same op on perturbed inputs (every input
    moved by up to its error bound): the float32 result stays within the bound of the exact one."""
    rng = np.random.default_rng(0)
    x = _bounded(rng, (256, 6, 128), 0.3)
    x.v[:, :, :] += 0.5  # a mean far from zero: the centring's own rounding matters
    for fn, args, ref in (
        (core_bounds.layer_norm, (np.float32(1e-5),), lambda a: (a - a.mean(-1, keepdims=True))
         / torch.sqrt(((a - a.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True) + 1e-5)),
        (core_bounds.softmax, (), lambda a: torch.softmax(a, dim=-1)),
    ):
        b = fn(x, *args)
        worst = 0.0
        for _ in range(4):
            moved = x.v + x.err * rng.uniform(-1, 1, size=x.v.shape)
            got = ref(torch.from_numpy(moved.astype(np.float32))).double().numpy()
            worst = max(worst, float((np.abs(got - b.v) / b.err).max()))
        assert worst < 1, (fn.__name__, worst)
    y = _bounded(rng, (256, 6, 32))
    keep = rng.random((256, 6)) < 0.6
    keep[:8] = False  # all padded: exactly 0
    b = core_bounds.masked_mean(y, keep, np.float32(1e-7))
    assert (b.v[:8] == 0).all() and (b.err[:8] == 0).all()
    k = torch.from_numpy(keep.astype(np.float32))
    got = ((torch.from_numpy(y.v.astype(np.float32)) * k[:, :, None]).sum(1) / (k.sum(1, keepdim=True) + 1e-7)).double().numpy()
    assert (np.abs(got - b.v) <= b.err).all()


def test_entity_count_comes_from_the_official_onnx(fx, tmp_path):
    """No tensor holds the number of entities: without the official ONNX it is one line naming the
    input and what to give; checkpoint.pt takes it from its step's ONNX beside it."""
    from huggy_convert.converter import convert_checkpoint

    ckpt = fx["attention"][0]
    p = tmp_path / "Attention-4188.pt"
    p.write_bytes(ckpt.path.read_bytes())
    with pytest.raises(SpecError) as e:
        convert_checkpoint(p)
    assert "obs_1 is a variable-length observation (entities of 5 features)" in e.value.one_line()
    assert "--reference" in e.value.one_line()
    cp = FIXTURES / RUNS["attention"]["checkpoint_pt"]
    assert prepare_conversion(load_checkpoint(cp), None).conversion.policy.spec == fx["attention"][3].spec


def test_entity_input_shape_errors_name_the_observation(fx, tmp_path):
    from huggy_convert.modes.sources import load_source, read_obs_file

    _, _, golden, pol = fx["attention"]
    bad = tmp_path / "bad.npz"
    np.savez(bad, obs_0=golden["obs_0"], obs_1=golden["obs_1"].transpose(0, 2, 1), obs_2=golden["obs_2"])
    with pytest.raises(InputError) as e:
        read_obs_file(pol.spec, bad)
    msg = e.value.one_line()
    assert "'obs_1' has shape [64, 5, 6], expected [rows, 6, 5]" in msg and "up to 6 entities of 5 features" in msg
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((2, 39), np.float32))
    with pytest.raises(InputError) as e:
        read_obs_file(pol.spec, flat)
    assert "obs_1 [rows, 6, 5]" in e.value.one_line() and ".npz" in e.value.one_line()
    good = tmp_path / "good.npz"
    np.savez(good, **{k: golden[k][:3] for k in ("obs_0", "obs_1", "obs_2")})
    src = load_source(_step("attention")[0])
    assert read_obs_file(src.spec, good)["obs_1"].shape == (3, 6, 5)


def test_info_shows_the_encoder_and_its_parameters(fx):
    from huggy_convert.modes.info import info

    for path in (_step("attention")[0], _step("attention_mlagents030")[1]):
        r = info(path)
        enc = [e for e in r.data["encoders"] if e["kind"] == "entity"]
        assert len(enc) == 1 and enc[0]["inputs"] == ["obs_1"] and enc[0]["width"] == 128
        assert enc[0]["parameters"] == 128 * 9 + 128 + 128 * 133 + 128 + 4 * (128 * 128 + 128)
        assert r.data["parameters"][C.P_WITH_LOG_SIGMA] == fx["attention"][3].spec.parameter_count()
        assert any(line.startswith("  encoder obs_1 (entity, 6x5): attention over 6 entities") for line in r.lines)


def test_conversion_of_the_030_fixture_at_opset_13_passes(tmp_path):
    """The whole pipeline (convert, write, verify the files written) at opset 13: PASS, the outputs
    bitwise equal to the official opset-9 file's (check 3), the module and the .pt2 within bounds."""
    from huggy_convert.pipeline import ConvertOptions, convert_one
    from huggy_convert.verify import VerifyOptions

    res = convert_one(_step("attention_mlagents030")[0], tmp_path, ConvertOptions(opset=13),
                      profile=VerifyOptions(dtypes=("float32", "float16"), fingerprint_steps=(64,)))
    assert res.report.ok, res.report.render()
    c3 = res.report.check("outputs")
    assert c3.status == "pass" and all("bitwise" in c.summary and "NOT" not in c.summary for c in c3.children)


def test_to_checkpoint_gives_back_mlagents_policy_dict(fx, tmp_path):
    """Back into ML-Agents: the Policy dict written from the canonical file is the original's key for key
    (ML-Agents' order with the entity set between two vectors, the aliases, dtypes, bits)."""
    for name in NAMES:
        ckpt, _, _, pol = fx[name]
        assert_back_to_the_checkpoint(ckpt, pol, tmp_path / name)


def test_mlagents_initializes_from_the_written_checkpoint(fx, tmp_path):
    """ML-Agents 1.1.0's own trainer code loads the attention policy written back (no missing or
    unexpected key) and its actor gives the original's outputs bit for bit (needs the generator's venv)."""
    import subprocess

    from test_to_checkpoint import _job, mlagents_python

    from conftest import ROOT
    from huggy_convert.converter import save_policy
    from huggy_convert.pipeline import to_checkpoint

    py = mlagents_python()
    if py is None:
        pytest.skip("mlagents is not installed here: set HUGGY_MLAGENTS_PYTHON or build fixtures/.venv")
    ckpt, _, _, pol = fx["attention"]
    st = save_policy(pol, tmp_path / "a.safetensors")
    job = _job("attention", ckpt.path, st, to_checkpoint(st, tmp_path / "back"), tmp_path / "a.npz")
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    p = subprocess.run([py, str(ROOT / "tests" / "mlagents_initialize.py"), str(tmp_path / "jobs.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])[0]
    assert r["state_dict_keys_equal"] and r["state_dict_mismatches"] == [] and r["init_path_bitwise"]
    assert all(r["outputs"][o]["bitwise_vs_original_initialized"] for o in job["deterministic"])


def test_atc_keeps_the_masking_float32(fx, tmp_path):
    """Ascend ATC's faster mode casts to fp16 what --keep_dtype does not list: -1e6 is -inf in fp16 (an
    all-padded set would give 0/0), so the masking and softmax are listed beside the normalizer."""
    from huggy_convert.exporters.atc import atc_plan

    pol = fx["attention"][3]
    keep = atc_plan(build_onnx(pol, 11), tmp_path / "a.onnx", pol.spec)["keep_dtype_nodes"]
    att = C.SCOPE_ATTENTION
    assert {f"{att}/Mul_1", f"{att}/Add_1", f"{att}/Softmax", f"{C.SCOPE_OBS_ENCODER}/Less"} <= set(keep)
    assert any(n.startswith(C.SCOPE_NORMALIZER.format(i=2)) for n in keep)
    assert not any(n.endswith("/MatMul") or "/fc_" in n for n in keep)  # the GEMMs run in fp16
