"""Issue 4: verification passes on correct artifacts and fails (exit 1, named problem) on broken ones."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import (HUGGY_RUN, VARIANTS, convert_without_sources, copy_out, copy_sources, rerecord, run_cli,
                      step_checkpoints, variant_names)
from onnx import numpy_helper

from huggy_convert.cli import main
from huggy_convert.pipeline import ConvertOptions, convert_one
from huggy_convert.verify import VerifyOptions
from huggy_convert.verify.compare import ulp_distance

HUGGY = step_checkpoints(HUGGY_RUN)[-1]
OLDER = step_checkpoints(HUGGY_RUN)[0]
STEM = HUGGY.stem


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("huggy_out")
    res = convert_one(HUGGY, out)
    assert res.report.ok, res.report.render()
    return out


@pytest.fixture
def out(converted, tmp_path):
    return copy_out(converted, tmp_path / "out")


@pytest.fixture(scope="module")
def converted_alone(tmp_path_factory):
    """Huggy's OUT, its sources gone (``conftest.convert_without_sources``)."""
    return convert_without_sources(HUGGY, tmp_path_factory.mktemp("huggy_src"), tmp_path_factory.mktemp("huggy_alone"))


@pytest.fixture
def alone(converted_alone, tmp_path):
    return copy_out(converted_alone, tmp_path / "alone")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _edit_initializer(path, pick, change):
    m = onnx.load(str(path))
    t = next(t for t in m.graph.initializer if pick(t.name))
    a = numpy_helper.to_array(t).copy()
    a = change(a)
    t.CopyFrom(numpy_helper.from_array(a.astype(np.float32), t.name))
    onnx.save(m, str(path))
    return t.name


def test_report_figures_and_environment(converted):
    rep = json.loads((converted / f"{STEM}.verify.json").read_text())
    assert rep["ok"] is True and rep["verdict"] == "PASS"
    env = rep["environment"]
    for k in ("torch", "onnx", "onnxruntime", "numpy", "execution_provider", "ort_intra_op_threads",
              "torch_threads", "devices"):
        assert k in env
    titles = [c["title"][:2] for c in rep["checks"]]
    assert titles == ["1 ", "2 ", "3 ", "4 ", "5 ", "6 "]
    c3 = rep["checks"][2]
    det = next(c for c in c3["checks"] if c["title"].startswith("deterministic_continuous_actions [probes]"))
    f = det["figures"]
    for k in ("max_abs", "max_rel", "max_ulp", "mean_abs", "p99_abs", "cosine", "bitwise_equal"):
        assert k in f
    assert f["bitwise_equal"] == f["count"] == 64 * 21 and f["max_ulp"] == 0
    c4 = rep["checks"][3]
    titles4 = [c["title"] for c in c4["checks"]]
    assert titles4[:2] == ["onnxruntime: rebuilt ONNX (cpu float32)", f"onnxruntime: official {STEM}.onnx (cpu float32)"]
    fp32 = next(c for c in c4["checks"] if c["title"] == "torch module cpu float32")
    f = fp32["checks"][0]["figures"]
    # judged against the float64 reference, element by element, by the derived bound
    assert fp32["status"] == "pass" and f["ok"] and 0 < f["ratio"] < 1 and f["max_abs"] < f["median_bound"]
    assert 0 < c4["figures"]["max_bound_ratio"] < 1
    fps = rep["checks"][4]["figures"]["fingerprints"]
    assert set(fps) == {"64", "128"} and len(fps["64"]["reference"]) == len(fps["64"]["torch_cpu_float32"]) == 64
    host = env["host"]
    for k in ("cpu", "isa", "machine", "torch", "mkl", "onnxruntime", "mkl_cbwr"):
        assert k in host, k
    golden = np.load(converted / f"{STEM}.golden.npz")
    assert golden["in.obs_0"].shape == (64, 59) and golden["out.deterministic_continuous_actions"].shape == (64, 21)
    assert json.loads(str(golden["host"]))["cpu"] == host["cpu"]  # the host that computed the golden outputs
    assert "divisor: adopted from the official ONNX" in " ".join(rep["notes"])


