"""Factories for objects that many tests build: one place that knows their fields and defaults."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.accuracy import AccuracyResult
from optimize.stage import Candidate, StageContext


class LogLines(list[str]):
    """A StageContext.log that keeps what the stage logged: call it with a line, read it as a list."""

    def __call__(self, line: str) -> None:
        self.append(line)


def refuse_accuracy_check(candidate: Candidate) -> AccuracyResult:
    """The default StageContext.check_accuracy: a stage that checks accuracy unasked fails the test."""
    pytest.fail(f"the stage must not check accuracy itself (it checked {candidate.label!r})")


def make_stage_context(
    workdir: Path,
    model: Path,
    feeds: Mapping[str, np.ndarray] | None = None,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    options: Mapping[str, Any] | None = None,
    best_standard: Candidate | None = None,
    best_latency_ms: float | None = None,
    target_ms: float | None = None,
    deadline: float | None = None,
    check_accuracy: Callable[[Candidate], AccuracyResult] | None = None,
    log: Callable[[str], None] | None = None,
    status: Callable[[str], None] | None = None,
) -> StageContext:
    """The StageContext the pipeline would lend a stage that works on `model` in `workdir`.

    Defaults, for what a test leaves out:
      * `workdir` is created, with its parents;
      * `feeds`: the model's inputs as lto generates them, batch 1, with `shapes` pinning dynamic
        dims (as `--shape` does);
      * `options`: none (a copy of the given mapping otherwise: the stage never shares the test's dict);
      * `best_standard`: the model itself, as the "baseline" candidate;
      * no measured or target latency, no deadline, no status line;
      * `check_accuracy` fails the test: pass a checker to a stage that searches (quantize);
      * `log` keeps every line: read them with `logged(ctx)`.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if feeds is None:
        from optimize.data import resolve_inputs

        _, feeds = resolve_inputs(model, dict(shapes or {}), batch=1)
    return StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options=dict(options or {}),
        best_standard=best_standard if best_standard is not None else Candidate("baseline", model),
        best_latency_ms=best_latency_ms,
        target_ms=target_ms,
        deadline=deadline,
        check_accuracy=check_accuracy if check_accuracy is not None else refuse_accuracy_check,
        log=log if log is not None else LogLines(),
        status=status,
    )


def logged(ctx: StageContext) -> LogLines:
    """The lines a stage logged to a context from `make_stage_context` (made with its default log)."""
    if not isinstance(ctx.log, LogLines):
        raise TypeError("this context was given its own log: read that instead")
    return ctx.log
