"""One typed error taxonomy for huggy-convert.

Every error the tool raises on purpose derives from :class:`HuggyError`. The CLI turns
one into a single line ``huggy-convert: error: <file>: <reason>`` and the error's
``exit_code``: 2 for bad input, output, environment or usage, 1 for a verification that failed,
3 for an exception the tool did not expect (a bug; ``from_foreign`` names its type). ``verify OUT/``
adds 4: every check it ran passed, but not every check its conversion ran could be run again (a
source moved or changed; ``EXIT_INCOMPLETE``), so a script can tell a partial PASS from a full one.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_BAD_INPUT = 2
# 3: EXIT_INTERNAL (below)
EXIT_INCOMPLETE = 4  # verify OUT/: a partial PASS (checks not run, e.g. the checkpoint moved); 1 with --require-complete
EXIT_INTERRUPTED = 130  # Ctrl-C (the CLI, a batch's worker): 128 + SIGINT, as shells report it
MAX_PATH_CHARS = 160  # of the file named in the one line (a 255-byte name, a deep path)
MAX_MESSAGE_CHARS = 400  # of the reason: a message quoting the input never prints MBs


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class HuggyError(Exception):
    """Base class. ``path`` names the file the message is about, when there is one."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, path: Optional[Union[str, Path]] = None):
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)

    def one_line(self) -> str:
        text = _cap(display(self.message), MAX_MESSAGE_CHARS)
        path = None if self.path is None else _cap(display(self.path.replace("\n", "\\n").replace("\r", "\\r")),
                                                   MAX_PATH_CHARS)
        return f"{path}: {text}" if path else text

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.one_line()


class InputError(HuggyError):
    """The input cannot be used: missing, unreadable, or of the wrong kind."""


class CheckpointError(InputError):
    """A checkpoint file that is not a loadable ML-Agents checkpoint (corrupt, unsafe, wrong layout)."""


class SpecError(InputError):
    """The tensors do not describe a consistent policy (missing/unexpected key, wrong shape, bad values)."""


class UnsupportedError(InputError):
    """A policy family the tool does not support yet (the message says which)."""


class PolicyFileError(InputError):
    """A canonical safetensors policy file that cannot be read back."""


class ExportError(HuggyError):
    """An artifact could not be built (e.g. an opset outside 9-15)."""


class DeviceError(HuggyError):
    """A device or dtype that is not available here (e.g. npu without torch_npu)."""


class OutputError(HuggyError, OSError):
    """An output cannot be written: an unwritable, full or missing folder, a name too long, ... It is
    an ``OSError`` too (with the original ``errno``), so a library caller's ``except OSError`` holds."""


EXIT_INTERNAL = 3  # an exception the tool did not expect: a bug (exit 1 and 2 keep their meaning)
MAX_QUOTE = 200  # characters of a foreign message quoted in one line


def utf8_name(name: Union[str, bytes, Path]) -> str:
    """A file name as valid UTF-8 text: the bytes of a non-UTF-8 name (surrogate escapes) as ``\\xff``;
    a UTF-8 name is itself."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def display(text: object) -> str:
    """``text`` as one printable line: a non-UTF-8 file name (surrogate escapes) shown as ``\\xff``,
    whitespace (newlines included) collapsed."""
    s = utf8_name(text) if isinstance(text, (str, bytes, Path)) else str(text)
    return " ".join(s.encode("utf-8", "backslashreplace").decode("utf-8").split())


def from_os_error(exc: OSError, path: Optional[Union[str, Path]] = None, output: bool = True) -> HuggyError:
    """The one translation of an ``OSError`` (EACCES, EROFS, ENOSPC, ENAMETOOLONG, ENOTDIR, ELOOP, ...)
    into a typed error naming the path and the system's reason: an :class:`OutputError` for a write,
    an :class:`InputError` for a read (``output=False``)."""
    where = path if path is not None else (exc.filename if exc.filename is not None else None)
    reason = exc.strerror or str(exc) or type(exc).__name__
    verb = "cannot write" if output else "cannot read"
    err = (OutputError if output else InputError)(f"{verb}: {display(reason)[:MAX_QUOTE]}",
                                                  None if where is None else display(where))
    if output:
        err.errno, err.strerror = exc.errno, exc.strerror
    return err


def from_foreign(exc: BaseException, path: Optional[Union[str, Path]] = None, output: bool = False) -> HuggyError:
    """A failure from outside the tool as a typed error: ``OSError`` by :func:`from_os_error`,
    ``MemoryError`` as "too large"; anything else is an internal error (a bug), exit
    ``EXIT_INTERNAL``, named by its type."""
    if isinstance(exc, HuggyError):
        return exc
    if isinstance(exc, OSError):
        return from_os_error(exc, path, output=output)
    where = None if path is None else display(path)
    if isinstance(exc, MemoryError):
        return InputError("too large to process here (MemoryError)", where)
    err = InternalError(f"internal error: {type(exc).__name__}: {display(exc)[:MAX_QUOTE]} "
                        "(a bug in huggy-convert: please report it)", where)
    return err


def describe(exc: BaseException, limit: int = MAX_QUOTE) -> str:
    """A foreign exception inside a sentence of ours (a check that could not run, a file that does not
    read): ``<type>: <its message on one line, capped at limit characters>``."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def as_error(exc: BaseException, path: Optional[Union[str, Path]] = None) -> HuggyError:
    """Any exception as a typed error of the one taxonomy (``from_foreign``: the file a foreign error
    names, else ``path``)."""
    return from_foreign(exc, getattr(exc, "filename", None) or path)


def one_line(exc: BaseException, path: Optional[Union[str, Path]] = None) -> str:
    """Any exception as the one line of the one taxonomy (:func:`as_error`), without the
    ``huggy-convert: error:`` prefix (:func:`error_line` adds it)."""
    return as_error(exc, path).one_line()


def error_line(error: Union[HuggyError, str]) -> str:
    """The one line an error is shown as: ``huggy-convert: error: <file>: <reason>`` (a ``HuggyError``'s
    ``one_line()``, or a line already made, e.g. a worker's error record's)."""
    return f"huggy-convert: error: {error.one_line() if isinstance(error, HuggyError) else error}"


class InternalError(HuggyError):
    """An exception the tool did not expect (a bug): one line naming its type, exit 3."""

    exit_code = EXIT_INTERNAL