@pytest.mark.parametrize("name", variant_names())
def test_every_variant_passes(name, tmp_path):
    ck = step_checkpoints(VARIANTS / name)[-1]
    res = convert_one(ck, tmp_path, ConvertOptions(verify_options=VerifyOptions(fingerprint_steps=(64,))))
    assert res.report.ok, res.report.render()
    assert res.reference == ck.with_suffix(".onnx")


# verify OUT/ with the recorded sources in place (exit 0) or gone (exit 4): tests/test_verify_record.py,
# on the Small variant
def test_verify_with_reference_and_checkpoint_json(out):
    """The sources named: checks 1-2 run on them; a full PASS, exit 0."""
    r = invoke("verify", out, "--reference", HUGGY.with_suffix(".onnx"), "--checkpoint", HUGGY, "--json")
    assert r.exit_code == 0, r.output
    rep, = json.loads(r.stdout)["policies"]
    assert rep["ok"] and rep["verdict"] == "PASS" and rep["complete"] and rep["not_run"] == []
    c1, c2 = rep["checks"][:2]
    assert c1["status"] == "pass" and "tensors bitwise equal to their checkpoint keys" in c1["summary"]
    assert c2["status"] == "pass" and c2["title"] == f"2 rebuilt ONNX vs official (official {STEM}.onnx)"


def test_flipped_bit_in_one_initializer_fails(out):
    name = _edit_initializer(out / f"{STEM}.onnx", lambda n: n.endswith("mu.weight"),
                             lambda a: (a.view(np.uint32).__setitem__((3, 100), a.view(np.uint32)[3, 100] ^ 1), a)[1])
    r = invoke("verify", out, "--reference", HUGGY.with_suffix(".onnx"))
    assert r.exit_code == 1
    assert f"first difference {name}[3, 100]" in r.stderr and "1 ulp" in r.stderr, r.stderr


def test_flipped_bit_is_caught_by_the_golden_outputs_without_the_official_file(alone):
    _edit_initializer(alone / f"{STEM}.onnx", lambda n: n.endswith("mu.weight"),
                      lambda a: (a.view(np.uint32).__setitem__((3, 100), a.view(np.uint32)[3, 100] ^ 1), a)[1])
    r = invoke("verify", alone)
    assert r.exit_code == 1 and "NOT bitwise" in r.stderr


def test_two_swapped_nodes_fail(out):
    p = out / f"{STEM}.onnx"
    m = onnx.load(str(p))
    nodes = list(m.graph.node)
    i = next(k for k, n in enumerate(nodes) if n.op_type == "Sigmoid")
    nodes[i], nodes[i + 1] = nodes[i + 1], nodes[i]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, str(p))
    r = invoke("verify", out, "--reference", HUGGY.with_suffix(".onnx"))
    assert r.exit_code == 1
    assert f"op sequence: differs at node {i}: official Sigmoid" in r.stderr, r.stderr


def test_normalizer_written_as_sqrt_var_plus_eps_fails(out, tmp_path):
    from huggy_convert.converter import load_policy

    pol = load_policy(out / f"{STEM}.safetensors")
    var = pol.tensors["obs.0.normalizer.variance"]
    name = _edit_initializer(out / f"{STEM}.onnx", lambda n: n.endswith("divisor"),
                             lambda a: np.sqrt(var + np.float32(1e-8)))
    r = invoke("verify", out, "--reference", HUGGY.with_suffix(".onnx"))
    assert r.exit_code == 1
    assert name in r.stderr and "ulp" in r.stderr, r.stderr


def test_another_checkpoints_official_onnx_fails(out):
    r = invoke("verify", out, "--reference", OLDER.with_suffix(".onnx"))
    assert r.exit_code == 1
    assert "initializers" in r.stderr and "first difference" in r.stderr, r.stderr


def test_fp16_program_with_fp16_normalizer_fails(out):
    from huggy_convert.converter import load_policy
    from huggy_convert.exporters.torch_module import build_module, export_program, save_program

    pol = load_policy(out / f"{STEM}.safetensors")
    naive = build_module(pol, dtype="float16", normalizer_dtype="float16")
    save_program(export_program(naive), out / f"{STEM}.pt2")
    r = invoke("verify", out, "--verify-dtype", "float32")
    assert r.exit_code == 1
    assert f"saved program {STEM}.pt2" in r.stderr and "normalizer buffer norm0_div is float16" in r.stderr, r.stderr


