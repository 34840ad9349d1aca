"""Issue 2: checkpoint -> PolicySpec + canonical safetensors, on checkpoints ML-Agents wrote."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from conftest import FIXTURES, HUGGY_RUN, run_cli, step_checkpoints, variant_names

from huggy_convert import contract as C
from huggy_convert.converter import convert_checkpoint, load_policy, policy_bytes, save_policy
from huggy_convert.errors import SpecError, UnsupportedError

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
RUNS = {r["name"]: r for r in MANIFEST["runs"]}


def test_huggy_spec_inferred_from_keys_and_shapes(huggy_ckpt):
    conv = convert_checkpoint(huggy_ckpt)
    spec = conv.policy.spec
    assert spec.algorithm == "ppo"
    assert spec.obs_sizes == (59,)
    assert spec.normalize is True
    assert (spec.hidden_units, spec.num_layers) == (512, 3)
    assert spec.continuous_size == 21 and spec.discrete_branches == () and spec.memory_size == 0
    # REFERENCE.md: Huggy's actor has 566,805 parameters in its linear layers (+21 log_sigma)
    assert spec.parameter_count(include_log_sigma=False) == 566_805
    assert spec.parameter_count() == 566_826
    # the training step comes from global_step, which ML-Agents names in the file name too
    assert conv.checkpoint.global_step == int(huggy_ckpt.stem.rsplit("-", 1)[1])
    # every Policy key is accounted for: mapped or deliberately ignored (the alias twins)
    keys = set(conv.checkpoint.policy)
    assert keys == set(conv.policy.sources.values()) | set(conv.mapped.ignored)
    assert all(k.startswith("network_body.processors.0.normalizer.") for k in conv.mapped.ignored)


@pytest.mark.parametrize("name", variant_names())
def test_variant_specs_match_what_mlagents_was_configured_with(name):
    run = RUNS[name]
    spec = convert_checkpoint(FIXTURES / run["checkpoints"][-1]["pt"], obs_sizes=run["obs_sizes"]
                              if not run["normalize"] else None).policy.spec
    assert spec.algorithm == run["trainer_type"]
    assert list(spec.obs_sizes) == run["obs_sizes"]
    assert spec.normalize == run["normalize"]
    assert spec.hidden_units == run["hidden_units"] and spec.num_layers == run["num_layers"]
    assert spec.continuous_size == run["continuous_size"]
    assert list(spec.discrete_branches) == run["discrete_branches"]
    assert spec.memory_size == run["memory_size"]


def test_safetensors_is_float32_bitwise_and_reproducible(huggy_ckpt, tmp_path):
    conv = convert_checkpoint(huggy_ckpt)
    path = save_policy(conv.policy, tmp_path / "p.safetensors")
    back = load_policy(path)
    assert back.spec == conv.policy.spec
    assert set(back.tensors) == set(conv.policy.tensors)
    for k, v in conv.policy.tensors.items():
        assert back.tensors[k].dtype == np.float32 and back.tensors[k].shape == v.shape
        assert back.tensors[k].tobytes() == v.tobytes(), k
    # every tensor equals its ML-Agents source key, bit for bit
    for k, src in back.sources.items():
        t = conv.checkpoint.policy[src]
        assert np.array_equal(t.to(torch.float32).numpy(), back.tensors[k]), k
    steps = back.tensors[C.c_norm(0, C.NORM_STEPS)]
    assert steps.shape == () and steps.dtype == np.float32
    assert float(steps) == float(conv.checkpoint.policy[C.NORM_PREFIX.format(i=0) + C.NORM_STEPS].item())
    assert json.loads(back.metadata["original_dtypes"])[C.c_norm(0, C.NORM_STEPS)] == {"dtype": "int64", "shape": []}
    # metadata: sorted keys in the header, str -> str, the facts a deployer needs
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header["__metadata__"]
    assert list(meta) == sorted(meta)
    assert meta["source_sha256"] == conv.checkpoint.sha256 and meta["source_file"] == huggy_ckpt.name
    assert meta["training_step"] == str(conv.checkpoint.global_step)
    assert json.loads(meta["sources"])[C.C_MU_W] == "action_model._continuous_distribution.mu.weight"
    assert set(json.loads(meta["versions"])) >= {"huggy_convert", "safetensors", "numpy"}


def test_same_input_gives_byte_identical_file_across_processes(huggy_ckpt, tmp_path):
    shas = []
    for d in ("a", "b"):
        r = run_cli(huggy_ckpt, tmp_path / d, "--no-verify", "--no-program", "--json")
        assert r.returncode == 0, r.stderr
        shas.append(json.loads(r.stdout)["artifacts"]["safetensors"]["sha256"])
        assert (tmp_path / d / f"{huggy_ckpt.stem}.safetensors").is_file()
    assert shas[0] == shas[1]
    assert (tmp_path / "a" / f"{huggy_ckpt.stem}.safetensors").read_bytes() == \
        (tmp_path / "b" / f"{huggy_ckpt.stem}.safetensors").read_bytes()


def test_normalizer_at_huggy_scale():
    """The fixture really has Huggy's traps: a running *sum* far beyond fp16, ~2e6 steps."""
    conv = convert_checkpoint(step_checkpoints(HUGGY_RUN)[-1])
    T = conv.policy.tensors
    var, steps = T[C.c_norm(0, C.NORM_VAR)], float(T[C.c_norm(0, C.NORM_STEPS)])
    assert 1e6 <= steps < 2 ** 24
    assert var.max() > 65504  # overflows float16
    assert np.isinf(var.astype(np.float16)).any() and np.isinf(np.float16(steps))
    assert np.any(T[C.C_LOG_SIGMA] != 0)


