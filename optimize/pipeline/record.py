"""The record of one `lto optimize` run: what was measured and decided, kept apart from the code
that runs it (the loop writes it; `summary` builds the reports from it and from nothing else).

A row's state is an enum, never a sentence: `Status` is what the table shows, `Outcome` what a
searching stage learns about its candidate (both in optimize.stage, where stages read and name
them too). Reasons only explain them.
Warnings have their own channel: a log line is never promoted to a warning by its wording.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optimize.data import InputSpec
from optimize.pipeline.request import OptimizeRequest
from optimize.recipes import Recipe
from optimize.stage import Outcome, Status

if TYPE_CHECKING:
    from optimize.bench import Measurement


@dataclass(frozen=True)
class Figures:
    """What a row shows of the side-by-side measurement its candidate was judged on: every figure
    from the one comparison, so none is a product of ratios (pipeline/judge.judge_candidate)."""

    latency_ms: dict[str, float]  # the candidate's p50, p99 and the target percentile
    versus: dict[str, Any]  # the best so far it was measured against: its label and latency_ms
    ratio: float  # metric(candidate) / metric(best so far)
    ratio_ci95: tuple[float, float]
    speedup: float | None  # over the baseline, in the same run
    speedup_ci95: tuple[float, float] | None
    baseline_ms: float
    metric: str
    modes: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decision:
    """What the judge decided about a candidate (pipeline/judge.py): the row's status, why, and the
    figures the decision read. The judge returns it; the evaluator records it (StageRecord.take)."""

    status: Status
    reason: str
    figures: Figures | None = None  # None: decided before any timing (its outputs)
    inaccurate: bool = False  # rejected for its outputs, not its speed


@dataclass
class StageRecord:
    """One row of the final table: a baseline, a candidate, or a stage that produced none."""

    stage: str
    label: str
    status: Status
    reason: str = ""
    latency_ms: dict[str, float] | None = None  # p50, p99 and the target percentile
    # The side it was measured against, in the same interleaved run: its latency_ms is only
    # comparable with this one (an interleaved run inflates both sides on few cores).
    versus: dict[str, Any] | None = None
    ratio: float | None = None  # metric(candidate) / metric(best so far)
    ratio_ci95: tuple[float, float] | None = None
    # vs the baseline, measured in the same side-by-side run as the ratio (never chained)
    speedup: float | None = None
    speedup_ci95: tuple[float, float] | None = None
    # The baseline's latency (at the target percentile) in the measurement the speedup comes
    # from: the row's latency divided into it gives its speedup.
    baseline_ms: float | None = None
    # Where a side ran at two speeds in that measurement: both figures (pipeline/judge.modes_of).
    modes: dict[str, Any] | None = None
    metric: str = "p50"  # the percentile latency_ms's figure and the ratios are of
    accuracy: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    runtime_config: dict[str, Any] | None = None
    precision: str | None = None
    # exact | reassociated | reduced | quantized (optimize/accuracy/evidence.py), once its outputs were seen
    numerics: str | None = None
    elapsed_s: float = 0.0
    # Why a rejected candidate was rejected: its outputs, or its speed.
    inaccurate: bool = False

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    def take(self, decision: Decision) -> None:
        """The judge's decision becomes this row's status, reason and figures."""
        self.status, self.reason, self.inaccurate = decision.status, decision.reason, decision.inaccurate
        figures = decision.figures
        if figures is None:
            return
        self.latency_ms, self.versus, self.metric = figures.latency_ms, figures.versus, figures.metric
        self.ratio, self.ratio_ci95 = figures.ratio, figures.ratio_ci95
        self.speedup, self.speedup_ci95 = figures.speedup, figures.speedup_ci95
        self.baseline_ms, self.modes = figures.baseline_ms, figures.modes

    def outcome(self) -> Outcome:
        """What a searching stage learns about this candidate."""
        if self.status == Status.KEPT:
            return Outcome.KEPT
        if self.status == Status.UNVERIFIED:
            return Outcome.UNVERIFIED
        if self.status == Status.REJECTED:
            return Outcome.INACCURATE if self.inaccurate else Outcome.SLOWER
        return Outcome.FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.label,
            "status": Status(self.status).value,
            "reason": self.reason,
            "latency_ms": self.latency_ms,
            "versus": self.versus,
            "ratio_vs_best": self.ratio,
            "ratio_ci95": list(self.ratio_ci95) if self.ratio_ci95 else None,
            "speedup_vs_baseline": self.speedup,
            "speedup_ci95": list(self.speedup_ci95) if self.speedup_ci95 else None,
            "baseline_ms": self.baseline_ms,
            "metric": self.metric,
            **({"modes": self.modes} if self.modes else {}),
            "accuracy": self.accuracy,
            "details": json_safe(self.details),
            "backend": self.backend,
            "runtime_config": self.runtime_config,
            "precision": self.precision,
            "numerics": self.numerics,
            "elapsed_s": round(self.elapsed_s, 3),
        }


class Progress:
    """What the pipeline tells a display while it runs. The default shows nothing."""

    def status(self, text: str) -> None:
        pass

    def record(self, record: StageRecord) -> None:
        pass

    def log(self, text: str) -> None:
        pass


@dataclass
class RunRecord:
    """Everything a run of `lto optimize` measured, decided and said, in the order it happened,
    with the facts the reports need. The loop adds to it; summary reads it."""

    request: OptimizeRequest
    recipe: Recipe
    model_kind: str
    out_dir: Path
    bench_settings: dict[str, Any]
    progress: Progress = field(default_factory=Progress)
    started: float = field(default_factory=time.monotonic)
    records: list[StageRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)  # measurements, as JSON
    # Seconds from the start at which each candidate became the best (the baseline's: measured).
    best_at: dict[str, float] = field(default_factory=dict)
    # Seconds each stage that was opened ran, by stage name.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # How the stages were ordered (pipeline/order.py), for the report.
    search: dict[str, Any] = field(default_factory=dict)
    # Known once the inputs are resolved (None: the run stopped before).
    input_spec: InputSpec | None = None
    accuracy_samples: int = 0
    external_data: bool = False
    # The --time-budget's end (monotonic seconds), and the step that was running when it passed.
    deadline: float | None = None
    over_budget_step: str = ""

    @property
    def metric(self) -> str:
        return self.request.target_percentile

    def add(self, record: StageRecord) -> None:
        if (
            record.status == Status.FAILED
            and self.external_data
            and "external data" not in record.reason.lower()
        ):
            # The report must say when a stage may have failed on a model with its weights in side files.
            record.reason += " (the model keeps its weights as external data)"
        self.records.append(record)
        self.progress.record(record)

    def log(self, text: str) -> None:
        self.logs.append(text)
        self.progress.log(text)

    def warn(self, text: str) -> None:
        """A warning for the report (once), shown as it happens."""
        if text not in self.warnings:
            self.warnings.append(text)
            self.progress.log(f"warning: {text}")

    def status(self, text: str) -> None:
        if self.deadline is not None and not self.over_budget_step and time.monotonic() > self.deadline:
            self.over_budget_step = text
            self.log(f"the --time-budget ran out; still to do: {text}")
        self.progress.status(text)

    def elapsed_s(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def became_best(self, label: str) -> None:
        self.best_at[label] = self.elapsed_s()

    def revert_kept(self, why: str) -> None:
        """The final comparison sent the original back (`why`): every kept row says so, in the
        table and as a streamed line, and so does every skip decided on a reverted candidate."""
        kept = {r.label for r in self.records if r.status == Status.KEPT}
        for row in self.records:
            if row.status == Status.KEPT:
                row.status = Status.REVERTED
                row.reason = f"{why}; it had been kept: {row.reason}"
                self.progress.record(row)
            elif row.status == Status.SKIPPED and row.details.get("decided_on") in kept:
                row.reason += f" (decided on {row.details['decided_on']}, which was reverted)"

    def all_warnings(self) -> list[str]:
        """The run's warnings, then the inputs' (padding, generated scalars)."""
        extra = list(self.input_spec.warnings) if self.input_spec is not None else []
        return self.warnings + [w for w in extra if w not in self.warnings]


def latency_figures(measurement: Measurement, metric: str, figure: float | None = None) -> dict[str, float]:
    """What a row shows of a measurement: p50 and p99 of its runs, and its figure at the target
    percentile `metric` (`figure` when given: a comparison's figure for the side, from the block
    pairs its ratio comes from)."""
    lat = measurement.latency
    value = lat[metric] if figure is None else figure
    return {"p50": lat["p50"], "p99": lat["p99"], metric: value}


def json_safe(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


__all__ = ["Decision", "Figures", "Progress", "RunRecord", "StageRecord", "json_safe", "latency_figures"]
