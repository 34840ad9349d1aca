"""Bounded file I/O: the one reader of input files (``read_input_file``: regular files within
``MAX_INPUT_BYTES``, checked before they are opened; a Git-LFS pointer named as such), zip records that fit
their file (``stored_zip``) and ``.npz`` files without pickles (``load_npz``); atomic writes
(``atomic_write_bytes``: a temporary whose name fits NAME_MAX, fsync, rename); the quoting of input in
messages (``clip``, ``quote``)."""
from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from .. import contract as C
from ..errors import CheckpointError, InputError, describe, from_os_error


# The size bound of any input file (a checkpoint, a policy, an ONNX, a golden file): Huggy's checkpoint
# is 13.5 MB with its optimizer state; 4 GiB is far beyond any ML-Agents actor, and bounds what is read.
MAX_INPUT_BYTES = 4 << 30
MAX_INPUT_QUOTE = 80  # characters of the input quoted in a message (errors.MAX_QUOTE: of a foreign message)


def clip(text: str, limit: int = MAX_INPUT_QUOTE) -> str:
    """``text`` capped at ``limit`` characters: a message quoting the input never prints MBs."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def quote(value, limit: int = MAX_INPUT_QUOTE) -> str:
    """``value``'s repr, capped (``clip``)."""
    return clip(repr(value), limit)


def _file_kind(mode: int) -> Optional[str]:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "special file"


def _check_regular(st: os.stat_result, p: Path, what: str, limit: int) -> None:
    kind = _file_kind(st.st_mode)
    if kind is not None:
        raise InputError(f"is a {kind}, not a {what} file (regular files only)", p)
    if st.st_size > limit:
        raise InputError(f"too large for a {what}: {st.st_size:,} bytes, over the {limit / 2 ** 30:g} GiB bound "
                         "on input files", p)


def check_regular(path, what: str = "checkpoint", limit: int = MAX_INPUT_BYTES) -> None:
    """``path`` (links followed) is a regular file of at most ``limit`` bytes (``InputError`` otherwise)."""
    p = Path(path)
    try:
        _check_regular(os.stat(p), p, what, limit)
    except FileNotFoundError:
        raise InputError("no such file", p) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror or type(exc).__name__})", p) from None


def read_input_file(path, what: str = "checkpoint", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: its type and size are checked
    with ``os.stat`` before it is opened, and again on the open descriptor (opened non-blocking, so a
    FIFO never hangs), so a directory, socket, FIFO, device or huge sparse file is refused unread.
    The one reader of every input file, so the one place a Git-LFS pointer left by a clone made
    without git-lfs is named as such (``lfs_pointer_message``) instead of "not a checkpoint"."""
    p = Path(path)
    check_regular(p, what, limit)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise InputError("no such file", p) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror or type(exc).__name__})", p) from None
    try:
        with os.fdopen(fd, "rb") as f:
            _check_regular(os.fstat(f.fileno()), p, what, limit)
            data = f.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror or type(exc).__name__})", p) from None
    if len(data) > limit:
        raise InputError(f"too large for a {what}: over the {limit / 2 ** 30:g} GiB bound on input files", p)
    if data.startswith(C.LFS_POINTER_MAGIC) and len(data) < C.LFS_POINTER_MAX_BYTES:
        raise InputError(lfs_pointer_message(data, p, what), p)
    return data


def _clone_of(p: Path) -> Optional[Path]:
    """The git clone ``p`` lies in: the nearest folder above it holding ``.git`` or ``.gitattributes``."""
    here = Path(os.path.abspath(p)).parent
    for d in (here, *here.parents):
        try:
            if (d / C.GIT_DIR).exists() or (d / C.GIT_ATTRIBUTES).is_file():
                return d if p.is_absolute() else Path(os.path.relpath(d))
        except OSError:
            return None
    return None


def lfs_pointer_message(data: bytes, p: Path, what: str) -> str:
    """What to say of a Git-LFS pointer text found where the ``what`` should be: a clone made without
    git-lfs (``mlagents-load-from-hf`` on a machine without it) leaves one for every LFS-tracked file."""
    size = None
    for line in data.splitlines()[1:]:
        key, _, value = line.partition(b" ")
        if key == C.LFS_SIZE_KEY and value.strip().isdigit():
            size = int(value)
    real = f"its {size:,} bytes were not downloaded" if size is not None else "the file itself was not downloaded"
    clone = _clone_of(p)
    where = f" in {clip(str(clone), 120)}" if clone is not None else " in its clone"
    return f"a Git LFS pointer, not the {what}: {real} (cloned without git-lfs?); run '{C.LFS_PULL}'{where}"


def stored_zip(data: bytes, p: Path, what: str = "torch checkpoint", error=CheckpointError) -> zipfile.ZipFile:
    """``data`` as a zip whose records fit the file: stored (torch and ``np.savez`` write no compressed
    entry), each no larger than the file and all together no larger than it, so reading them never
    takes more memory than the file's real size (``error`` otherwise)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error) as exc:
        raise error(f"not a readable {what} (damaged or truncated zip: {type(exc).__name__})", p) from None
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise error(f"not a readable {what} (zip entry {quote(info.filename)} is compressed; "
                        "only stored entries are read)", p)
        total += info.file_size
        if info.file_size > len(data) or total > len(data):
            raise error(f"not a readable {what} (zip entry {quote(info.filename)} claims "
                        f"{info.file_size:,} bytes, more than the {len(data):,}-byte file holds)", p)
    return zf


def load_npz(path, what: str, error=InputError, data: Optional[bytes] = None) -> Dict[str, "object"]:
    """The arrays of an ``.npz`` (a golden file, observations): a regular file within the size bound,
    stored records that fit it, loaded with ``allow_pickle=False`` (an object array is refused), only
    numbers and strings. Any failure is ``error`` naming the file. ``data``: the file's bytes, already
    read (``read_input_file``)."""
    p = Path(path)
    if data is None:
        data = read_input_file(p, what)
    zf = stored_zip(data, p, what, error)
    zf.close()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # numpy raises ValueError, OSError, EOFError, BadZipFile... for a bad file
        raise error(f"not a readable {what} ({describe(exc, 100)})", p) from None
    for k, a in arrays.items():
        if a.dtype.kind not in "biufU":
            raise error(f"not a readable {what} (array {quote(k, 40)} is {a.dtype}, not numbers)", p)
    return arrays


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


NAME_MAX = 255  # bytes of one file name (Linux, macOS, Windows)
TEMPORARY_SUFFIX = ".tmp"
_RANDOM = 8  # characters tempfile adds


def temporary_key(name: str) -> str:
    """What a temporary of ``name`` is called after (``.<key>.<random>.tmp``): the name itself, or,
    where that would pass NAME_MAX, a digest of it, so that a temporary fits beside any file name."""
    raw = os.fsencode(name)
    if len(raw) + len(TEMPORARY_SUFFIX) + _RANDOM + 2 <= NAME_MAX:
        return name
    return f"{hashlib.sha256(raw).hexdigest()[:40]}.long"


def _write_fd(f, data: bytes, fsync: bool) -> None:
    f.write(data)
    if fsync:
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` under ``.<name>.<random>.tmp`` (``temporary_key``) in the same folder, (fsync,)
    then rename; on any error the temporary is removed and an ``OSError`` becomes an ``OutputError``
    naming ``path`` (``errors.from_os_error``)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{temporary_key(path.name)}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
        try:
            os.chmod(tmp, 0o666 & ~_umask())
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "wb") as f:
            _write_fd(f, data, fsync)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise from_os_error(exc, path) from None
        raise
