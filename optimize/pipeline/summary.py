"""What a run of `lto optimize` hands back: the per-stage records, the report assembled from
them, and the partial report of a run that stopped early.

Nothing here measures or decides; it writes down what the loop measured and the judge decided.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optimize.errors import UsageError, first_line
from optimize.pipeline.request import partial_report_path
from optimize.stage import Candidate

if TYPE_CHECKING:
    from optimize.pipeline.loop import Pipeline


@dataclass
class StageRecord:
    """One row of the final table: a baseline, a candidate, or a stage that produced none."""

    stage: str
    label: str
    # baseline | kept | rejected | skipped | failed | reverted (kept, then sent back by the
    # final side-by-side comparison with the original) | unverified (reduced or quantized,
    # measured faster, but the rows could not verify its accuracy: never shipped)
    status: str
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
    accuracy: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    runtime_config: dict[str, Any] | None = None
    precision: str | None = None
    # exact | reassociated | reduced | quantized (optimize/evidence.py), once its outputs were seen
    numerics: str | None = None
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.label,
            "status": self.status,
            "reason": self.reason,
            "latency_ms": self.latency_ms,
            "versus": self.versus,
            "ratio_vs_best": self.ratio,
            "ratio_ci95": list(self.ratio_ci95) if self.ratio_ci95 else None,
            "speedup_vs_baseline": self.speedup,
            "speedup_ci95": list(self.speedup_ci95) if self.speedup_ci95 else None,
            "accuracy": self.accuracy,
            "details": json_safe(self.details),
            "backend": self.backend,
            "runtime_config": self.runtime_config,
            "precision": self.precision,
            "numerics": self.numerics,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass
class PipelineResult:
    report: dict[str, Any]
    records: list[StageRecord]
    best: Candidate
    exit_code: int
    artifact_dir: Path
    verdict: str


class Progress:
    """What the pipeline tells a display while it runs. The default shows nothing."""

    def status(self, text: str) -> None:
        pass

    def record(self, record: StageRecord) -> None:
        pass

    def log(self, text: str) -> None:
        pass


def json_safe(value: Any) -> Any:
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


@dataclass
class FinalFigures:
    """What the end of the run measured and decided about the artifact."""

    best: Candidate
    accuracy: dict[str, Any]
    kept_chain: list[dict[str, Any]]
    speedup: float
    speedup_ci: tuple[float, float]
    final_comparison: dict[str, Any] | None
    best_ms: float
    best_ms_ci: tuple[float, float]
    verdict: str
    exit_code: int
    met: bool | None
    numerics: str = "exact"
    # Faster candidates the rows could not verify, and how to verify them (None: there are none).
    unverified: dict[str, Any] | None = None


def optimize_report(run: Pipeline, final: FinalFigures) -> dict[str, Any]:
    """The report of a finished run (kind "optimize"), validated by the report writer."""
    from optimize.report import new_report

    section = {
        "partial": False,
        "recipe": run.recipe.to_json(),
        "model_kind": run.model_kind,
        "target": {
            "ms": run.request.target_ms,
            "percentile": run.metric,
            "batch_size": run.input_spec.batch_size,
            "met": final.met,
            "best_ms": final.best_ms,
            "best_ms_ci95": list(final.best_ms_ci),
        },
        "verdict": final.verdict,
        "exit_code": final.exit_code,
        "best": {
            "label": final.best.label,
            "backend": final.best.backend,
            "runtime_config": final.best.runtime_config,
            "precision": final.best.precision,
            "kept_stages": [c["stage"] for c in final.kept_chain],
            "numerics": final.numerics,
        },
        "unverified": final.unverified,
        "speedup": final.speedup,
        "speedup_ci95": list(final.speedup_ci),
        "final_comparison": final.final_comparison,
        "baseline": run.records[0].latency_ms,
        "runtimes": runtime_bests(run.records),
        "stages": [r.to_json() for r in run.records],
        "accuracy": final.accuracy,
        "accuracy_samples": len(run.samples),
        "external_data": run.external_data,
        "artifact": str(run.out_dir),
        "warnings": run.warnings + list(getattr(run.input_spec, "warnings", [])),
        "log": run.logs[-200:],
        "elapsed_s": round(time.monotonic() - run.started, 3),
    }
    settings = {
        "bench": run.settings.to_json(),
        "recipe": run.recipe.name,
        "target_ms": run.request.target_ms,
        "target_percentile": run.metric,
        "quantize": run.request.quantize,
        "time_budget_s": run.request.time_budget_s,
        "stop_at_target": run.request.stop_at_target,
    }
    report = new_report(
        "optimize",
        model_path=run.request.model_path,
        input_spec=run.input_spec.to_json(),
        settings=settings,
    )
    report["results"] = list(run.results)
    report["optimize"] = json_safe(section)
    return report


def runtime_bests(records: list[StageRecord]) -> dict[str, dict[str, Any]]:
    """Per runtime, its fastest accurate candidate of the run (speedup vs the baseline, chained
    through the comparisons that measured it): what each runtime achieved, whichever won."""
    bests: dict[str, dict[str, Any]] = {}
    for record in records:
        accurate_and_timed = record.status in ("kept", "reverted") or (
            record.status == "rejected" and not record.reason.startswith("inaccurate")
        )
        if not accurate_and_timed or record.speedup is None or record.backend is None:
            continue
        if record.speedup > bests.get(record.backend, {}).get("speedup", 0.0):
            bests[record.backend] = {
                "label": record.label,
                "speedup": record.speedup,
                "precision": record.precision,
                "status": record.status,
            }
    return bests


def best_so_far(records: list[StageRecord]) -> dict[str, Any] | None:
    """The best accurate candidate when a run stopped (the last kept one, else the baseline),
    with its figures and how to get it without the rest of the run."""
    from optimize.render.optimize_section import accuracy_cell

    kept = [r for r in records if r.status in ("kept", "baseline")]
    if not kept:
        return None
    best = kept[-1]
    p50 = (best.latency_ms or {}).get("p50")
    figures = ", ".join(
        x
        for x in (
            f"{best.speedup:.2f}x vs the baseline" if best.speedup else "",
            f"p50 {p50:.3f} ms" if p50 is not None else "",
            f"accuracy {accuracy_cell(best.accuracy)}" if best.status == "kept" else "",
        )
        if x
    )
    if best.status == "baseline":
        summary = "no candidate had beaten the original model yet"
    else:
        summary = (
            f"best accurate candidate so far: {best.label} ({figures}); to get it, rerun with "
            f"--stop-at-target or a --time-budget that ends after {best.stage}"
        )
    return {**best.to_json(), "summary": summary}


def write_partial_report(run: Pipeline, exc: BaseException) -> None:
    """Ctrl-C, SIGTERM or a crash: no artifact, but a report of what was done and the best
    candidate so far, beside where the artifact would be."""
    from optimize import interrupts
    from optimize.files import write_json_atomic

    if isinstance(exc, UsageError) and not run.records:
        return  # bad inputs found before the baseline ran: the one-line error says it all
    path = partial_report_path(run.out_dir)
    reason = interrupts.describe(exc) if isinstance(exc, KeyboardInterrupt) else first_line(exc)
    best = best_so_far(run.records)
    section = {
        "partial": True,
        "stopped_by": reason,
        "best_so_far": best,
        "recipe": run.recipe.to_json(),
        "stages": [r.to_json() for r in run.records],
        "warnings": run.warnings,
        "log": run.logs[-200:],
        "elapsed_s": round(time.monotonic() - run.started, 3),
    }
    with contextlib.suppress(Exception):
        from optimize.report import new_report, write_report

        spec = getattr(run, "input_spec", None)
        report = new_report(
            "optimize",
            model_path=run.request.model_path,
            input_spec=spec.to_json() if spec is not None else None,
            settings={"recipe": run.recipe.name, "target_ms": run.request.target_ms},
        )
        report["results"] = list(run.results)
        report["optimize"] = json_safe(section)
        write_report(path, report)
        run.progress.log(f"no artifact written; partial report: {path}")
        if best is not None:
            run.progress.log(best["summary"])
        return
    with contextlib.suppress(Exception):  # the schema or environment failed: keep the facts anyway
        write_json_atomic(path, {"kind": "optimize", "optimize": json_safe(section)})
        run.progress.log(f"no artifact written; partial report: {path}")
