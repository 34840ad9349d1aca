"""Shared test fixtures: the committed files that ML-Agents' own code wrote (fixtures/)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click.testing
import pytest


def _stderr_apart(init):
    """click < 8.2's ``CliRunner`` mixes stderr into ``output`` unless told (``mix_stderr``, gone in 8.2):
    the tests read ``result.stderr`` as click 8.2+ gives it, on the declared floor (click 8.1) too."""
    def __init__(self, *args, mix_stderr=False, **kwargs):
        init(self, *args, mix_stderr=mix_stderr, **kwargs)
    return __init__


if "mix_stderr" in click.testing.CliRunner.__init__.__code__.co_varnames:
    click.testing.CliRunner.__init__ = _stderr_apart(click.testing.CliRunner.__init__)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
HUGGY_RUN = FIXTURES / "huggy"
VARIANTS = FIXTURES / "variants"
FAMILIES = FIXTURES / "families"
GOAL_FAMILIES = ("goal_hyper", "goal_none")  # goal-conditioned policies (ObservationType.GOAL_SIGNAL)


def step_checkpoints(run_dir: Path):
    """The ``<Behavior>-<step>.pt`` files of a run directory, oldest first."""
    files = [p for p in run_dir.glob("*/*-*.pt")]
    return sorted(files, key=lambda p: int(p.stem.rsplit("-", 1)[1]))


def family_run(name: str) -> dict:
    """A family fixture's record in fixtures/families/manifest.json."""
    return {r["name"]: r for r in json.loads((FAMILIES / "manifest.json").read_text())["runs"]}[name]


def family_step(name: str):
    """The newest step checkpoint of a family fixture, its official ONNX and its golden inputs."""
    c = family_run(name)["checkpoints"][-1]
    return FIXTURES / c["pt"], FIXTURES / c["onnx"], FIXTURES / c["golden"]


def load_families(names):
    """name -> (checkpoint, official ONNX, golden inputs by the policy's input names, the canonical policy)."""
    import numpy as np
    import onnx

    from huggy_convert.converter import load_checkpoint
    from huggy_convert.pipeline import prepare_conversion

    out = {}
    for name in names:
        pt, off, golden = family_step(name)
        ckpt = load_checkpoint(pt)
        pol = prepare_conversion(ckpt, off).conversion.policy
        g = dict(np.load(golden))
        out[name] = (ckpt, onnx.load(str(off)), {k: g[k] for k in pol.spec.input_names()}, pol)
    return out


def assert_rebuilt_outputs_bitwise(official, policy, feeds, outputs):
    """At every opset, the ONNX rebuilt from ``policy`` gives the official file's ``outputs`` bit for bit
    in onnxruntime on every feed of ``feeds`` (name -> inputs); returns the last opset's runner."""
    from huggy_convert import contract as C
    from huggy_convert.exporters.onnx_export import build_onnx
    from huggy_convert.runtime import OrtRunner

    theirs = OrtRunner(official)
    want = {k: theirs.infer(f) for k, f in feeds.items()}
    for opset in C.ONNX_OPSETS:
        ours = OrtRunner(build_onnx(policy, opset))
        for k, f in feeds.items():
            got = ours.infer(f)
            for out in outputs:
                assert got[out].tobytes() == want[k][out].tobytes(), (opset, k, out)
    return ours


def bitwise_outputs(spec):
    """The outputs that are comparable bit for bit: the constants, the deterministic actions (an argmax
    among them) and the memory (``recurrent_out``)."""
    sig = spec.io_signature()
    return [p.name for p in sig.constant_outputs()] + sig.deterministic_output_names()


def assert_onnx_mirrors_official(policy, official, nodes=None, manifest_nodes=None):
    """Opset 9: the ONNX rebuilt from ``policy`` passes check 2 against ``official`` (op sequence,
    attributes, initializers paired by node and input slot), has its node types in order, and every
    initializer it shares a name with the official file (the checkpoint's keys) is bitwise that one
    (the folded divisor has another name there). ``nodes=(n9, n13)``: it has ``n9`` nodes (and so has
    the official file; ``manifest_nodes``, the generator's recorded count, equals it too where given) and
    the rebuild at opset 13 has ``n13``. Returns the rebuilt model."""
    from onnx import numpy_helper

    from huggy_convert.exporters.onnx_export import build_onnx
    from huggy_convert.verify.checks import check_onnx_structure

    ours = build_onnx(policy, 9)
    c = check_onnx_structure(ours, official, "rebuilt", "official", policy)
    assert c.status == "pass", [(s.title, s.summary) for s in c.children]
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in official.graph.node]
    theirs = {t.name: numpy_helper.to_array(t).tobytes() for t in official.graph.initializer}
    paired = [t for t in ours.graph.initializer if t.name in theirs]
    assert paired
    for t in paired:
        assert numpy_helper.to_array(t).tobytes() == theirs[t.name], t.name
    if nodes is not None:
        n9, n13 = nodes
        assert len(ours.graph.node) == len(official.graph.node) == n9
        if manifest_nodes is not None:
            assert manifest_nodes == n9
        assert len(build_onnx(policy, 13).graph.node) == n13
    return ours


