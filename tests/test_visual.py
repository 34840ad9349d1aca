"""Issue 12, cameras: every ML-Agents visual encoder (simple, nature_cnn, resnet, match3,
fully_connected), a camera beside a normalized vector, and ML-Agents 0.30.0's export, against the
files ML-Agents' own code wrote (fixtures/families/visual_*: mlagents 1.1.0 / torch 2.13, and
visual_simple_mlagents030: mlagents 0.30.0 / torch 1.11)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import (FAMILIES, FIXTURES, assert_back_to_the_checkpoint, assert_onnx_mirrors_official,
                      assert_rebuilt_outputs_bitwise, bitwise_outputs, family_run, family_step, load_families,
                      run_cli)

from huggy_convert import contract as C
from huggy_convert.converter import load_checkpoint
from huggy_convert.converter.policy_file import dumps, loads
from huggy_convert.errors import InputError, SpecError
from huggy_convert.exporters.torch_module import build_module
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime import OrtRunner, make_probes
from huggy_convert.core import bounds as core_bounds
from huggy_convert.verify import bounds

NAMES = ("visual_simple", "visual_nature_cnn", "visual_resnet", "visual_match3", "visual_fully_connected",
         "visual_vector", "visual_simple_mlagents030")
# per fixture: (vis_encode_type, camera (C, H, W), ONNX nodes at opset 9 (= the official file's) and at 13)
EXPECT = {"visual_simple": ("simple", (3, 20, 20), 32, 36), "visual_nature_cnn": ("nature_cnn", (1, 36, 36), 34, 38),
          "visual_resnet": ("resnet", (2, 15, 15), 78, 82), "visual_match3": ("match3", (3, 5, 5), 48, 54),
          "visual_fully_connected": ("fully_connected", (2, 8, 6), 28, 32),
          "visual_vector": ("simple", (3, 20, 20), 35, 41), "visual_simple_mlagents030": ("simple", (3, 20, 20), 32, 36)}


_step = family_step


@pytest.fixture(scope="module")
def fx():
    """name -> (checkpoint, official ONNX, golden inputs, the canonical policy)."""
    return load_families(NAMES)


def _feeds(fx, name):
    _, _, golden, pol = fx[name]
    return {"golden": golden, **{f"probes{s}": make_probes(pol, rows=64, seed=s) for s in (0, 1)}}


@pytest.mark.parametrize("name", NAMES)
def test_spec_inferred_and_every_key_accounted_for(fx, name):
    ckpt, _, _, pol = fx[name]
    spec = pol.spec
    vtype, shape, _, _ = EXPECT[name]
    assert spec.vis_encode_type == vtype and spec.obs_shape(0) == shape and spec.obs_kind(0) == "visual"
    assert spec.hidden_units == family_run(name)["hidden_units"] and spec.normalize == family_run(name)["normalize"]
    if name == "visual_vector":
        assert spec.obs_shapes == ((3, 20, 20), (6,)) and spec.encoded_width == 48 + 6
    sources = set(pol.sources.values())
    ignored = json.loads(pol.metadata["ignored_keys"])
    assert set(ckpt.policy) == sources | set(ignored)  # every key: a canonical tensor's, or its twin's alias
    assert ignored and all(k.startswith("network_body.processors.") for k in ignored)
    trainable = sum(t.numel() for k, t in ckpt.policy.items()
                    if k not in C.CONSTANT_KEYS and C.NORMALIZER_INFIX not in k and k not in ignored)
    consts = sum(ckpt.policy[k].numel() for k in C.CONSTANT_KEYS)  # the generator counts the constant vectors too
    assert spec.parameter_count() == trainable == family_run(name)["facts"]["policy_parameters"] - consts
    assert f'"vis_encode_type":"{vtype}"' in spec.to_json()
    back = loads(dumps(pol))
    assert back.spec == spec and all(np.array_equal(back.tensors[k], v) for k, v in pol.tensors.items())


@pytest.mark.parametrize("name", NAMES)
def test_onnx_mirrors_the_official_node_for_node(fx, name):
    """Opset 9: the same op sequence and attributes, and every initializer paired by (node, input slot)
    with a bitwise-equal official one (same names too: the checkpoint keys)."""
    _, off, _, pol = fx[name]
    assert_onnx_mirrors_official(pol, off, nodes=EXPECT[name][2:4], manifest_nodes=family_run(name)["facts"]["onnx_nodes"])


@pytest.mark.parametrize("name", NAMES)
def test_outputs_bitwise_equal_to_the_official_at_every_opset(fx, name):
    """Deterministic and constant outputs in onnxruntime: the rebuilt ONNX (opsets 9-15) and the official
    file, bitwise, on ML-Agents' golden inputs and on seeded probe images in [0, 1]."""
    _, off, _, pol = fx[name]
    feeds = _feeds(fx, name)
    assert_rebuilt_outputs_bitwise(off, pol, feeds, bitwise_outputs(pol.spec))
    # the outputs ML-Agents' generator recorded from the official file (onnxruntime on the exporting host):
    # onnxruntime's Conv kernels depend on the CPU, so they are this host's within the derived bound, not
    # bitwise (fully_connected and match3's argmax happen to be); the bitwise claim is official vs rebuilt
    # on one host, above
    golden = dict(np.load(_step(name)[2]))
    out = pol.spec.deterministic_output_names()[0]
    j = bounds.judge(bounds.Float64Policy(pol).forward(feeds["golden"]), out, golden[out])
    assert j["ok"], j


