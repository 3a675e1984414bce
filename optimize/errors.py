"""Errors that reach the user as one line and an exit code, never a traceback."""

from __future__ import annotations


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
    """The first non-empty line of an exception's text (native libraries write pages), or its
    type's name when it has no text."""
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


def first_line(exc: BaseException) -> str:
    """One line for a report or a log: an LtoError's message (with its hint), else the
    exception's type and the first line of its text."""
    if isinstance(exc, LtoError):
        return exc.one_line()
    line = message_line(exc)
    return f"{type(exc).__name__}: {line}" if line != type(exc).__name__ else line
