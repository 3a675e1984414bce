"""Run a stage in a child process group that lto ends when it is interrupted.

Why: a stage that spends minutes inside a native library (TVM's MetaSchedule) cannot be
trusted with a signal. TVM's FFI turns KeyboardInterrupt into a RuntimeError, which made a
Ctrl-C look like a failed stage (the run went on, exit 0, and replaced the previous artifact),
and an interrupt landing inside its worker threads sometimes crashed the process (exit 139).
Run in a child with a session of its own, the stage never sees the terminal's Ctrl-C; lto's
main thread does, ends the child's whole group (the builder and runner workers included)
and unwinds as for any other interrupt.

The child (started, heard and ended by optimize.system.child) gets a copy of the StageContext without
its callables: `log`, `warn` and `status` lines come back as messages, and `check_accuracy` is not
offered (a stage that needs it runs in-process).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

from optimize.accuracy import AccuracyResult
from optimize.stage import Candidate, Stage, StageContext, StageSkipped
from optimize.system.child import LOG, STATUS, WARN, ChildFailed, ParentLink, start_child

# How long a stage's process that has sent its result has to exit before its group is ended.
_EXIT_WAIT_S = 30.0


class StageProcessFailed(ChildFailed):
    """The stage raised an exception that is not one of lto's in its child process, or the
    child died; the message says which."""


def _no_accuracy(candidate: Candidate) -> AccuracyResult:
    raise RuntimeError("check_accuracy is not available to a stage run in a child process")


def _drop(text: str) -> None:
    pass


def _run_stage(
    link: ParentLink, stage: Stage, candidate: Candidate, ctx: StageContext, budget_s: float | None
) -> list[Candidate]:
    """The child: the stage's run, its log and status lines sent to the parent."""
    ctx = replace(
        ctx,
        # time.monotonic() is not comparable across processes everywhere: rebase the deadline.
        deadline=None if budget_s is None else time.monotonic() + budget_s,
        check_accuracy=_no_accuracy,
        log=link.log,
        status=link.status,
        warn_fn=link.warn,
    )
    os.chdir(ctx.workdir)
    return list(stage.run(candidate, ctx))


def run_in_child(stage: Stage, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
    """`stage.run(candidate, ctx)` in a child process group; same results and exceptions as
    in-process (lto's errors and StageSkipped as themselves, carrying `where` the stage raised
    them), except that any other exception, or the child's death, comes back as
    StageProcessFailed."""
    budget_s = None if ctx.deadline is None else max(0.0, ctx.deadline - time.monotonic())
    # The callables stay here (they do not pickle): the child gets its own, which talk to these.
    bare_ctx = replace(
        ctx, check_accuracy=_no_accuracy, log=_drop, status=None, note_point_fn=None, warn_fn=None
    )

    def said(kind: str, text: Any) -> None:
        if kind == LOG:
            ctx.log(text)
        elif kind == WARN:
            ctx.warn(text)
        elif kind == STATUS:
            (ctx.status or ctx.log)(text)

    # Exiting the block ends the child's whole group: on an interrupt or an error it may still
    # be working, and its workers may outlive it even after a result.
    with start_child(
        _run_stage,
        stage,
        candidate,
        bare_ctx,
        budget_s,
        what=f"the {stage.name} process",
        own_group=True,
        failure=StageProcessFailed,
    ) as child:
        candidates = child.result(said, known=(StageSkipped,))
        child.wait(_EXIT_WAIT_S)
    return list(candidates)


__all__ = ["StageProcessFailed", "run_in_child"]
