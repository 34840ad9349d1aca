"""The SB3 reading layer (importers/sb3_files.py): real files written by SB3 2.9.2 read back, and crafted
files that would run code if unpickled: each refused in one line, nothing executed."""
from __future__ import annotations

import base64
import io
import json
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from huggy_convert import contract as C
from huggy_convert.errors import CheckpointError, InputError, UnsupportedError
from huggy_convert.importers import sb3_files as S

FIXTURES = Path(os.environ.get("HUGGY_SB3_FIXTURES") or Path(__file__).resolve().parents[1] / "fixtures" / "sb3")
RUNS = ("ppo_pendulum_vecnorm", "ppo_multidiscrete", "sac_pendulum_vecnorm", "td3_pendulum", "ppo_cartpole_relu")
VECNORM_RUNS = ("ppo_pendulum_vecnorm", "ppo_multidiscrete", "sac_pendulum_vecnorm")
OBS_SIZE = {"ppo_pendulum_vecnorm": 3, "ppo_multidiscrete": 6, "sac_pendulum_vecnorm": 3, "td3_pendulum": 3,
            "ppo_cartpole_relu": 4}

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="fixtures/sb3 not present")


def _one_line(exc: InputError) -> str:
    line = exc.one_line()
    assert "\n" not in line and "Traceback" not in line
    return line


# --- the real files --------------------------------------------------------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_real_zip_reads(run):
    path = FIXTURES / run / "model.zip"
    z = S.read_sb3_zip(path)
    assert S.is_sb3_zip(path)
    assert z.version == "2.9.2"
    manifest = {r["name"]: r for r in json.loads((FIXTURES / "manifest.json").read_text())["runs"]}
    assert z.sha256 == manifest[run]["files"]["model.zip"]
    assert C.SB3_DATA in z.members and C.SB3_POLICY in z.members
    obs = z.data[C.SB3_OBSERVATION_SPACE]
    assert obs[C.SB3_TYPE] == "<class 'gymnasium.spaces.box.Box'>"
    assert obs["_shape"] == [OBS_SIZE[run]]
    assert isinstance(obs[C.SB3_SERIALIZED], str)  # left as text
    assert C.SB3_ACTION_SPACE in z.data and C.SB3_POLICY_KWARGS in z.data
    import torch
    assert all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in z.state.items())


def test_real_ppo_and_td3_state_keys():
    import torch
    ppo = S.read_sb3_zip(FIXTURES / "ppo_pendulum_vecnorm" / "model.zip")
    assert {"log_std", "action_net.weight", "action_net.bias", "mlp_extractor.policy_net.0.weight",
            "mlp_extractor.policy_net.2.weight", "value_net.weight"} <= set(ppo.state)
    runs = {r["name"]: r for r in json.loads((FIXTURES / "manifest.json").read_text())["runs"]}
    w = runs["ppo_pendulum_vecnorm"]["policy_kwargs"]["net_arch"]["pi"][0]  # what the generator asked SB3 for
    assert tuple(ppo.state["mlp_extractor.policy_net.0.weight"].shape) == (w, 3)
    assert tuple(ppo.state["action_net.weight"].shape) == (1, w)
    assert ppo.state["log_std"].dtype == torch.float32
    assert ppo.data[C.SB3_POLICY_KWARGS] == {"net_arch": {"pi": [w, w], "vf": [w, w]}}
    act = ppo.data[C.SB3_ACTION_SPACE]
    assert act["low"] == "[-2.]" and act["high"] == "[2.]" and act["_shape"] == [1]
    td3 = S.read_sb3_zip(FIXTURES / "td3_pendulum" / "model.zip")
    for i in (0, 2, 4):
        assert f"actor.mu.{i}.weight" in td3.state and f"actor_target.mu.{i}.weight" in td3.state
    w = runs["td3_pendulum"]["policy_kwargs"]["net_arch"][0]
    assert tuple(td3.state["actor.mu.0.weight"].shape) == (w, 3)
    assert tuple(td3.state["actor.mu.4.weight"].shape) == (1, w)
    assert any(k.startswith("critic.qf0.") for k in td3.state)
    md = S.read_sb3_zip(FIXTURES / "ppo_multidiscrete" / "model.zip")
    assert md.data[C.SB3_ACTION_SPACE]["nvec"] == "[3 4]"
    assert tuple(md.state["action_net.weight"].shape) == (7, runs["ppo_multidiscrete"]["policy_kwargs"]["net_arch"][0])
    relu = S.read_sb3_zip(FIXTURES / "ppo_cartpole_relu" / "model.zip")
    assert relu.data[C.SB3_ACTION_SPACE]["n"] == "2"


