"""Ctrl-C and SIGTERM end every command the same way: an exception that unwinds the stack.

Python raises KeyboardInterrupt on SIGINT only when it was not ignored at start (a command run
with `&` in a script starts with SIGINT ignored), and SIGTERM (CI cancellation, `timeout`,
container stop) kills the process without running any cleanup. lto installs one handler for
both, raising `Interrupted`, a KeyboardInterrupt: every `finally` runs, work folders are removed,
the previous artifact stays whole, and `optimize` writes its partial report.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# What the command is doing, for the one line printed when it is interrupted.
_activity: list[str] = []
# The signal that stopped the command: typer swallows KeyboardInterrupt into a bare exit code.
_received: list[Interrupted] = []


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread; exit code 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def how(self) -> str:
        return "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else signal.Signals(self.signum).name


def exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def describe(exc: BaseException) -> str:
    """'interrupted by Ctrl-C (SIGINT)' or 'terminated by SIGTERM'."""
    if isinstance(exc, Interrupted) and exc.signum != signal.SIGINT:
        return f"terminated by {exc.how}"
    return "interrupted by Ctrl-C (SIGINT)"


def _raise(signum: int, frame: FrameType | None) -> None:
    exc = Interrupted(signum)
    _received[:] = [exc]
    raise exc


def received() -> Interrupted | None:
    """The Interrupted raised in this process, if one was."""
    return _received[0] if _received else None


def install_handlers() -> None:
    """Called once by the `lto` entry point, in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise)


def set_activity(text: str) -> None:
    """Say what the command is doing now; the interruption message repeats it."""
    _activity[:] = [text]


def activity() -> str | None:
    return _activity[0] if _activity else None
