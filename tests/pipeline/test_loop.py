"""pipeline/loop.py and stage_run.py: a stage's stream of candidates and how it ended, kept apart,
and the loop's stopping rules (the target met, the budget spent, --stop-at-target). The evaluator
is a fake that decides from a table of latencies: no model is loaded, run or timed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from optimize.accuracy import AccuracyResult
from optimize.backend import Backend
from optimize.pipeline import judge
from optimize.pipeline.budget import TimeBudget
from optimize.pipeline.evaluate import BestSoFar
from optimize.pipeline.loop import Pipeline
from optimize.pipeline.record import StageRecord
from optimize.pipeline.request import OptimizeRequest
from optimize.pipeline.stage_run import StageRun
from optimize.recipes import StageSpec
from optimize.stage import Candidate, Outcome, Stage, StageContext, StageSkipped, Status
from tests.factories import make_stage_context
from tests.pipeline.values import measurement, recipe, row


class Worker:
    def close(self) -> None:
        pass


class TableEvaluator:
    """Keeps a candidate faster than the best (alone: its latency in `latency_ms`), rejects the rest."""

    def __init__(
        self, latency_ms: dict[str, float], baseline_ms: float = 10.0, on_evaluate: object = None
    ) -> None:
        self.latency_ms = latency_ms
        self.best = BestSoFar(Candidate("baseline", Path("m.onnx")))
        self.best.begin(row("baseline", Status.BASELINE, speedup=1.0), measurement("baseline", baseline_ms))
        self.evaluated: list[str] = []
        self.on_evaluate = on_evaluate

    def evaluate(self, stage: str, cand: Candidate) -> tuple[StageRecord, Backend | None, AccuracyResult]:
        self.evaluated.append(cand.label)
        if callable(self.on_evaluate):
            self.on_evaluate()
        ms = self.latency_ms[cand.label]
        kept = ms < self.best.alone_ms("p50")
        status = Status.KEPT if kept else Status.REJECTED
        result = StageRecord(
            stage, cand.label, status, speedup=10.0 / ms, versus={"label": self.best.candidate.label}
        )
        return result, Worker() if kept else None, AccuracyResult(True, "", {})  # type: ignore[return-value]

    def adopt(self, cand: Candidate, worker: Backend, row: StageRecord, accuracy: AccuracyResult) -> None:
        alone = measurement(cand.label, self.latency_ms[cand.label])
        self.best.adopt(cand, worker, row=row, accuracy=accuracy, alone=alone)


class Yields(Stage):
    """A stage that yields candidates by label, then raises `then` (if given); counts what it was asked."""

    name = "fake"

    def __init__(self, labels: list[str], then: BaseException | None = None) -> None:
        self.labels, self.then, self.asked = labels, then, 0

    def run(self, candidate: Candidate, ctx: StageContext) -> Iterator[Candidate]:
        for label in self.labels:
            self.asked += 1
            yield Candidate(label, Path(f"{label}.onnx"))
        if self.then is not None:
            raise self.then


def stage_run(tmp_path: Path, stage: Stage, spec: StageSpec, deadline: float | None = None) -> StageRun:
    ctx = make_stage_context(
        tmp_path / spec.name, tmp_path / "m.onnx", feeds={"x": np.zeros(1)}, deadline=deadline
    )
    return StageRun(spec, stage, Candidate("baseline", tmp_path / "m.onnx"), ctx)


def pipeline(tmp_path: Path, spec: StageSpec, **request: object) -> Pipeline:
    return Pipeline(OptimizeRequest(model_path=tmp_path / "m.onnx", **request), recipe(spec))  # type: ignore[arg-type]


def rows_of(run: Pipeline) -> list[tuple[str, str]]:
    return [(r.label, r.status.value) for r in run.record.records]


def test_a_stage_stops_being_asked_once_the_target_it_runs_for_is_met(tmp_path: Path) -> None:
    spec = StageSpec("fake", run_when="above-target")
    run = pipeline(tmp_path, spec, target_ms=5.0)
    stage = Yields(["a", "b", "c"])
    evaluator = TableEvaluator({"a": 6.0, "b": 4.0, "c": 3.0})
    started = stage_run(tmp_path, stage, spec)
    run._run_stage(evaluator, started, 0.0)  # type: ignore[arg-type]
    assert evaluator.evaluated == ["a", "b"] and stage.asked == 2
    assert rows_of(run) == [("a", "kept"), ("b", "kept")]
    assert started.ctx.outcomes == {"a": Outcome.KEPT, "b": Outcome.KEPT}
    assert started.ctx.best_latency_ms == 4.0
    assert run.record.logs[-1].startswith(
        "fake: the best p50 (4.000 ms, measured alone) meets the 5 ms target"
    )


def test_a_stage_that_runs_always_is_asked_for_every_candidate(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    run = pipeline(tmp_path, spec, target_ms=5.0)
    evaluator = TableEvaluator({"a": 4.0, "b": 6.0, "c": 3.0})
    runners_up = run._run_stage(evaluator, stage_run(tmp_path, Yields(["a", "b", "c"]), spec), 0.0)  # type: ignore[arg-type]
    assert rows_of(run) == [("a", "kept"), ("b", "rejected"), ("c", "kept")]
    assert [cand.label for _, cand, _ in runners_up] == ["b"]  # accurate and slower: it may meet c later


def test_a_spent_budget_leaves_the_next_candidate_unmeasured_and_ends_the_stage(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    run = pipeline(tmp_path, spec)
    clock = [0.0]
    run.budget = TimeBudget(100.0, clock=lambda: clock[0])

    def spend() -> None:
        clock[0] = 200.0

    stage = Yields(["a", "b", "c"])
    evaluator = TableEvaluator({"a": 4.0, "b": 3.0, "c": 2.0}, on_evaluate=spend)
    run._run_stage(evaluator, stage_run(tmp_path, stage, spec), 0.0)  # type: ignore[arg-type]
    assert rows_of(run) == [("a", "kept"), ("b", "skipped")]
    assert run.record.records[1].reason == "the --time-budget was used up before it could be measured"
    assert stage.asked == 2


def test_how_a_stage_ended_is_recorded_after_its_candidates(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    run = pipeline(tmp_path, spec)
    evaluator = TableEvaluator({"a": 4.0})
    broken = stage_run(tmp_path, Yields(["a"], then=RuntimeError("the library refused")), spec)
    run._run_stage(evaluator, broken, 0.0)  # type: ignore[arg-type]
    assert rows_of(run) == [("a", "kept"), ("fake", "failed")]
    assert run.record.records[1].reason == "RuntimeError: the library refused"
    assert run.record.records[1].details["exception"] == "RuntimeError"


def test_a_stage_that_skips_itself_or_yields_nothing_says_so_once(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    skipped = pipeline(tmp_path, spec)
    skipped._run_stage(
        TableEvaluator({}), stage_run(tmp_path, Yields([], then=StageSkipped("no conv")), spec), 0.0
    )  # type: ignore[arg-type]
    assert [(r.status, r.reason) for r in skipped.record.records] == [(Status.SKIPPED, "no conv")]
    empty = pipeline(tmp_path, spec)
    empty._run_stage(TableEvaluator({}), stage_run(tmp_path, Yields([]), spec), 0.0)  # type: ignore[arg-type]
    assert [(r.status, r.reason) for r in empty.record.records] == [
        (Status.SKIPPED, "the stage produced no candidate")
    ]


def test_a_programming_error_in_lto_stops_the_run(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    run = stage_run(tmp_path, Yields(["a"]), spec)
    # A TypeError raised in lto's own code (None compared with a float in the judge) is a bug.
    run.stage.run = lambda candidate, ctx: judge.target_verdict(None, 1.0, "p50")  # type: ignore[arg-type, method-assign, return-value]
    with pytest.raises(TypeError):
        list(run.candidates())
    # The same error type raised outside lto (a library refusing the model) is a failed stage.
    outside = stage_run(tmp_path, Yields(["a"], then=TypeError("unsupported operand")), spec)
    assert [c.label for c in outside.candidates()] == ["a"]
    assert outside.ended is not None and outside.ended.status == Status.FAILED


def test_the_candidates_stream_yields_candidates_only(tmp_path: Path) -> None:
    spec = StageSpec("fake")
    run = stage_run(tmp_path, Yields(["a", "b"], then=MemoryError()), spec)
    produced = list(run.candidates())
    assert [c.label for c in produced] == ["a", "b"]
    assert all(c.model_path == tmp_path / "fake" / f"{c.label}.onnx" for c in produced)
    assert run.ended is not None and (run.ended.status, run.ended.reason) == (
        Status.FAILED,
        "ran out of memory",
    )


def test_stop_at_target_reads_the_best_measured_alone_with_confidence(tmp_path: Path) -> None:
    run = pipeline(tmp_path, StageSpec("fake"), target_ms=5.0, stop_at_target=True)
    evaluator = TableEvaluator({"a": 4.0, "b": 5.0})
    assert not run._stop_at_target(evaluator.best)
    evaluator.adopt(
        Candidate("a", Path("a.onnx")), Worker(), row("a", Status.KEPT), AccuracyResult(True, "", {})
    )  # type: ignore[arg-type]
    assert run._stop_at_target(evaluator.best)
    without = pipeline(tmp_path, StageSpec("fake"), target_ms=5.0)
    assert not without._stop_at_target(evaluator.best)  # only with --stop-at-target
