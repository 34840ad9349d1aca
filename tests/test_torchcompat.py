"""torch's private APIs each have a public fallback that gives the same result: the same ``.pt2`` bytes,
the same forward bits, the same verdict on an archive (``huggy_convert.core.torchcompat``)."""
from __future__ import annotations

import inspect
import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from huggy_convert.core import torchcompat
from huggy_convert.converter import convert_checkpoint
from huggy_convert.exporters.pt2 import ProgramWriter, unsafe_reason
from huggy_convert.exporters.torch_module import build_module
from huggy_convert.runtime.feeds import make_probes

from conftest import HUGGY_RUN, ROOT, VARIANTS, step_checkpoints


def _policies(run):
    return [convert_checkpoint(p).policy for p in step_checkpoints(run)]


@pytest.fixture(scope="module")
def huggy_policies():
    return _policies(HUGGY_RUN)  # two checkpoints of one architecture: the second takes the split writer


def _save(policy) -> bytes:
    """``torch.export.save``'s archive for ``policy`` (the supported way)."""
    return ProgramWriter(fast=False).program_bytes(policy)


def test_pt2_fallback_gives_the_fast_writers_bytes(huggy_policies):
    first, second = huggy_policies
    fast = ProgramWriter(fast=True)
    fast_bytes = [fast.program_bytes(first), fast.program_bytes(second)]
    if torchcompat.available(torchcompat.PT2_WRITER):
        assert not fast.notes  # the split writer reproduced torch.export.save and is used
    with torchcompat.without_private(torchcompat.PT2_WRITER):
        assert torchcompat.fast_pt2() is None
        fallback = ProgramWriter(fast=True)
        fallback_bytes = [fallback.program_bytes(first), fallback.program_bytes(second)]
        assert any("torch.export.save" in n for n in fallback.notes)
    assert fast_bytes == fallback_bytes == [_save(first), _save(second)]
    assert fast_bytes[0] != fast_bytes[1]  # two policies, two archives: the bytes compared are the weights too


@pytest.mark.parametrize("run", ["small", "lstm"])
def test_no_private_api_gives_the_same_pt2(run):
    """Every fallback at once (module dicts read through attributes while torch.export traces, SiLU through
    F.silu, the archive through torch.export.save): the same ``.pt2``, byte for byte."""
    pol = _policies(VARIANTS / run)[-1]
    expected = _save(pol)
    with torchcompat.without_private():
        assert not any(torchcompat.available(n) for n in torchcompat.PRIVATE)
        assert ProgramWriter(fast=True).program_bytes(pol) == expected
        assert unsafe_reason(expected) is None


@pytest.mark.parametrize("run", ["huggy", "lstm", "small"])
def test_module_fallbacks_compute_the_same_bits(run, huggy_policies):
    pol = huggy_policies[-1] if run == "huggy" else _policies(VARIANTS / run)[-1]
    feed = make_probes(pol, rows=8, seed=3)

    def outputs(module):
        out = []
        with torch.no_grad():
            for rows in (slice(0, 1), slice(0, 8)):  # one row: the blocks' eager row forms; a batch: the flow
                xs = [torch.from_numpy(np.ascontiguousarray(feed[n][rows])) for n in module.input_names]
                out += [o.numpy().tobytes() for o in module(*xs)]
                out += [o.numpy().tobytes() for o in module.sample(*xs, seed=7)]
        return out

    def converted(module):  # a conversion keeps the normalizer float32, the weights follow
        module = module.half()
        assert set(module.pinned_dtypes().values()) <= {"float32"}
        assert {p.dtype for p in module.parameters()} == {torch.float16}
        return module

    private = outputs(build_module(pol)) + outputs(converted(build_module(pol)))
    with torchcompat.without_private(torchcompat.MODULE_DICTS, torchcompat.MODULE_APPLY, torchcompat.SILU_KERNEL):
        public = outputs(build_module(pol)) + outputs(converted(build_module(pol)))
    assert public == private


# what each conversion PolicyModule overrides is called with on a CPU-only host (the device moves to an
# accelerator need one: their override is checked to be there)
CPU_CALLS = {"to": ((torch.float16,), {}), "to_empty": ((), {"device": "cpu"}), "cpu": ((), {}),
             "type": ((torch.float64,), {}), "float": ((), {}), "double": ((), {}), "half": ((), {}),
             "bfloat16": ((), {}), "share_memory": ((), {})}


