"""The batch on folders of Stable-Baselines3 model zips, the way SB3 users keep them: CheckpointCallback's
saves (``rl_model_<N>_steps.zip`` with ``rl_model_vecnormalize_<N>_steps.pkl``), rl-baselines3-zoo's log
folder (``<EnvName>.zip``, ``best_model.zip``, ``<EnvName>/vecnormalize.pkl``), and zips beside ML-Agents
checkpoints. The folders are built in ``tmp_path`` from copies of the SB3-written fixtures
(``fixtures/sb3/<run>/``, or ``HUGGY_SB3_FIXTURES``); each batch must exit 0 with every entry PASS, and
``verify OUT/`` must re-verify it. Also: ``find_vec_normalize``'s lookup order, ``zip_step``, and
``discover`` on zips (the run modes take ML-Agents checkpoints only)."""
from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from conftest import FIXTURES, VARIANTS, run_cli

from huggy_convert.batch.manifest import MANIFEST_JSON
from huggy_convert.batch.rundir import discover, newest_checkpoint, step_checkpoints
from huggy_convert.errors import InputError
from huggy_convert.importers.sb3_files import find_vec_normalize, zip_step

SB3 = Path(os.environ.get("HUGGY_SB3_FIXTURES") or FIXTURES / "sb3")
RUNS = ("ppo_pendulum_vecnorm", "td3_pendulum", "ppo_cartpole_relu")
if not all((SB3 / r / "model.zip").is_file() for r in RUNS):
    pytest.skip(f"no SB3 fixtures in {SB3} (HUGGY_SB3_FIXTURES names another folder)", allow_module_level=True)

VECNORM = SB3 / "ppo_pendulum_vecnorm"
SMALL = VARIANTS / "small" / "Small" / "Small-4157.pt"


def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


def _entries(out: Path) -> dict:
    return {e["source"]: e for e in json.loads((out / MANIFEST_JSON).read_text())["checkpoints"]}


