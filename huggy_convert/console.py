"""The console: what every command prints goes through here, so that output never decides the exit code.

A command's verdict is decided (and its files written) before its lines are printed; printing them
must not turn a PASS into ``internal error: UnicodeEncodeError`` (a ``cp1252`` pipe on Windows,
``PYTHONIOENCODING=ascii``) nor a closed pipe or a full disk into another exit code. ``guard()``,
entered once around the click group (``cli.DefaultGroup.main``), puts ``ConsoleStream`` in front of
``sys.stdout`` and ``sys.stderr`` for the command's duration, so every ``click.echo`` (any command,
any line added later) gets it without a word in the command:

- a character the stream's encoding cannot take is written as its ASCII fallback (``FALLBACKS``: the
  tree's ``├─ └─ │``, the marks ``✓ ✗``, ``→ … — ±``), anything else (a path in another script, a
  lone surrogate from a file name that is not UTF-8) as a backslash escape (``\\u00e9``), through the
  codec error handler ``ERRORS``, registered once; characters the stream can encode are written as
  they are (UTF-8 output is unchanged);
- an ``OSError`` on writing or flushing (``EPIPE`` of ``| head``, ``ENOSPC`` of ``> /dev/full``) stops
  that stream's output: the rest is dropped, the file descriptor is pointed at the null device so that
  the interpreter's last flush cannot fail either (it would exit 120), and one warning line on stderr
  says so (none for a closed pipe, whose reader has gone).
"""
from __future__ import annotations

import codecs
import contextlib
import errno
import os
import sys
from typing import Iterator, Optional
from .errors import from_foreign

ERRORS = "huggy-console"  # the codec error handler's name (codecs.register_error)

# the non-ASCII characters the tool prints, as ASCII (each fallback is what a reader expects in a log)
FALLBACKS = {
    "✓": "ok", "✗": "FAIL", "├": "|", "└": "`", "│": "|", "─": "-", "┌": ",", "┐": ".", "┘": "'", "┤": "|",
    "→": "->", "←": "<-", "⇒": "=>", "↔": "<->", "…": "...", "—": "--", "–": "-", "›": ">", "‹": "<", "·": ".",
    "•": "*", "±": "+-", "×": "x", "÷": "/", "≤": "<=", "≥": ">=", "≈": "~", "≠": "!=", "∞": "inf", "−": "-",
    "²": "^2", "³": "^3", "µ": "u", "μ": "u", "σ": "sigma", "Δ": "delta", "°": "deg", "‖": "||",
    "“": '"', "”": '"', "‘": "'", "’": "'", "«": "<<", "»": ">>", "\u00a0": " ",
}


