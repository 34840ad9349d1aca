"""Issue 23 items 5 and 6: what to-checkpoint says of a policy recovered from an ONNX; run logs that name
paths outside the run; numeric warnings; a golden file with nothing in it.

Inputs are made at test time from the small variant (fixtures/variants/small).
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import VARIANTS, convert_without_sources, copy_out, rerecord, step_checkpoints

from huggy_convert import contract as C

SMALL_RUN = VARIANTS / "small"
SMALL = step_checkpoints(SMALL_RUN)[-1]
SMALL_ONNX = SMALL.with_suffix(".onnx")


def _cli(args):
    from huggy_convert.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _policy(source: Path, out: Path) -> Path:
    from huggy_convert.pipeline import ConvertOptions, convert_one

    res = convert_one(source, out, ConvertOptions(verify=False, program=False))
    return Path(res.artifacts["safetensors"]["path"])


# --- 5. to-checkpoint of a policy recovered from an ONNX -------------------------------------------
def test_5_to_checkpoint_of_a_recovered_policy_says_the_normalizer_counts_one_step(tmp_path):
    recovered = _policy(SMALL_ONNX, tmp_path / "fromonnx")
    r = _cli(["to-checkpoint", recovered, tmp_path / "a"])
    assert r.exit_code == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if "warning:" in line]
    assert len(said) == 1, r.stdout
    line = said[0]
    assert f"{C.NORM_STEPS} = 1" in line and "ONE observation" in line and "first new observations" in line, line
    assert ".pt checkpoint" in line, line  # what to do
    r = _cli(["to-checkpoint", recovered, tmp_path / "b", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["warnings"] == [line.split("warning: ", 1)[1]], doc.get("warnings")
    back = torch.load(tmp_path / "b" / C.CHECKPOINT_FILE, map_location="cpu", weights_only=True)[C.CKPT_POLICY]
    steps = [int(t) for k, t in back.items() if k.endswith(C.NORM_STEPS)]
    assert steps and set(steps) == {1}, steps


def test_5_to_checkpoint_of_a_checkpoint_warns_of_nothing(tmp_path):
    r = _cli(["to-checkpoint", _policy(SMALL, tmp_path / "ckpt"), tmp_path / "a", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["warnings"] == [], r.stdout[-2000:]


# --- 6. run logs naming paths outside the run ------------------------------------------------------
def _entry(step, path):
    return {"steps": step, "file_path": path.replace(".pt", ".onnx"), "reward": 1.5, "auxillary_file_paths": [path]}


GOOD = _entry(4157, "results/small/Small/Small-4157.pt")
STATUS = {
    "behavior_absolute": {"/etc": {"checkpoints": [_entry(1000, "/etc/Small-1000.pt")]}, "Small": {"checkpoints": [GOOD]}},
    "behavior_parent": {"..": {"checkpoints": [_entry(1000, "x/Small-1000.pt")]}, "Small": {"checkpoints": [GOOD]}},
    "behavior_nested": {"../../etc": {"checkpoints": [_entry(1000, "x/Small-1000.pt")]}, "Small": {"checkpoints": [GOOD]}},
    "behavior_windows_drive": {"C:\\x": {"checkpoints": [_entry(1000, "x/Small-1000.pt")]}, "Small": {"checkpoints": [GOOD]}},
    "file_path_climbs_out": {"Small": {"checkpoints": [_entry(1000, "../../../etc/Small-1000.pt"), GOOD],
                                       "final_checkpoint": {"steps": 4157, "file_path": "../../Small.onnx"}}},
}


def _run_dir(tmp_path: Path, status: dict) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SMALL_RUN, run)
    (run / C.STATUS_FILE).write_text(json.dumps(status))
    return run


@pytest.mark.parametrize("kind", sorted(STATUS))
def test_6_status_naming_paths_outside_the_run_is_one_warning(kind, tmp_path):
    from huggy_convert.batch.rundir import discover

    run = _run_dir(tmp_path, STATUS[kind])
    found = discover(run)
    assert len(found.warnings) == 1 and "outside the run" in found.warnings[0], found.warnings
    assert len(found.warnings[0]) < 400, found.warnings[0]
    good = [it for it in found.items if it.path.name == SMALL.name]
    assert [(it.listed, it.missing, it.step, it.reward) for it in good] == [(True, False, 4157, 1.5)]
    root = run.resolve()
    assert all(root in it.path.resolve().parents for it in found.items), [str(it.path) for it in found.items]
    assert all(root in d.path.resolve().parents for r in found.runs for d in r.deployed)


def test_6_batch_over_such_a_run_converts_its_checkpoints(tmp_path):
    run = _run_dir(tmp_path, STATUS["behavior_absolute"])
    out = tmp_path / "out"
    r = _cli([run, out, "--jobs", "1", "--no-program"])
    assert r.exit_code == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "warning" in lines[0] and "/etc" in lines[0], lines
    assert json.loads((out / f"{SMALL.stem}.verify.json").read_text())["ok"]


# --- 6. numeric warnings never reach the console --------------------------------------------------
def _checkpoint(tmp_path: Path, suffix: str, value: float) -> Path:
    ck = torch.load(SMALL, map_location="cpu", weights_only=True)
    for k in [k for k in ck[C.CKPT_POLICY] if k.endswith(suffix)]:
        ck[C.CKPT_POLICY][k] = torch.full_like(ck[C.CKPT_POLICY][k], value)
    p = tmp_path / "ck" / SMALL.name
    p.parent.mkdir()
    torch.save(ck, p)
    return p


NUMERIC = {  # (tensor, value, the verdict's exit code, convert's options)
    "log_sigma_huge": (C.LOG_SIGMA, 1e30, 0, []),  # exp overflows: every sample at the +-1 clip, exactly
    "log_sigma_denormal": (C.LOG_SIGMA, 1e-44, 0, []),
    # the float32 divisor underflows to 0: ML-Agents' own export divides by 0 too, NaN where obs == mean
    "variance_denormal": ("normalizer." + C.NORM_VAR, 1e-44, 1, []),
    # ... which the float32 runs alone fail too (a NaN reference value bounds nothing; it once passed)
    "variance_denormal_float32_only": ("normalizer." + C.NORM_VAR, 1e-44, 1, ["--verify-dtype", "float32"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(NUMERIC))
def test_6_numeric_extremes_convert_without_numpy_warnings(kind, tmp_path):
    suffix, value, code, options = NUMERIC[kind]
    ck = _checkpoint(tmp_path, suffix, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = _cli([ck, tmp_path / "out", "--no-program"] + options)
        s = _cli(["stats", ck, "--steps", "8", "--rows", "2"])
    noise = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
             if issubclass(w.category, RuntimeWarning)]
    assert noise == [], noise
    assert r.exit_code == code, r.stdout[-3000:] + r.stderr[-2000:]
    assert "internal error" not in r.stderr + s.stderr, r.stderr + s.stderr
    assert s.exit_code == (1 if kind.startswith("variance_denormal") else 0), s.stdout[-2000:]


def test_6_a_nan_bound_bounds_nothing():
    from huggy_convert.verify.bounds import Reference, judge

    ref = Reference({"a": np.array([1.0, np.nan])}, {"a": np.array([np.nan, 1e-6])}, {})
    assert not judge(ref, "a", np.array([1.0, 1.0], np.float32))["ok"]
    assert judge(Reference({"a": np.array([1.0])}, {"a": np.array([1e-6])}, {}), "a", np.float32([1.0]))["ok"]


def test_6_an_element_without_a_finite_bound_still_needs_finite_values():
    """An element whose bound the arithmetic could not make finite (inf, or NaN: counted as unbounded and
    reported) passes only with a finite runtime value and a finite reference: an overflowed runtime or a
    NaN reference never passes, whatever the bound (this once let a policy whose divisor underflowed to 0
    PASS with max_abs=inf)."""
    from huggy_convert.verify.bounds import Reference, judge, within_both

    unbounded = Reference({"a": np.array([1.0, 2.0])}, {"a": np.array([np.inf, np.nan])}, {})
    j = judge(unbounded, "a", np.float32([5.0, -3.0]))
    assert j["ok"] and j["unbounded"] == 2, j
    for got in ([np.inf, 2.0], [1.0, np.nan], [-np.inf, np.nan]):
        assert not judge(unbounded, "a", np.float32(got))["ok"], got
    nan_ref = Reference({"a": np.array([np.nan])}, {"a": np.array([np.inf])}, {})
    assert not judge(nan_ref, "a", np.float32([np.nan]))["ok"]
    inf_bound = Reference({"a": np.array([1.0])}, {"a": np.array([np.inf])}, {})
    assert not within_both(inf_bound, inf_bound, "a", np.float32([np.inf]), np.float32([1.0]))["ok"]
    assert within_both(inf_bound, inf_bound, "a", np.float32([7.0]), np.float32([1.0]))["ok"]


def test_6_within_both_needs_finite_reference_values_and_warns_of_nothing():
    """``within_both`` takes ``judge``'s rule: a NaN or infinite reference value fails the element whatever
    its bound (with two finite runtime values), and nothing warns; a NaN limit fails the element (the
    comparison of two files stays as strict as it was: only ``judge`` counts a NaN bound as unbounded)."""
    from huggy_convert.verify.bounds import Reference, within_both

    ok = Reference({"a": np.array([1.0, 2.0])}, {"a": np.array([1e-3, 1e-3])}, {})
    assert within_both(ok, ok, "a", np.float32([1.0, 2.0]), np.float32([1.0, 2.0]))["ok"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for bad in ([np.nan, 2.0], [1.0, np.inf], [-np.inf, np.nan]):
            ref = Reference({"a": np.array(bad)}, {"a": np.array([np.inf, np.inf])}, {})
            for a, b in ((ref, ok), (ok, ref), (ref, ref)):
                j = within_both(a, b, "a", np.float32([1.0, 2.0]), np.float32([1.0, 2.0]))
                assert not j["ok"] and j["over"] >= 1 and "first_failure" in j, (bad, j)
        nan_bound = Reference({"a": np.array([1.0])}, {"a": np.array([np.nan])}, {})
        one = Reference({"a": np.array([1.0])}, {"a": np.array([1e-3])}, {})
        j = within_both(nan_bound, one, "a", np.float32([1.0]), np.float32([1.0]))
        assert not j["ok"] and j["over"] == 1, j
        assert not within_both(nan_bound, one, "a", np.float32([np.inf]), np.float32([1.0]))["ok"]


# --- 6. a golden file that holds nothing check 3 reads ---------------------------------------------
@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """OUT of a conversion whose sources are gone since (converted from a copy, then removed): check 3
    then has only the golden file to compare with, so it reads it (with the official ONNX there, the
    golden file is checked by its sha256 alone)."""
    from huggy_convert.pipeline import ConvertOptions

    return convert_without_sources(SMALL, tmp_path_factory.mktemp("small_src"), tmp_path_factory.mktemp("converted"),
                                   ConvertOptions(program=False))


def _rewrite(change):
    """Rewrite the golden file's arrays: ``change(dict) -> dict``; the report beside it records the new
    file's sha256, as a conversion that wrote such a file would have (otherwise check 6 fails the file as
    changed since it was written, before check 3 reads it)."""
    def damage(p: Path):
        d = change(dict(np.load(p)))
        with open(p, "wb") as f:
            np.savez(f, **d)
        rerecord(p)
    return damage


OBS = "in." + C.OBS_INPUT.format(i=0)
NOISED = "noised." + C.OUT_CONT
GOLDEN = {
    "no_arrays": (_rewrite(lambda d: {}), "no arrays"),
    "no_inputs": (_rewrite(lambda d: {k: v for k, v in d.items() if not k.startswith("in.")}), "no input"),
    "no_deterministic_output": (_rewrite(lambda d: {k: v for k, v in d.items() if not k.startswith("out.determ")}),
                                "no output"),
    "zero_rows": (_rewrite(lambda d: dict(d, **{OBS: d[OBS][:0]})), "rows"),
    "wrong_width": (_rewrite(lambda d: dict(d, **{OBS: d[OBS][:, :5]})), "shape"),
    # the host record is JSON, but not an object; the noise and the outputs it gave (continuous actions) go
    # together, each of the golden inputs' rows by the continuous actions
    "host_number": (_rewrite(lambda d: dict(d, host=np.array("5"))), "'host' record is a JSON int"),
    "host_list": (_rewrite(lambda d: dict(d, host=np.array("[1]"))), "'host' record is a JSON list"),
    "noise_wrong_width": (_rewrite(lambda d: dict(d, noise=d["noise"][:, :1])), "golden 'noise' is float32 of shape"),
    "noise_wrong_rows": (_rewrite(lambda d: dict(d, noise=d["noise"][:3])), "golden 'noise' is float32 of shape"),
    "noise_not_float": (_rewrite(lambda d: dict(d, noise=d["noise"].astype(str))), "golden 'noise' is <U"),
    "noised_wrong_shape": (_rewrite(lambda d: dict(d, **{NOISED: d[NOISED][:, :1]})), f"golden '{NOISED}' is"),
    "noised_without_noise": (_rewrite(lambda d: {k: v for k, v in d.items() if k != "noise"}), "no 'noise' array"),
    "noise_without_noised": (_rewrite(lambda d: {k: v for k, v in d.items() if k != NOISED}), f"no '{NOISED}' array"),
}


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_6_golden_without_what_check_3_reads_fails_that_check(kind, converted, tmp_path):
    out = copy_out(converted, tmp_path / "out")
    golden = out / f"{SMALL.stem}.golden.npz"
    damage, expect = GOLDEN[kind]
    damage(golden)
    r = _cli(["verify", out])
    assert r.exit_code == 1, r.stdout[-3000:] + r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "verification failed" in lines[0] and golden.name in lines[0], lines
    assert expect in lines[0], lines[0]
    assert "3 outputs" in lines[0], lines[0]