def test_fp16_module_with_fp16_normalizer_fails_in_the_engine(out):
    from huggy_convert.converter import load_policy
    from huggy_convert.exporters.torch_module import build_module
    from huggy_convert.core.artifacts import ArtifactSet
    from huggy_convert.verify import Reference, verify

    pol = load_policy(out / f"{STEM}.safetensors")
    rep = verify(ArtifactSet(out, STEM), Reference(golden_path=out / f"{STEM}.golden.npz"),
                 VerifyOptions(dtypes=("float16",), fingerprint_steps=()), subject="t",
                 extra_modules=[("naive fp16", build_module(pol, dtype="float16", normalizer_dtype="float16"))])
    assert not rep.ok
    fail = rep.first_failure()
    assert fail.startswith("4 runtimes") and "naive fp16 › deterministic_continuous_actions" in fail, fail
    assert "normalizer buffer norm0_div is float16" in fail, fail


def test_per_output_tolerance_override_applies(out):
    r = invoke("verify", out, "--atol", "deterministic_continuous_actions:1e-12", "--verify-dtype", "float32")
    assert r.exit_code == 1 and "over tolerance (atol 1e-12" in r.output
    r = invoke("verify", out, "--atol", "nonsense")
    assert r.exit_code == 2 and "bad tolerance 'nonsense'" in r.stderr


def test_checkpoint_without_official_onnx_says_so(tmp_path):
    ck = HUGGY_RUN / "Huggy" / "checkpoint.pt"
    r = run_cli(ck, tmp_path, "--no-program", "--verify-dtype", "float32", "-v")  # -v: the notes and the tree
    assert r.returncode == 0, r.stderr
    assert "no official ONNX found beside checkpoint.pt" in r.stdout
    assert "- 2 rebuilt ONNX vs official: no official ONNX" in r.stdout


def test_verify_of_a_missing_dir_is_bad_input(tmp_path):
    r = invoke("verify", tmp_path / "nothing")
    assert r.exit_code == 2 and "no such directory" in r.stderr


def test_ulp_distance():
    a = np.array([1.0, -0.0, 0.0, 1e-45], np.float32)
    b = np.nextafter(a, np.float32(np.inf))
    assert ulp_distance(a, b).tolist() == [1, 1, 1, 1]
    assert ulp_distance(np.float32([-1e-45]), np.float32([1e-45])).tolist() == [2]


def test_other_opset_compares_outputs_and_warns_on_structure(tmp_path):
    res = convert_one(HUGGY, tmp_path, ConvertOptions(opset=13, program=False, verify_options=VerifyOptions(
        dtypes=("float32",), fingerprint_steps=(64,))))
    rep = res.report
    assert rep.ok and rep.verdict == "PASS (with warnings)", rep.render()
    assert "rebuilt 13, official 9" in rep.render()
    c3 = next(c for c in rep.checks if c.title.startswith("3 "))
    det = [c for c in c3.children if c.title.startswith("deterministic_continuous_actions")]
    assert det and all(c.status == "pass" and c.summary.startswith("bitwise") for c in det)


# --- issue 10: the same verdict whatever CPU wrote the reference ---------------------------------------
def _rewrite_golden(path, host=None, nudge=0):
    """The golden file as another host would have written it: its host record, and (``nudge``) its
    deterministic actions moved by that many float32 ulps on every element; the report beside it
    records that file's sha256, as that host's conversion would have (a golden file that is not the
    one its report records fails check 6)."""
    with np.load(path) as z:
        d = {k: z[k] for k in z.files}
    h = json.loads(str(d["host"]))
    if host:
        h.update(host)
    d["host"] = np.array(json.dumps(h, sort_keys=True))
    k = "out.deterministic_continuous_actions"
    a = d[k].copy()
    free = np.abs(a) < 1  # a clipped action is exactly +-1 on every host: only the others can move
    for _ in range(abs(nudge)):
        a = np.where(free, np.nextafter(a, np.float32(np.inf) if nudge > 0 else np.float32(-np.inf)), a).astype(np.float32)
    d[k] = a
    np.savez(path, **d)
    rerecord(path)