def test_probes_are_images_in_the_unit_range(fx):
    pol = fx["visual_vector"][3]
    p = make_probes(pol, rows=64, seed=0)
    x = p[C.OBS_INPUT.format(i=0)]
    assert x.shape == (64, 3, 20, 20) and x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0
    assert (x[-1] == 0).all() and (x[-2] == 1).all() and set(np.unique(x[3]).tolist()) == {0.0, 1.0}
    assert len(np.unique(x[0])) > 1000  # uniform pixels
    assert p[C.OBS_INPUT.format(i=1)].shape == (64, 6)


@pytest.mark.parametrize("name", NAMES)
def test_module_within_the_derived_bound(fx, name):
    """float32 torch module (NCHW in, as Unity feeds) and onnxruntime on the official file: every element
    within its derived bound of the float64 reference; match3's discrete actions: the same argmax."""
    _, off, _, pol = fx[name]
    ref = bounds.Float64Policy(pol)
    m = build_module(pol)
    out = pol.spec.deterministic_output_names()[0]
    official = OrtRunner(off)
    runners = {"module": lambda f: m(*[torch.from_numpy(f[n]) for n in pol.spec.input_names()])[0].numpy(),
               "official": lambda f: official.infer(f)[out]}
    for k, f in _feeds(fx, name).items():
        r = ref.forward(f)
        for what, run in runners.items():
            with torch.no_grad():
                j = bounds.judge(r, out, run(f))
            if name == "visual_match3":
                assert j["ok"] and j["equal"] + j["ties"] == 128, (k, what, j)
            else:
                assert np.isfinite(r.bounds[out]).all()
                assert j["ok"] and 0 < j["ratio"] < 1, (k, what, j)


def test_the_bound_catches_a_wrong_encoder(fx, monkeypatch):
    """The bound is tight enough to fail a module whose LeakyReLU has another slope (0.02)."""
    _, _, golden, pol = fx["visual_simple"]
    r = bounds.Float64Policy(pol).forward(golden)
    monkeypatch.setattr(C, "LEAKY_RELU_SLOPE", 0.02)
    m = build_module(pol)
    with torch.no_grad():
        got = m(*[torch.from_numpy(golden[n]) for n in pol.spec.input_names()])[0].numpy()
    assert not bounds.judge(r, C.OUT_CONT_DET, got)["ok"]


