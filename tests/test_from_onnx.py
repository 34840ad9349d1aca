"""Issue 13, ONNX-only models: every ONNX ML-Agents wrote (fixtures/, ML-Agents 1.1.0 on torch 2.13's legacy
exporter) read back into its canonical policy (importers.from_onnx), every artifact made from it alone, and
graphs that are not ML-Agents' refused in one line naming what is unexpected."""
from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import FIXTURES, HUGGY_RUN, VARIANTS, step_checkpoints, variant_names
from onnx import helper, numpy_helper

from huggy_convert import contract as C
from huggy_convert.cli import main
from huggy_convert.converter import load_checkpoint, load_policy
from huggy_convert.importers.from_onnx import checkpoint_from_onnx, recovered_record
from huggy_convert.converter.reference import official_divisors
from huggy_convert.errors import UnsupportedError
from huggy_convert.exporters.onnx_export import build_onnx, model_bytes, with_noise_input
from huggy_convert.core.numerics import ieee_divisor, ulp_distance
from huggy_convert.pipeline import prepare_conversion
from huggy_convert.runtime import ort_run, ort_session
from huggy_convert.runtime.feeds import make_probes

RUNS = {"huggy": HUGGY_RUN, **{n: VARIANTS / n for n in variant_names()}}
HUGGY_ONNX = HUGGY_RUN / "Huggy.onnx"
OLDER_HUGGY = step_checkpoints(HUGGY_RUN)[0]  # a second official Huggy ONNX (the run root copies the newest)
DETERMINISTIC = (C.OUT_VERSION, C.OUT_MEMORY, C.OUT_CONT_SHAPE, C.OUT_CONT_DET, C.OUT_DISC_SHAPE, C.OUT_DISC_DET,
                 C.RECURRENT_OUT)


def deployed(run):
    """(the run-root <Behavior>.onnx, the step checkpoint whose official ONNX it is a byte copy of)."""
    root = next(p for p in run.glob("*.onnx"))
    pt = next(p for p in step_checkpoints(run) if p.with_suffix(".onnx").read_bytes() == root.read_bytes())
    return root, pt


def cli(*args, code=0):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == code, (res.exit_code, res.stdout[-3000:], res.stderr[-2000:], res.exception)
    return res


def recover(path):
    """The canonical policy of an ONNX alone, as convert makes it (the ONNX its own reference)."""
    return prepare_conversion(checkpoint_from_onnx(path), path).conversion.policy


def same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feed) -> list:
    """The deterministic and constant outputs of both graphs in onnxruntime, bitwise (and the sampled
    continuous action with the same injected noise): the names that differ."""
    ra, rb = ort_run(ort_session(model_bytes(a)), feed), ort_run(ort_session(model_bytes(b)), feed)
    bad = [k for k in DETERMINISTIC if k in ra and (ra[k].dtype != rb[k].dtype or ra[k].tobytes() != rb[k].tobytes())]
    assert {k for k in DETERMINISTIC if k in ra} == {k for k in DETERMINISTIC if k in rb}
    if C.OUT_CONT in ra:
        rows = next(iter(feed.values())).shape[0]
        noise = dict(feed, **{C.NOISE_INPUT: np.random.default_rng(rows).standard_normal(
            (rows, ra[C.OUT_CONT].shape[1])).astype(np.float32)})
        na, nb = (ort_run(ort_session(model_bytes(with_noise_input(m))), noise)[C.OUT_CONT] for m in (a, b))
        if na.tobytes() != nb.tobytes():
            bad.append(C.OUT_CONT)
    return bad


@functools.lru_cache(maxsize=None)
def recovered(name: str):
    return recover(deployed(RUNS[name])[0])


@pytest.fixture(scope="module", params=sorted(RUNS) + ["huggy-older"])
def run(request):
    """Every official ONNX in fixtures/: each run's deployed <Behavior>.onnx and Huggy's older step file."""
    if request.param == "huggy-older":
        root, pt = OLDER_HUGGY.with_suffix(".onnx"), OLDER_HUGGY
    else:
        root, pt = deployed(RUNS[request.param])
    onnx_model = onnx.load(str(root))
    pol = recovered(request.param) if request.param in RUNS else recover(root)
    from_ckpt = prepare_conversion(load_checkpoint(pt), root).conversion.policy  # the divisor adopted from it
    return request.param, root, onnx_model, pol, from_ckpt