def test_golden_from_another_host_is_judged_by_the_derived_bound(alone):
    """(The sources are gone, so that the golden file is the reference of check 3: exit 4, checks 1-2
    not run, where it was exit 0 before issue 23.)"""
    out = alone
    g = out / f"{STEM}.golden.npz"
    other = {"cpu": "Intel(R) Xeon(R) Platinum 8481C", "isa": ["avx2", "avx512f"], "mkl_cbwr": None}
    # bitwise on another host: PASS, and the report says where the golden file came from
    _rewrite_golden(g, other)
    r = invoke("verify", out, "--verify-dtype", "float32", "--json")
    assert r.exit_code == 4, r.output
    rep, = json.loads(r.stdout)["policies"]
    assert any("written on another host (Intel(R) Xeon(R) Platinum 8481C" in n for n in rep["notes"]), rep["notes"]
    # 2 ulps off on every unclipped element (what another CPU's kernels could give): within the bound
    _rewrite_golden(g, nudge=2)
    r = invoke("verify", out, "--verify-dtype", "float32", "-v")
    assert r.exit_code == 4, r.output
    assert "not bitwise (golden written on another host)" in r.stdout and "within the derived bound" in r.stdout
    # the same difference from this host's own golden file is a failure: bitwise is expected there
    shutil.copy(g, out / "other.npz")
    from huggy_convert.host import host_info

    _rewrite_golden(g, {k: host_info()[k] for k in other})
    r = invoke("verify", out, "--verify-dtype", "float32")
    assert r.exit_code == 1 and "NOT bitwise" in r.stderr, r.output
    # far beyond the bound is a failure whoever wrote the file
    shutil.copy(out / "other.npz", g)
    _rewrite_golden(g, nudge=400000)
    r = invoke("verify", out, "--verify-dtype", "float32")
    assert r.exit_code == 1 and "OVER the derived bound" in r.stderr, r.stderr


def test_divisor_ieee_mode_passes_within_the_bound_and_auto_is_bitwise(tmp_path):
    """--divisor ieee keeps the IEEE divisor against an official folded on another sqrt path: PASS,
    outputs judged by the bound; auto adopts the official's: bitwise. The decision is recorded
    in the ONNX metadata, the report and the safetensors."""
    ieee, auto = tmp_path / "ieee", tmp_path / "auto"
    r = run_cli(HUGGY, ieee, "--divisor", "ieee", "--no-program", "--verify-dtype", "float32", "-v")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rebuilt keeps IEEE (--divisor ieee)" in r.stdout
    assert "not bitwise (the divisors differ by 1 ulp: --divisor ieee)" in r.stdout and "within the derived bound" in r.stdout
    r = run_cli(HUGGY, auto, "--no-program", "--verify-dtype", "float32", "-v")
    assert r.returncode == 0 and "adopted, bitwise equal" in r.stdout, r.stdout
    for d, source in ((ieee, "ieee"), (auto, "official")):
        m = onnx.load(str(d / f"{STEM}.onnx"))
        rec = json.loads({p.key: p.value for p in m.metadata_props}["huggy_convert.divisor"])
        assert rec["source"] == source and rec["observations"]["0"]["indices"] == [15, 18, 26, 44, 51, 55]
        rep = json.loads((d / f"{STEM}.verify.json").read_text())
        assert any(n.startswith("divisor: ") for n in rep["notes"])
    # without a reference the bytes are IEEE's whatever the mode; with --divisor ieee too
    from huggy_convert.converter import load_policy

    assert load_policy(ieee / f"{STEM}.safetensors").divisor(0).tobytes() != \
        load_policy(auto / f"{STEM}.safetensors").divisor(0).tobytes()
    # re-verifying either folder later gives the same verdict
    assert invoke("verify", ieee, "--verify-dtype", "float32").exit_code == 0
    assert invoke("verify", ieee, "--reference", HUGGY.with_suffix(".onnx"), "--verify-dtype", "float32").exit_code == 0


def test_tampered_stored_divisor_fails_check_1(out):
    """A .safetensors whose divisor is not sqrt(variance/steps) (nor an adopted 1-ulp neighbour) fails."""
    from huggy_convert.converter import load_policy, save_policy

    p = out / f"{STEM}.safetensors"
    pol = load_policy(p)
    d = pol.tensors["obs.0.normalizer.divisor"].copy()
    d[3] = np.nextafter(np.nextafter(d[3], np.float32(9)), np.float32(9))
    pol.tensors["obs.0.normalizer.divisor"] = d
    save_policy(pol, p)
    r = invoke("verify", out, "--checkpoint", HUGGY, "--verify-dtype", "float32")
    assert r.exit_code == 1 and "obs.0.normalizer.divisor[3]" in r.stderr and "2 ulp" in r.stderr, r.stderr