def _batch(src: Path, out: Path) -> dict:
    r = run_cli(src, out, "-j", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    v = run_cli("verify", out)
    assert v.returncode == 0, v.stdout + v.stderr
    return _entries(out)


# --- find_vec_normalize: the lookup order ----------------------------------------------------------------
def test_callback_vecnormalize_comes_first(tmp_path):
    z = _touch(tmp_path / "rl_model_4096_steps.zip")
    own = _touch(tmp_path / "rl_model_vecnormalize_4096_steps.pkl")
    _touch(tmp_path / "rl_model_vecnormalize_2048_steps.pkl")  # another step's statistics
    for name in ("rl_model_4096_steps_vec_normalize.pkl", "vec_normalize.pkl", "vecnormalize.pkl"):
        _touch(tmp_path / name)
    _touch(tmp_path / "Env-v1" / "vecnormalize.pkl")
    assert find_vec_normalize(z) == own


def test_another_steps_callback_file_is_not_taken(tmp_path):
    z = _touch(tmp_path / "rl_model_4096_steps.zip")
    _touch(tmp_path / "rl_model_vecnormalize_2048_steps.pkl")
    assert find_vec_normalize(z) is None
    plain = _touch(tmp_path / "vec_normalize.pkl")
    assert find_vec_normalize(z) == plain


def test_the_names_beside_the_zip_in_their_order(tmp_path):
    z = _touch(tmp_path / "model.zip")
    names = ["model_vec_normalize.pkl", "model.vec_normalize.pkl", "vec_normalize.pkl", "vecnormalize.pkl"]
    for n in names:
        _touch(tmp_path / n)
    _touch(tmp_path / "Env-v1" / "vecnormalize.pkl")
    for n in names:  # each found while it is there, before the ones after it and the zoo's subfolder
        assert find_vec_normalize(z) == tmp_path / n
        (tmp_path / n).unlink()
    assert find_vec_normalize(z) == tmp_path / "Env-v1" / "vecnormalize.pkl"


def test_the_zoo_subfolder_only_when_it_is_the_only_one(tmp_path):
    z = _touch(tmp_path / "best_model.zip")
    (tmp_path / "Pendulum-v1").mkdir()
    assert find_vec_normalize(z) is None
    zoo = _touch(tmp_path / "Pendulum-v1" / "vecnormalize.pkl")
    (tmp_path / "tensorboard").mkdir()  # another subfolder, without one: no matter
    _touch(tmp_path / ".hidden" / "vecnormalize.pkl")  # hidden folders are not looked into
    assert find_vec_normalize(z) == zoo
    _touch(tmp_path / "CartPole-v1" / "vecnormalize.pkl")  # two candidates: neither is chosen
    assert find_vec_normalize(z) is None


# --- zip_step, discover ---------------------------------------------------------------------------------
def test_zip_step_from_the_name_then_the_data(tmp_path):
    z = _copy(VECNORM / "model.zip", tmp_path / "rl_model_2048_steps.zip")
    assert zip_step(z) == 2048  # the name first (the data states 4096)
    assert zip_step(_copy(VECNORM / "model.zip", tmp_path / "best_model.zip")) == 4096
    bare = tmp_path / "bare.zip"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("data", json.dumps({"policy_class": {}}))
        zf.writestr("policy.pth", b"")
    assert zip_step(bare) is None
    assert zip_step(_touch(tmp_path / "broken.zip")) is None


def test_discover_takes_sb3_zips_beside_pt_files(tmp_path):
    _copy(VECNORM / "model.zip", tmp_path / "rl_model_2048_steps.zip")
    _copy(VECNORM / "model.zip", tmp_path / "rl_model_4096_steps.zip")
    _copy(SMALL, tmp_path / "Small-4157.pt")
    _copy(SB3 / "td3_pendulum" / "model.zip", tmp_path / "Small-4157.zip")  # one stem, two files
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:  # not a model zip: not an item
        zf.writestr("data", "{}")
    items = {it.rel: it for it in discover(tmp_path).items}
    assert sorted(items) == ["Small-4157.pt", "Small-4157.zip", "rl_model_2048_steps.zip", "rl_model_4096_steps.zip"]
    a, b, pt, clash = (items[k] for k in ("rl_model_2048_steps.zip", "rl_model_4096_steps.zip", "Small-4157.pt",
                                          "Small-4157.zip"))
    assert (a.step, b.step, clash.step, pt.step) == (2048, 4096, 1500, 4157)
    assert (a.foreign, clash.foreign, pt.foreign) == (True, True, False)
    assert (a.stem, b.stem, pt.stem, clash.stem) == ("rl_model_2048_steps", "rl_model_4096_steps", "Small-4157",
                                                     "Small-4157-zip")
    assert a.behavior == tmp_path.name and not a.newest and b.newest and pt.newest
    # the run modes: ML-Agents checkpoints only
    assert step_checkpoints(tmp_path) == [tmp_path / "Small-4157.pt"]
    assert newest_checkpoint(tmp_path) == tmp_path / "Small-4157.pt"
    (tmp_path / "Small-4157.pt").unlink()
    with pytest.raises(InputError):
        newest_checkpoint(tmp_path)


# --- the batch, end to end ------------------------------------------------------------------------------
def test_a_checkpoint_callback_folder(tmp_path):
    src = tmp_path / "checkpoints"
    for n in (2048, 4096):
        _copy(VECNORM / "model.zip", src / f"rl_model_{n}_steps.zip")
        _copy(VECNORM / "vec_normalize.pkl", src / f"rl_model_vecnormalize_{n}_steps.pkl")
    out = tmp_path / "out"
    es = _batch(src, out)
    assert sorted(es) == ["rl_model_2048_steps.zip", "rl_model_4096_steps.zip"]
    for n in (2048, 4096):
        e = es[f"rl_model_{n}_steps.zip"]
        assert (e["step"], e["stem"], e["status"], e["verify"]["verdict"]) == (n, f"rl_model_{n}_steps", "ok", "PASS")
        assert e["trained_with"]["vec_normalize"] == f"rl_model_vecnormalize_{n}_steps.pkl"
        assert e["spec"]["normalize"] is True and e["spec"]["source"] == "sb3"
        assert all((out / a["file"]).is_file() for a in e["outputs"].values())
    assert es["rl_model_4096_steps.zip"]["profile"] == "full" and es["rl_model_2048_steps.zip"]["profile"] == "batch"


def test_a_zoo_log_folder(tmp_path):
    src = tmp_path / "logs" / "ppo" / "Pendulum-v1_1"
    for name in ("Pendulum-v1.zip", "best_model.zip"):
        _copy(VECNORM / "model.zip", src / name)
    _copy(VECNORM / "vec_normalize.pkl", src / "Pendulum-v1" / "vecnormalize.pkl")
    es = _batch(src, tmp_path / "out")
    assert sorted(es) == ["Pendulum-v1.zip", "best_model.zip"]
    for name, e in es.items():
        assert (e["step"], e["stem"], e["verify"]["verdict"]) == (4096, name[:-4], "PASS")  # num_timesteps
        assert e["trained_with"]["vec_normalize"] == "Pendulum-v1/vecnormalize.pkl"
        assert e["spec"]["normalize"] is True


def test_zips_beside_an_mlagents_run(tmp_path):
    src = tmp_path / "mixed"
    _copy(SMALL, src / "Small-4157.pt")
    _copy(SMALL, src / "checkpoint.pt")  # ML-Agents' newest step twice: recognised by content, never by a zip
    _copy(SB3 / "td3_pendulum" / "model.zip", src / "td3.zip")
    _copy(SB3 / "ppo_cartpole_relu" / "model.zip", src / "more" / "model.zip")
    es = _batch(src, tmp_path / "out")
    assert sorted(es) == ["Small-4157.pt", "checkpoint.pt", "more/model.zip", "td3.zip"]
    assert es["checkpoint.pt"]["status"] == "same_as" and es["checkpoint.pt"]["same_as"] == "Small-4157"
    for k in ("Small-4157.pt", "td3.zip", "more/model.zip"):
        assert es[k]["status"] == "ok" and es[k]["verify"]["verdict"] == "PASS", es[k]
    assert (es["td3.zip"]["step"], es["more/model.zip"]["step"]) == (1500, 4096)
    assert es["td3.zip"]["spec"]["algorithm"] == "td3" and es["Small-4157.pt"]["spec"].get("source") is None
    assert es["more/model.zip"]["stem"] == "model" and es["more/model.zip"]["profile"] == "full"
