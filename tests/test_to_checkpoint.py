"""Back into ML-Agents: ``to-checkpoint POLICY.safetensors OUT/`` writes the ``checkpoint.pt`` that
ML-Agents 1.1.0 initializes from, for Huggy and every variant (the canonical files are made here from
the committed fixtures, which ML-Agents' own trainer wrote).

Without mlagents (CI): the file's ``Policy`` dict equals the original checkpoint's key for key (order,
dtype, shape, bits) and this tool reads it back as the same canonical policy. With the fixture
generator's environment (``fixtures/.venv``, or ``$HUGGY_MLAGENTS_PYTHON``): ML-Agents' own trainer
code initializes from it and its policy gives the outputs of the original."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FIXTURES, HUGGY_RUN, ROOT, VARIANTS, run_cli, step_checkpoints, variant_names
from huggy_convert import contract as C
from huggy_convert.core.flow import MASK, OBSERVATION, SAMPLED, STATE
from huggy_convert.converter import convert_checkpoint, load_checkpoint, load_policy, save_policy
from huggy_convert.converter.state_dict import policy_state_dict, torch_order
from huggy_convert.errors import SpecError
from huggy_convert.pipeline import prepare_conversion, to_checkpoint

RUNS = {"huggy": HUGGY_RUN, **{n: VARIANTS / n for n in variant_names()}}


def mlagents_python():
    p = os.environ.get("HUGGY_MLAGENTS_PYTHON") or str(FIXTURES / ".venv" / "bin" / "python")
    return p if Path(p).is_file() else None


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """name -> (original .pt, its .safetensors as convert writes it (divisor decided against the
    official ONNX), the to-checkpoint result)."""
    out = {}
    for name, run in RUNS.items():
        ck = step_checkpoints(run)[-1]
        d = tmp_path_factory.mktemp(name)
        policy = prepare_conversion(load_checkpoint(ck), ck.with_suffix(".onnx")).conversion.policy
        st = save_policy(policy, d / f"{ck.stem}.safetensors")
        out[name] = (ck, st, to_checkpoint(st, d / "back"))
    return out


def test_the_policy_dict_is_the_original_key_for_key(written):
    for name, (ck, st, res) in written.items():
        orig = torch.load(ck, map_location="cpu", weights_only=True)
        back = torch.load(res.path, map_location="cpu", weights_only=True)
        assert list(back) == [C.CKPT_POLICY, C.CKPT_GLOBAL_STEP], name
        want, got = orig[C.CKPT_POLICY], back[C.CKPT_POLICY]
        assert list(got) == list(want), name  # the same keys, in ML-Agents' order
        for k, t in want.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), (name, k)
        gs = back[C.CKPT_GLOBAL_STEP][C.GLOBAL_STEP_KEY]
        assert gs.dtype == torch.int64 and gs.tolist() == orig[C.CKPT_GLOBAL_STEP][C.GLOBAL_STEP_KEY].tolist()
        assert res.ok and res.read_back["bitwise_equal"] == res.read_back["tensors"] > 0, name


def test_read_back_by_the_converter_gives_the_same_canonical_policy(written):
    """The file converts again into the canonical tensors and spec of the original checkpoint, bit for
    bit (IEEE divisors on both sides); the safetensors' own tensors too, bar an adopted divisor."""
    for name, (ck, st, res) in written.items():
        a, b = convert_checkpoint(ck).policy, convert_checkpoint(res.path).policy
        assert a.spec == b.spec, name
        assert set(a.tensors) == set(b.tensors), name
        for k in a.tensors:
            assert a.tensors[k].shape == b.tensors[k].shape and a.tensors[k].tobytes() == b.tensors[k].tobytes(), (name, k)
        p = load_policy(st)
        for k in p.sources:
            assert p.tensors[k].tobytes() == b.tensors[k].tobytes(), (name, k)


def test_the_same_policy_gives_the_same_bytes(written, tmp_path):
    ck, st, res = written["twoobs"]
    again = to_checkpoint(st, tmp_path)
    assert again.sha256 == res.sha256 and again.path.read_bytes() == res.path.read_bytes()


def test_torch_order_is_modules_own_tensors_then_children():
    keys = ["a.m.w", "a.p", "b", "a.m.b", "a.n.x"]
    assert torch_order(keys) == ["b", "a.p", "a.m.w", "a.m.b", "a.n.x"]


def test_exact_step_counts_past_float32_and_a_fractional_count(tmp_path):
    """A normalizer step count float32 cannot hold (kept in the metadata) goes back exact, int64; a
    count that is not whole cannot go back at all."""
    ck = step_checkpoints(VARIANTS / "small")[-1]
    obj = torch.load(ck, map_location="cpu", weights_only=True)
    big = 2 ** 24 + 1
    for key in list(obj[C.CKPT_POLICY]):
        if key.endswith(C.NORM_STEPS):
            obj[C.CKPT_POLICY][key] = torch.tensor(big)
    torch.save(obj, tmp_path / ck.name)
    st = save_policy(convert_checkpoint(tmp_path / ck.name).policy, tmp_path / "big.safetensors")
    res = to_checkpoint(st, tmp_path / "out")
    back = torch.load(res.path, map_location="cpu", weights_only=True)[C.CKPT_POLICY]
    steps = back[C.NORM_PREFIX.format(i=0) + C.NORM_STEPS]
    assert steps.dtype == torch.int64 and steps.shape == () and int(steps) == big
    pol = load_policy(st)
    pol.tensors[C.c_norm(0, C.NORM_STEPS)] = np.array(1.5, np.float32)
    pol.metadata["normalizer_exact_steps"] = "{}"
    with pytest.raises(SpecError, match="not a whole count"):
        policy_state_dict(pol)