def test_conv_and_pool_bounds_hold_for_float32():
    """conv2d (padded or not) and max_pool against float32 torch on inputs moved by up to their bounds."""
    rng = np.random.default_rng(0)
    x = core_bounds.Bounded(rng.random((16, 4, 11, 11)).astype(np.float32).astype(np.float64), None)
    x.err = np.abs(x.v) * 8 * 2.0 ** -24 + 1e-9
    w = rng.normal(scale=0.3, size=(8, 4, 3, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    lin = core_bounds.Linear(w.reshape(8, -1), b)
    for stride, pad in ((1, 1), (2, 0)):
        c = core_bounds.conv2d(x, lin, 3, stride, pad)
        p = core_bounds.max_pool(c, 3, 2)
        worst = 0.0
        for _ in range(4):
            moved = torch.from_numpy((x.v + x.err * rng.uniform(-1, 1, size=x.v.shape)).astype(np.float32))
            got = torch.nn.functional.conv2d(moved, torch.from_numpy(w), torch.from_numpy(b), stride=stride, padding=pad)
            worst = max(worst, float((np.abs(got.double().numpy() - c.v) / c.err).max()))
            pooled = torch.nn.functional.max_pool2d(got, 3, 2).double().numpy()
            worst = max(worst, float((np.abs(pooled - p.v) / p.err).max()))
        assert worst < 1, (stride, pad, worst)


def test_half_precision_keeps_the_normalizer_float32(fx):
    _, _, golden, pol = fx["visual_vector"]
    want = bounds.Float64Policy(pol).forward(golden, bounds=False).values[C.OUT_CONT_DET]
    for dtype in ("float16", "bfloat16"):
        m = build_module(pol, dtype=dtype)
        assert set(m.pinned_dtypes().values()) == {"float32"} and m.visual_convs[0][0].dtype == getattr(torch, dtype)
        with torch.no_grad():
            got = m(*[torch.from_numpy(golden[n]) for n in pol.spec.input_names()])[0].float().numpy()
        assert np.isfinite(got).all() and np.abs(got - want).max() < (0.01 if dtype == "float16" else 0.05)


def test_image_size_comes_from_the_official_onnx_or_obs_sizes(fx, tmp_path):
    """The dense layer's width fits many images: without the official ONNX, one line naming the camera
    and what to give; --obs-sizes CxHxW gives it (checked against the dense width and the channels);
    checkpoint.pt takes it from its step's ONNX beside it."""
    from huggy_convert.converter import convert_checkpoint

    for name in ("visual_simple", "visual_fully_connected"):
        pt = _step(name)[0]
        p = tmp_path / f"Alone-{name}.pt"
        shutil.copyfile(pt, p)
        with pytest.raises(SpecError) as e:
            convert_checkpoint(p)
        assert "obs_0 is a camera observation" in e.value.one_line() and "--obs-sizes CxHxW" in e.value.one_line()
        shape = EXPECT[name][1]
        assert convert_checkpoint(p, obs_sizes=[shape]).policy.spec == fx[name][3].spec
    p = tmp_path / "Alone-visual_simple.pt"
    with pytest.raises(SpecError, match=r"wrong shape for '.*dense\.0\.weight': \[32, 32\], expected \[32, 2592\] for the simple encoder of a 3x84x84 image"):
        convert_checkpoint(p, obs_sizes=[(3, 84, 84)])
    with pytest.raises(SpecError, match="whose 20 channels are not the first convolution's 3 .an HWC shape"):
        convert_checkpoint(p, obs_sizes=[(20, 20, 3)])
    with pytest.raises(SpecError, match="smaller than the simple encoder's minimum 20x20"):
        convert_checkpoint(p, obs_sizes=[(3, 19, 19)])
    vv = tmp_path / "Alone-visual_vector.pt"
    shutil.copyfile(_step("visual_vector")[0], vv)
    assert convert_checkpoint(vv, obs_sizes=[(3, 20, 20), 6]).policy.spec == fx["visual_vector"][3].spec
    cp = FIXTURES / family_run("visual_resnet")["checkpoint_pt"]
    assert prepare_conversion(load_checkpoint(cp), None).conversion.policy.spec == fx["visual_resnet"][3].spec
    r = run_cli(p, tmp_path / "out", "--obs-sizes", "3x20x20", "--no-verify", "--no-program")
    assert r.returncode == 0, r.stderr
    r = run_cli(p, tmp_path / "out2", "--obs-sizes", "3x20")
    assert r.returncode == 2 and "neither a width nor a CxHxW shape" in r.stderr and r.stderr.count("\n") == 1


def test_camera_input_shape_errors_name_the_observation(fx, tmp_path):
    from huggy_convert.modes.sources import read_obs_file

    _, _, golden, pol = fx["visual_vector"]
    for arr, says in ((golden["obs_0"].transpose(0, 2, 3, 1), "this one is HWC (channels last), transpose it to NCHW"),
                      (np.zeros((2, 3, 84, 84), np.float32), "a 3x84x84 image is not this policy's 3x20x20")):
        bad = tmp_path / "bad.npz"
        np.savez(bad, obs_0=arr, obs_1=golden["obs_1"][:len(arr)])
        with pytest.raises(InputError) as e:
            read_obs_file(pol.spec, bad)
        msg = e.value.one_line()
        assert f"'obs_0' has shape {list(arr.shape)}, expected [rows, 3, 20, 20]" in msg and says in msg, msg
        assert "a camera of 3 channels, 20x20 pixels, fed channels first (NCHW)" in msg
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((2, 1206), np.float32))
    with pytest.raises(InputError) as e:
        read_obs_file(pol.spec, flat)
    assert "obs_0 [rows, 3, 20, 20]" in e.value.one_line() and ".npz" in e.value.one_line()


def test_info_and_act_with_images(fx, tmp_path):
    """``info`` names each camera's encoder and its parameter count (from a checkpoint and from an ONNX
    alone); ``act`` takes images from an .npz and gives the official ONNX's actions bitwise."""
    from huggy_convert.modes.info import info

    for path in (_step("visual_resnet")[0], _step("visual_resnet")[1]):
        r = info(path)
        enc = [e for e in r.data["encoders"] if e["kind"] == "visual"]
        assert len(enc) == 1 and enc[0]["inputs"] == ["obs_0"] and enc[0]["width"] == 32
        assert enc[0]["parameters"] == fx["visual_resnet"][3].spec.parameter_count() - (32 * 32 + 32) * 2 - (2 * 32 + 2 + 2)
        assert r.data["parameters"][C.P_WITH_LOG_SIGMA] == fx["visual_resnet"][3].spec.parameter_count()
        assert r.data["spec"]["vis_encode_type"] == "resnet"
        assert any(line.startswith("  encoder obs_0 (visual, 2x15x15): resnet: 3 stacks") for line in r.lines)
    _, off, golden, pol = fx["visual_vector"]
    obs = tmp_path / "obs.npz"
    np.savez(obs, **{k: golden[k][:5] for k in pol.spec.input_names()})
    r = run_cli("act", _step("visual_vector")[1], "--obs", obs, "--json")
    assert r.returncode == 0, r.stderr
    got = np.asarray(json.loads(r.stdout)["outputs"][C.OUT_CONT_DET], np.float32)
    assert got.tobytes() == OrtRunner(off).infer({k: golden[k][:5] for k in golden})[C.OUT_CONT_DET].tobytes()


@pytest.mark.parametrize("name, opset", [("visual_simple", 9), ("visual_nature_cnn", 13), ("visual_resnet", 9),
                                         ("visual_match3", 13), ("visual_fully_connected", 9), ("visual_vector", 13),
                                         ("visual_simple_mlagents030", 13)])
def test_conversion_passes(tmp_path, name, opset):
    """The whole pipeline (convert, write, verify the files written: the .pt2 too) on each fixture: PASS,
    the outputs bitwise equal to the official opset-9 file's (check 3). (Each fixture at both opsets 9 and
    13, by the CLI: the report's table.)"""
    from huggy_convert.pipeline import ConvertOptions, convert_one
    from huggy_convert.verify import VerifyOptions

    res = convert_one(_step(name)[0], tmp_path, ConvertOptions(opset=opset),
                      profile=VerifyOptions(dtypes=("float32", "float16"), fingerprint_steps=(64,)))
    assert res.report.ok, res.report.render()
    c3 = res.report.check("outputs")
    assert c3.status == "pass" and all("bitwise" in c.summary and "NOT" not in c.summary for c in c3.children)


def test_the_cli_converts_a_camera_checkpoint_at_opset_13(tmp_path):
    r = run_cli(_step("visual_simple")[0], tmp_path / "out", "--opset", "13")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict: PASS" in r.stdout and "(simple visual encoder)" in r.stdout


def test_to_checkpoint_gives_back_mlagents_policy_dict(fx, tmp_path):
    """Back into ML-Agents: the Policy dict written from the canonical file is the original's key for key
    (ML-Agents' order: resnet's dense before its sequential, the aliases, dtypes, bits)."""
    for name in NAMES:
        ckpt, _, _, pol = fx[name]
        assert_back_to_the_checkpoint(ckpt, pol, tmp_path / name)


def test_a_camera_key_out_of_place_is_named(fx, tmp_path):
    from huggy_convert.converter.mapping import map_policy
    from huggy_convert.converter.reference import input_hints

    ckpt, off, _, _ = fx["visual_resnet"]
    sd = dict(ckpt.policy)
    sd[C.VIS_PREFIX.format(i=0) + "sequential.13.weight"] = torch.zeros(2)
    with pytest.raises(SpecError, match=r"unexpected key '.*sequential\.13\.weight' \(not part of a resnet encoder\)"):
        map_policy(sd, inputs=input_hints(off))
    sd = dict(ckpt.policy)
    del sd[C.VIS_PREFIX.format(i=0) + "dense.weight"]
    with pytest.raises(SpecError, match=r"missing key '.*processors\.0\.dense\.weight'"):
        map_policy(sd, inputs=input_hints(off))


def test_batch_and_matrix_cover_a_camera_run(tmp_path):
    """A camera run directory through the batch (every checkpoint PASS, the deployed ONNX recognised),
    and the matrix's observation, ONNX and export groups on a camera + vector checkpoint: no failure."""
    from huggy_convert.modes.matrix import run_matrix

    out = tmp_path / "batch"
    r = run_cli(FAMILIES / "visual_fully_connected", out, "--json", "--jobs", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["summary"]["failed"] == 0 and m["checkpoints"]
    assert all(e["verify"]["verdict"] == "PASS" for e in m["checkpoints"] if e.get("verify"))
    res = run_matrix(tmp_path / "m", quick=True, source=_step("visual_vector")[0], only=["2", "6", "10"], echo=False)
    cases = res.data["cases"]
    assert res.ok and not [c for c in cases if c["verdict"] == "FAIL"]
    assert sum(c["verdict"] == "PASS" for c in cases) >= 20
