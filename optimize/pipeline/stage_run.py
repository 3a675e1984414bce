"""One stage of a run: loaded once, opened with its context and its share of the --time-budget,
run in its scratch directory.

A running stage gives two things, kept apart: the stream of its candidates, which the loop
evaluates one at a time, and at most one record of how it ended early (skipped, failed), which
the loop adds once the stream is done. A point of its search it does not yield is recorded as it
is noted (StageContext.note_point).

A stage that raises is recorded as failed, unless the error is a programming error raised in
lto's own code: that is a bug, and it stops the run (the partial report says where).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from optimize.accuracy import MetricError
from optimize.errors import first_line, full_text
from optimize.pipeline import judge
from optimize.pipeline.budget import TimeBudget
from optimize.pipeline.evaluate import Evaluator
from optimize.pipeline.isolation import run_in_child
from optimize.pipeline.record import RunRecord, StageRecord
from optimize.recipes import StageSpec
from optimize.runtimes.registry import stage_runtime
from optimize.stage import Candidate, Stage, StageContext, StageSkipped, Status
from optimize.system import interrupts

StageFactory = Callable[[str], Stage]

# Exception types that, raised by lto's own code, are its bugs (Olive re-raises the same kinds).
PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, AssertionError, UnboundLocalError)
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _named(stage: str, text: str) -> str:
    """A stage's line, led by its name once ("openvino-convert: openvino-convert:bf16: ..." read
    twice when the line already names one of the stage's candidates)."""
    return text if text.startswith(f"{stage}:") else f"{stage}: {text}"


