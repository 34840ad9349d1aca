"""Stable-Baselines3 policies into Unity's contract and every target (issue 28).

The fixtures are SB3's own files: ``fixtures/generate_sb3.py`` trains small policies with SB3's own
algorithm classes on gymnasium toy environments and saves them with ``model.save`` (the zip) and
``VecNormalize.save`` (``vec_normalize.pkl``); its ``golden.npz`` holds observations and SB3's
``predict(obs, deterministic=True)`` through its own normalizer (``VecNormalize.normalize_obs``). The
committed set is a subset (the fixtures' size ceiling); CI writes the whole set with SB3 itself and runs
these tests on it (``HUGGY_SB3_FIXTURES``, ``.ci/run``).

What is asserted, run by run: the conversion PASSes; our float64 reference, derived from the canonical
tensors, holds SB3's own actions within its bound for float32 (the bound covers VecNormalize's float64
statistics rounded once to float32, and SB3's float32 network); the ONNX, the torch module and the
``.pt2`` hold the same bound on those observations; discrete actions are SB3's exactly; the written ONNX
is accepted by ML-Agents 4's loader rules (``check --for mlagents-4``); ``verify OUT/`` re-runs it.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, run_cli
from huggy_convert import contract as C
from huggy_convert.conformance import check_file
from huggy_convert.converter import load_policy
from huggy_convert.core.artifacts import ONNX, PT2, SAFETENSORS, SUFFIXES
from huggy_convert.pipeline import ConvertOptions, convert_one
from huggy_convert.runtime.feeds import complete_feed
from huggy_convert.verify.bounds import Float64Policy, judge

SB3 = Path(os.environ.get("HUGGY_SB3_FIXTURES") or FIXTURES / "sb3")
MANIFEST = json.loads((SB3 / "manifest.json").read_text()) if (SB3 / "manifest.json").is_file() else {"runs": []}
RUNS = {r["name"]: r for r in MANIFEST["runs"]}
ALGORITHMS = {"PPO": "ppo", "A2C": "a2c", "SAC": "sac", "TD3": "td3"}


def _zip(name: str) -> Path:
    return SB3 / name / "model.zip"


def _golden(name: str):
    with np.load(SB3 / name / "golden.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each run converted once (verified), OUT/<run>/model.*"""
    root = tmp_path_factory.mktemp("sb3")
    cache = {}

    def get(name):
        if name not in cache:
            res = convert_one(_zip(name), root / name)
            cache[name] = (res, root / name)
        return cache[name]
    return get


def _feed(policy, obs):
    """The observations, and every input SB3 has not (action masks allowing every choice: ``complete_feed``)."""
    return complete_feed(policy.spec, {C.OBS_INPUT.format(i=0): obs.astype(np.float32)})