def _sd(huggy_ckpt):
    return torch.load(huggy_ckpt, map_location="cpu", weights_only=True)


def test_steps_beyond_float32_exact_range_keep_the_exact_count(huggy_ckpt, tmp_path):
    ck = _sd(huggy_ckpt)
    big = 2 ** 24 + 3  # not representable in float32
    for pre in (C.NORM_PREFIX, C.NORM_ALIAS_PREFIX):
        ck["Policy"][pre.format(i=0) + C.NORM_STEPS] = torch.tensor(big)
    p = tmp_path / "Big-1.pt"
    torch.save(ck, p)
    pol = convert_checkpoint(p).policy
    save_policy(pol, tmp_path / "big.safetensors")
    back = load_policy(tmp_path / "big.safetensors")
    # float32 is what torch divides by (int64 / float32 promotes to float32) ...
    assert float(back.tensors[C.c_norm(0, C.NORM_STEPS)]) == float(torch.tensor(big).to(torch.float32))
    # ... and the exact count survives in the metadata
    assert back.exact_steps == {C.c_norm(0, C.NORM_STEPS): big}


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.__setitem__("continuous_act_size_vector", torch.tensor([20.0])), "continuous_act_size_vector' says [20.0]"),
    (lambda p: p.__setitem__("network_body.processors.0.normalizer.running_mean",
                             p["network_body.processors.0.normalizer.running_mean"] + 1), "differs from its twin"),
    (lambda p: p.__setitem__("network_body.observation_encoder.processors.0.conv_layers.0.weight", torch.zeros(2)),
     "are none of ML-Agents' visual encoders"),
    (lambda p: p.__setitem__("version_number", torch.tensor([2.0])), "not supported yet: model export version"),
])
def test_inconsistent_or_unsupported_policies_are_named(huggy_ckpt, tmp_path, mutate, message):
    ck = _sd(huggy_ckpt)
    mutate(ck["Policy"])
    p = tmp_path / "X-1.pt"
    torch.save(ck, p)
    with pytest.raises((SpecError, UnsupportedError)) as e:
        convert_checkpoint(p)
    assert message in e.value.one_line()
    assert e.value.one_line().startswith(str(p))


def test_policy_bytes_refuses_non_float32():
    from huggy_convert.errors import PolicyFileError

    with pytest.raises(PolicyFileError):
        policy_bytes({"x": np.zeros(2, np.float64)}, {})


def test_observation_shapes_in_the_spec():
    """``obs_shapes`` states each observation's kind; an all-vector spec's JSON is what it was before
    the field existed (the canonical file's bytes do not change), and a bad shape is named."""
    import pytest as _pytest

    from huggy_convert.core.spec import PolicySpec
    from huggy_convert.errors import SpecError

    base = dict(algorithm="ppo", normalize=True, hidden_units=32, num_layers=1, continuous_size=2)
    vec = PolicySpec(obs_sizes=(4, 3), **base)
    assert "obs_shapes" not in vec.to_json()
    assert vec.vector_obs == [(0, 4), (1, 3)] and vec.obs_kind(1) == "vector"
    mixed = PolicySpec(obs_sizes=(300, 4, 30), obs_shapes=((3, 10, 10), (4,), (6, 5)), vis_encode_type="match3", **base)
    assert '"vis_encode_type":"match3"' in mixed.to_json() and "vis_encode_type" not in vec.to_json()
    with _pytest.raises(SpecError, match="smaller than the simple encoder's minimum 20x20"):
        PolicySpec(obs_sizes=(300,), obs_shapes=((3, 10, 10),), vis_encode_type="simple", **base)
    with _pytest.raises(SpecError, match="'vis_encode_type' is ''"):
        PolicySpec(obs_sizes=(300,), obs_shapes=((3, 10, 10),), **base)
    with _pytest.raises(SpecError, match="without a visual observation"):
        PolicySpec(obs_sizes=(4,), vis_encode_type="simple", **base)
    assert [mixed.obs_kind(i) for i in range(3)] == ["visual", "vector", "entity"]
    assert mixed.vector_obs == [(1, 4)] and mixed.obs_total == 4
    assert mixed.observations("visual") == [(0, (3, 10, 10))]
    again = PolicySpec.from_json(mixed.to_json())
    assert again == mixed and hash(again) == hash(mixed)
    assert "3x10x10+4+6x5" in mixed.family
    with _pytest.raises(SpecError, match="entry 0 .* does not hold obs_sizes"):
        PolicySpec(obs_sizes=(301, 4), obs_shapes=((3, 10, 10), (4,)), vis_encode_type="match3", **base)
    with _pytest.raises(SpecError, match="one shape per observation"):
        PolicySpec(obs_sizes=(300, 4), obs_shapes=((3, 10, 10),), vis_encode_type="match3", **base)
    with _pytest.raises(SpecError, match="1 to 3 dimensions"):
        PolicySpec(obs_sizes=(300,), obs_shapes=((3, 10, 10, 1),), **base)