def _fallback(exc: UnicodeError):
    """Codec error handler: each character the encoding cannot take -> its ASCII fallback, else a
    backslash escape (what ``backslashreplace`` writes)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out = []
    for ch in exc.object[exc.start:exc.end]:
        rep = FALLBACKS.get(ch)
        if rep is None:
            n = ord(ch)
            rep = f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"
        out.append(rep)
    return "".join(out), exc.end


try:
    codecs.lookup_error(ERRORS)
except LookupError:
    codecs.register_error(ERRORS, _fallback)


def printable(text: str, encoding: Optional[str]) -> str:
    """``text`` as it reaches a stream of ``encoding`` (None or unknown: unchanged)."""
    try:
        return text.encode(encoding or "utf-8", ERRORS).decode(encoding or "utf-8")
    except LookupError:
        return text


class ConsoleStream:
    """A text stream in front of ``sys.stdout`` / ``sys.stderr``: writes with the fallbacks above and
    never raises ``OSError``; everything else is the stream's own (``isatty``, ``fileno``,
    ``encoding``). It has no ``buffer``: bytes written around it would skip the fallbacks (click, given
    a stream with an ASCII encoding, otherwise writes UTF-8 to its buffer)."""

    def __init__(self, stream, name: str):
        self._stream = stream
        self._name = name
        self.lost: Optional[OSError] = None
        try:
            stream.reconfigure(errors=ERRORS)  # io.TextIOWrapper: the encoder itself falls back
            self._encode = None
        except (AttributeError, ValueError, OSError):
            self._encode = getattr(stream, "encoding", None)  # any other text stream: fall back before writing

    def write(self, text):
        if isinstance(text, (bytes, bytearray)) and text:  # click.echo(b"..."), e.g. its shell completion: UTF-8
            text = bytes(text).decode("utf-8", "replace")
        if not isinstance(text, str):  # b"": the stream's own TypeError (click probes for a binary stream)
            return self._stream.write(text)
        if self.lost is not None:
            return len(text)
        if _STEP["shown"] and text:
            step_clear()
        if self._encode:
            text = printable(text, self._encode)
        try:
            return self._stream.write(text)
        except OSError as e:
            self._lose(e)
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.lost is not None:
            return
        try:
            self._stream.flush()
        except OSError as e:
            self._lose(e)
        except ValueError:  # closed
            pass

    def _lose(self, e: OSError) -> None:
        self.lost = e
        with contextlib.suppress(Exception):  # what is still buffered goes nowhere, the exit's flush included
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)

    @property
    def errors(self):
        return getattr(self._stream, "errors", None)

    def __getattr__(self, name):
        if name == "buffer":  # deliberately absent (see the class docstring)
            raise AttributeError(name)
        return getattr(self._stream, name)


def _isatty(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as ``ConsoleStream`` for the duration (the originals back
    after, their encoder's error handler the fallbacks'); at the end, one warning line on stderr for
    a stream whose output was lost (not for a closed pipe)."""
    saved = sys.stdout, sys.stderr
    wrapped = []
    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if sys.platform == "win32" and _isatty(s):  # a Windows console: Unicode already (PEP 528; click writes
            continue                                 # it through WriteConsoleW, which needs the stream's buffer)
        if s is not None and not isinstance(s, ConsoleStream):
            cs = ConsoleStream(s, name)
            setattr(sys, name, cs)
            wrapped.append(cs)
    try:
        yield
    finally:
        step_clear()
        for cs in wrapped:
            cs.flush()
        lost = [cs for cs in wrapped if cs.lost is not None and cs.lost.errno not in (errno.EPIPE, errno.ECONNRESET)]
        err = sys.stderr
        for cs in lost:
            if isinstance(err, ConsoleStream) and err.lost is None:
                err.write(f"huggy-convert: warning: {cs._name}: output lost: {os.strerror(cs.lost.errno or 0)}\n")
                err.flush()
        sys.stdout, sys.stderr = saved


# the step line a terminal shows while a longer step runs (``step``): its stream, and whether it is shown
_STEP = {"shown": False, "stream": None}
ERASE = "\r\033[K"  # back to the line's start, the line erased


def step(text: str) -> None:
    """On a terminal (stderr a tty), one transient line on stderr naming the step that runs now
    (``huggy-convert: converting X.pt ...``), replaced by the next step and erased by the next output
    on either stream; without a terminal, nothing (a log gets the result, not the steps)."""
    err = sys.stderr
    if not _isatty(err):
        return
    raw = err._stream if isinstance(err, ConsoleStream) else err
    step_clear()
    try:
        raw.write(printable(f"huggy-convert: {text} ...", getattr(raw, "encoding", None)))
        raw.flush()
    except (OSError, ValueError):
        return
    _STEP["shown"], _STEP["stream"] = True, raw


def step_clear() -> None:
    """Erase the step line a terminal shows, if any."""
    raw, _STEP["shown"], _STEP["stream"] = _STEP["stream"], False, None
    if raw is not None:
        with contextlib.suppress(OSError, ValueError):
            raw.write(ERASE)
            raw.flush()


def show_verdict(show, code: int) -> int:
    """``show()`` (print a result whose files are written and whose verdict is decided), then ``code``:
    a failure while printing (a bug in a renderer, a file the display reads gone) is one line on stderr,
    never another exit code, so the files on disk and the exit code say the same thing."""
    try:
        show()
    except Exception as e:  # noqa: BLE001 - the verdict stands; the display is what failed

        sys.stdout.flush()
        sys.stderr.write(f"huggy-convert: warning: the result could not be printed in full: "
                         f"{from_foreign(e).one_line()}; exit code {code} is the verdict's\n")
        sys.stderr.flush()
    return code