def test_reference_fingerprint_is_the_same_batched_or_step_by_step():
    """The float64 reference rounded to float32 does not depend on how its GEMMs are blocked: the
    sequence run as one batch hashes as the same sequence run one row at a time (every fixture)."""
    from conftest import HUGGY_RUN, VARIANTS

    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.verify.bounds import Float64Policy
    from huggy_convert.verify.fingerprints import fingerprint, reference_fingerprint

    for ck in [step_checkpoints(HUGGY_RUN)[-1]] + [step_checkpoints(VARIANTS / v)[-1] for v in variant_names()]:
        pol = convert_checkpoint(ck).policy
        assert reference_fingerprint(pol, 64, 0) == fingerprint(Float64Policy(pol).values32, pol, 64, 0), ck.stem


def test_the_float64_reference_runs_once_per_feed():
    """Check 4's float64 reference runs once per feed: the forward with the injected noise gives the
    one without it (every output and bound but continuous_actions), and a batch's 16-step reference
    fingerprint reads the forward of its 16 probe rows; each bitwise what a fresh Float64Policy
    computes (every fixture)."""
    from conftest import VARIANTS

    from huggy_convert import contract as C
    from huggy_convert.converter import convert_checkpoint
    from huggy_convert.exporters.onnx_export import build_onnx
    from huggy_convert.runtime.feeds import make_noise, make_probes
    from huggy_convert.verify.bounds import Float64Policy
    from huggy_convert.verify.fingerprints import reference_fingerprint
    from huggy_convert.verify.context import Context

    def same(a, b):
        return list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)

    for ck in [step_checkpoints(HUGGY_RUN)[-1]] + [step_checkpoints(VARIANTS / v)[-1] for v in variant_names()]:
        pol = convert_checkpoint(ck).policy
        ctx = Context(pol, build_onnx(pol), VerifyOptions(rows=16))
        fresh, feed = Float64Policy(pol), make_probes(pol, 16, 0)
        got, want = ctx.reference("ours", "probes"), fresh.forward(feed)  # (the noised forward first, if any)
        assert same(got.values, want.values) and same(got.bounds, want.bounds), ck.stem
        if pol.spec.continuous_size:
            got, want = ctx.reference("ours", "probes", True), fresh.forward(feed, make_noise(pol, 16, 0))
            assert C.OUT_CONT in got.values and same(got.values, want.values) and same(got.bounds, want.bounds)
        f = reference_fingerprint(pol, 16, 0, ctx.prepared("ours"), make_probes(pol, 16, 0), ctx.values32)
        assert f == reference_fingerprint(pol, 16, 0), ck.stem