def test_the_recovered_policy_is_the_checkpoints(run):
    """Spec and every canonical tensor bitwise equal to the checkpoint's (constants included, those the ONNX
    does not keep come from the spec); the normalizer holds steps = 1, variance = divisor^2, its divisor is
    the ONNX's bit for bit, which is the checkpoint's sqrt(variance / steps) within the 1 ulp of the
    exporting CPU's sqrt (these files were folded on MKL's generic path)."""
    name, root, model, pol, ck = run
    assert pol.spec == ck.spec and set(pol.tensors) == set(ck.tensors)
    norm = {C.c_norm(i, f) for i in range(len(ck.spec.obs_sizes)) for f in (C.NORM_STEPS, C.NORM_VAR)} \
        if ck.spec.normalize else set()
    for k, a in ck.tensors.items():
        if k not in norm:
            assert a.dtype == pol.tensors[k].dtype and a.shape == pol.tensors[k].shape, k
            assert a.tobytes() == pol.tensors[k].tobytes(), k
    assert pol.sources == ck.sources
    folded = official_divisors(model)
    for i in range(len(ck.spec.obs_sizes) if ck.spec.normalize else 0):
        d, steps, var = pol.divisor(i), pol.tensors[C.c_norm(i, C.NORM_STEPS)], pol.tensors[C.c_norm(i, C.NORM_VAR)]
        assert d.tobytes() == folded[i].tobytes() == ck.divisor(i).tobytes()
        assert steps.tolist() == 1.0 and json.loads(pol.metadata["original_dtypes"])[C.c_norm(i, C.NORM_STEPS)] == \
            {"dtype": "int64", "shape": []}
        assert var.tobytes() == (d.astype(np.float64) ** 2).astype(np.float32).tobytes()
        assert ieee_divisor(var, steps).tobytes() == d.tobytes()
        truth = ieee_divisor(ck.tensors[C.c_norm(i, C.NORM_VAR)], ck.tensors[C.c_norm(i, C.NORM_STEPS)])
        assert ulp_distance(truth, d).max() <= 1
    rec = recovered_record(pol)
    assert rec["kind"] == "onnx" and rec["file"] == root.name and rec["opset"] == 9
    assert (rec["normalizer"] is not None) == ck.spec.normalize and pol.metadata["training_step"] == ""


@pytest.mark.parametrize("opset", [9, 13])
def test_the_rebuilt_graph_gives_the_inputs_outputs_bitwise(run, opset):
    """The graph rebuilt from the ONNX alone: deterministic, constant and (with the same injected noise)
    sampled outputs bitwise equal to the input file's in onnxruntime, on ML-Agents' golden inputs and on
    the seeded probes; at opset 9 it is the input graph node for node."""
    name, root, model, pol, _ = run
    rebuilt = build_onnx(pol, opset)
    golden = dict(np.load(root.with_suffix(".golden.npz")))
    feeds = {"golden": {i.name: golden[i.name] for i in model.graph.input},
             "probes": make_probes(pol, rows=64, seed=0)}
    for feed_name, feed in feeds.items():
        assert same_outputs(model, rebuilt, feed) == [], (name, feed_name)
    if opset == 9:
        from huggy_convert.importers.from_onnx import match_graph

        match_graph(model, rebuilt, root, collect=False)  # raises on the first difference


def test_divisor_squared_gives_the_divisor_back_for_every_float32_significand():
    """The relation the canonical file relies on: fl(sqrt(fl(D * D))) == D (what core.numerics.ieee_divisor computes
    for variance = D^2, steps = 1) for every float32 significand, in [1, 2) and [2, 4); scaling D by 2^k scales
    D^2 by 4^k exactly, so this covers every D whose square is a normal float32."""
    for exponent in (127, 128):
        d = ((np.uint32(exponent) << np.uint32(23)) | np.arange(1 << 23, dtype=np.uint32)).view(np.float32)
        var = (d.astype(np.float64) ** 2).astype(np.float32)
        assert np.array_equal(ieee_divisor(var, 1), d)


