"""Issue 12, the run modes on the attention and goal-conditioned families (the cameras' are in
test_visual.py): ``act`` with entity and goal inputs from an .npz, the batch over their run
directories and the matrix on their checkpoints, against the files ML-Agents' own code wrote
(fixtures/families/attention, attention_mlagents030, goal_hyper, goal_none)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import FIXTURES, family_step, run_cli

from huggy_convert import contract as C
from huggy_convert.runtime import OrtRunner

FAMILIES = FIXTURES / "families"
RUNS = {r["name"]: r for r in json.loads((FAMILIES / "manifest.json").read_text())["runs"]}


_step = family_step


@pytest.mark.parametrize("name", ["attention", "attention_mlagents030", "goal_hyper", "goal_none"])
def test_act_takes_entity_and_goal_inputs_from_an_npz(tmp_path, name):
    """``act CKPT --obs FILE.npz`` with ML-Agents' golden rows (entity sets with padded rows, goals):
    through the ONNX rebuilt from the checkpoint, the official file's actions bit for bit; through the
    torch module, within 1e-5 of them."""
    pt, off, golden = _step(name)
    g = np.load(golden)
    inputs = [i.name for i in onnx.load(str(off)).graph.input]
    feed = {k: g[k][:6] for k in inputs}
    for k, v in feed.items():
        if v.ndim == 3:  # an entity set: rows with fewer entities (the rest padding: all zero), one with none
            v = v.copy()
            v[0, 2:] = 0
            v[1, 1:] = 0
            v[2] = 0
            feed[k] = v
    obs = tmp_path / "obs.npz"
    np.savez(obs, **feed)
    want = OrtRunner(off).infer(feed)[C.OUT_CONT_DET]
    for runtime in ("onnxruntime", "torch"):
        r = run_cli("act", pt, "--obs", obs, "--runtime", runtime, "--json")
        assert r.returncode == 0, r.stderr
        got = np.asarray(json.loads(r.stdout)["outputs"][C.OUT_CONT_DET], np.float32)
        assert got.shape == want.shape == (6, RUNS[name]["continuous_size"])
        if runtime == "onnxruntime":
            assert got.tobytes() == want.tobytes(), name
        else:
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["attention", "goal_hyper"])
def test_batch_and_matrix_cover_the_family(tmp_path, name):
    """The family's run directory through the batch (every checkpoint PASS, ``checkpoint.pt``
    recognised, the deployed ONNX's verdict), and the matrix's observation, ONNX and export groups on its
    newest checkpoint: no failure."""
    from huggy_convert.modes.matrix import run_matrix

    out = tmp_path / "batch"
    r = run_cli(FAMILIES / name, out, "--json", "--jobs", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["summary"]["failed"] == 0
    steps = [e for e in m["checkpoints"] if e.get("verify")]
    assert len(steps) >= len(RUNS[name]["checkpoints"])
    assert all(e["verify"]["verdict"] == "PASS" for e in steps)
    res = run_matrix(tmp_path / "m", quick=True, source=_step(name)[0], only=["2", "6", "10"], echo=False)
    cases = res.data["cases"]
    assert res.ok and not [c for c in cases if c["verdict"] == "FAIL"], [c for c in cases if c["verdict"] == "FAIL"]
    assert sum(c["verdict"] == "PASS" for c in cases) >= 20