# --- the verification reads the files written (issue 11) ---------------------------------------
def _flip_in_file(path, needle: bytes, bit: int = 0):
    """Flip one bit of the first byte of ``needle`` (bytes that occur once) in the file."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "needle must occur exactly once"
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))


def _tensor_bytes(name):
    from huggy_convert.converter import convert_checkpoint

    return convert_checkpoint(HUGGY).policy.tensors[name].tobytes()


def _failures(r):
    return [line for line in r.stderr.splitlines() + r.stdout.splitlines() if "6 files" in line]


@pytest.mark.parametrize("kind", ["safetensors", "onnx", "pt2"])
def test_verify_dir_catches_a_bit_flipped_in_each_written_file(out, kind):
    from huggy_convert import contract as C

    path = out / f"{STEM}.{kind}"
    # a low mantissa bit of one weight of the second body layer: the value moves by 1 ulp
    _flip_in_file(path, _tensor_bytes(C.c_body(1, "weight"))[4 * 1000:4 * 1000 + 64])
    r = invoke("verify", out, "--verify-dtype", "float32", "--json")
    assert r.exit_code == 1, r.output
    # check 6 names the file (the report's first failure may be check 1: since issue 23 it runs again on
    # the checkpoint the report records, which is still there, and catches a flipped .safetensors first)
    files = next(c for c in json.loads(r.stdout)["policies"][0]["checks"] if c["id"] == "files")
    assert any(k["status"] == "fail" and k["title"] == path.name for k in files["checks"]), files


@pytest.mark.parametrize("kind", ["safetensors", "onnx", "pt2"])
def test_verify_dir_without_the_report_still_catches_the_flip_by_content(out, kind):
    """No record of the bytes written (the report deleted): the flipped .safetensors gives another
    .onnx/.pt2 than the files, and a flipped .onnx/.pt2 is not what the .safetensors gives."""
    from huggy_convert import contract as C

    (out / f"{STEM}.verify.json").unlink()
    _flip_in_file(out / f"{STEM}.{kind}", _tensor_bytes(C.c_body(1, "weight"))[4 * 1000:4 * 1000 + 64])
    r = invoke("verify", out, "--verify-dtype", "float32")
    assert r.exit_code == 1, r.output
    assert _failures(r), r.output


@pytest.mark.parametrize("kind", ["safetensors", "onnx", "pt2"])
def test_the_check_at_the_end_of_a_conversion_reads_the_files_back(tmp_path, monkeypatch, kind):
    """A file damaged on its way to the disk (simulated: one bit flipped as it is written) fails the
    conversion's own verification."""
    import huggy_convert.core.artifacts as A
    from huggy_convert import contract as C

    real = A.atomic_write_bytes
    needle = _tensor_bytes(C.c_body(1, "weight"))[4 * 1000:4 * 1000 + 64]

    def damaged(path, data, fsync=True):
        if str(path).endswith(f".{kind}"):
            b = bytearray(data)
            b[bytes(b).find(needle)] ^= 1
            data = bytes(b)
        real(path, data, fsync=fsync)

    monkeypatch.setattr(A, "atomic_write_bytes", damaged)
    res = convert_one(HUGGY, tmp_path, ConvertOptions(verify_options=VerifyOptions(
        dtypes=("float32",), fingerprint_steps=(16,))))
    rep = res.report
    assert not rep.ok
    files = rep.check("files")
    bad = [c for c in files.children if c.status == "fail"]
    assert [c.title for c in bad] == [f"{STEM}.{kind}"] and "changed since its conversion" in bad[0].summary
    assert all(c.status == "pass" for c in files.children if c.title != f"{STEM}.{kind}")


def test_verify_dir_regenerates_the_onnx_and_the_program_from_the_policy(out):
    r = invoke("verify", out, "--verify-dtype", "float32", "--json")
    assert r.exit_code == 0, r.output
    files = next(c for c in json.loads(r.stdout)["policies"][0]["checks"] if c["id"] == "files")
    titles = {c["title"]: c["status"] for c in files["checks"]}
    # (the golden file too since issue 23: every file the report records must be there, unchanged)
    assert titles == {f"{STEM}.{k}": "pass" for k in ("safetensors", "onnx", "pt2", "golden.npz")} | {
        f"{STEM}.onnx from {STEM}.safetensors": "pass", f"{STEM}.pt2 from {STEM}.safetensors": "pass"}


def _rewrite_pt2(path, change):
    """Rewrite a .pt2 with torch's archive writer, ``change(name, data) -> data | None`` per record
    (None drops it); returns the extra records to add as ``change.extra`` (name -> bytes)."""
    from torch.export.pt2_archive import _package as P

    fixed = {"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id"}
    with P.PT2ArchiveReader(str(path)) as r:
        records = {n: r.read_bytes(n) for n in r.get_file_names() if n not in fixed}
    out = {}
    for n, d in records.items():
        d = change(n, d)
        if d is not None:
            out[n] = d
    out.update(getattr(change, "extra", {}))
    with P.PT2ArchiveWriter(str(path)) as w:
        for n, d in out.items():
            w.write_bytes(n, d)


class _Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.path}",)


