"""Its own outputs are inputs: a ``.safetensors`` it wrote converts (to the same files), and works for
export, info, act and verify; ``info OUT/`` describes the sets; ``verify OUT/<stem>.onnx`` verifies that
set; a folder with only ``<Behavior>.onnx`` (a Hub download) converts it; ``export`` writes into OUT/ or
says why not."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import family_step, run_cli, variant_ckpt
from huggy_convert.core.artifacts import ONNX, PT2, REPORT, SAFETENSORS, SUFFIXES
from huggy_convert.pipeline import ConvertOptions, convert_one

FAST = ConvertOptions(verify_options=None)


def _files(out: Path, stem: str):
    return {k: (out / f"{stem}{SUFFIXES[k]}").read_bytes() for k in (SAFETENSORS, ONNX, PT2)}


def _graph(data: bytes) -> bytes:
    """The ONNX without its metadata (the divisor record names the reference's sha256)."""
    import onnx

    m = onnx.load_model_from_string(data)
    del m.metadata_props[:]
    return m.SerializeToString()


@pytest.fixture(scope="module")
def small_out(tmp_path_factory):
    """A conversion of the 'small' variant: OUT/<stem>.* (the checkpoint's official ONNX beside it)."""
    out = tmp_path_factory.mktemp("out")
    res = convert_one(variant_ckpt("small"), out)
    assert res.ok
    return out, res.stem


@pytest.mark.parametrize("source", ["small", "gridworld"])
def test_a_safetensors_it_wrote_converts_to_the_same_files(source, tmp_path):
    """Alone (no ONNX beside it: its own divisors, its spec for the inputs no tensor describes): the same
    ONNX and .pt2, bit for bit, and a PASS. In OUT/, the ONNX written with it is its reference: the same
    .pt2 and graph, the ONNX's divisor record naming that reference."""
    ckpt = variant_ckpt(source) if source == "small" else family_step(source)[0]
    first = convert_one(ckpt, tmp_path / "first")
    assert first.ok
    want = _files(tmp_path / "first", first.stem)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(tmp_path / "first" / f"{first.stem}.safetensors", alone / f"{first.stem}.safetensors")
    for src, out in ((alone, tmp_path / "again"), (tmp_path / "first", tmp_path / "beside")):
        res = convert_one(src / f"{first.stem}.safetensors", out)
        assert res.ok, res.report.to_dict() if res.report else None
        got = _files(out, first.stem)
        assert got[PT2] == want[PT2]
        if src == alone:
            assert got[ONNX] == want[ONNX]
        else:
            assert _graph(got[ONNX]) == _graph(want[ONNX])
    # the canonical file names the canonical file it came from; its tensors are the same
    from huggy_convert.converter import load_policy

    a, b = load_policy(tmp_path / "first" / f"{first.stem}.safetensors"), load_policy(
        tmp_path / "again" / f"{first.stem}.safetensors")
    assert a.spec == b.spec and b.metadata["source_file"] == f"{first.stem}.safetensors"
    assert all(a.tensors[k].tobytes() == b.tensors[k].tobytes() for k in a.tensors)


def test_converting_a_safetensors_into_its_own_folder_is_refused(small_out):
    out, stem = small_out
    r = run_cli(out / f"{stem}.safetensors", out)
    assert r.returncode == 2 and "would overwrite the input" in r.stderr


def test_the_commands_take_a_safetensors_it_wrote(small_out, tmp_path):
    out, stem = small_out
    st = out / f"{stem}.safetensors"
    r = run_cli("info", st, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["policy_file"]["source_file"] == variant_ckpt("small").name
    r = run_cli("act", st, "--rows", "2", "--json")
    assert r.returncode == 0, r.stderr
    r = run_cli("verify", st, "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    r = run_cli("verify", out / f"{stem}.onnx")  # a file of a set: that set
    assert r.returncode == 0, r.stderr + r.stdout
    assert "PASS" in r.stdout.splitlines()[-1]
    # export without -o: beside the set convert wrote (OUT/), as OUT/<stem>.opset13.onnx
    r = run_cli("export", st, "--opset", "13", "--rows", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / f"{stem}.opset13.onnx").is_file() and not list(tmp_path.iterdir())


def test_verify_reruns_check_1_on_the_safetensors_a_set_was_converted_from(small_out, tmp_path):
    out, stem = small_out
    res = convert_one(out / f"{stem}.safetensors", tmp_path / "o")
    assert res.ok
    r = run_cli("verify", tmp_path / "o", "--json")
    assert r.returncode == 0, r.stderr + r.stdout  # 4 would mean a check could not run again
    doc = json.loads(r.stdout)
    rep = doc[0] if isinstance(doc, list) else doc
    assert rep.get("complete", True) and not rep.get("not_run")


def test_info_out_describes_its_sets(small_out):
    out, stem = small_out
    r = run_cli("info", out, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "output directory"
    (s,) = d["sets"]
    assert s["set"] == stem and s["verdict"] == "PASS"
    assert s["training_step"] == stem.rsplit("-", 1)[1] and s["spec"]["parameters"] > 0
    assert f"{stem}{SUFFIXES[REPORT]}" in s["files"]
    r = run_cli("info", out)
    assert r.returncode == 0 and "output directory: 1 artifact set" in r.stdout


def test_export_writes_into_out_or_says_why_not(tmp_path):
    ckpt = variant_ckpt("small")
    r = run_cli("export", ckpt, "--opset", "11", "--rows", "4", cwd=tmp_path)
    assert r.returncode == 2 and "give OUT/" in r.stderr and not list(tmp_path.iterdir())
    r = run_cli("export", ckpt, tmp_path / "o", "--opset", "11", "--rows", "4")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / f"{ckpt.stem}.opset11.onnx").is_file()


def test_a_folder_with_only_the_behavior_onnx_converts_it(tmp_path):
    """A Hub repo without checkpoints: the model card and ``<Behavior>.onnx``."""
    hub = tmp_path / "downloads" / "ppo-Small"
    hub.mkdir(parents=True)
    ckpt = variant_ckpt("small")
    behavior = ckpt.parent.name
    shutil.copyfile(ckpt.with_suffix(".onnx"), hub / f"{behavior}.onnx")
    (hub / "README.md").write_text("a model card\n")
    r = run_cli(hub, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / f"{behavior}.safetensors").is_file()
    shutil.copyfile(hub / f"{behavior}.onnx", hub / "Other.onnx")
    r = run_cli(tmp_path / "downloads", tmp_path / "out2")
    assert r.returncode == 2 and "2 ONNX files" in r.stderr and not (tmp_path / "out2").exists()