def _apply_methods():
    """nn.Module's public methods that go through ``self._apply``, read from this torch's source."""
    out = []
    for name, fn in vars(torch.nn.Module).items():
        if name.startswith("_") or not callable(fn):
            continue
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        if "self._apply(" in src:
            out.append(name)
    return out


def test_every_conversion_keeps_the_normalizer_float32_with_or_without_the_private_hook(huggy_policies):
    """Every public nn.Module method that goes through ``_apply`` in this torch is overridden by
    PolicyModule (torchcompat.MODULE_APPLY's fallback); on the CPU each gives the same module with the
    hook and without it: the normalizer float32 with its values, the weights in the same dtype."""
    from huggy_convert.exporters.torch_module import CONVERSIONS, PolicyModule

    found = _apply_methods()
    assert {"to", "half", "to_empty"} <= set(found) and set(found) <= set(CONVERSIONS), found
    assert all(name in vars(PolicyModule) for name in found), [n for n in found if n not in vars(PolicyModule)]
    pol = huggy_policies[-1]

    def converted(name):
        args, kwargs = CPU_CALLS[name]
        module = build_module(pol)
        module = getattr(module, name)(*args, **kwargs)
        assert set(module.pinned_dtypes().values()) == {"float32"}, name
        pinned = {n: getattr(module, n).numpy().tobytes() for n in module.pinned_dtypes()}
        return pinned, sorted({str(p.dtype) for p in module.parameters()}), module.compute_dtype

    for name in (n for n in found if n in CPU_CALLS):
        private = converted(name)
        with torchcompat.without_private(torchcompat.MODULE_APPLY):
            public = converted(name)
        assert public == private, name


def _archive(records: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in records.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_pt2_reader_fallback_gives_the_same_verdicts(huggy_policies):
    good = _save(huggy_policies[0])
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        records = {i.filename: z.read(i) for i in z.infolist()}
    root = next(iter(records)).split("/", 1)[0] + "/"
    extra = dict(records, **{root + "extra/payload.pkl": b"\x80\x02N."})
    cfg_name = root + "data/weights/model_weights_config.json"
    cfg = json.loads(records[cfg_name])
    fqn = next(iter(cfg["config"]))
    cfg["config"][fqn]["use_pickle"] = True
    pickled = dict(records, **{cfg_name: json.dumps(cfg).encode()})
    fmt = root + "archive_format"  # torch's reader requires it to say "pt2"
    assert records[fmt] == b"pt2"
    wrong_format = dict(records, **{fmt: b"pt1"})
    no_format = {k: v for k, v in records.items() if k != fmt}
    cases = {"good": good, "extra": _archive(extra), "pickled": _archive(pickled), "garbage": b"PK\x03\x04 not a zip",
             "wrong_format": _archive(wrong_format), "no_format": _archive(no_format)}
    private = {k: unsafe_reason(v) for k, v in cases.items()}
    with torchcompat.without_private(torchcompat.PT2_READER):
        public = {k: unsafe_reason(v) for k, v in cases.items()}
    assert private["good"] is None and public["good"] is None
    assert "extra/payload.pkl" in private["extra"] and public["extra"] == private["extra"]
    assert "pickle" in private["pickled"] and public["pickled"] == private["pickled"]
    for bad in ("garbage", "wrong_format", "no_format"):  # refused both ways (the reader's message may differ)
        assert private[bad] and public[bad], bad
    assert "archive format" in private["wrong_format"].lower() and "archive format" in public["wrong_format"].lower()


def test_preload_imports_dynamo_only_where_it_is_used():
    code = ("import sys; from huggy_convert.core import torchcompat as T\n"
            "with T.without_private(T.DYNAMO):\n    T.preload_export()\n"
            "print('torch._dynamo' in sys.modules)\n"
            "T.preload_export(); print('torch._dynamo' in sys.modules, T.available(T.DYNAMO))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = out.split("\n")
    assert lines[0] == "False"  # the fallback imports nothing ahead of time
    assert lines[1] in ("True True", "False False")


def test_unknown_private_name_is_refused():
    with pytest.raises(ValueError, match="unknown private API"):
        with torchcompat.without_private("_no_such_thing"):
            pass
