"""Child processes: start one, hear what it says, rebuild its errors, end it or its whole group.

lto runs work in child processes for three reasons: a pipeline stage that spends minutes in
native code which mishandles signals (optimize.pipeline.isolation), a benchmark repetition that
must not share a process with the others (optimize.bench.repeat), and a backend whose thread
pool must not share a process with another runtime's (optimize.runtimes.worker). This module
is what they share; each keeps only what is its own.

Start: a fresh interpreter running `python -c`, never a fork (the parent may hold ONNX Runtime
thread pools and locks, which a fork copies half-made) and not multiprocessing's spawn (it
re-imports the caller's __main__). The child gets its end of a socket pair by descriptor and
reads from it the parent's sys.path, then the function to run and its arguments (pickled). It
ignores SIGINT: the parent owns Ctrl-C and ends the child itself. With `own_group` the child
leads a session of its own, so that the terminal's signals never reach it or the workers it
starts, and `end` reaches them all with one killpg.

Talk: every message is a (kind, value) pair. While it works the child says `progress`, `log`
or `status`; it ends with one `result` (what the function returned) or one `error` (what it
raised, as an ErrorRecord). A long-lived child (a backend worker) answers each request the
same way, with `result` or `error`, over `Child.connection` directly.

Errors: an exception crosses as one ErrorRecord of text (so nothing from the child's libraries
has to unpickle here) and is raised in the parent as the same optimize.errors class, message
and hint; an exception that is not one of lto's becomes a ChildFailed naming its type.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, NamedTuple

from optimize import errors
from optimize.errors import LtoError, message_line

# The message kinds.
PROGRESS = "progress"
LOG = "log"
WARN = "warn"  # a warning for the user's report, apart from the log
STATUS = "status"
RESULT = "result"
ERROR = "error"

Message = tuple[str, Any]

# How often a parent waiting for a message checks that the child still lives: a child whose
# channel is also held open by its own workers never shows end-of-file when it dies.
POLL_S = 0.2
# How long a SIGTERMed child (or group) has to end before it is SIGKILLed.
TERM_GRACE_S = 5.0
# The longest stderr line quoted in an error.
_TAIL_CHARS = 300
# Where optimize/ lives, so that the child finds this module before it has the parent's sys.path.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class ChildFailed(LtoError):
    """A child process raised an exception that is not one of lto's, or died; the message says
    which. `type_name` is the original exception's type, `where` the file and line it came from."""

    def __init__(
        self, message: str, hint: str | None = None, *, type_name: str = "", where: str = ""
    ) -> None:
        super().__init__(message, hint)
        self.type_name = type_name
        self.where = where


def _nearest_lto_class(cls: type) -> str:
    """The name of the optimize.errors class `cls` is or derives from ("" when none)."""
    for base in cls.__mro__:
        if base.__module__ == errors.__name__ and issubclass(base, LtoError):
            return base.__name__
    return ""


class ErrorRecord(NamedTuple):
    """An exception as it crosses from a child to its parent: text only."""

    type_name: str  # the exception's own type
    lto_class: str  # the optimize.errors class it is or derives from, "" when it is not lto's
    message: str  # an LtoError's message, else the first line of the exception's text
    hint: str | None
    where: str  # "file.py:line" where it was raised, "" when unknown

    @classmethod
    def of(cls, exc: BaseException) -> ErrorRecord:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        if isinstance(exc, LtoError):
            return cls(type(exc).__name__, _nearest_lto_class(type(exc)), exc.message, exc.hint, where)
        # Native libraries write pages: one line crosses (nothing when the exception has no text).
        message = message_line(exc) if str(exc).strip() else ""
        return cls(type(exc).__name__, "", message, None, where)

    def rebuild(
        self,
        what: str = "a child process",
        failure: type[ChildFailed] = ChildFailed,
        known: Sequence[type[BaseException]] = (),
    ) -> BaseException:
        """The exception to raise in the parent: one of `known` when its type is named so (built
        from the message alone), else the optimize.errors class with the same message and hint,
        else `failure` saying that `what` failed and naming the original type. Each carries
        `where`, for reports that say where a failure came from."""
        error: BaseException
        same_type = next((cls for cls in known if cls.__name__ == self.type_name), None)
        lto_class = getattr(errors, self.lto_class, None) if self.lto_class else None
        if same_type is not None and issubclass(same_type, LtoError):
            error = same_type(self.message, self.hint)
        elif same_type is not None:
            error = same_type(self.message) if self.message else same_type()
        elif isinstance(lto_class, type) and issubclass(lto_class, LtoError):
            error = lto_class(self.message, self.hint)
        else:
            said = f"{self.type_name}: {self.message}" if self.message else self.type_name
            return failure(f"{what} failed: {said}", self.hint, type_name=self.type_name, where=self.where)
        error.where = self.where  # type: ignore[attr-defined]
        return error


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a number this platform has no name for
        return f"signal {number}"


