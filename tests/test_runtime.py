"""The runtime layer: every backend is a Runner with infer(feed) and sample(feed, seed or noise)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import HUGGY_RUN, step_checkpoints, variant_ckpt

from huggy_convert import contract as C
from huggy_convert.converter import load_checkpoint
from huggy_convert.errors import UnsupportedError
from huggy_convert.exporters.torch_module import export_program, save_program
from huggy_convert.modes.common import fp32_agree, fp32_reference
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime import (ModuleRunner, OrtRunner, ProgramRunner, Runner, complete_feed, draw_noise,
                                   make_probes)

HUGGY = step_checkpoints(HUGGY_RUN)[-1]
PACKAGE = Path(__file__).resolve().parents[1] / "huggy_convert"


@pytest.fixture(scope="module")
def huggy():
    return prepare_conversion(load_checkpoint(HUGGY), HUGGY.with_suffix(".onnx")).conversion.policy


def test_every_backend_is_a_runner_and_they_agree(huggy, tmp_path):
    feed = make_probes(huggy, 32, seed=1)
    official = OrtRunner(onnx.load(str(HUGGY.with_suffix(".onnx"))), spec=huggy.spec)
    module = ModuleRunner.build(huggy)
    save_program(export_program(module.module), tmp_path / "h.pt2")
    program = ProgramRunner(tmp_path / "h.pt2", huggy.spec.input_names(), huggy.spec.deterministic_output_names())
    ref = fp32_reference(huggy, feed)
    for r in (official, module, program):
        assert isinstance(r, Runner) and r.label.startswith(r.runtime)
        out = r.deterministic(feed)
        assert C.OUT_CONT not in out  # a draw is not a function of the feed
        assert fp32_agree(ref, C.OUT_CONT_DET, official.infer(feed)[C.OUT_CONT_DET], out[C.OUT_CONT_DET]), r.label
    assert program.buffers and set(program.buffers.values()) == {"float32"}
    with pytest.raises(UnsupportedError):
        program.sample(feed, seed=0)


def test_a_seed_is_the_noise_it_draws_on_every_backend(huggy):
    feed = make_probes(huggy, 16, seed=2)
    eps, _ = draw_noise(huggy.spec, 16, 7)
    official = OrtRunner(onnx.load(str(HUGGY.with_suffix(".onnx"))), spec=huggy.spec)
    module = ModuleRunner.build(huggy)
    a, b = official.sample(feed, seed=7)[C.OUT_CONT], official.sample(feed, noise=eps)[C.OUT_CONT]
    assert a.tobytes() == b.tobytes()
    c, d = module.sample(feed, seed=7)[C.OUT_CONT], module.sample(feed, noise=eps)[C.OUT_CONT]
    assert c.tobytes() == d.tobytes()
    assert fp32_agree(fp32_reference(huggy, feed, eps), C.OUT_CONT, a, c)
    assert official.sample(feed, seed=8)[C.OUT_CONT].tobytes() != a.tobytes()


def test_complete_feed_and_a_discrete_onnx_refuses_seeded_sampling():
    ck = variant_ckpt("discrete")
    pol = prepare_conversion(load_checkpoint(ck), ck.with_suffix(".onnx")).conversion.policy
    feed = complete_feed(pol.spec, {C.OBS_INPUT.format(i=0): np.zeros((3, pol.spec.obs_sizes[0]), np.float32)})
    assert feed[C.ACTION_MASKS].shape == (3, pol.spec.discrete_total) and feed[C.ACTION_MASKS].all()
    r = OrtRunner(onnx.load(str(ck.with_suffix(".onnx"))), spec=pol.spec, path=ck.with_suffix(".onnx"))
    assert r.infer(feed)[C.OUT_DISC_DET].shape == (3, len(pol.spec.discrete_branches))
    with pytest.raises(UnsupportedError) as e:
        r.sample(feed, seed=0)
    assert "Multinomial" in e.value.one_line() and ck.with_suffix(".onnx").name in e.value.one_line()


def test_one_session_factory_one_program_loader_one_torch_load():
    """onnxruntime sessions are made in runtime/ort.py only; .pt2 files are loaded only through runtime/
    (which checks them first); a pickle is read only by converter/checkpoint.py, weights-only."""
    sessions = [p for p in PACKAGE.rglob("*.py") if re.search(r"\bInferenceSession\(", p.read_text())]
    assert [p.relative_to(PACKAGE).as_posix() for p in sessions] == ["runtime/ort.py"]
    loaders = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if "torch.export.load(" in p.read_text()]
    assert loaders == ["runtime/torch_runners.py"], loaders
    pickles = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if re.search(r"\btorch\.load\(|\bpickle\.loads?\(|\bUnpickler\(", p.read_text())]
    assert pickles == ["converter/checkpoint.py"], pickles
    text = (PACKAGE / "converter" / "checkpoint.py").read_text()
    assert len(re.findall(r"\btorch\.load\(", text)) == 1 and "weights_only=True" in text
    # the allow-listing unpicklers (a pickle.Unpickler whose find_class answers a fixed list): the checkpoint's
    # fast reader and SB3's VecNormalize reader (importers/sb3_files.py), nowhere else
    subclasses = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                        if re.search(r"\(pickle\.Unpickler\)", p.read_text()))
    assert subclasses == ["converter/checkpoint.py", "importers/sb3_files.py"], subclasses
    assert all("def find_class" in (PACKAGE / f).read_text() for f in subclasses)


def test_torch_threads_is_scoped():
    """runtime.torch_threads: torch on n threads inside, the earlier count back after (an error too)."""
    import torch

    from huggy_convert.runtime import VERIFY_THREADS, torch_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch_threads(1):
            assert torch.get_num_threads() == 1 == VERIFY_THREADS
        assert torch.get_num_threads() == 2
        with pytest.raises(ZeroDivisionError):
            with torch_threads(1):
                1 / 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_conversion_without_program_imports_no_torch_dynamo(tmp_path):
    """torch._dynamo (~1 s to import) is what torch.export needs: only a .pt2 written or loaded imports
    it. A verified --no-program conversion in a fresh interpreter does not; the process's torch thread
    count is the same after the verification as before it."""
    import subprocess
    import sys

    code = ("import sys, torch; from huggy_convert.cli import main\n"
            "n = torch.get_num_threads()\n"
            "try:\n    main(sys.argv[1:], standalone_mode=False)\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch._dynamo' in sys.modules, 'torch.export._trace' in sys.modules, 'sympy' in sys.modules, "
            "torch.get_num_threads() == n)")
    r = subprocess.run([sys.executable, "-c", code, str(HUGGY), str(tmp_path), "--no-program", "--json"],
                       capture_output=True, text=True, cwd=str(PACKAGE.parent))
    assert r.returncode == 0, r.stderr[-500:]
    assert r.stdout.strip().splitlines()[-1] == "False False False True", r.stdout[-300:]
    assert json.loads(r.stdout[:r.stdout.rindex("}") + 1])["verify"]["verdict"] == "PASS"
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npz", ".onnx", ".safetensors"]
