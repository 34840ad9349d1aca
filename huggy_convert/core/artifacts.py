"""The files of one converted policy: ``<dir>/<stem>.<suffix>`` for every artifact kind.

``ArtifactSet`` is the one place that knows the suffixes, writes a file atomically (temporary
name in the same folder, then rename) and hashes what it wrote or reads. The kinds that are built
from a policy are in ``exporters.KINDS``; the report and the golden file are written after the
verification of the others.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List

from ..contract import targets as _targets
from ..errors import OutputError, from_os_error
from .files import NAME_MAX, TEMPORARY_SUFFIX, atomic_write_bytes, temporary_key

SAFETENSORS, ONNX, PT2, REPORT, GOLDEN = "safetensors", "onnx", "pt2", "report", "golden"
SUFFIXES: Dict[str, str] = {SAFETENSORS: ".safetensors", ONNX: ".onnx", PT2: ".pt2", REPORT: ".verify.json",
                            GOLDEN: ".golden.npz"}
BUILT = (SAFETENSORS, ONNX, PT2)  # made from the policy; REPORT and GOLDEN come from the verification
# the deploy targets' files (issue 27: OpenVINO's .xml + .bin, LiteRT's .tflite, ExecuTorch's .pte), written
# when asked (``--targets``): target -> {kind: suffix}
TARGET_KINDS: Dict[str, Dict[str, str]] = {t: dict(k) for t, k in _targets.FILE_KINDS.items()}
for _kinds in TARGET_KINDS.values():
    SUFFIXES.update(_kinds)
TARGET_OF: Dict[str, str] = {k: t for t, ks in TARGET_KINDS.items() for k in ks}  # a target file's kind -> target


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_TEMPORARY = re.compile(r"^\.(?P<key>.+)\.[A-Za-z0-9_]+\.tmp$")  # atomic_write_bytes' temporary names


def clean_stale_temporaries(out: Path, names: Iterable[str]) -> List[Path]:
    """Remove the ``.<name>.<random>.tmp`` files a killed run left in ``out`` for the files it writes
    (``names``; ``temporary_key`` for long ones); any other ``.tmp`` is the user's and stays."""
    removed = []
    keys = {temporary_key(n) for n in names}
    try:
        found = sorted(Path(out).glob(f".*{TEMPORARY_SUFFIX}"))
    except OSError:
        return removed
    for p in found:
        m = _TEMPORARY.match(p.name)
        if m and m.group("key") in keys and p.is_file() and not p.is_symlink():
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def check_out(folder: Path) -> Path:
    """An output folder that can be looked at: not a dangling symlink, no symlink loop (which
    ``Path.resolve`` reports as a ``RuntimeError``)."""
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise OutputError(f"cannot write: a symbolic link to a missing folder ({os.readlink(folder)[:100]})", folder)
    try:
        folder.resolve()
    except RuntimeError:
        raise OutputError(f"cannot write: {os.strerror(errno.ELOOP)}", folder) from None
    except OSError as exc:
        raise from_os_error(exc, folder) from None
    return folder


def make_dirs(folder: Path) -> None:
    """``mkdir -p folder`` (an ``OSError`` becomes an ``OutputError`` naming it). A folder made for
    a conversion whose write then failed stays, empty."""
    folder = check_out(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, folder) from None


