"""Errors that reach the user as one line and an exit code, never a traceback."""

from __future__ import annotations

import re

# A line of a native library's error that only says where it was raised (OpenVINO writes one per
# layer it passed through before the cause: "Exception from src/inference/src/cpp/core.cpp:84:").
_LOCATION_LINE = re.compile(
    r"^(Exception from |Check '.*' failed at )?\S+\.(c|cc|cpp|cxx|h|hpp)(:\d+)*:?\s*$"
)


class LtoError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(LtoError):
    """Bad flags, bad files or bad inputs given on the command line: exit code 2."""

    exit_code = 2


class ModelError(UsageError):
    """The model file is missing, not ONNX, corrupt, or uses something we cannot run."""


class InputError(UsageError):
    """Input specification problems: shapes, dtypes, names, data files."""


class BackendUnavailable(LtoError):
    """A runtime (TVM, TensorRT, CUDA) is not installed or has no device here."""


def message_line(exc: BaseException) -> str:
    """The first line of an exception's text that says what went wrong (native libraries write
    pages, and OpenVINO starts with lines that only say where), or its type's name when it has
    no text."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    meaningful = [ln for ln in lines if not _LOCATION_LINE.match(ln)] or lines
    if not meaningful:
        return type(exc).__name__
    # A line that ends in a colon introduces the cause on the next one ("... failed with
    # GeneralFailure:" / "Conversion is failed for: Conv-15 ..."): keep them together.
    line, rest = meaningful[0], meaningful[1:]
    while line.endswith(":") and rest and len(line) < 300:
        line, rest = f"{line} {rest[0]}", rest[1:]
    return line


def full_text(exc: BaseException, limit: int = 4000) -> str:
    """The exception's whole text (for report.json), cut at `limit` characters."""
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(exc: BaseException) -> str:
    """One line for a report or a log: an LtoError's message (with its hint), else the
    exception's type and the first line of its text."""
    if isinstance(exc, LtoError):
        return exc.one_line()
    line = message_line(exc)
    return f"{type(exc).__name__}: {line}" if line != type(exc).__name__ else line