# -- the parent's side ---------------------------------------------------------------------------


class Child:
    """A running child process and the parent's end of its channel. Made by `start_child`;
    close it (or use it as a context manager) to end it, its group with it when it has one."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        connection: Connection,
        *,
        what: str,
        own_group: bool,
        failure: type[ChildFailed],
        stderr: IO[bytes] | None,
        stderr_noise: Sequence[str],
    ) -> None:
        self.process = process
        self.connection = connection
        self.what = what
        self.own_group = own_group
        self.failure = failure
        self._stderr = stderr
        self._stderr_noise = tuple(stderr_noise)

    @property
    def pid(self) -> int:
        return self.process.pid

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def receive(self, timeout_s: float | None = None) -> Message | None:
        """The next message, checking every POLL_S that the child lives; None when `timeout_s`
        passes first. A child that ended with nothing more to say raises `died()`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            try:
                if self.connection.poll(wait_s):
                    return self.connection.recv()  # type: ignore[no-any-return]
            except (EOFError, OSError):
                raise self.died() from None
            if self.process.poll() is not None and not self.connection.poll(0):
                raise self.died()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def result(
        self,
        on_message: Callable[[str, Any], None] | None = None,
        known: Sequence[type[BaseException]] = (),
    ) -> Any:
        """Wait for the child's result, passing what it says meanwhile to `on_message(kind,
        value)`; the child's error is raised here, rebuilt (see ErrorRecord.rebuild)."""
        while True:
            message = self.receive()
            assert message is not None  # no timeout: a message or an error
            kind, value = message
            if kind == RESULT:
                return value
            if kind == ERROR:
                raise self.rebuild(value, known)
            if on_message is not None:
                on_message(kind, value)

    def rebuild(self, record: ErrorRecord, known: Sequence[type[BaseException]] = ()) -> BaseException:
        return record.rebuild(self.what, self.failure, known)

    def died(self) -> ChildFailed:
        """The error for a child that ended without answering: how it ended, and the last line
        it wrote to stderr when that was captured."""
        try:
            code = self.process.wait(timeout=5.0)  # its channel closed: it is about to exit
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            text = f"{self.what} closed its channel but did not exit"
        elif code < 0:
            text = f"{self.what} died (signal {-code}), killed by {_signal_name(-code)}"
        elif code == 0:
            text = f"{self.what} ended (exit code 0) without answering"
        else:
            text = f"{self.what} died (exit code {code})"
        tail = self.stderr_tail()
        return self.failure(text + (f": {tail}" if tail else ""))

    def stderr_tail(self) -> str:
        """The last line the child wrote to stderr (captured ones only), noise left out."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [ln.strip() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln and not any(noise in ln for noise in self._stderr_noise)]
        return lines[-1][:_TAIL_CHARS] if lines else ""

    def wait(self, timeout_s: float) -> bool:
        """Whether the child exited within `timeout_s`."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def end(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the child (its whole group when it has one), SIGKILL after `grace_s`."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.own_group:
                # The group too when the leader is gone: its workers may still run.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, sig)
            elif self.process.poll() is None:
                self.process.send_signal(sig)
            if self.wait(grace_s):
                break
        if self.own_group:
            # Workers that outlived the leader still carry its group id.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def close(self, grace_s: float = TERM_GRACE_S) -> None:
        """End the child if it still runs (and its group's stragglers), release the channel."""
        if self.own_group or self.process.poll() is None:
            self.end(grace_s)
        with contextlib.suppress(OSError):
            self.connection.close()
        if self._stderr is not None:
            self._stderr.close()