def test_convert_an_onnx_alone(tmp_path):
    """``huggy-convert Huggy.onnx out/``: safetensors, rebuilt ONNX, .pt2, golden and a PASS verified against that
    same ONNX as the official file; the canonical file says where it came from; ``info`` and ``verify`` read it."""
    out = tmp_path / "out"
    res = cli(HUGGY_ONNX, out, "--json")
    s = json.loads(res.stdout)
    assert s["verify"]["ok"] and s["verify"]["verdict"] == "PASS" and s["training_step"] is None
    assert s["reference"] == str(HUGGY_ONNX) and s["recovered_from"]["file"] == HUGGY_ONNX.name
    assert sorted(p.name for p in out.iterdir()) == sorted(f"Huggy{x}" for x in (".safetensors", ".onnx", ".pt2",
                                                                                 ".verify.json", ".golden.npz"))
    report = json.loads((out / "Huggy.verify.json").read_text())
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status == {"safetensors": "pass", "official": "pass", "outputs": "pass", "runtimes": "pass",
                      "fingerprints": "pass", "files": "pass"}
    pol = load_policy(out / "Huggy.safetensors")
    assert recovered_record(pol)["sha256"] == s["source_sha256"]
    assert onnx.load(str(out / "Huggy.onnx")).graph.node  # a real graph, and the pipeline's own file
    info = cli("info", out / "Huggy.safetensors").stdout
    assert f"recovered from the ONNX {HUGGY_ONNX.name}" in info and "steps folded into the ONNX" in info
    d = json.loads(cli("info", HUGGY_ONNX, "--json").stdout)
    assert d["recovered_from"]["kind"] == "onnx" and "checkpoint" not in d
    # back into ML-Agents: the normalizer counts one step, its variance is D^2 (README, "Only an ONNX")
    assert json.loads(cli("to-checkpoint", out / "Huggy.safetensors", tmp_path / "ck", "--json").stdout)["read_back"]
    sd = load_checkpoint(tmp_path / "ck" / C.CHECKPOINT_FILE).policy
    steps, var = (sd[C.NORM_PREFIX.format(i=0) + f] for f in (C.NORM_STEPS, C.NORM_VAR))
    assert steps.dtype == torch.int64 and steps.shape == () and int(steps) == 1
    assert var.numpy().tobytes() == pol.tensors[C.c_norm(0, C.NORM_VAR)].tobytes()


@pytest.mark.parametrize("name", [n for n in ("lstm", "hybrid") if n in RUNS])
def test_convert_then_verify_a_small_onnx(tmp_path, name):
    root, _ = deployed(RUNS[name])
    out = tmp_path / "out"
    cli(root, out)
    verify, = json.loads(cli("verify", out, "--checkpoint", root, "--json").stdout)["policies"]
    assert verify["verdict"] == "PASS"  # the .onnx and .pt2 regenerated from the .safetensors, byte for byte
    assert next(c for c in verify["checks"] if c["id"] == "safetensors")["status"] == "pass"


@pytest.mark.parametrize("opset", range(11, 16))
def test_export_an_onnx_alone_at_opsets_11_to_15(tmp_path, opset):
    """``export X.onnx --opset N``: checked (full_check) and verified against the input (checks 2 and 3, bitwise)."""
    for name in [n for n in ("hybrid", "lstm") if n in RUNS]:
        root, _ = deployed(RUNS[name])
        d = json.loads(cli("export", root, "--opset", opset, "-o", tmp_path / f"{name}.onnx", "--json").stdout)
        assert d["checker_full_check"] == "pass" and d["matches_reference"] and d["bitwise"], (name, d["outputs"])
        assert {o.domain or "": o.version for o in onnx.load(str(tmp_path / f"{name}.onnx")).opset_import}[""] == opset


def test_our_own_rebuild_at_any_opset_reads_back_to_the_same_policy(tmp_path):
    """A file this tool wrote at opset 9-15 (Clip, Slice, Squeeze in each opset's form) reads back into the same
    canonical tensors: export -> ONNX -> policy is lossless (LSTM: Slice, Squeeze; hybrid: Slice, Clip, masks)."""
    names = [n for n in ("lstm", "hybrid", "twoobs") if n in RUNS]
    assert names
    for name in names:
        pol = recovered(name)
        for opset in range(9, 16):
            p = tmp_path / f"{name}.{opset}.onnx"
            p.write_bytes(model_bytes(build_onnx(pol, opset)))
            back = recover(p)
            assert back.spec == pol.spec and recovered_record(back)["opset"] == opset
            assert all(back.tensors[k].tobytes() == v.tobytes() for k, v in pol.tensors.items()), (name, opset)


