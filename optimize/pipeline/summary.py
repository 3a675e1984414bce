"""What a run of `lto optimize` hands back: the report assembled from the run's record, and the
partial report of a run that stopped early.

Nothing here measures or decides, and nothing reads the running pipeline: the report is built
from the `RunRecord` (optimize/pipeline/record.py) and the final figures alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimize.bench import Comparison
from optimize.errors import UsageError, first_line
from optimize.files import write_json_atomic
from optimize.pipeline.record import RunRecord, StageRecord, json_safe
from optimize.pipeline.request import partial_report_path
from optimize.render.optimize_section import accuracy_cell
from optimize.report import new_report, write_report
from optimize.stage import Candidate, Status
from optimize.system import interrupts


@dataclass
class PipelineResult:
    report: dict[str, Any]
    records: list[StageRecord]
    best: Candidate
    exit_code: int
    artifact_dir: Path
    verdict: str


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
    # Seconds from the start of the run until the artifact's candidate became the best.
    time_to_best_s: float = 0.0
    # The artifact's arithmetic rate against this machine's measured one (bench.peaks.efficiency).
    efficiency: dict[str, Any] | None = None


def final_line(
    label: str,
    metric: str,
    comparison: Comparison,
    speedup: float,
    speedup_ci: tuple[float, float],
    modes: dict[str, Any] | None,
) -> str:
    """The log line of the artifact's final comparison: the figures every report then shows."""
    base_ms, art_ms = comparison.side_ms
    paired = comparison.paired
    pairs = f"{paired.figure.pairs} block pairs in " if paired is not None else ""
    sets = len(paired.overall.groups) if paired is not None else 1
    line = (
        f"final: {label} against ONNX Runtime defaults, {pairs}{sets} fresh pair(s) of processes: "
        f"{metric} {art_ms:.3f} ms vs {base_ms:.3f} ms, {speedup:.2f}x "
        f"(95% CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}); the table and the reports show this measurement"
    )
    if modes:
        line += f"; {modes['sentence']}"
    return line


def optimize_report(run: RunRecord, final: FinalFigures) -> dict[str, Any]:
    """The report of a finished run (kind "optimize"), validated by the report writer."""
    assert run.input_spec is not None, "a finished run resolved its inputs"
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
            # Nodes kept above the artifact's main precision, each with the one it runs at.
            "lifted": list(final.best.details.get("lifted") or []),
        },
        "unverified": final.unverified,
        "efficiency": final.efficiency,
        "speedup": final.speedup,
        "speedup_ci95": list(final.speedup_ci),
        "final_comparison": final.final_comparison,
        "baseline": run.records[0].latency_ms,
        "runtimes": runtime_bests(run.records),
        "stages": [r.to_json() for r in run.records],
        "accuracy": final.accuracy,
        "accuracy_samples": run.accuracy_samples,
        "external_data": run.external_data,
        "artifact": str(run.out_dir),
        "warnings": run.all_warnings(),
        "log": run.logs[-200:],
        "elapsed_s": run.elapsed_s(),
        "over_budget": _over_budget(run),
        "time_to_best_s": final.time_to_best_s,
        "search": run.search,
        "stage_seconds": {name: round(s, 3) for name, s in run.stage_seconds.items()},
    }
    settings = {
        "bench": run.bench_settings,
        "recipe": run.recipe.name,
        "target_ms": run.request.target_ms,
        "target_percentile": run.metric,
        "quantize": run.request.quantize,
        "time_budget_s": run.request.time_budget_s,
        "time_budget_default": run.request.default_budget,
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


def _over_budget(run: RunRecord) -> dict[str, Any] | None:
    """How far past the --time-budget the run ended, and the step that was running then."""
    budget = run.request.time_budget_s
    if not budget:
        return None
    over = run.elapsed_s() - budget
    if over <= 0:
        return None
    return {"seconds": round(over, 3), "step": run.over_budget_step}


def runtime_bests(records: list[StageRecord]) -> dict[str, dict[str, Any]]:
    """Per runtime, its fastest accurate candidate of the run (speedup vs the baseline, chained
    through the comparisons that measured it): what each runtime achieved, whichever won."""
    bests: dict[str, dict[str, Any]] = {}
    for record in records:
        accurate_and_timed = record.status in (Status.KEPT, Status.REVERTED) or (
            record.status == Status.REJECTED and not record.inaccurate
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
    kept = [r for r in records if r.status in (Status.KEPT, Status.BASELINE)]
    if not kept:
        return None
    best = kept[-1]
    p50 = (best.latency_ms or {}).get("p50")
    figures = ", ".join(
        x
        for x in (
            f"{best.speedup:.2f}x vs the baseline" if best.speedup else "",
            f"p50 {p50:.3f} ms" if p50 is not None else "",
            f"accuracy {accuracy_cell(best.accuracy)}" if best.status == Status.KEPT else "",
        )
        if x
    )
    if best.status == Status.BASELINE:
        summary = "no candidate had beaten the original model yet"
    else:
        summary = (
            f"best accurate candidate so far: {best.label} ({figures}); to get it, rerun with "
            f"--stop-at-target or a --time-budget that ends after {best.stage}"
        )
    return {**best.to_json(), "summary": summary}


def write_partial_report(run: RunRecord, exc: BaseException) -> None:
    """Ctrl-C, SIGTERM or a crash: no artifact, but a report of what was done and the best
    candidate so far, beside where the artifact would be."""
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
        "elapsed_s": run.elapsed_s(),
    }
    with contextlib.suppress(Exception):
        report = new_report(
            "optimize",
            model_path=run.request.model_path,
            input_spec=run.input_spec.to_json() if run.input_spec is not None else None,
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


__all__ = [
    "FinalFigures",
    "PipelineResult",
    "StageRecord",
    "best_so_far",
    "final_line",
    "optimize_report",
    "runtime_bests",
    "write_partial_report",
]
