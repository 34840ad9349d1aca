"""The review's findings on batch/, cli/ and the API, held: ``verify OUT/``'s two drivers give each set
the same profile and note, the exit code of ``verify`` is decided before its display, a sample carries
the next memory state without a forward of its own, one zero memory, a closed loop's masks made once."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import huggy_convert as hc
from huggy_convert import contract as C
from huggy_convert import errors
from huggy_convert.batch import reverify
from huggy_convert.batch.manifest import MANIFEST_FORMAT, MANIFEST_JSON, PROFILE_BATCH, PROFILE_FULL
from huggy_convert.cli import main, render
from huggy_convert.cli.render import EXIT_INTERRUPTED
from huggy_convert.runtime.feeds import Stepper, complete_feed
from huggy_convert.verify import VerifyOptions

VARIANTS = Path(__file__).resolve().parents[1] / "fixtures" / "variants"
SMALL = VARIANTS / "small" / "Small" / "Small-4157.pt"
LSTM = VARIANTS / "lstm" / "Lstm" / "Lstm-4108"
DISCRETE = VARIANTS / "discrete" / "Discrete" / "Discrete-4101.pt"
FAST = VerifyOptions(dtypes=("float32",))


@pytest.fixture(scope="module")
def batch_out(tmp_path_factory):
    """Two converted sets (a continuous and a discrete policy); OUT/manifest.json records the batch profile
    for the first, the full one for the second."""
    out = tmp_path_factory.mktemp("out")
    assert hc.convert(SMALL, out, program=False).ok and hc.convert(DISCRETE, out, program=False).ok
    (out / MANIFEST_JSON).write_text(json.dumps({"format": MANIFEST_FORMAT, "checkpoints": [
        {"source": "Small-4157.pt", "stem": "Small-4157", "profile": PROFILE_BATCH},
        {"source": "Discrete-4101.pt", "stem": "Discrete-4101", "profile": PROFILE_FULL}]}))
    return out


def _strip(rep: dict):
    return rep["verdict"], [(c["id"], c["status"]) for c in rep["checks"]], rep["notes"]


def test_both_drivers_of_verify_out_give_the_recorded_profile_and_its_note(batch_out, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(batch_out, a)
    shutil.copytree(batch_out, b)
    reports, warns = reverify.verify_dir(a, options=FAST)
    recs, _ = reverify.verify_out(b, reverify.Asked(options=FAST), jobs=1, processes=False)
    assert warns == [] and len(reports) == len(recs) == 2
    assert [r["profile"] for r in recs] == [PROFILE_FULL, PROFILE_BATCH]  # Discrete-4101, Small-4157
    assert [_strip(r.to_dict()) for r in reports] == [_strip(r["report"]) for r in recs]
    assert not any("batch verification profile" in n for n in reports[0].notes)
    assert any("batch verification profile" in n and MANIFEST_JSON in n for n in reports[1].notes)
    # --profile full: the full profile in both, without the note
    reports, _ = reverify.verify_dir(a, options=FAST, profile=PROFILE_FULL)
    recs, _ = reverify.verify_out(b, reverify.Asked(options=FAST, profile=PROFILE_FULL), jobs=1, processes=False)
    assert [r["profile"] for r in recs] == [PROFILE_FULL] * 2
    assert [_strip(r.to_dict()) for r in reports] == [_strip(r["report"]) for r in recs]
    assert not any("batch verification profile" in n for r in reports for n in r.notes)
    # the API: the reports, as documented
    assert [r.verdict for r in hc.verify_files(a, dtypes=("float32",))] == ["PASS", "PASS"]


def test_a_tolerance_warning_reaches_verify_dir_and_the_api(batch_out, tmp_path):
    shutil.copytree(batch_out, tmp_path / "a")
    opts = VerifyOptions(dtypes=("float32",), atol={C.OUT_CONT_DET: 0.5, "deterministic_discrete_actions": 0.5})
    with pytest.raises(errors.InputError):  # an output of none of the sets: refused
        reverify.verify_dir(tmp_path / "a", options=VerifyOptions(atol={"no_such_output": 0.5}))
    reports, warns = reverify.verify_dir(tmp_path / "a", options=opts)  # an output of one of them: a warning
    assert len(warns) == 2 and "not of Small-4157" in warns[1] and all(r.ok for r in reports)
    with pytest.warns(UserWarning) as caught:
        hc.verify_files(tmp_path / "a", dtypes=("float32",), atol=opts.atol)
    assert sorted(str(w.message) for w in caught) == sorted(warns), [str(w.message) for w in caught]


def test_verify_exit_code_is_the_verdict_when_the_display_fails(batch_out, tmp_path, monkeypatch):
    shutil.copytree(batch_out, tmp_path / "a")

    def boom(*args, **kwargs):
        raise RuntimeError("display broke")

    monkeypatch.setattr(render, "verification", boom)
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "a"), "--verify-dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert "could not be printed in full" in r.stderr and "exit code 0 is the verdict's" in r.stderr


def test_exit_interrupted_has_one_home():
    assert EXIT_INTERRUPTED is errors.EXIT_INTERRUPTED == 130


@pytest.mark.parametrize("suffix", [".pt", ".onnx"])
def test_sample_returns_the_next_state_without_an_infer_of_its_own(suffix, monkeypatch):
    s = hc.load_policy(LSTM.with_suffix(suffix))
    obs = np.ones((3, 8), np.float32)
    _, want = s.act(obs)
    _, want2 = s.act(obs, want)

    def no_infer(feed):
        raise AssertionError("sample ran infer")

    monkeypatch.setattr(s.runner, "infer", no_infer)
    a, state = s.sample(obs, seed=1)
    assert np.array_equal(state, want) and a.continuous.shape == (3, 2)
    assert np.array_equal(s.sample(obs, state, seed=2)[1], want2)  # the state passed back in moves on


def test_one_zero_memory_and_a_loops_masks_made_once():
    session = hc.load_policy(LSTM.with_suffix(".pt"))
    lstm = session.spec
    z = session.initial_state(3)
    assert z.shape == (3, 1, lstm.memory_size) and z.dtype == np.float32 and not z.any()
    assert hc.load_policy(SMALL).initial_state(3) is None
    assert np.array_equal(complete_feed(lstm, {"obs_0": np.zeros((3, 8), np.float32)})[C.RECURRENT_IN], z)
    disc = hc.load_policy(DISCRETE).spec
    m = Stepper(disc, 2)
    f1, f2 = m.step({}), m.step({})
    assert f1[C.ACTION_MASKS] is f2[C.ACTION_MASKS]
    assert f1[C.ACTION_MASKS].shape == (2, disc.discrete_total) and f1[C.ACTION_MASKS].all()


def test_a_policy_recovered_from_its_own_official_onnx_is_re_verified_on_one_read(tmp_path, monkeypatch):
    """The source and the official ONNX are one file (one sha256): ``locate_source`` reads and hashes it,
    check 2's reader takes those bytes, and the recovery takes the model it validated."""
    assert hc.convert(LSTM.with_suffix(".onnx"), tmp_path, program=False).ok
    calls = []
    read_reference, read_onnx = reverify.read_reference, reverify.read_onnx
    monkeypatch.setattr(reverify, "read_reference",
                        lambda path, data=None: calls.append(("reference", data is not None)) or
                        read_reference(path, data=data))
    monkeypatch.setattr(reverify, "read_onnx", lambda *a, **k: calls.append(("onnx", k.get("data") is not None)) or
                        read_onnx(*a, **k))
    reports, _ = reverify.verify_dir(tmp_path, options=FAST)
    assert calls == [("reference", True)]
    assert reports[0].ok and reports[0].complete, reports[0].render()
    assert [c.status for c in reports[0].checks[:2]] == ["pass", "pass"]