def _independent_stats(blob: bytes):
    """mean/var/count/clip_obs/epsilon read off the pickle's opcodes (pickletools, nothing built): the bytes
    after the string 'mean' / 'var' (the first bytes argument of 8*n bytes), the float after 'count'..."""
    ops = list(pickletools.genops(blob))
    out = {}
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "SHORT_BINUNICODE" and arg in ("mean", "var") and arg not in out:
            raw = next(a for o, a, _ in ops[i + 1:] if o.name in ("SHORT_BINBYTES", "BINBYTES") and len(a) % 8 == 0
                       and len(a) > 1)
            out[arg] = np.frombuffer(raw, dtype="<f8")
        if op.name == "SHORT_BINUNICODE" and arg in ("count", "clip_obs", "epsilon") and arg not in out:
            out[arg] = next(a for o, a, _ in ops[i + 1:] if o.name not in ("MEMOIZE", "BINPUT"))
    return out


@pytest.mark.parametrize("run", VECNORM_RUNS)
def test_real_vec_normalize(run):
    path = FIXTURES / run / "vec_normalize.pkl"
    assert S.find_vec_normalize(FIXTURES / run / "model.zip") == path
    st = S.read_vec_normalize(path)
    n = OBS_SIZE[run]
    assert st.mean.dtype == np.float64 and st.var.dtype == np.float64
    assert st.mean.shape == (n,) and st.var.shape == (n,) and st.obs_shape == (n,)
    assert st.clip_obs == 10.0 and st.epsilon == 1e-8 and st.norm_obs is True
    ref = _independent_stats(path.read_bytes())
    np.testing.assert_array_equal(st.mean, ref["mean"])
    np.testing.assert_array_equal(st.var, ref["var"])
    assert st.count == ref["count"] and st.clip_obs == ref["clip_obs"] and st.epsilon == ref["epsilon"]
    assert st.count > 1000 and np.all(st.var > 0)


def test_known_values_pendulum():
    """RunningMeanStd counts from epsilon 1e-4, plus the reset's observation and one per step (one env)."""
    st = S.read_vec_normalize(FIXTURES / "ppo_pendulum_vecnorm" / "vec_normalize.pkl")
    runs = {r["name"]: r for r in json.loads((FIXTURES / "manifest.json").read_text())["runs"]}
    assert st.count == pytest.approx(runs["ppo_pendulum_vecnorm"]["timesteps"] + 1 + 1e-4, abs=1e-9)
    assert np.all(st.var > 0) and abs(st.mean[0]) <= 1 and abs(st.mean[2]) <= 8  # Pendulum: cos, sin, speed <= 8


def test_numpy_random_constructors_are_never_called(monkeypatch):
    import numpy.random._pickle as rp

    def boom(*a, **k):
        raise AssertionError("a numpy.random constructor ran")

    for name in ("__generator_ctor", "__bit_generator_ctor"):
        monkeypatch.setattr(rp, name, boom)
    st = S.read_vec_normalize(FIXTURES / "ppo_pendulum_vecnorm" / "vec_normalize.pkl")
    assert st.obs_shape == (3,)


