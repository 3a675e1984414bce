"""Run a stage in a child process group that lto ends when it is interrupted.

Why: a stage that spends minutes inside a native library (TVM's MetaSchedule) cannot be
trusted with a signal. TVM's FFI turns KeyboardInterrupt into a RuntimeError, which made a
Ctrl-C look like a failed stage (the run went on, exit 0, and replaced the previous artifact),
and an interrupt landing inside its worker threads sometimes crashed the process (exit 139).
Run in a child with a session of its own, the stage never sees the terminal's Ctrl-C; lto's
main thread does, ends the child's whole group (the builder and runner workers included)
and unwinds as for any other interrupt.

The child gets a copy of the StageContext without its callables: `log` and `status` lines come
back over a pipe, and `check_accuracy` is not offered (a stage that needs it runs in-process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from optimize.accuracy import AccuracyResult
from optimize.errors import LtoError, message_line
from optimize.stage import Candidate, Stage, StageContext, StageSkipped

_POLL_S = 0.2
_TERM_GRACE_S = 5.0


class StageProcessFailed(LtoError):
    """The stage raised in its child process, or the child died; the message says which."""


def _no_accuracy(candidate: Candidate) -> AccuracyResult:
    raise RuntimeError("check_accuracy is not available to a stage run in a child process")


def _child_main(
    stage: Stage, candidate: Candidate, ctx: StageContext, budget_s: float | None, conn: Any
) -> None:
    # A session of its own: the terminal's Ctrl-C goes to lto's group only, and lto can end
    # this process and every worker it starts with one killpg.
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lock = threading.Lock()

    def send(kind: str, value: Any) -> None:
        with lock, contextlib.suppress(OSError, ValueError):
            conn.send((kind, value))

    ctx = replace(
        ctx,
        # time.monotonic() is not comparable across processes everywhere: rebase the deadline.
        deadline=None if budget_s is None else time.monotonic() + budget_s,
        check_accuracy=_no_accuracy,
        log=lambda text: send("log", text),
        status=lambda text: send("status", text),
        warn_fn=lambda text: send("warn", text),
    )
    os.chdir(ctx.workdir)
    try:
        send("result", list(stage.run(candidate, ctx)))
    except StageSkipped as exc:
        send("skipped", str(exc))
    except BaseException as exc:  # everything crosses as text: the parent decides what it means
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        line = exc.one_line() if isinstance(exc, LtoError) else message_line(exc)
        send("error", (type(exc).__name__, line, where))
    finally:
        conn.close()


def _end_group(process: Any) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after a grace period."""
    if process.pid is None:
        return
    for sig, wait_s in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, _TERM_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        process.join(wait_s)
        if not process.is_alive():
            break
    # Workers that outlived the leader still carry its group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def run_in_child(stage: Stage, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
    """`stage.run(candidate, ctx)` in a child process group; same results and exceptions as
    in-process, except that an error inside the stage comes back as StageProcessFailed."""
    import multiprocessing

    # spawn, not fork: the parent holds ONNX Runtime thread pools, which fork does not copy.
    mp = multiprocessing.get_context("spawn")
    receiver, sender = mp.Pipe(duplex=False)
    budget_s = None if ctx.deadline is None else max(0.0, ctx.deadline - time.monotonic())
    bare_ctx = replace(
        ctx, check_accuracy=_no_accuracy, log=_drop, status=None, note_point_fn=None, warn_fn=None
    )
    process = mp.Process(
        target=_child_main, args=(stage, candidate, bare_ctx, budget_s, sender), name=f"lto-{stage.name}"
    )
    process.start()
    sender.close()
    try:
        return _receive(stage, process, receiver, ctx)
    finally:
        # On success the child has exited; on an interrupt or error it may still be working.
        _end_group(process)
        receiver.close()


def _drop(text: str) -> None:
    pass


def _receive(stage: Stage, process: Any, receiver: Connection, ctx: StageContext) -> list[Candidate]:
    while True:
        if not receiver.poll(_POLL_S):
            if process.is_alive():
                continue
            if not receiver.poll(0):  # it died with nothing more to say
                process.join(1.0)
                raise StageProcessFailed(
                    f"the {stage.name} process ended without a result ({_exit_words(process.exitcode)})"
                )
        try:
            kind, value = receiver.recv()
        except EOFError:
            process.join(1.0)
            raise StageProcessFailed(
                f"the {stage.name} process ended without a result ({_exit_words(process.exitcode)})"
            ) from None
        if kind == "log":
            ctx.log(value)
        elif kind == "warn":
            ctx.warn(value)
        elif kind == "status":
            (ctx.status or ctx.log)(value)
        elif kind == "result":
            process.join(30.0)
            return list(value)
        elif kind == "skipped":
            raise StageSkipped(value)
        elif kind == "error":
            name, line, where = value
            error = StageProcessFailed(f"{name}: {line}" if line else name)
            error.where = where  # type: ignore[attr-defined]
            raise error


__all__ = ["StageProcessFailed", "run_in_child"]
