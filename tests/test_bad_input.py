"""Issue 2: every kind of bad input ends in one line naming the file and the reason, exit 2,
and nothing left in OUT (not even a temporary file)."""
from __future__ import annotations

import io
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import run_cli

from huggy_convert import contract as C
from huggy_convert.cli import main


def _policy(huggy_ckpt):
    return torch.load(huggy_ckpt, map_location="cpu", weights_only=True)


class _Evil:
    """A pickle whose __reduce__ would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _make(kind, huggy_ckpt, tmp_path):
    p = tmp_path / f"{kind}.pt"
    if kind == "missing":
        return tmp_path / "nope.pt"
    if kind == "empty_dir":
        d = tmp_path / "emptyrun"
        d.mkdir()
        (d / "notes.txt").write_text("no checkpoints here")
        return d
    if kind == "truncated_zip":
        data = huggy_ckpt.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    elif kind == "random_bytes":
        p.write_bytes(b"\x17" + np.random.default_rng(7).bytes(4095))
    elif kind == "pickle_header_then_garbage":  # what 1 random file in 256 looks like: a pickle's first byte
        p.write_bytes(b"\x80\x02\xff" + np.random.default_rng(7).bytes(4093))
    elif kind == "malicious_pickle":
        buf = io.BytesIO()
        torch.save({"Policy": _Evil(tmp_path / "PWNED")}, buf)
        p.write_bytes(buf.getvalue())
    elif kind == "plain_pickle_code":
        p.write_bytes(pickle.dumps(_Evil(tmp_path / "PWNED")))
    elif kind == "bare_tensor":
        torch.save(torch.zeros(3), p)
    elif kind == "unrelated_state_dict":
        torch.save(torch.nn.Linear(3, 2).state_dict(), p)
    else:
        ck = _policy(huggy_ckpt)
        pol = ck["Policy"]
        if kind == "missing_layer":
            del pol["network_body._body_endoder.seq_layers.2.weight"]
        elif kind == "wrong_shape":
            pol["action_model._continuous_distribution.mu.weight"] = torch.zeros(21, 100)
        elif kind == "nan_weight":
            w = pol["network_body._body_endoder.seq_layers.0.weight"].clone()
            w[3, 4] = float("nan")
            pol["network_body._body_endoder.seq_layers.0.weight"] = w
        elif kind == "inf_weight":
            b = pol["action_model._continuous_distribution.mu.bias"].clone()
            b[0] = float("inf")
            pol["action_model._continuous_distribution.mu.bias"] = b
        elif kind == "variance_not_positive":
            for pre in (C.NORM_PREFIX, C.NORM_ALIAS_PREFIX):
                v = pol[pre.format(i=0) + C.NORM_VAR].clone()
                v[7] = 0.0
                pol[pre.format(i=0) + C.NORM_VAR] = v
        elif kind == "steps_zero":
            for pre in (C.NORM_PREFIX, C.NORM_ALIAS_PREFIX):
                pol[pre.format(i=0) + C.NORM_STEPS] = torch.tensor(0)
        elif kind == "unexpected_key":
            pol["network_body.extra_head.weight"] = torch.zeros(2)
        else:  # pragma: no cover
            raise AssertionError(kind)
        torch.save(ck, p)
    return p


CASES = {
    "missing": "no such file",
    "empty_dir": "no ML-Agents checkpoint",
    "truncated_zip": "not a readable torch checkpoint",
    "random_bytes": "not a readable torch checkpoint",
    "pickle_header_then_garbage": "not a readable torch checkpoint (not a valid pickle",
    "malicious_pickle": "refused to load",
    "plain_pickle_code": "refused to load",
    "bare_tensor": "bare tensor",
    "unrelated_state_dict": "no 'Policy' state dict",
    "missing_layer": "missing key 'network_body._body_endoder.seq_layers.2.weight'",
    "wrong_shape": "wrong shape for 'action_model._continuous_distribution.mu.weight': [21, 100], expected [21, 512]",
    "nan_weight": "'network_body._body_endoder.seq_layers.0.weight' holds 1 non-finite value(s)",
    "inf_weight": "'action_model._continuous_distribution.mu.bias' holds 1 non-finite value(s)",
    "variance_not_positive": "running_variance' must be > 0",
    "steps_zero": "normalization_steps' is 0: must be > 0",
    "unexpected_key": "unexpected key 'network_body.extra_head.weight'",
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_input_one_line_exit_2_nothing_written(kind, huggy_ckpt, tmp_path):
    src = _make(kind, huggy_ckpt, tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [str(src), str(out)])
    assert res.exit_code == 2, (res.output, res.exception)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"huggy-convert: error: {src}"), err
    assert CASES[kind] in err, err
    assert not out.exists() or list(out.iterdir()) == []
    assert not (tmp_path / "PWNED").exists(), "the pickle's command ran"


def test_malicious_pickle_in_a_real_process(huggy_ckpt, tmp_path):
    src = _make("malicious_pickle", huggy_ckpt, tmp_path)
    r = run_cli(src, tmp_path / "out")
    assert r.returncode == 2
    assert "refused to load" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_zip_is_really_truncated(huggy_ckpt, tmp_path):
    p = _make("truncated_zip", huggy_ckpt, tmp_path)
    assert not zipfile.is_zipfile(p)


def test_a_failing_write_leaves_no_half_file(huggy_ckpt, tmp_path, monkeypatch):
    """Outputs are written under a temporary name and renamed: a failure at the rename leaves nothing."""
    import huggy_convert.core.files as pf

    def boom(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(pf.os, "replace", boom)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        from huggy_convert.pipeline import ConvertOptions, convert_one

        convert_one(huggy_ckpt, out, ConvertOptions(verify=False, program=False))
    assert list(out.iterdir()) == []


def test_usage_errors_exit_2_in_one_line(tmp_path):
    for args in (["convert"], ["x.pt", str(tmp_path), "--opset", "8"], ["x.pt", str(tmp_path), "--jobs", "-1"],
                 ["verify", str(tmp_path), "--bogus"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("huggy-convert: error: "), (args, r.stderr)