def test_cli(written, tmp_path):
    ck, st, _ = written["huggy"]
    out = tmp_path / "ck"
    r = run_cli("to-checkpoint", st, out)
    assert r.returncode == 0, r.stderr
    assert f"-> {out / C.CHECKPOINT_FILE}" in r.stdout and "read back: spec equal" in r.stdout
    assert "--initialize-from=<run-id>" in r.stdout and f"results/<run-id>/Huggy/{C.CHECKPOINT_FILE}" in r.stdout
    j = run_cli("to-checkpoint", st, out, "--global-step", "7", "--json")
    s = json.loads(j.stdout)
    assert j.returncode == 0 and s["ok"] and s["training_step"] == 7 and s["read_back"]["training_step"] == 7
    assert s["modules"] == [C.CKPT_POLICY, C.CKPT_GLOBAL_STEP] and len(s["policy_keys"]) == 21
    bad = run_cli("to-checkpoint", ck, tmp_path / "none")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "canonical .safetensors" in bad.stderr
    assert not (tmp_path / "none").exists()


def _job(name, ck, st, res, save):
    pol = load_policy(st)
    sig = pol.spec.io_signature()
    first = lambda kind: next((p.name for p in sig.inputs if p.kind == kind), None)  # noqa: E731
    return {"name": name, "config": str(ck.parents[1] / "configuration.yaml"), "behavior": ck.parent.name,
            "checkpoint": str(res.path), "original": str(ck), "golden": str(ck.with_suffix(".golden.npz")),
            "obs_sizes": list(pol.spec.obs_sizes), "obs_shapes": [list(s) for s in pol.spec.obs_shapes],
            "continuous": pol.spec.continuous_size,
            "branches": list(pol.spec.discrete_branches), "outputs": sig.output_names(),
            "obs_inputs": [p.name for p in sig.inputs if p.kind == OBSERVATION],
            "mask_input": first(MASK), "memory_input": first(STATE),
            "deterministic": [p.name for p in sig.outputs if p.kind != SAMPLED], "save": str(save)}


def test_mlagents_initializes_from_it_and_acts_as_the_original(written, tmp_path):
    """ML-Agents 1.1.0's own trainer code (``--initialize-from``, ``init_path`` and ``--resume``) loads
    the file: no missing or unexpected Policy key, only the optimizer and critic started fresh; its actor
    is the original's bit for bit and gives the original's outputs bit for bit, within the derived
    float32 bound of the official ONNX's (onnxruntime, the golden files)."""
    py = mlagents_python()
    if py is None:
        pytest.skip("mlagents is not installed here: set HUGGY_MLAGENTS_PYTHON or build fixtures/.venv "
                    "(fixtures/README.md) to load the checkpoints with ML-Agents' own code")
    from huggy_convert.verify.bounds import judge, reference_forward, within_both

    jobs = [_job(n, ck, st, res, tmp_path / f"{n}.npz") for n, (ck, st, res) in written.items()]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    p = subprocess.run([py, str(ROOT / "tests" / "mlagents_initialize.py"), str(tmp_path / "jobs.json")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = {r["name"]: r for r in json.loads(p.stdout.strip().splitlines()[-1])}
    assert set(results) == set(written)
    for job in jobs:
        r, name = results[job["name"]], job["name"]
        assert r["ours_warnings"] and all(w.startswith("Failed to load for module " + C.CKPT_KNOWN_PREFIXES[0])
                                          for w in r["ours_warnings"]), (name, r["ours_warnings"])
        assert r["original_warnings"] == [], name
        assert r["ours_step_after_initialize"] == 0 and r["ours_step_after_resume"] == r["original_step_after_resume"] > 0
        assert r["state_dict_keys_equal"] and r["state_dict_mismatches"] == [] and r["init_path_bitwise"], name
        outs = dict(np.load(job["save"]))
        golden = dict(np.load(job["golden"]))
        pol = load_policy(written[name][1])
        ref = reference_forward(pol, {k: golden[k] for k in pol.spec.input_names()})
        for out in job["deterministic"]:
            assert r["outputs"][out]["bitwise_vs_original_initialized"], (name, out)
            a = outs[f"ours.{out}"]
            if out in ref.values and ref.values[out].dtype.kind == "f":
                j = within_both(ref, ref, out, a, golden[out])
                assert j["ok"], (name, out, j)
            elif out in ref.values:  # argmax: the reference's, or a tie float32 cannot resolve
                assert judge(ref, out, a)["ok"] and np.array_equal(a, golden[out]), (name, out)
            else:
                assert np.array_equal(a.astype(golden[out].dtype).reshape(golden[out].shape), golden[out]), (name, out)
