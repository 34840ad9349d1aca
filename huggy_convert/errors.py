"""One typed error taxonomy for huggy-convert.

Every error the tool raises on purpose derives from :class:`HuggyError`. The CLI turns
one into a single line ``huggy-convert: error: <file>: <reason>`` and the error's
``exit_code``: 2 for bad input or usage, 1 for a verification that failed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_BAD_INPUT = 2
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
        text = _cap(" ".join(self.message.split()), MAX_MESSAGE_CHARS)
        path = None if self.path is None else _cap(self.path.replace("\n", "\\n").replace("\r", "\\r"), MAX_PATH_CHARS)
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


class VerificationError(HuggyError):
    """One or more verification checks failed."""

    exit_code = EXIT_VERIFY_FAILED