def test_the_fixtures_are_sb3s_own_and_cover_the_issue():
    """The manifest names SB3's version and what each run is; the committed set covers PPO (Box, Discrete,
    MultiDiscrete), A2C, SAC and TD3, with and without VecNormalize."""
    assert MANIFEST["versions"]["stable_baselines3"].startswith("2.")
    kinds = {(r["algorithm"], r["action_space"], r["vec_normalize"]) for r in RUNS.values()}
    algos = {a for a, _, _ in kinds}
    assert {"PPO", "A2C", "SAC", "TD3"} <= algos, kinds
    assert {"Box", "Discrete", "MultiDiscrete"} <= {s for a, s, _ in kinds if a == "PPO"}, kinds
    assert {True, False} == {v for _, _, v in kinds}
    for r in RUNS.values():
        assert (SB3 / r["name"] / "model.zip").is_file()
        assert (SB3 / r["name"] / "vec_normalize.pkl").is_file() == r["vec_normalize"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_converts_and_verifies_within_the_bound_of_sb3s_own_actions(name, converted):
    """SB3's deterministic actions (golden) against our float64 reference within its float32 bound; our ONNX,
    module and .pt2 on the same observations within it too; argmax actions equal SB3's."""
    import onnxruntime as ort
    import torch

    run = RUNS[name]
    res, out = converted(name)
    assert res.ok and res.report.verdict.startswith("PASS"), res.report.to_dict()
    policy = load_policy(out / "model.safetensors")
    spec = policy.spec
    assert spec.source == C.SB3_SOURCE and spec.algorithm == ALGORITHMS[run["algorithm"]]
    assert spec.normalize == run["vec_normalize"]
    g = _golden(name)
    obs = g["obs"]
    feed = _feed(policy, obs)
    ref = Float64Policy(policy).forward(feed)
    out_name = C.OUT_CONT_DET if spec.continuous_size else C.OUT_DISC_DET
    sb3 = g["actions"].reshape(len(obs), -1)
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got_onnx = sess.run([out_name], feed)[0]
    module = torch.export.load(str(out / "model.pt2")).module()
    with torch.no_grad():
        got_pt2 = module(*[torch.from_numpy(feed[n]) for n in spec.input_names()])
    got_pt2 = [o.numpy() for o in got_pt2][spec.deterministic_output_names().index(out_name)] \
        if isinstance(got_pt2, (tuple, list)) else got_pt2.numpy()
    if spec.continuous_size:
        j = judge(ref, out_name, sb3.astype(np.float32))
        assert j["ok"] and j["ratio"] < 1.0, j
        for got in (got_onnx, got_pt2):
            jr = judge(ref, out_name, got)
            assert jr["ok"] and jr["ratio"] < 1.0, jr
        lo, hi = np.array(spec.action_low), np.array(spec.action_high)
        assert np.all(got_onnx >= lo) and np.all(got_onnx <= hi)
        assert np.abs(got_onnx - sb3).max() < 1e-5
    else:
        assert np.array_equal(got_onnx, sb3.astype(np.int64))
        assert np.array_equal(got_pt2, sb3.astype(np.int64))
        assert judge(ref, out_name, sb3.astype(np.int64))["ok"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_unity_accepts_what_we_write(name, converted):
    """ML-Agents 4's loader rules (the constant outputs, names, shapes, action masks where there are
    branches) accept the ONNX written for an SB3 policy, and so do Sentis 2 and Barracuda's windows of its opset."""
    _, out = converted(name)
    r = check_file(out / "model.onnx", ["mlagents-4"])
    assert r.ok, [f.__dict__ for f in r.findings]
    spec = load_policy(out / "model.safetensors").spec
    import onnx

    m = onnx.load(str(out / "model.onnx"))
    outs = [o.name for o in m.graph.output]
    assert outs[:2] == [C.OUT_VERSION, C.OUT_MEMORY]
    if spec.discrete_branches:
        assert C.ACTION_MASKS in [i.name for i in m.graph.input]
        assert C.OUT_DISC_DET in outs and C.OUT_DISC_SHAPE in outs
    else:
        assert C.OUT_CONT_DET in outs and C.OUT_CONT in outs and C.OUT_CONT_SHAPE in outs


def test_what_the_spec_and_metadata_say_of_a_vecnormalize_ppo(converted):
    """The numbers come from SB3's files: VecNormalize's clip and epsilon from its pickle, the action bounds
    from the zip's data, the divisor sqrt(var + eps) rounded once to float32 from its float64 statistics."""
    name = "ppo_pendulum_vecnorm"
    res, out = converted(name)
    p = load_policy(out / "model.safetensors")
    s = p.spec
    assert (s.norm_rule, s.norm_clip, s.norm_eps) == (C.NORM_RULE_VECNORM, 10.0, 1e-8)
    assert (s.action_rule, s.action_low, s.action_high) == (C.ACTION_RULE_CLIP, (-2.0,), (2.0,))
    assert (s.activation, s.obs_sizes) == ("tanh", (3,))
    assert s.family.startswith("Stable-Baselines3 PPO actor: normalized obs 3 -> ")
    origin = json.loads(p.metadata[C.MD_ORIGIN])
    assert origin["format"] == "stable-baselines3" and origin["version"] == MANIFEST["versions"]["stable_baselines3"]
    assert origin["keys"][C.MU.format(p="weight")] == "action_net.weight"
    assert any("value_net" in t for t in origin["not_held"])
    # the divisor, from SB3's float64 statistics (read here by SB3's own normalizer's arithmetic on the golden)
    g = _golden(name)
    div = p.divisor(0).astype(np.float64)
    mean = p.tensors[C.c_norm(0, C.NORM_MEAN)].astype(np.float64)
    q = np.clip((g["obs"].astype(np.float64) - mean) / div, -10, 10)
    assert np.abs(q - g["normalized_obs"]).max() < 1e-5  # SB3's float64 normalization, rounded to float32


def test_verify_out_reruns_every_check(converted):
    _, out = converted("td3_pendulum")
    r = run_cli("verify", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not run" not in r.stdout.splitlines()[-1].split(",")[0]


def test_its_canonical_file_converts_again_to_the_same_files(converted, tmp_path):
    """The canonical file of an SB3 policy is an input like any other (its spec states the SB3 rules)."""
    _, out = converted("sac_pendulum_vecnorm")
    again = convert_one(out / "model.safetensors", tmp_path / "again", ConvertOptions(verify_options=None))
    for k in (SAFETENSORS, PT2):
        assert k in again.artifacts
    assert (tmp_path / "again" / f"model{SUFFIXES[PT2]}").read_bytes() == (out / f"model{SUFFIXES[PT2]}").read_bytes()
    assert load_policy(tmp_path / "again" / "model.safetensors").spec == load_policy(out / "model.safetensors").spec
    a, b = (load_policy(d / "model.safetensors") for d in (out, tmp_path / "again"))
    assert all(np.array_equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert (tmp_path / "again" / f"model{SUFFIXES[ONNX]}").is_file()


def test_to_checkpoint_refuses_an_sb3_policy(converted, tmp_path):
    _, out = converted("td3_pendulum")
    r = run_cli("to-checkpoint", out / "model.safetensors", tmp_path / "ck")
    assert r.returncode == 2 and "trained with stable-baselines3" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ck" / C.CHECKPOINT_FILE).exists()


# --- what is not supported: one line naming it, exit 2, nothing written --------------------------------
def _crafted(tmp_path, name: str, edit) -> Path:
    """A copy of a fixture's zip whose ``data`` JSON ``edit`` changed (the other members as SB3 wrote them)."""
    src = zipfile.ZipFile(_zip(name))
    data = json.loads(src.read("data"))
    edit(data)
    d = tmp_path / "crafted"
    d.mkdir(exist_ok=True)
    out = d / "model.zip"
    with zipfile.ZipFile(out, "w") as z:
        for m in src.namelist():
            z.writestr(m, json.dumps(data) if m == "data" else src.read(m))
    return out


def _set_class(cls):
    def edit(d):
        d["policy_class"]["__init__"] = f"<function {cls}.__init__ at 0x7f0000000000>"
    return edit


def _set_kwarg(k, v):
    def edit(d):
        d["policy_kwargs"][k] = v
    return edit


def _set_obs_shape(shape):
    def edit(d):
        d["observation_space"]["_shape"] = shape
    return edit


@pytest.mark.parametrize("edit,says", [
    (_set_class("RecurrentActorCriticPolicy"), "not supported yet: the SB3 policy class 'RecurrentActorCriticPolicy'"),
    (_set_class("ActorCriticCnnPolicy"), "'ActorCriticCnnPolicy'"),
    (_set_class("MultiInputActorCriticPolicy"), "'MultiInputActorCriticPolicy'"),
    (_set_kwarg("features_extractor_class", "<class 'my_pkg.MyExtractor'>"), "custom features extractor 'MyExtractor'"),
    (_set_kwarg("activation_fn", "<class 'torch.nn.modules.activation.ELU'>"), "the activation 'ELU'"),
    (_set_kwarg("use_sde", True), "gSDE"),
    (_set_obs_shape([2, 2]), "observation space of shape [2, 2]"),
])
def test_what_it_cannot_read_is_one_line_and_exit_2(tmp_path, edit, says):
    z = _crafted(tmp_path, "td3_pendulum" if "Actor" not in says else "ppo_pendulum_vecnorm", edit)
    r = run_cli(z, tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_vec_normalize_pickle_runs_no_code(tmp_path):
    """A ``vec_normalize.pkl`` whose pickle would run a command: refused in one line, nothing executed."""
    d = tmp_path / "run"
    shutil.copytree(SB3 / "ppo_pendulum_vecnorm", d)
    marker = tmp_path / "MARKER"
    (d / "vec_normalize.pkl").write_bytes(pickle.dumps({"obs_rms": _Boom(marker)}))
    r = run_cli(d / "model.zip", tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert not marker.exists()
    assert "vec_normalize.pkl" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_crafted_serialized_field_in_data_is_never_unpickled(tmp_path):
    """``data``'s ``:serialized:`` fields (cloudpickle, base64) stay unread: one that would run a command
    changes nothing, the conversion PASSes."""
    import base64

    marker = tmp_path / "MARKER"
    payload = base64.b64encode(pickle.dumps(_Boom(marker))).decode()

    def edit(d):
        d["policy_class"][":serialized:"] = payload
        d["lr_schedule"] = {":type:": "<class 'function'>", ":serialized:": payload}
    z = _crafted(tmp_path, "td3_pendulum", edit)
    r = run_cli(z, tmp_path / "out", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not marker.exists()
    assert io.StringIO(r.stdout).read().startswith("verdict: PASS")


def test_an_on_policy_zip_trained_under_vecnormalize_needs_its_file(tmp_path):
    """PPO/A2C's data records VecNormalize's use (``_last_original_obs``): without its file beside the zip the
    deployed policy would see unnormalized observations, so the conversion refuses, in one line."""
    (tmp_path / "alone").mkdir()
    shutil.copyfile(_zip("ppo_pendulum_vecnorm"), tmp_path / "alone" / "model.zip")
    r = run_cli(tmp_path / "alone" / "model.zip", tmp_path / "out")
    assert r.returncode == 2 and "trained under VecNormalize" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_convert_json_names_the_trainer_and_fits_its_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    r = run_cli(_zip("ppo_multidiscrete"), tmp_path / "out", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    schema = json.loads((Path(C.__file__).parents[1] / "schemas" / "convert.json").read_text())
    jsonschema.validate(d, schema, cls=jsonschema.Draft202012Validator)
    assert d["trained_with"]["format"] == "stable-baselines3" and d["reference"] is None
    assert d["spec"]["source"] == C.SB3_SOURCE and d["spec"]["discrete_branches"] == [3, 4]
    assert d["trained_with"]["action_space"] == "MultiDiscrete(3, 4)"


@pytest.mark.parametrize("target", ["openvino", "litert", "executorch"])
@pytest.mark.parametrize("name", ["sac_pendulum_vecnorm", "ppo_multidiscrete"])
def test_every_deploy_target_takes_an_sb3_policy(target, name, tmp_path):
    """A deploy target (an optional extra: skipped where it is not installed) converts, verifies and
    re-verifies an SB3 policy like any other (check 4 within the derived bound, check 6 its files)."""
    from huggy_convert.exporters.targets import missing

    if missing(target):
        pytest.skip(missing(target))
    out = tmp_path / "out"
    r = run_cli(_zip(name), out, "--targets", f"onnx,pt2,{target}", "-q")
    assert r.returncode == 0 and r.stdout.startswith("verdict: PASS"), r.stdout + r.stderr
    r = run_cli("verify", out)
    assert r.returncode == 0, r.stdout + r.stderr


def test_verify_out_notices_a_changed_vec_normalize_file(tmp_path):
    """The VecNormalize file is a second source, recorded by its sha256 (``trained_with``): ``verify OUT/``
    with another one beside the zip does not run check 1 against it (exit 4, a partial PASS), it never FAILs
    the conversion that was right for the file it read."""
    d = tmp_path / "run"
    shutil.copytree(SB3 / "ppo_pendulum_vecnorm", d)
    assert run_cli(d / "model.zip", d / "out", "-q").returncode == 0
    assert run_cli("verify", d / "out").returncode == 0
    shutil.copyfile(SB3 / "sac_pendulum_vecnorm" / "vec_normalize.pkl", d / "vec_normalize.pkl")
    r = run_cli("verify", d / "out")
    assert r.returncode == 4 and "VecNormalize file changed" in r.stdout, r.stdout + r.stderr
    assert run_cli("verify", d / "out", "--require-complete").returncode == 1
