"""The files of one converted policy: ``<dir>/<stem>.<suffix>`` for every artifact kind.

``ArtifactSet`` is the one place that knows the suffixes, writes a file atomically (temporary
name in the same folder, then rename) and hashes what it wrote or reads. The kinds that are built
from a policy are in ``exporters.KINDS``; the report and the golden file are written after the
verification of the others.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from .converter.policy_file import atomic_write_bytes

SAFETENSORS, ONNX, PT2, REPORT, GOLDEN = "safetensors", "onnx", "pt2", "report", "golden"
SUFFIXES: Dict[str, str] = {SAFETENSORS: ".safetensors", ONNX: ".onnx", PT2: ".pt2", REPORT: ".verify.json",
                            GOLDEN: ".golden.npz"}
BUILT = (SAFETENSORS, ONNX, PT2)  # made from the policy; REPORT and GOLDEN come from the verification


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ArtifactSet:
    """``dir/stem.*``: paths, atomic writes and hashes of one policy's files."""

    dir: Path
    stem: str

    def __post_init__(self):
        object.__setattr__(self, "dir", Path(self.dir))

    def path(self, kind: str) -> Path:
        return self.dir / f"{self.stem}{SUFFIXES[kind]}"

    def name(self, kind: str) -> str:
        return f"{self.stem}{SUFFIXES[kind]}"

    def exists(self, kind: str) -> bool:
        return self.path(kind).is_file()

    def read(self, kind: str) -> bytes:
        return self.path(kind).read_bytes()

    def sha256(self, kind: str) -> Optional[str]:
        try:
            return sha256_bytes(self.read(kind))
        except OSError:
            return None

    def write(self, kind: str, data: bytes, fsync: bool = False) -> Dict[str, str]:
        """Write ``data`` as this kind's file (atomically); returns ``{path, file, sha256}``.
        No per-file fsync by default: a torn file after a power cut is found by its sha256."""
        p = self.path(kind)
        atomic_write_bytes(p, data, fsync=fsync)
        return {"path": str(p), "file": p.name, "sha256": sha256_bytes(data)}

    def present(self) -> Iterator[Tuple[str, Path]]:
        for kind in SUFFIXES:
            if self.exists(kind):
                yield kind, self.path(kind)

    @staticmethod
    def stems(folder: Path) -> list:
        """The stems of every ``<stem>.safetensors`` policy in ``folder``, sorted."""
        suffix = SUFFIXES[SAFETENSORS]
        return sorted(p.name[:-len(suffix)] for p in Path(folder).glob(f"*{suffix}"))