def test_names_and_dedup_do_not_matter(tmp_path):
    """What torch 1.x's legacy exporter writes differently from torch 2.x's (REFERENCE.md): node names
    (``Gemm_12``), numbered tensor names, no initializer-dedup Identity nodes; and a constant as an initializer
    instead of a Constant node. Simulated here by rewriting the official SAC file (its dedup Identity included):
    the same tensors come back. Not an official torch 1.x file: none is in fixtures/."""
    if "sac" not in RUNS:
        pytest.skip("fixture variant sac not present")
    root, _ = deployed(RUNS["sac"])
    m = onnx.load(str(root))
    g = m.graph
    keep = {i.name for i in g.input} | {o.name for o in g.output}
    inits = {t.name: t for t in g.initializer}
    rename, fresh = {}, iter(range(1000, 100000))
    for n in g.node:  # dedup Identity -> a copy of the initializer; Constant -> an initializer
        if n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in keep:
            t = onnx.TensorProto()
            t.CopyFrom(inits[n.input[0]])
            t.name = n.output[0]
            g.initializer.append(t)
        elif n.op_type == "Constant":
            g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(n.attribute[0].t), n.output[0]))
    nodes = [n for n in g.node if not (n.op_type == "Constant" or (n.op_type == "Identity" and n.output[0] not in keep))]
    del g.node[:]
    g.node.extend(nodes)
    names = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for name in sorted(names - keep):
        rename[name] = str(next(fresh))
    for t in g.initializer:
        t.name = rename.get(t.name, t.name)
    for k, n in enumerate(g.node):
        n.name = f"{n.op_type}_{k}"
        n.input[:] = [rename.get(x, x) for x in n.input]
        n.output[:] = [rename.get(x, x) for x in n.output]
    onnx.checker.check_model(m, full_check=True)
    p = tmp_path / "renamed.onnx"
    p.write_bytes(m.SerializeToString())
    a, b = recover(p), recover(root)
    assert a.spec == b.spec and all(a.tensors[k].tobytes() == v.tobytes() for k, v in b.tensors.items())


FAMILIES = FIXTURES / "families"


@pytest.mark.parametrize("name", sorted(p.name for p in FAMILIES.iterdir() if p.is_dir()) if FAMILIES.is_dir() else [])
def test_the_observation_families_read_from_an_onnx_as_from_their_checkpoint(name):
    """fixtures/families (cameras, attention, goal conditioning; ML-Agents 1.1.0 and 0.30.0 with torch 1.11):
    an ONNX alone gives what its checkpoint gives: the same spec and tensors and, rebuilt, the input's outputs
    bitwise on ML-Agents' golden inputs (attention_mlagents030 is a torch 1.11 export: other node and tensor
    names, no dedup Identity nodes), or the same 'not supported yet: <family>' refusal, named from the graph."""
    root, pt = deployed(FAMILIES / name)
    try:
        want = prepare_conversion(load_checkpoint(pt), root).conversion.policy
    except UnsupportedError as exc:
        with pytest.raises(UnsupportedError) as got:
            checkpoint_from_onnx(root)
        assert got.value.message.split(" (")[0] == exc.message.split(" (")[0], (got.value.message, exc.message)
        return
    pol = recover(root)  # a family whose checkpoint converts must read from its ONNX too
    assert pol.spec == want.spec
    skip = {C.c_norm(i, f) for i, _ in want.spec.vector_obs for f in (C.NORM_STEPS, C.NORM_VAR)} if want.spec.normalize else set()
    assert set(pol.tensors) == set(want.tensors)
    assert all(pol.tensors[k].tobytes() == v.tobytes() for k, v in want.tensors.items() if k not in skip)
    model, golden = onnx.load(str(root)), dict(np.load(root.with_suffix(".golden.npz")))
    assert same_outputs(model, build_onnx(pol), {i.name: golden[i.name] for i in model.graph.input}) == []


def test_a_camera_onnx_without_its_names_reads_as_with_them(tmp_path):
    """With the parameter names gone (nothing says 'conv_layers'), the camera's encoder is still found by
    its graph: the same spec and tensors as from the named file."""
    m = onnx.load(str(deployed(FAMILIES / "visual_simple")[0]))
    rename = {t.name: f"w{k}" for k, t in enumerate(m.graph.initializer)}
    for t in m.graph.initializer:
        t.name = rename[t.name]
    for n in m.graph.node:
        n.input[:] = [rename.get(x, x) for x in n.input]
    p = tmp_path / "cam.onnx"
    p.write_bytes(m.SerializeToString())
    a, b = recover(p), recover(deployed(FAMILIES / "visual_simple")[0])
    assert a.spec == b.spec and a.spec.vis_encode_type == C.VIS_SIMPLE
    assert all(a.tensors[k].tobytes() == v.tobytes() for k, v in b.tensors.items())


