"""The allow-listed checkpoint reader (converter.checkpoint.fast_policy_load): on every checkpoint
ML-Agents wrote under fixtures/ it takes the fast path and gives torch.load(weights_only=True)'s
tensors bit for bit; a pickle asking for anything else is never run and is refused as before."""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import zipfile
from collections import OrderedDict

import pytest
import torch
from conftest import FIXTURES

from huggy_convert import contract as C
from huggy_convert.converter import checkpoint as ck
from huggy_convert.errors import CheckpointError

# the committed fixtures (not a generator venv under fixtures/.venv*, whose packages ship .pt files of their own)
ALL = sorted(p for p in FIXTURES.rglob("*.pt") if not p.relative_to(FIXTURES).parts[0].startswith("."))


def _zip(path_or_bytes):
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else path_or_bytes.read_bytes()
    zf = zipfile.ZipFile(io.BytesIO(data))
    name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
    return zf, name, zf.read(name)


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return (x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            and x.storage_offset() == y.storage_offset() and x.requires_grad == y.requires_grad
            and bytes(x.untyped_storage()) == bytes(y.untyped_storage()))


def test_every_fixture_checkpoint_takes_the_fast_path_and_equals_torch_load_bitwise():
    assert len(ALL) >= 40 and any("families" in p.parts for p in ALL) and any("variants" in p.parts for p in ALL)
    for p in ALL:
        fast = ck.fast_policy_load(*_zip(p))  # raises _NotFast if it would fall back
        ref = torch.load(p, map_location="cpu", weights_only=True)
        assert list(fast[C.CKPT_POLICY]) == list(ref[C.CKPT_POLICY]), p
        for k, t in ref[C.CKPT_POLICY].items():
            assert _same(fast[C.CKPT_POLICY][k], t), (p, k)
        for k, t in ref[C.CKPT_GLOBAL_STEP].items():
            assert _same(fast[C.CKPT_GLOBAL_STEP][k], t), (p, k)
        assert list(fast) == list(ref), p
        a, b = ck.load_checkpoint(p), ck.load_checkpoint(p, fast=False)
        assert (a.global_step, a.top_keys, list(a.policy)) == (b.global_step, b.top_keys, list(b.policy))


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["policy", "optimizer"])
def test_a_malicious_pickle_is_never_run_and_is_refused(tmp_path, where):
    evil = _Evil(tmp_path / "PWNED")
    doc = {C.CKPT_POLICY: OrderedDict(w=torch.ones(2))}
    doc[C.CKPT_POLICY if where == "policy" else "Optimizer:value_optimizer"] = evil
    buf = io.BytesIO()
    torch.save(doc, buf)
    data = buf.getvalue()
    with pytest.raises(ck._NotFast, match="GLOBAL posix.system"):
        ck.fast_policy_load(*_zip(data))
    p = tmp_path / "evil.pt"
    p.write_bytes(data)
    with pytest.raises(CheckpointError, match="refused to load"):  # torch.load(weights_only=True)'s verdict
        ck.load_checkpoint(p)
    assert not (tmp_path / "PWNED").exists()


def test_what_the_fast_reader_does_not_know_goes_to_torch_load(tmp_path):
    # a Parameter (torch._utils._rebuild_parameter: in torch's allow-list, not in ours) loads as torch does
    buf = io.BytesIO()
    torch.save({C.CKPT_POLICY: OrderedDict(w=torch.nn.Parameter(torch.arange(4.0)))}, buf)
    with pytest.raises(ck._NotFast):
        ck.fast_policy_load(*_zip(buf.getvalue()))
    p = tmp_path / "param.pt"
    p.write_bytes(buf.getvalue())
    assert torch.equal(ck.load_checkpoint(p).policy["w"], torch.arange(4.0))
    # a storage record shorter than the pickle says: refused by the fast reader, torch.load decides
    src = ALL[0].read_bytes()
    zin = zipfile.ZipFile(io.BytesIO(src))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zo:
        for info in zin.infolist():
            b = zin.read(info)
            zo.writestr(info, b[:-4] if info.filename.endswith("/data/0") else b)
    with pytest.raises(ck._NotFast, match="storage record"):
        ck.fast_policy_load(*_zip(out.getvalue()))


class _Storage:
    """Pickled as torch.save writes a storage: a persistent id ``('storage', torch.FloatStorage, key, 'cpu', n)``."""


class _Crafted:
    """Pickled as torch.save writes a tensor (``_rebuild_tensor_v2`` over a persistent storage), then a BUILD
    with ``state``."""

    def __init__(self, state):
        self.state = state


class _CraftingPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, "0", "cpu", 1) if isinstance(obj, _Storage) else None

    def reducer_override(self, obj):
        if not isinstance(obj, _Crafted):
            return NotImplemented
        return (torch._utils._rebuild_tensor_v2, (_Storage(), 0, (1,), (1,), False, OrderedDict()), obj.state)


def test_a_pickle_cannot_give_the_readers_markers_state():
    """BUILD on a tensor reference (its storage, sizes) or on what find_class answers for a storage type
    (the dtype name the reader looks up on torch) would set fields the reader trusts: refused, so the
    weights-only torch.load decides."""
    buf = io.BytesIO()
    _CraftingPickler(buf, protocol=2).dump({C.CKPT_POLICY: OrderedDict(w=_Crafted((None, {"size": (1 << 40,)})))})
    ops = [op.name for op, _, _ in pickletools.genops(buf.getvalue())]
    assert b"_rebuild_tensor_v2" in buf.getvalue() and ops[ops.index("REDUCE", ops.index("BINPERSID")) + 1:].count("BUILD") == 1
    with pytest.raises(ck._NotFast, match="BUILD on a tensor or storage"):
        ck._PolicyUnpickler(io.BytesIO(buf.getvalue())).load()
    # GLOBAL torch.FloatStorage, then BUILD (None, {'dtype': 'load'}) on the marker find_class answers
    marker = b"\x80\x02ctorch\nFloatStorage\nN}X\x05\x00\x00\x00dtypeX\x04\x00\x00\x00loads\x86b."
    with pytest.raises(ck._NotFast, match="BUILD on a tensor or storage"):
        ck._PolicyUnpickler(io.BytesIO(marker)).load()
    assert ck._STORAGE_TYPES["FloatStorage"].dtype == "float32"


def test_any_failure_of_the_fast_reader_goes_to_torch_load(monkeypatch, tmp_path):
    """A bug or a case the fast reader does not foresee is never the verdict: torch.load gives it."""
    def broken(*a):
        raise KeyError("unforeseen")

    monkeypatch.setattr(ck, "_fast_policy_load", broken)
    with pytest.raises(ck._NotFast, match="KeyError"):
        ck.fast_policy_load(*_zip(ALL[0]))
    a, b = ck.load_checkpoint(ALL[0]), ck.load_checkpoint(ALL[0], fast=False)
    assert list(a.policy) == list(b.policy) and all(torch.equal(a.policy[k], b.policy[k]) for k in a.policy)