@contextlib.contextmanager
def locked(folder: Path, stem: str):
    """An exclusive ``fcntl.flock`` on ``folder/.<stem>.lock`` while a set is written and verified:
    a second conversion of the same stem into the same folder waits for the first. The lock file
    is removed by its holder before the lock is released; a waiter that then finds another file
    (or none) at the name retries, so two holders never overlap. (A kill leaves the file: the next
    conversion of that stem takes it and removes it.)"""
    import fcntl

    path = Path(folder) / f".{temporary_key(stem)}.lock"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise from_os_error(exc, folder) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:  # a file system without locks (some network mounts): go on unlocked
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
            st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                break
        except FileNotFoundError:
            pass
        except OSError as exc:
            os.close(fd)
            raise from_os_error(exc, folder) from None
        os.close(fd)
    try:
        yield path
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


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

    def write(self, kind: str, data: bytes, fsync: bool = False) -> Dict[str, str]:
        """Write ``data`` as this kind's file (atomically); returns ``{path, file, sha256}``.
        No per-file fsync by default: a torn file after a power cut is found by its sha256."""
        p = self.path(kind)
        atomic_write_bytes(p, data, fsync=fsync)
        return {"path": str(p), "file": p.name, "sha256": sha256_bytes(data)}

    def names(self) -> List[str]:
        return [self.name(kind) for kind in SUFFIXES]

    def check_names(self) -> None:
        """Every file name of the set fits NAME_MAX (else nothing is written)."""
        longest = max(self.names(), key=lambda n: len(os.fsencode(n)))
        if len(os.fsencode(longest)) > NAME_MAX:
            raise OutputError(f"file name too long: {longest[:40]}… is {len(os.fsencode(longest))} bytes, the "
                              f"limit is {NAME_MAX} (rename the checkpoint)", self.dir)

    @contextlib.contextmanager
    def transaction(self):
        """Files written through it (``tx.write_all``) stand or fall together: on any error inside the
        block (disk full, a kill signal turned exception, a bug) each one is rolled back: a file it
        replaced is put back (a hard link kept meanwhile, a ``.<name>.<random>.tmp``), a new one
        removed; an ``OSError`` becomes an ``OutputError`` naming the folder."""
        tx = _Transaction(self)
        try:
            yield tx
        except BaseException as exc:
            tx.rollback()
            if isinstance(exc, OSError) and not isinstance(exc, OutputError):
                raise from_os_error(exc, self.dir) from None
            raise
        try:
            tx.commit()
        except BaseException:  # interrupted while dropping the backups: the set stands, drop the rest
            tx.commit()
            raise

    @staticmethod
    def stems(folder: Path) -> list:
        """The stems of every ``<stem>.safetensors`` policy in ``folder``, sorted."""
        suffix = SUFFIXES[SAFETENSORS]
        return sorted(p.name[:-len(suffix)] for p in Path(folder).glob(f"*{suffix}"))


def _identity(p: Path):
    """What tells the file at ``p`` from another one put there since (``None``: nothing there)."""
    try:
        st = os.stat(p, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class _Transaction:
    """The files of one ``ArtifactSet.transaction``: the kinds it writes (each recorded before its
    write starts, with the identity of the file it replaces), and the hard links of those files.

    The rollback goes by what is on disk, not by how far a write got: a ``KeyboardInterrupt`` can
    come after a rename and before the write returns, or inside ``mkstemp`` once the temporary
    exists but before its name is known. So each recorded kind is put back (its hard link) or its
    file removed unless it is still the one that was there, and then every temporary of the set's
    names goes (``clean_stale_temporaries``; safe: the caller holds ``locked(dir, stem)``)."""

    def __init__(self, arts: ArtifactSet):
        self.arts = arts
        self.backups: Dict[str, Path] = {}
        self.written: List[str] = []  # in the order their writes started
        self.before: Dict[str, object] = {}  # kind -> _identity of the file it replaces (no hard link)

    def write_all(self, blobs: Dict[str, bytes], fsync: bool = False) -> Dict[str, Dict[str, str]]:
        for kind in blobs:
            p = self.arts.path(kind)
            if kind not in self.backups and kind not in self.written and p.is_file() and not p.is_symlink():
                b = p.with_name(f".{temporary_key(p.name)}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
                try:
                    os.link(p, b)
                    self.backups[kind] = b
                except OSError:  # no hard links here: that file cannot be put back
                    pass
        done = {}
        for kind, data in blobs.items():
            if kind not in self.written:
                self.before[kind] = _identity(self.arts.path(kind))
                self.written.append(kind)
            done[kind] = self.arts.write(kind, data, fsync=fsync)
        return done

    def rollback(self) -> None:
        for kind in self.written:
            p = self.arts.path(kind)
            with contextlib.suppress(OSError):
                if kind in self.backups:
                    os.replace(self.backups.pop(kind), p)
                elif self.before.get(kind) is None or _identity(p) != self.before[kind]:
                    os.unlink(p)  # ours (or nothing yet)
        self.commit()
        with contextlib.suppress(OSError):
            clean_stale_temporaries(self.arts.dir, self.arts.names())

    def commit(self) -> None:
        for b in self.backups.values():
            with contextlib.suppress(OSError):
                os.unlink(b)
        self.backups.clear()
