"""The public API (huggy_convert.api): its docstring examples run, and what a user relies on holds on the
bundled fixtures (memory carried between steps as the official ONNX carries it, one argument order)."""
from __future__ import annotations

import doctest
import tempfile

import numpy as np
import pytest

import huggy_convert
from huggy_convert import api
from huggy_convert.converter import load_checkpoint

from conftest import ROOT, VARIANTS


def test_docstring_examples_run(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the examples name the fixtures from the repository root
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # their tempfile.mkdtemp() folders: this test's
    res = doctest.testmod(api, optionflags=doctest.ELLIPSIS, report=True)
    assert res.failed == 0
    assert res.attempted >= 40  # every public function has its example


def test_every_public_name_is_documented_with_an_example():
    for name in api.__all__:
        obj = getattr(huggy_convert, name)
        assert obj is getattr(api, name)  # the package root is the API
        assert obj.__doc__ and obj.__doc__.strip()
    for fn in (api.convert, api.verify_files, api.load_policy, api.save_policy, api.to_checkpoint,
               api.Session.act, api.Session.sample):
        assert ">>> " in fn.__doc__, fn.__name__


def test_memory_carried_as_the_official_onnx_carries_it():
    """Five steps of the LSTM fixture, the state passed back each time: torch on the checkpoint gives what
    onnxruntime gives on ML-Agents' own ONNX, step after step (within float32 noise)."""
    torch_s = api.load_policy(VARIANTS / "lstm" / "Lstm" / "Lstm-4108.pt")
    onnx_s = api.load_policy(VARIANTS / "lstm" / "Lstm" / "Lstm-4108.onnx")
    assert (torch_s.runner.runtime, onnx_s.runner.runtime) == ("torch", "onnxruntime")
    obs = np.random.default_rng(0).normal(size=(5, 3, 8)).astype(np.float32)
    s_t = s_o = None
    states = []
    for step in range(5):
        a_t, s_t = torch_s.act(obs[step], s_t)
        a_o, s_o = onnx_s.act(obs[step], s_o)
        np.testing.assert_allclose(a_t.continuous, a_o.continuous, atol=1e-5)
        np.testing.assert_allclose(s_t, s_o, atol=1e-5)
        states.append(s_t)
    assert not np.array_equal(states[0], states[-1])
    # without the state carried the later steps differ: the memory matters
    assert not np.allclose(torch_s.act(obs[4])[0].continuous, torch_s.act(obs[4], states[3])[0].continuous)


def test_sample_is_the_seeds_and_masks_are_obeyed():
    s = api.load_policy(VARIANTS / "discrete" / "Discrete" / "Discrete-4101.pt")
    obs = np.random.default_rng(1).normal(size=(64, 9)).astype(np.float32)
    a1, _ = s.sample(obs, seed=5)
    assert np.array_equal(a1.discrete, s.sample(obs, seed=5)[0].discrete)
    assert not np.array_equal(a1.discrete, s.sample(obs, seed=6)[0].discrete)
    assert s.spec.discrete_branches == (3, 2)
    masks = np.ones((64, 5), np.float32)
    masks[:, :2] = 0  # branch 0 (3 choices): only its third action allowed
    assert set(a1.discrete[:, 0]) > {2}  # unmasked, the others are drawn too
    assert np.all(s.sample(obs, seed=5, action_masks=masks)[0].discrete[:, 0] == 2)
    assert np.all(s.act(obs, action_masks=masks)[0].discrete[:, 0] == 2)


def test_observations_in_every_form_give_the_same_actions():
    s = api.load_policy(VARIANTS / "twoobs" / "TwoObs")  # a run directory: its newest checkpoint
    obs = np.random.default_rng(2).normal(size=(3, 13)).astype(np.float32)
    flat = s.act(obs)[0].continuous
    split = s.act([obs[:, :8], obs[:, 8:]])[0].continuous
    named = s.act({"obs_0": obs[:, :8], "obs_1": obs[:, 8:]})[0].continuous
    assert np.array_equal(flat, split) and np.array_equal(flat, named)
    with pytest.raises(huggy_convert.errors.InputError, match="2 observations"):
        s.act([obs[:, :8]])
    with pytest.raises(huggy_convert.errors.InputError):
        s.act(obs, np.zeros((3, 1, 4), np.float32))  # a memory for a policy without one


def test_save_policy_takes_the_policy_first(tmp_path):
    s = api.load_policy(VARIANTS / "small" / "Small" / "Small-4157.pt")
    p = huggy_convert.save_policy(s.policy, tmp_path / "a.safetensors")
    assert p.read_bytes() == huggy_convert.save_policy(s, tmp_path / "b.safetensors").read_bytes()
    with pytest.raises(TypeError, match="the policy first"):
        huggy_convert.save_policy(tmp_path / "c.safetensors", s.policy)
    assert not (tmp_path / "c.safetensors").exists()


def test_to_checkpoint_from_a_checkpoint_path_gives_its_policy_back(tmp_path):
    src = VARIANTS / "small" / "Small" / "Small-4157.pt"
    res = api.to_checkpoint(src, tmp_path)
    assert res.ok and res.source is None
    back, orig = load_checkpoint(res.path), load_checkpoint(src)
    assert back.global_step == orig.global_step
    assert list(back.policy) == list(orig.policy)  # the same keys in the same order, then each one's dtype and bits
    for k, v in orig.policy.items():
        assert back.policy[k].dtype == v.dtype and np.asarray(back.policy[k]).tobytes() == np.asarray(v).tobytes(), k
