"""Each file a conversion or a verification reads is read once: an ONNX source that is its own reference,
and ``verify OUT/``'s files (check 3's golden file and check 4's ``.pt2`` are the bytes check 6 vouches
for). The small variant ML-Agents wrote (fixtures/variants/small)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from conftest import VARIANTS, step_checkpoints

import huggy_convert.converter.reference as reference_mod
import huggy_convert.core.files as files_mod
import huggy_convert.verify.engine as engine_mod

SMALL = step_checkpoints(VARIANTS / "small")[-1]


def _counting(monkeypatch, *modules):
    """Counts, by file name, every read through ``read_input_file`` (as each of ``modules`` binds it) and
    ``Path.read_bytes``."""
    reads = Counter()
    real = files_mod.read_input_file
    real_bytes = Path.read_bytes

    def read_input_file(path, *a, **k):
        reads[Path(path).name] += 1
        return real(path, *a, **k)

    def read_bytes(self):
        reads[self.name] += 1
        return real_bytes(self)

    for m in modules:
        monkeypatch.setattr(m, "read_input_file", read_input_file)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return reads


def test_an_onnx_source_that_is_its_own_reference_is_read_once(tmp_path, monkeypatch):
    from huggy_convert.pipeline import ConvertOptions, convert_one

    onnx_src = SMALL.with_suffix(".onnx")
    reads = _counting(monkeypatch, reference_mod, files_mod)
    res = convert_one(onnx_src, tmp_path / "out", ConvertOptions(verify=False, program=False))
    assert reads[onnx_src.name] == 1, reads
    assert res.reference == onnx_src and res.conversion.checkpoint.recovered is not None
    assert res.conversion.policy.metadata and res.atc() is not None and res.atc()["opset"]


def test_verify_out_reads_each_file_once(tmp_path, monkeypatch):
    from huggy_convert.batch.reverify import verify_dir
    from huggy_convert.pipeline import convert_one
    from huggy_convert.verify import VerifyOptions

    out = tmp_path / "out"
    src = tmp_path / "src"
    src.mkdir()
    ck = src / SMALL.name
    ck.write_bytes(SMALL.read_bytes())  # no official ONNX: check 3 reads the golden file
    assert convert_one(ck, out).report.ok
    reads = _counting(monkeypatch, engine_mod, files_mod)
    (rep,), warnings = verify_dir(out, options=VerifyOptions(dtypes=("float32",)))
    assert warnings == []
    assert rep.ok, rep.render()
    assert "golden" in rep.check("outputs").title or "golden" in rep.render()
    for suffix in (".safetensors", ".onnx", ".pt2", ".golden.npz"):
        assert reads[SMALL.stem + suffix] == 1, (suffix, reads)