def test_find_vec_normalize_names(tmp_path):
    z = tmp_path / "agent.zip"
    z.write_bytes(b"")
    assert S.find_vec_normalize(z) is None
    (tmp_path / "vecnormalize.pkl").write_bytes(b"x")
    assert S.find_vec_normalize(z) == tmp_path / "vecnormalize.pkl"
    (tmp_path / "vec_normalize.pkl").write_bytes(b"x")
    assert S.find_vec_normalize(z) == tmp_path / "vec_normalize.pkl"
    (tmp_path / "agent.vec_normalize.pkl").write_bytes(b"x")
    assert S.find_vec_normalize(z) == tmp_path / "agent.vec_normalize.pkl"
    (tmp_path / "agent_vec_normalize.pkl").write_bytes(b"x")
    assert S.find_vec_normalize(z) == tmp_path / "agent_vec_normalize.pkl"


def test_is_sb3_zip_probe(tmp_path):
    assert not S.is_sb3_zip(tmp_path / "nothing.zip")
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    assert not S.is_sb3_zip(bad)
    other = tmp_path / "model.pt"
    other.write_bytes((FIXTURES / "td3_pendulum" / "model.zip").read_bytes())
    assert not S.is_sb3_zip(other)  # not a .zip name
    assert not S.is_sb3_zip(tmp_path)


# --- crafted VecNormalize pickles ------------------------------------------------------------------


