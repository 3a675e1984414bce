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
    ensure_signal_stack()  # before any native library saves the one it finds (see below)


def set_activity(text: str) -> None:
    """Say what the command is doing now; the interruption message repeats it."""
    _activity[:] = [text]


def activity() -> str | None:
    return _activity[0] if _activity else None


# --- the signal stack Python's handlers run on ---------------------------------------------------
#
# CPython installs its signal handlers with SA_ONSTACK: they run on the thread's alternate signal
# stack when it has one. OpenVINO's CPU plugin gives the thread that creates it an alternate
# stack of its own (an anonymous mapping) and, when released, puts back the one it found. Released
# out of order (plugin A, then B, A released, then B), the last one puts back A's stack, which is
# unmapped by then: the next Ctrl-C or SIGTERM makes the kernel raise SIGSEGV instead of running
# the handler (measured 2026-12-06, OpenVINO 2026.4: two Cores compiled and released in that order,
# then SIGINT: exit 139). lto points the main thread's signal stack back at one of its own, mapped
# for the process's life, after any work that may have loaded or released a plugin.

_SIGNAL_STACK_BYTES = 256 * 1024
_signal_stack: list[object] = []  # the mapping, kept alive with the process


def ensure_signal_stack() -> bool:
    """Point the calling thread's alternate signal stack at lto's own when it points elsewhere
    (Linux; only the main thread runs Python's handlers' C part for the signals lto handles).
    Returns whether it had to be reset."""
    import sys

    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return False
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)

    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]

    if not _signal_stack:
        area = mmap.mmap(-1, _SIGNAL_STACK_BYTES)
        _signal_stack[:] = [area, ctypes.addressof(ctypes.c_char.from_buffer(area))]
    ours = int(_signal_stack[1])  # type: ignore[call-overload]
    current = StackT()
    if libc.sigaltstack(None, ctypes.byref(current)) != 0:
        return False
    if current.ss_sp == ours and current.ss_size == _SIGNAL_STACK_BYTES:
        return False
    wanted = StackT(ours, 0, _SIGNAL_STACK_BYTES)
    return libc.sigaltstack(ctypes.byref(wanted), None) == 0
