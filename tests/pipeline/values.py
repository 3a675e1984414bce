"""Hand-made values for the unit tests of the pipeline's roles: measurements, comparisons, rows,
a run's record. Nothing here loads, runs or times a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optimize.accuracy import Thresholds
from optimize.bench import Comparison, Measurement
from optimize.pipeline.record import RunRecord, StageRecord
from optimize.pipeline.request import OptimizeRequest
from optimize.recipes import Recipe, StageSpec
from optimize.stage import Status


def measurement(label: str, centre_ms: float, n: int = 50, spread: float = 0.0) -> Measurement:
    """`n` latencies evenly spread over centre_ms * (1 ± spread)."""
    step = 2.0 * spread / max(n - 1, 1)
    samples = [centre_ms * (1.0 - spread + i * step) for i in range(n)]
    return Measurement(label, "onnxruntime", 1, samples, 0, 0.1, "runs", 0.0)


def comparison(
    ratio: float,
    ci: tuple[float, float],
    *,
    a_ms: float = 10.0,
    a_label: str = "best",
    b_label: str = "cand",
    metric: str = "p50",
) -> Comparison:
    """B against A at `ratio` (B / A) with its 95% interval, each side's figure in ms given."""
    b_ms = a_ms * ratio
    a, b = measurement(a_label, a_ms), measurement(b_label, b_ms)
    return Comparison(a, b, metric, ratio, ci, 8, a_ms=a_ms, b_ms=b_ms)


def recipe(*stages: StageSpec, name: str = "unit", min_improvement: float = 0.05) -> Recipe:
    return Recipe(name, "unit test", "", list(stages), Thresholds(), {}, min_improvement)


def run_record(tmp_path: Path, stages: tuple[StageSpec, ...] = (), **request: Any) -> RunRecord:
    """A run's record for a request on a model that need not exist (nothing here reads it)."""
    return RunRecord(
        request=OptimizeRequest(model_path=tmp_path / "m.onnx", **request),
        recipe=recipe(*stages),
        model_kind="default",
        out_dir=tmp_path / "out",
        bench_settings={},
    )


def row(label: str, status: Status, stage: str | None = None, **fields: Any) -> StageRecord:
    return StageRecord(stage or label.split(":")[0], label, status, **fields)