# --- not ML-Agents' graphs: one line, exit 2, naming what is unexpected, nothing written --------------------
def _tiny(m):
    x = helper.make_tensor_value_info(C.OBS_INPUT.format(i=0), onnx.TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", [x.name], ["y"])], "tiny", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 9)])


def _extra_node(m):
    sub = next(n for n in m.graph.node if n.op_type == "Sub")
    m.graph.node.insert(list(m.graph.node).index(sub) + 1, helper.make_node("Relu", [sub.output[0]], ["relu_out"]))
    next(n for n in m.graph.node if n.op_type == "Div").input[0] = "relu_out"
    return m


def _missing_initializer(m):
    t = next(t for t in m.graph.initializer if t.name == C.MU.format(p="weight"))
    m.graph.initializer.remove(t)
    return m


def _initializer_as_input(m):
    t = next(t for t in m.graph.initializer if t.name == C.MU.format(p="weight"))
    m.graph.initializer.remove(t)
    m.graph.input.append(helper.make_tensor_value_info(t.name, onnx.TensorProto.FLOAT, list(t.dims)))
    return m


def _renamed_output(m):
    for n in m.graph.node:
        n.output[:] = ["actions" if o == C.OUT_CONT_DET else o for o in n.output]
    next(o for o in m.graph.output if o.name == C.OUT_CONT_DET).name = "actions"
    return m


def _clip_bound(m):
    clip = [n for n in m.graph.node if n.op_type == "Clip"][-1]
    next(a for a in clip.attribute if a.name == "max").f = 4.0
    return m


def _negative_divisor(m):
    name = official_divisors.__globals__["divisor_initializers"](m)[0]
    t = next(t for t in m.graph.initializer if t.name == name)
    a = numpy_helper.to_array(t).copy()
    a[3] = -a[3]
    t.CopyFrom(numpy_helper.from_array(a, name))
    return m


def _contradicting_constant(m):
    t = next(t for t in m.graph.initializer if t.name == C.K_CONT_SIZE)
    t.CopyFrom(numpy_helper.from_array(np.array([20.0], np.float32), t.name))
    return m


def _mask_width(_):
    """The hybrid fixture (Huggy has no masks) with action_masks declared wider than its branches."""
    m = onnx.load(str(deployed(RUNS["hybrid"])[0]))
    next(i for i in m.graph.input if i.name == C.ACTION_MASKS).type.tensor_type.shape.dim[1].dim_value = 7
    return m


def _unread_initializer(m):
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "stray"))
    return m


BAD = [(_tiny, "unexpected output 'y'"), (_extra_node, "node 1 (Relu) where ML-Agents' graph has Div"),
       (_missing_initializer, C.MU.format(p="weight")), (_initializer_as_input, "unexpected input"),
       (_renamed_output, "unexpected output 'actions'"), (_clip_bound, "'max': 4.0"),
       (_negative_divisor, f"the {C.OBS_INPUT.format(i=0)} normalizer divisor [3]"),
       (_contradicting_constant, "says [20.0] but the mu layer says [21]"),
       (_unread_initializer, "unexpected initializer 'stray' (no node reads it)"),
       (_mask_width, f"the input '{C.ACTION_MASKS}' is float['batch', 7], ML-Agents' is float['batch', 3]")]


@pytest.mark.parametrize("make,says", BAD, ids=[f.__name__.strip("_") for f, _ in BAD])
def test_a_graph_that_is_not_ml_agents_is_refused_in_one_line(tmp_path, make, says):
    p = tmp_path / "bad.onnx"
    p.write_bytes(make(onnx.load(str(HUGGY_ONNX))).SerializeToString())
    res = cli(p, tmp_path / "out", code=2)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"huggy-convert: error: {p}: ") and says in lines[0], lines
    assert not (tmp_path / "out").exists()
    cli("export", p, "--opset", "13", "-o", tmp_path / "x.onnx", code=2)
    assert not (tmp_path / "x.onnx").exists()
