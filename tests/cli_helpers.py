"""Run `lto` the way a user does, in this process (`run_cli`) or in a new one (`run_lto`).

`run_cli` calls `optimize.cli.main` with what a fresh `python -m optimize` process would have:
the repository root as working folder, COLUMNS=200 and NO_COLOR=1, no LTO_DEBUG, its own
sys.argv, stdout and stderr captured at the file descriptors (so output from native libraries
and child processes is caught too), warnings and log records printed on stderr, and the signal
handlers, environment and module state of the test process given back afterwards. Starting no
interpreter, it saves the import of onnxruntime and the rest on every call.

`run_lto` starts the real entry point in a subprocess; tests use it only where the process itself
is what they check (its exit status, start-up, signals, limits set on the process).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
# What every run sees, in-process or not: a wide console without colour, and no tracebacks.
_ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
_UNSET = ("LTO_DEBUG",)


def run_lto(
    *args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **_ENV, **(env or {})}
    for name in _UNSET:
        full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=full_env,
    )


def run_cli(
    *args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`lto ARGS` through `optimize.cli.main` in this process; the result run_lto would return.

    An exception other than SystemExit fails the test: a user would have seen a traceback. A
    run still going after `timeout` seconds is stopped as Ctrl-C stops it, and fails the test.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_cli runs lto in the main thread, where its signal handlers go")
    argv = [str(arg) for arg in args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with (
            _as_a_fresh_process(argv, env) as interrupted,
            _Watchdog(timeout) as watchdog,
            _descriptors_into(out, err),
        ):
            code, raised = _call_main(argv, watchdog)
        stdout, stderr = _text(out), _text(err)
    command = shlex.join(["lto", *argv])
    if raised is not None:
        raise AssertionError(f"{command} raised instead of exiting; stderr:\n{stderr}") from raised
    if watchdog.fired:
        raise AssertionError(f"{command} still ran after {timeout} s; stderr:\n{stderr}")
    if interrupted:
        # Ctrl-C or SIGTERM reached this process during the run (no test sends one in-process):
        # hand it to the handlers given back, so pytest stops as it would have.
        signal.raise_signal(interrupted[0])
    return subprocess.CompletedProcess(["lto", *argv], code, stdout, stderr)


def _call_main(argv: list[str], watchdog: _Watchdog) -> tuple[int, Exception | None]:
    """The exit code main() leaves with, as the interpreter would turn it into one, or what it
    raised instead of exiting."""
    from optimize.cli import main

    try:
        try:
            main(argv)
        finally:
            watchdog.stop()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0, None
        print(exc.code, file=sys.stderr)  # what the interpreter does with sys.exit("text")
        return 1, None
    except KeyboardInterrupt:
        if not watchdog.fired:
            raise
        return 130, None  # the watchdog's SIGINT landed after main() had already exited
    except Exception as exc:
        return 1, exc
    return 0, None


class _Watchdog:
    """Sends SIGINT to the main thread after `timeout` seconds: lto stops as on Ctrl-C."""

    def __init__(self, timeout: float) -> None:
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def stop(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


@contextlib.contextmanager
def _as_a_fresh_process(argv: list[str], env: dict[str, str] | None) -> Iterator[list[int]]:
    """The state a new `python -m optimize ARGV` starts with, and this process's given back.

    Yields a list that holds, afterwards, the number of a signal that interrupted the run.
    """
    import optimize.__main__ as entry_point
    from optimize.system import interrupts

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_argv, saved_main = sys.argv, sys.modules["__main__"]
    saved_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    saved_interrupts = interrupts._activity[:], interrupts._received[:]
    root_logger = logging.getLogger()
    saved_log_handlers, saved_log_level = root_logger.handlers[:], root_logger.level
    interrupted: list[int] = []
    try:
        os.environ.update({**_ENV, **(env or {})})
        for name in _UNSET:
            os.environ.pop(name, None)
        os.chdir(ROOT)
        # As `python -m optimize` sets them: the reports record sys.argv, and click names the
        # program in usage lines after __main__ ("python -m optimize", not pytest).
        sys.argv = [str(entry_point.__file__), *argv]
        sys.modules["__main__"] = entry_point
        interrupts._activity.clear()
        interrupts._received.clear()
        # pytest's log capture on the root logger would take the records a process prints on
        # stderr (logging's last-resort handler, which writes to the current sys.stderr).
        root_logger.handlers.clear()
        with warnings.catch_warnings():
            _warnings_as_at_start_up()
            yield interrupted
    finally:
        received = interrupts.received()
        if received is not None:
            interrupted.append(received.signum)
        interrupts._activity[:], interrupts._received[:] = saved_interrupts
        root_logger.handlers[:] = saved_log_handlers
        root_logger.setLevel(saved_log_level)
        for signum, handler in saved_handlers.items():
            if handler is not None:  # None: not set from Python, nothing to give back
                signal.signal(signum, handler)
        sys.argv, sys.modules["__main__"] = saved_argv, saved_main
        os.chdir(saved_cwd)
        # Back to the test's environment, dropping what the command set (TVM_NUM_THREADS, ...).
        for name in set(os.environ) - set(saved_env):
            del os.environ[name]
        os.environ.update(saved_env)


def _warnings_as_at_start_up() -> None:
    """Python's default warning filters, and warnings printed on stderr as a process prints
    them, instead of pytest's filters and its collection of warnings for its summary."""
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: IO[str] | None = None,
        line: str | None = None,
    ) -> None:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show


@contextlib.contextmanager
def _descriptors_into(out: IO[bytes], err: IO[bytes]) -> Iterator[None]:
    """File descriptors 1 and 2 into `out` and `err`, and sys.stdout/sys.stderr writing through
    to them: what native code and child processes write is caught with what Python prints."""
    saved_streams = sys.stdout, sys.stderr
    for stream in saved_streams:
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = _text_stream(1), _text_stream(2)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            sys.stdout, sys.stderr = saved_streams
    finally:
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)


def _text_stream(fd: int) -> io.TextIOWrapper:
    # Not a terminal, like the pipe run_lto reads; unbuffered, so that lines keep their order
    # with what native code and child processes write to the same descriptor.
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # type: ignore[arg-type]


def _text(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


def assert_clean_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """A user error: the expected exit code, a one-line message, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