def start_child(
    target: Callable[..., Any],
    *args: Any,
    what: str,
    own_group: bool = False,
    capture_output: bool = False,
    env: Mapping[str, str] | None = None,
    failure: type[ChildFailed] = ChildFailed,
    stderr_noise: Sequence[str] = (),
) -> Child:
    """`target(link, *args)` in a fresh child process, `link` being its ParentLink; target and
    args must pickle (a module-level function). `what` names the child in errors ("the
    onnxruntime worker process"); `failure` is the class of those errors. `own_group`: a session
    and process group of its own. `capture_output`: stdout discarded and stderr kept for
    `died()` (else both are this process's). `env`: added to this process's environment.
    `stderr_noise`: stderr lines holding one of these are never quoted."""
    parent_socket, child_socket = socket.socketpair()
    stderr = tempfile.TemporaryFile() if capture_output else None  # noqa: SIM115 - Child.close closes it
    fd = child_socket.fileno()
    # On sys.path, not PYTHONPATH: the processes the child starts inherit its environment.
    code = (
        f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
        f"from optimize.system.child import _child_main; _child_main({fd})"
    )
    try:
        process = subprocess.Popen(
            # `what` is only for people (and tests) reading the process list.
            [sys.executable, "-c", code, what],
            pass_fds=(fd,),
            env={**os.environ, **dict(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if capture_output else None,
            stderr=stderr,
            close_fds=True,
            start_new_session=own_group,
        )
    except BaseException:
        parent_socket.close()
        if stderr is not None:
            stderr.close()
        raise
    finally:
        child_socket.close()
    child = Child(
        process,
        Connection(parent_socket.detach()),
        what=what,
        own_group=own_group,
        failure=failure,
        stderr=stderr,
        stderr_noise=stderr_noise,
    )
    try:
        child.connection.send(list(sys.path))
        child.connection.send((target, args))
    except OSError:  # it died before it read them
        error = child.died()
        child.close()
        raise error from None
    except BaseException:  # arguments that do not pickle, or an interrupt
        child.close()
        raise
    return child


# -- the child's side ----------------------------------------------------------------------------


class ParentLink:
    """The child's end of the channel: what the running function says to its parent. Safe to
    use from several threads (a library may log from its own)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def send(self, kind: str, value: Any) -> None:
        """One message; dropped when the parent is gone (it no longer listens)."""
        with self._lock, contextlib.suppress(OSError):
            self.connection.send((kind, value))

    def progress(self, value: Any) -> None:
        self.send(PROGRESS, value)

    def log(self, text: str) -> None:
        self.send(LOG, text)

    def warn(self, text: str) -> None:
        self.send(WARN, text)

    def status(self, text: str) -> None:
        self.send(STATUS, text)

    def error(self, exc: BaseException) -> None:
        self.send(ERROR, ErrorRecord.of(exc))

    def result(self, value: Any) -> None:
        try:
            with self._lock:
                self.connection.send((RESULT, value))
        except OSError:
            pass  # the parent is gone
        except Exception as exc:  # a result that does not pickle crosses as that error
            self.error(exc)


def _child_main(fd: int) -> None:
    """The child process: run what the parent sends, answer with its result or its error."""
    # The parent owns Ctrl-C: it ends this process when it is interrupted.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Processes this one starts must not hold the channel open after it dies.
    os.set_inheritable(fd, False)
    connection = Connection(fd)
    link = ParentLink(connection)
    try:
        sys.path[:] = connection.recv()
        target, args = connection.recv()
        value = target(link, *args)
    except BaseException as exc:  # everything crosses as an ErrorRecord: the parent decides
        link.error(exc)
    else:
        link.result(value)
    finally:
        connection.close()


__all__ = [
    "ERROR",
    "LOG",
    "PROGRESS",
    "RESULT",
    "STATUS",
    "Child",
    "ChildFailed",
    "ErrorRecord",
    "ParentLink",
    "start_child",
]