@pytest.mark.parametrize("where", ["pickled weight", "sample inputs"])
def test_verify_never_unpickles_a_hostile_program(out, tmp_path, where):
    """A .pt2 whose records are pickles (torch.export.load unpickles them with weights_only=False, or
    falls back to it for sample inputs) is not loaded: nothing it carries runs."""
    import pickle

    marker = tmp_path / "ran"
    payload = pickle.dumps(_Marker(marker), protocol=2)

    def change(name, data):
        if where == "pickled weight" and name == "data/weights/model_weights_config.json":
            cfg = json.loads(data)
            fqn = next(iter(cfg["config"]))
            cfg["config"][fqn].update(use_pickle=True, path_name="weight_hostile")
            return json.dumps(cfg).encode()
        if where == "sample inputs" and name == "data/sample_inputs/model.pt":
            return payload
        return data

    change.extra = {"data/weights/weight_hostile": payload} if where == "pickled weight" else {}
    _rewrite_pt2(out / f"{STEM}.pt2", change)
    r = invoke("verify", out, "--verify-dtype", "float32")
    assert not marker.exists(), "code from the .pt2 ran"
    assert r.exit_code == 1 and "not loaded" in r.stderr + r.stdout and "can run code" in r.stderr + r.stdout, r.output


def test_converting_into_the_checkpoints_own_folder_overwrites_nothing(tmp_path):
    """``huggy-convert run/Huggy/Huggy-1.pt run/Huggy/`` would replace the official ONNX (and its
    golden file) with the rebuilt ones: refused, one line, exit 2, every file unchanged."""
    run = tmp_path / "Huggy"
    copy_sources(HUGGY, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    r = invoke(run / f"{STEM}.pt", run)
    assert r.exit_code == 2 and f"{STEM}.onnx would overwrite {STEM}.onnx" in r.stderr, r.output
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_fingerprints_do_not_depend_on_the_thread_count(converted):
    """Check 5's fingerprints are the same whatever torch's thread count (issue 15): each action is one
    row's own forward, run on runtime.VERIFY_THREADS threads. The unscoped forwards give the same
    bytes on 1 and 2 threads too (so a conversion on 2 threads, as before, wrote the same report), and
    the process's setting is left as it was. In CI under both MKL paths (MKL_CBWR)."""
    import torch

    from huggy_convert.converter import load_policy
    from huggy_convert.exporters.torch_module import build_module
    from huggy_convert.runtime import OrtRunner, module_runner
    from huggy_convert.runtime.feeds import make_probes
    from huggy_convert.verify.fingerprints import _fingerprint, fingerprint, reference_fingerprint

    pol = load_policy(converted / f"{STEM}.safetensors")
    torch_run = module_runner(build_module(pol))
    ort_run = OrtRunner((converted / f"{STEM}.onnx").read_bytes(), spec=pol.spec).infer
    recorded = json.loads((converted / f"{STEM}.verify.json").read_text())["checks"][4]["figures"]["fingerprints"]
    before = torch.get_num_threads()
    seen = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            seen[n] = (fingerprint(torch_run, pol, 64), fingerprint(ort_run, pol, 64), reference_fingerprint(pol, 64),
                       _fingerprint(torch_run, make_probes(pol, rows=64, seed=0), pol, 64))  # on n threads
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(before)
    assert seen[1] == seen[2]
    assert seen[1][0] == seen[1][3] == recorded["64"]["torch_cpu_float32"]
    assert seen[1][1] == recorded["64"]["onnxruntime_rebuilt"] and seen[1][2] == recorded["64"]["reference"]
    assert len({seen[1][0], seen[1][1], seen[1][2]}) == 3  # three runtimes, three different hashes


def test_a_report_does_not_depend_on_the_thread_count(tmp_path):
    """Verification runs torch on runtime.VERIFY_THREADS threads whatever the process's count, so a
    conversion on 1 and on 2 threads writes the same files, the report's figures included (its
    environment records the process's setting: that field aside). Under MKL_CBWR=AVX2 the 64-row
    GEMMs (module and float64 reference) differ in their last bits between 1 and 2 threads."""
    import torch

    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            res = convert_one(HUGGY, tmp_path / str(n), ConvertOptions(program=False, verify_options=VerifyOptions(
                fingerprint_steps=(16,))))
            assert res.report.ok and torch.get_num_threads() == n
    finally:
        torch.set_num_threads(before)
    names = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "2").iterdir()) and len(names) == 4
    for name in names:
        a, b = ((tmp_path / d / name).read_bytes() for d in ("1", "2"))
        if name.endswith(".verify.json"):
            ja, jb = json.loads(a), json.loads(b)
            assert (ja["environment"].pop("torch_threads"), jb["environment"].pop("torch_threads")) == (1, 2)
            assert ja == jb
        else:
            assert a == b, name