def _own_programming_error(exc: BaseException) -> bool:
    """A programming error whose innermost frame is in lto's own package (not in a library a stage
    calls, where the same types mean the library refused the model)."""
    if not isinstance(exc, PROGRAMMING_ERRORS):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(_PACKAGE_DIR)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def stage_failure(stage: str, exc: BaseException) -> StageRecord:
    """A model a stage cannot handle, or a library that fails on it, must not end the run: record
    it and go on. A programming error raised in lto's own code is raised: recorded as a "failed"
    row, a bug would pass for a limit of the model (the partial report says where the run
    stopped)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, MetricError)) or _own_programming_error(exc):
        raise exc
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    where = getattr(exc, "where", None) or where  # an isolated stage says where it raised
    details = {"exception": type(exc).__name__, "where": where, "error_text": full_text(exc)}
    return StageRecord(stage, stage, Status.FAILED, first_line(exc), details=details)


def stage_weight(spec: StageSpec) -> float:
    """What a stage weighs when the --time-budget is shared out: its recipe budget."""
    return float(spec.budget_s) if spec.budget_s else judge.DEFAULT_STAGE_WEIGHT_S


class StageRun:
    """One stage running from `start`: its candidates as it yields them, each step run in its
    scratch directory, and `ended`, the record of how it ended early (None: it did not)."""

    def __init__(self, spec: StageSpec, stage: Stage, start: Candidate, ctx: StageContext) -> None:
        self.spec, self.stage, self.start, self.ctx = spec, stage, start, ctx
        self.ended: StageRecord | None = None

    def candidates(self) -> Generator[Candidate, None, None]:
        """The stage's candidates as it yields them; an exception ends the stage as `ended` and
        keeps what was already yielded."""
        workdir, name = self.ctx.workdir, self.spec.name
        produced: Iterator[Candidate] | None = None
        try:
            # Some libraries write side files into the current directory (onnxruntime.quantization
            # names external data "<uuid>.data" there): keep them in the stage's scratch space.
            with _working_directory(workdir):
                if self.stage.isolated:
                    produced = iter(run_in_child(self.stage, self.start, self.ctx))
                else:
                    produced = iter(self.stage.run(self.start, self.ctx))
            while True:
                with _working_directory(workdir):
                    cand = next(produced, None)
                # A stage's native libraries may leave the signal stack unmapped (interrupts.py).
                interrupts.ensure_signal_stack()
                if cand is None:
                    return
                # A path relative to the stage's directory stays valid outside it.
                cand.model_path = workdir / cand.model_path
                cand.extra_files = [workdir / Path(f) for f in cand.extra_files]
                yield cand
        except StageSkipped as exc:
            self.ended = StageRecord(name, name, Status.SKIPPED, str(exc) or "does not apply")
        except (KeyboardInterrupt, SystemExit, MetricError):
            raise
        except MemoryError:
            self.ended = StageRecord(name, name, Status.FAILED, "ran out of memory")
        except Exception as exc:
            self.ended = stage_failure(name, exc)
        finally:
            close = getattr(produced, "close", None)
            if close is not None:
                with _working_directory(workdir):
                    close()


class StageOpener:
    """Loads the recipe's stages (each once) and opens one: its scratch directory, its context
    with the services the pipeline lends it, and its deadline."""

    def __init__(self, record: RunRecord, factory: StageFactory, budget: TimeBudget, workdir: Path) -> None:
        self.record, self.factory, self.budget, self.workdir = record, factory, budget, workdir
        self._loaded: dict[str, Stage | StageSkipped] = {}

    def load(self, name: str) -> Stage | StageSkipped:
        """The stage registered as `name`, loaded once (or why it cannot load)."""
        if name not in self._loaded:
            try:
                self._loaded[name] = self.factory(name)
            except StageSkipped as exc:
                self._loaded[name] = exc
        return self._loaded[name]

    def runnable(self, specs: Sequence[StageSpec]) -> list[StageSpec]:
        """Those of `specs` that are on and can load: those a --time-budget is shared with (a
        runtime that is not installed reserves nothing)."""
        return [s for s in specs if s.enabled and not isinstance(self.load(s.name), StageSkipped)]

    def open(
        self, spec: StageSpec, later: Sequence[StageSpec], evaluator: Evaluator
    ) -> StageRun | StageRecord:
        """The stage ready to run from its runtime's best so far, or the record of why it does not
        run. `later`: the stages still to run after it (they share the --time-budget with it)."""
        record = self.record
        record.status(f"{spec.name}: loading")
        loaded = self.load(spec.name)
        if isinstance(loaded, StageSkipped):
            return StageRecord(spec.name, spec.name, Status.SKIPPED, str(loaded) or "not available")
        stage_dir = self.workdir / spec.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        weights = [stage_weight(s) for s in self.runnable([s for s in later if s.name != spec.name])]
        share = self.budget.stage_share(spec.budget_s, stage_weight(spec), weights)
        if share.share_s is not None and share.left_s is not None:
            record.log(
                f"{spec.name}: {share.share_s:.0f} s of the {share.left_s:.0f} s left in the --time-budget "
                "(its share by the recipe's stage budgets)"
            )
        ctx = self._context(spec, stage_dir, share.deadline, evaluator)
        start = evaluator.best.of_runtime(stage_runtime(spec.name))
        try:
            reason = loaded.skip_reason(start, ctx)
        except Exception as exc:
            return stage_failure(spec.name, exc)
        if reason:
            return StageRecord(spec.name, spec.name, Status.SKIPPED, reason)
        record.status(f"{spec.name}: running")
        return StageRun(spec, loaded, start, ctx)

    def _context(
        self, spec: StageSpec, stage_dir: Path, deadline: float | None, evaluator: Evaluator
    ) -> StageContext:
        record = self.record

        def note_point(label: str, status: Status, reason: str, details: dict[str, Any]) -> None:
            record.add(StageRecord(spec.name, label, status, reason, details=details))

        return StageContext(
            workdir=stage_dir,
            original_model=Path(record.request.model_path).absolute(),
            feeds=evaluator.baseline.feeds,
            options=dict(spec.options),
            best_standard=evaluator.best.standard,
            best_latency_ms=evaluator.best.alone_ms(record.metric),
            target_ms=record.request.target_ms,
            deadline=deadline,
            check_accuracy=evaluator.check_accuracy,
            log=lambda text: record.log(_named(spec.name, text)),
            status=lambda text: record.status(_named(spec.name, text)),
            note_point_fn=note_point,
            warn_fn=lambda text: record.warn(_named(spec.name, text)),
        )


__all__ = [
    "PROGRAMMING_ERRORS",
    "StageFactory",
    "StageOpener",
    "StageRun",
    "stage_failure",
    "stage_weight",
]