ML_AGENTS_FILES = (".pt", ".onnx", ".golden.npz")  # a step checkpoint, its official ONNX, its golden I/O


def copy_sources(checkpoint: Path, dst: Path) -> Path:
    """The checkpoint and what ML-Agents wrote beside it (official ONNX, golden inputs), copied into
    ``dst``; returns the copied checkpoint."""
    dst.mkdir(parents=True, exist_ok=True)
    for suffix in ML_AGENTS_FILES:
        shutil.copyfile(checkpoint.with_suffix(suffix), dst / (checkpoint.stem + suffix))
    return dst / checkpoint.name


def copy_out(converted: Path, dst: Path) -> Path:
    """A test's own copy, at ``dst``, of a module-scoped OUT (``converted``): to change, move or delete
    files in without touching the other tests' OUT."""
    shutil.copytree(converted, dst)
    return dst


def rerecord(path: Path) -> None:
    """The report beside the artifact at ``path`` (``<stem>.verify.json``) records that file's sha256 now,
    as a conversion that wrote this file would have (a file other than the one its report records fails
    check 6). The artifact's kind (golden, onnx, ...) is read from its suffix."""
    from huggy_convert.core.artifacts import REPORT, SUFFIXES

    kind, suffix = next((k, s) for k, s in SUFFIXES.items() if k != REPORT and path.name.endswith(s))
    report = path.with_name(path.name[:-len(suffix)] + SUFFIXES[REPORT])
    rep = json.loads(report.read_text())
    rep["recorded"]["artifacts"][kind]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    report.write_text(json.dumps(rep))


def convert_without_sources(checkpoint: Path, src: Path, out: Path, options=None) -> Path:
    """OUT of a conversion whose sources are gone since (converted from a copy in ``src``, then ``src``
    removed): what ``verify OUT/`` sees on another machine, or after the run directory was cleaned up."""
    from huggy_convert.pipeline import convert_one

    res = convert_one(copy_sources(checkpoint, src), out, options)
    assert res.report.ok, res.report.render()
    shutil.rmtree(src)
    return out


def assert_back_to_the_checkpoint(ckpt, policy, dest: Path):
    """``to-checkpoint`` of ``policy`` (saved as a canonical file under ``dest``) writes ML-Agents'
    Policy dict of ``ckpt`` back: the same keys in the same order, each tensor's dtype and bits."""
    import torch

    from huggy_convert import contract as C
    from huggy_convert.converter import save_policy
    from huggy_convert.pipeline import to_checkpoint

    res = to_checkpoint(save_policy(policy, dest / "p.safetensors"), dest / "back")
    assert res.ok and res.read_back["bitwise_equal"] == res.read_back["tensors"] > 0
    got = torch.load(res.path, map_location="cpu", weights_only=True)[C.CKPT_POLICY]
    assert list(got) == list(ckpt.policy)
    assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in ckpt.policy.items())


def variant_names():
    return sorted(p.name for p in VARIANTS.iterdir() if p.is_dir()) if VARIANTS.is_dir() else []


@pytest.fixture(scope="session")
def huggy_ckpt() -> Path:
    """The newest Huggy-spec step checkpoint (its official ONNX lies beside it)."""
    return step_checkpoints(HUGGY_RUN)[-1]


@pytest.fixture(scope="session")
def huggy_ckpts():
    return step_checkpoints(HUGGY_RUN)


def variant_ckpt(name: str) -> Path:
    return step_checkpoints(VARIANTS / name)[-1]


# a batch without a terminal prints a progress line every 10 s on stderr (cli.render.progress_interval):
# off in the tests, whose stderr assertions would otherwise depend on the machine's speed
# (tests/test_cli_surface.py turns them on again)
os.environ.setdefault("HUGGY_CONVERT_PROGRESS_INTERVAL", "0")


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run the real console entry point in a subprocess; returns CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "huggy_convert.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=e, timeout=timeout)
