"""The observation-family fixtures (fixtures/families/, written by ML-Agents' own code through
fixtures/generate.py): every run the generator defines is listed in fixtures/families/manifest.json,
every file of a run directory is listed there with the sha256 it has on disk, and the official ONNX
inputs have the shapes the manifest records (a camera as NCHW, an entity set as [batch, n, size])."""
from __future__ import annotations

import hashlib
import json

import onnx
import pytest

from conftest import FIXTURES

FAMILIES = FIXTURES / "families"
MANIFEST = json.loads((FAMILIES / "manifest.json").read_text())
RUNS = {r["name"]: r for r in MANIFEST["runs"]}
EXPECTED = ["visual_simple", "visual_nature_cnn", "visual_resnet", "visual_match3",
            "visual_fully_connected", "visual_vector", "attention", "goal_hyper", "goal_none",
            "gridworld", "visual_pushblock", "visual_simple_mlagents030", "attention_mlagents030",
            "hallway_mlagents030"]


def test_every_family_run_is_listed():
    assert list(RUNS) == EXPECTED
    kinds = {o["kind"] for r in RUNS.values() for o in r["observations"]}
    assert kinds == {"vector", "visual", "entities", "goal"}
    assert {r["vis_encode_type"] for n, r in RUNS.items() if n.startswith("visual_")} == {
        "simple", "nature_cnn", "resnet", "match3", "fully_connected"}
    assert {RUNS["goal_hyper"]["goal_conditioning_type"], RUNS["goal_none"]["goal_conditioning_type"]} == {
        "hyper", "none"}


@pytest.mark.parametrize("name", EXPECTED)
def test_files_match_the_manifest(name):
    run = RUNS[name]
    on_disk = sorted(str(p.relative_to(FIXTURES)) for p in (FIXTURES / run["path"]).rglob("*") if p.is_file())
    assert on_disk == sorted(run["sha256"])
    for rel, digest in run["sha256"].items():
        assert hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest() == digest, rel
    for c in run["checkpoints"]:
        assert {c["pt"], c["onnx"], c["golden"]} <= set(run["sha256"])


@pytest.mark.parametrize("name", EXPECTED)
def test_onnx_inputs_have_the_recorded_shapes(name):
    run = RUNS[name]
    model = onnx.load(str(FIXTURES / run["final_onnx"]), load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    shapes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input if i.name not in init}
    for obs in run["observations"]:
        assert shapes[obs["onnx_input"]] == obs["onnx_shape"]
        if obs.get("layout") == "HWC":  # mlagents 0.30: an HWC spec, exported as NCHW
            h, w, c = obs["shape"]
            assert obs["onnx_shape"] == ["batch", c, h, w]
        else:
            assert obs["onnx_shape"] == ["batch"] + obs["shape"]
    assert run["versions"]["mlagents"] == ("0.30.0" if name.endswith("_mlagents030") else "1.1.0")