class _Runs:
    """Pickles as a call of ``func(*args)``: unpickled by plain ``pickle.loads`` it would run."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.fixture
def fake_sb3(monkeypatch):
    """Modules named like SB3's, so that objects of the test pickle under SB3's global names (pickling here
    is fine; our reader must never unpickle them into the real classes)."""
    classes = {}
    for module in {m for m, _ in (C.VN_CLASS, C.RMS_CLASS, ("gymnasium.spaces.box", ""), ("gymnasium.spaces.dict", ""))}:
        parts = module.split(".")
        for i in range(1, len(parts)):  # the parents, so that pickle's import of the module finds it
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    for module, name in (C.VN_CLASS, C.RMS_CLASS, ("gymnasium.spaces.box", "Box"), ("gymnasium.spaces.dict", "Dict")):
        mod = types.ModuleType(module)
        cls = type(name, (), {"__module__": module, "__qualname__": name})
        setattr(mod, name, cls)
        monkeypatch.setitem(sys.modules, module, mod)
        classes[name] = cls
    return classes


def _vecnorm(classes, **over):
    rms = classes["RunningMeanStd"]()
    rms.__dict__.update(mean=np.zeros(3), var=np.ones(3), count=5.0)
    box = classes["Box"]()
    box.__dict__.update(_shape=(3,), dtype=np.dtype("float32"))
    vn = classes["VecNormalize"]()
    vn.__dict__.update(observation_space=box, norm_obs=True, norm_obs_keys=None, obs_rms=rms, clip_obs=10.0,
                       epsilon=1e-8)
    vn.__dict__.update(over)
    return vn


def _write(tmp_path, obj, name="vec_normalize.pkl", protocol=4) -> Path:
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=protocol, fix_imports=False))
    return p


def test_crafted_vecnorm_reads(tmp_path, fake_sb3):
    st = S.read_vec_normalize(_write(tmp_path, _vecnorm(fake_sb3)))
    assert st.mean.tolist() == [0, 0, 0] and st.var.tolist() == [1, 1, 1] and st.count == 5.0
    off = S.read_vec_normalize(_write(tmp_path, _vecnorm(fake_sb3, norm_obs=False), "off.pkl", protocol=5))
    assert off.norm_obs is False


@pytest.mark.parametrize("payload, shown", [
    (lambda m: _Runs(os.system, f"touch {m}"), ("os.system", "posix.system")),
    (lambda m: _Runs(exec, f"open({str(m)!r}, 'w').close()"), ("builtins.exec",)),
    (lambda m: _Runs(subprocess.call, ["touch", str(m)]), ("subprocess.call",)),
    (lambda m: _Runs(eval, f"open({str(m)!r}, 'w')"), ("builtins.eval",)),
])
@pytest.mark.parametrize("hidden", [False, True])
def test_code_in_vecnorm_never_runs(tmp_path, fake_sb3, payload, shown, hidden):
    marker = tmp_path / "MARKER"
    evil = payload(marker)
    obj = _vecnorm(fake_sb3, obs_rms=evil) if hidden else evil  # hidden: in an allowed class's state
    for proto in (2, 4, 5):
        p = _write(tmp_path, obj, protocol=proto)
        with pytest.raises(InputError) as info:
            S.read_vec_normalize(p)
        line = _one_line(info.value)
        assert "refuses to load the global" in line and any(s in line for s in shown), line
        assert "nothing was executed" in line
        assert not marker.exists()


def test_getattr_and_dotted_names_refused(tmp_path, fake_sb3):
    marker = tmp_path / "MARKER"
    vn_cls = fake_sb3["VecNormalize"]
    p = _write(tmp_path, _Runs(getattr, vn_cls, "__init__"))
    with pytest.raises(InputError, match="builtins.getattr"):
        S.read_vec_normalize(p)
    # STACK_GLOBAL of an allowed module with a dotted name: 'VecNormalize.__init__'
    mod, name = C.VN_CLASS
    body = (b"\x80\x04" + _unicode(mod) + _unicode(name + ".__init__") + b"\x93" + b")R.")
    p.write_bytes(body)
    with pytest.raises(InputError, match="VecNormalize.__init__"):
        S.read_vec_normalize(p)
    # the real numpy.random constructors are not an escape hatch either: they become inert stand-ins
    assert not marker.exists()


def _unicode(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def test_hand_built_reduce_hidden_under_allowed_class(tmp_path):
    """VecNormalize NEWOBJ, its state dict holding a GLOBAL posix.system REDUCE: refused at the global."""
    marker = tmp_path / "MARKER"
    mod, name = C.VN_CLASS
    cmd = f"touch {marker}".encode()
    blob = (b"\x80\x02c" + mod.encode() + b"\n" + name.encode() + b"\n)\x81}(" + _unicode("obs_rms")
            + b"cposix\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85Rub.")
    p = tmp_path / "vec_normalize.pkl"
    p.write_bytes(blob)
    with pytest.raises(InputError, match="posix.system"):
        S.read_vec_normalize(p)
    assert not marker.exists()


def test_object_arrays_and_persistent_ids_refused(tmp_path, fake_sb3):
    p = _write(tmp_path, _vecnorm(fake_sb3, obs_rms=np.array([None, 1], dtype=object)))
    with pytest.raises(InputError, match="dtype"):
        S.read_vec_normalize(p)

    class Persist(pickle.Pickler):
        def persistent_id(self, obj):
            return "x" if isinstance(obj, float) else None

    buf = io.BytesIO()
    Persist(buf, protocol=4).dump(_vecnorm(fake_sb3))
    p.write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="BINPERSID"):
        S.read_vec_normalize(p)


def test_dict_observations_unsupported(tmp_path, fake_sb3):
    p = _write(tmp_path, _vecnorm(fake_sb3, norm_obs_keys=["pos"], obs_rms={"pos": None}))
    with pytest.raises(UnsupportedError, match="dict observation space"):
        S.read_vec_normalize(p)


@pytest.mark.parametrize("over, says", [
    ({"obs_rms": None}, "RunningMeanStd"),
    ({"clip_obs": "10"}, "clip_obs"),
    ({"epsilon": float("nan")}, "epsilon"),
    ({"norm_obs": 1}, "norm_obs"),
])
def test_ill_typed_vecnorm(tmp_path, fake_sb3, over, says):
    with pytest.raises(InputError, match=says) as info:
        S.read_vec_normalize(_write(tmp_path, _vecnorm(fake_sb3, **over)))
    _one_line(info.value)


def test_not_a_pickle_or_not_a_vecnorm(tmp_path, fake_sb3):
    p = tmp_path / "vec_normalize.pkl"
    for blob, says in ((b"", "empty"), (b"hello", "not a VecNormalize pickle"), (b"\x80\x04\xff", "not a readable"),
                       (pickle.dumps([1, 2], protocol=4), "not a VecNormalize"),
                       ((FIXTURES / "ppo_pendulum_vecnorm" / "vec_normalize.pkl").read_bytes()[:500],
                        "not a readable")):
        p.write_bytes(blob)
        with pytest.raises(InputError, match=says) as info:
            S.read_vec_normalize(p)
        _one_line(info.value)


# --- crafted model zips ----------------------------------------------------------------------------


def _members(run="ppo_pendulum_vecnorm"):
    with zipfile.ZipFile(FIXTURES / run / "model.zip") as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(tmp_path, members, name="model.zip", compression=zipfile.ZIP_STORED) -> Path:
    p = tmp_path / name
    with zipfile.ZipFile(p, "w", compression=compression) as zf:
        for k, v in members.items():
            zf.writestr(k, v)
    return p


def test_serialized_data_is_never_decoded(tmp_path):
    marker = tmp_path / "MARKER"
    m = _members()
    data = json.loads(m[C.SB3_DATA])
    evil = base64.b64encode(pickle.dumps(_Runs(os.system, f"touch {marker}"))).decode()
    data[C.SB3_OBSERVATION_SPACE][C.SB3_SERIALIZED] = evil
    data["lr_schedule"] = {C.SB3_TYPE: "<class 'function'>", C.SB3_SERIALIZED: evil}
    m[C.SB3_DATA] = json.dumps(data).encode()
    z = S.read_sb3_zip(_zip(tmp_path, m, compression=zipfile.ZIP_DEFLATED))
    assert z.data["lr_schedule"][C.SB3_SERIALIZED] == evil
    assert z.data[C.SB3_OBSERVATION_SPACE][C.SB3_SERIALIZED] == evil
    assert "log_std" in z.state
    assert not marker.exists()


def test_policy_pth_that_would_run_code(tmp_path):
    import torch
    marker = tmp_path / "MARKER"
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2), "x": _Runs(os.system, f"touch {marker}")}, buf)
    m = _members()
    m[C.SB3_POLICY] = buf.getvalue()
    with pytest.raises(CheckpointError) as info:
        S.read_sb3_zip(_zip(tmp_path, m))
    line = _one_line(info.value)
    assert "policy.pth" in line and "refused" in line and "system" in line and "nothing was executed" in line
    assert not marker.exists()


@pytest.mark.parametrize("value, says", [
    (lambda torch: torch.zeros(3), "holds a Tensor"),
    (lambda torch: {"w": 3}, "not a tensor"),
    (lambda torch: {1: torch.zeros(1)}, "not a str"),
])
def test_policy_pth_not_a_flat_state_dict(tmp_path, value, says):
    import torch
    buf = io.BytesIO()
    torch.save(value(torch), buf)
    m = _members()
    m[C.SB3_POLICY] = buf.getvalue()
    with pytest.raises(CheckpointError, match=says) as info:
        S.read_sb3_zip(_zip(tmp_path, m))
    _one_line(info.value)


def test_policy_pth_garbage(tmp_path):
    m = _members()
    m[C.SB3_POLICY] = b"not torch at all"
    with pytest.raises(CheckpointError, match="policy.pth") as info:
        S.read_sb3_zip(_zip(tmp_path, m))
    _one_line(info.value)


def test_damaged_and_incomplete_zips(tmp_path):
    real = (FIXTURES / "td3_pendulum" / "model.zip").read_bytes()
    p = tmp_path / "model.zip"
    for blob in (real[: len(real) // 2], b"PK\x05\x06" + b"\0" * 18, b"not a zip", real[:-30]):
        p.write_bytes(blob)
        with pytest.raises(InputError, match="damaged or truncated zip|not a readable|not an SB3 model zip") as info:
            S.read_sb3_zip(p)
        _one_line(info.value)
    m = _members()
    for drop in (C.SB3_DATA, C.SB3_POLICY):
        rest = {k: v for k, v in m.items() if k != drop}
        with pytest.raises(InputError, match=f"not an SB3 model zip: no '{drop}'") as info:
            S.read_sb3_zip(_zip(tmp_path, rest))
        _one_line(info.value)
    with pytest.raises(InputError, match="no 'data' and no 'policy.pth'"):
        S.read_sb3_zip(_zip(tmp_path, {"other": b"x"}))


def test_corrupt_member_crc(tmp_path):
    m = _members()
    p = _zip(tmp_path, m)
    blob = bytearray(p.read_bytes())
    at = blob.find(b'"policy_class"')
    blob[at + 1] ^= 0x01  # a flipped bit inside the stored data member
    p.write_bytes(bytes(blob))
    with pytest.raises(InputError, match="damaged") as info:
        S.read_sb3_zip(p)
    _one_line(info.value)


@pytest.mark.parametrize("data, says", [
    (b"\xff\xfe not utf8", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
])
def test_bad_data_json(tmp_path, data, says):
    m = _members()
    m[C.SB3_DATA] = data
    with pytest.raises(InputError, match=says) as info:
        S.read_sb3_zip(_zip(tmp_path, m))
    _one_line(info.value)


def test_oversized_and_bomb_members(tmp_path, monkeypatch):
    m = _members()
    p = _zip(tmp_path, m, compression=zipfile.ZIP_DEFLATED)
    monkeypatch.setattr(S, "MAX_DATA_BYTES", 1000)
    with pytest.raises(InputError, match="over the 1,000-byte bound") as info:
        S.read_sb3_zip(p)
    _one_line(info.value)
    monkeypatch.undo()
    m[C.SB3_DATA] = b'{"x": "' + b" " * (8 << 20) + b'"}'  # 8 MB of spaces: deflates ~1000:1
    p = _zip(tmp_path, m, compression=zipfile.ZIP_DEFLATED)
    monkeypatch.setattr(S, "MAX_RATIO", 100)
    with pytest.raises(InputError, match="zip bomb") as info:
        S.read_sb3_zip(p)
    _one_line(info.value)


def test_other_compression_refused(tmp_path):
    p = _zip(tmp_path, _members(), compression=zipfile.ZIP_BZIP2)
    with pytest.raises(InputError, match="compression method") as info:
        S.read_sb3_zip(p)
    _one_line(info.value)


def test_zip_stored_and_deflated_read_the_same(tmp_path):
    m = _members("td3_pendulum")
    a = S.read_sb3_zip(_zip(tmp_path, m, "a.zip"))
    b = S.read_sb3_zip(_zip(tmp_path, m, "b.zip", compression=zipfile.ZIP_DEFLATED))
    assert a.data == b.data and a.version == b.version == "2.9.2" and set(a.state) == set(b.state)
    assert all(bool((a.state[k] == b.state[k]).all()) for k in a.state)
    no_version = {k: v for k, v in m.items() if k != C.SB3_VERSION}
    assert S.read_sb3_zip(_zip(tmp_path, no_version, "c.zip")).version == ""


def test_module_does_not_import_torch():
    code = ("import sys; import huggy_convert.importers.sb3_files; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr
    # the package's own imports may bring torch in elsewhere; the module itself imports it only inside functions
    src = Path(S.__file__).read_text()
    assert "\nimport torch" not in src and "\nfrom torch" not in src
