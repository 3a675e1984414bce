"""The end of a run of `lto optimize`: the best candidate measured once more against the baseline
in fresh processes (the one figure its row, the baseline's row, the headline and the target verdict
all read), the original shipped when it loses there, the verdict, and the artifact written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimize.accuracy import accuracy_json, numerics
from optimize.artifact import write_artifact
from optimize.bench import Comparison, Measurement, peaks
from optimize.model.inspection import model_flops
from optimize.pipeline import judge
from optimize.pipeline.baseline import Baseline
from optimize.pipeline.evaluate import Evaluator
from optimize.pipeline.record import RunRecord, latency_figures
from optimize.pipeline.request import partial_report_path
from optimize.pipeline.summary import FinalFigures, PipelineResult, final_line, optimize_report
from optimize.render.markdown import render_markdown
from optimize.report import write_report
from optimize.runtimes.registry import BASELINE_RUNTIME
from optimize.stage import Candidate
from optimize.stats import percentile_ci


@dataclass(frozen=True)
class Headline:
    """What ships and its figures: from the final comparison, or the baseline's own measurement
    when the original ships without one."""

    best: Candidate
    kept_chain: list[dict[str, Any]]
    speedup: float = 1.0
    speedup_ci: tuple[float, float] = (1.0, 1.0)
    final_comparison: dict[str, Any] | None = None
    value_ms: float = 0.0
    value_ci: tuple[float, float] = (0.0, 0.0)


def side_interval(comparison: Comparison, side: str, metric: str) -> tuple[float, float]:
    """The 95% interval of side "a" (the baseline) or "b" (the artifact)'s figure in the final
    comparison, from the same pairs as the figure."""
    paired = comparison.paired
    if paired is not None:
        return paired.figure.a_ci95 if side == "a" else paired.figure.b_ci95
    _, lo, hi = percentile_ci((comparison.a if side == "a" else comparison.b).samples_ms, metric)
    return lo, hi


class FinalStep:
    """The end of one run, from its record, its evaluator (the best so far) and its baseline."""

    def __init__(
        self, record: RunRecord, evaluator: Evaluator, baseline: Baseline, machine: peaks.Peaks | None
    ) -> None:
        self.record, self.evaluator, self.baseline, self.machine = record, evaluator, baseline, machine
        self.metric = record.metric

    def headline(self, base_meas: Measurement, max_time_s: float | None) -> Headline:
        """The best so far against the baseline in fresh processes, or the baseline alone when
        nothing beat it."""
        best = self.evaluator.best
        if best.candidate is self.evaluator.original:
            value, lo, hi = percentile_ci(base_meas.samples_ms, self.metric)
            return Headline(best.candidate, [], value_ms=value, value_ci=(lo, hi))
        self.record.status(f"final: {best.candidate.label} against the baseline, fresh processes")
        comparison = self.evaluator.measure_artifact(best.candidate, max_time_s=max_time_s)
        return self._confirmed(comparison)

    def _confirmed(self, comparison: Comparison) -> Headline:
        """The final comparison written into the artifact's row and the baseline's; the original
        ships when the artifact measured slower there (judge.original_wins_final)."""
        record, best = self.record, self.evaluator.best
        label, final = best.candidate.label, comparison.to_json()
        lo, hi = comparison.ratio_ci95
        speedup, speedup_ci = 1.0 / comparison.ratio, (1.0 / hi, 1.0 / lo)
        base_ms, art_ms = comparison.side_ms
        row = best.row
        assert row is not None, "a candidate is kept on a row"
        row.reason = (
            f"{speedup:.2f}x (95% CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}) in the final comparison; "
            f"kept in the search: {row.reason}"
        )
        row.speedup, row.speedup_ci95 = speedup, speedup_ci
        row.latency_ms = latency_figures(comparison.b, self.metric, art_ms)
        row.baseline_ms = base_ms
        row.modes = judge.modes_of(comparison, f"{BASELINE_RUNTIME.title} defaults", label)
        row.details["final"] = final
        base_row = record.records[0]
        base_row.latency_ms = latency_figures(comparison.a, self.metric, base_ms)
        base_row.baseline_ms = base_ms
        base_row.reason = (
            f"original model, {BASELINE_RUNTIME.title} default settings; measured beside the artifact in its "
            "final comparison"
        )
        record.results += [
            {**comparison.a.to_json(), "label": "baseline (final comparison)"},
            {**comparison.b.to_json(), "label": f"{label} (final comparison)"},
        ]
        record.log(final_line(label, self.metric, comparison, speedup, speedup_ci, row.modes))
        if not judge.original_wins_final(comparison):
            art_ci = side_interval(comparison, "b", self.metric)
            return Headline(best.candidate, best.kept_chain, speedup, speedup_ci, final, art_ms, art_ci)
        record.warnings.append(
            f"{label} measured slower than the baseline side by side "
            f"(speedup {speedup:.2f}x, CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}); "
            "the artifact is the original model"
        )
        record.revert_kept(
            f"reverted: side by side with the original, {label} measured "
            f"{speedup:.2f}x (CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f})"
        )
        # the original ships: its figure is the baseline's in the same measurement
        base_ci = side_interval(comparison, "a", self.metric)
        return Headline(
            self.evaluator.original, [], final_comparison=final, value_ms=base_ms, value_ci=base_ci
        )

    def figures(self, headline: Headline) -> FinalFigures:
        """The verdict, the exit code and every figure the report shows of the artifact."""
        record, request = self.record, self.record.request
        best, shipped_original = headline.best, headline.best is self.evaluator.original
        verdict, exit_code, met = judge.target_verdict(headline.value_ms, request.target_ms, self.metric)
        unverified = judge.unverified_faster(record.records, headline.speedup)
        verdict, exit_code = judge.final_exit(
            exit_code, verdict, unverified, target_ms=request.target_ms,
            baseline_ms=(record.records[0].latency_ms or {}).get(self.metric),
            fail_on_unverified=request.fail_on_unverified,
        )  # fmt: skip
        best_numerics = "exact" if shipped_original else self._numerics(best)
        best_accuracy = (
            self.evaluator.reference_accuracy() if shipped_original else self.evaluator.best.accuracy
        )
        return FinalFigures(
            best=best,
            accuracy=self._accuracy_section(accuracy_json(best_accuracy)),
            kept_chain=headline.kept_chain,
            speedup=headline.speedup,
            speedup_ci=headline.speedup_ci,
            final_comparison=headline.final_comparison,
            best_ms=headline.value_ms,
            best_ms_ci=headline.value_ci,
            verdict=verdict,
            exit_code=exit_code,
            met=met,
            numerics=best_numerics,
            unverified=self._unverified_section(unverified),
            time_to_best_s=record.best_at[best.label],
            efficiency=self._efficiency(headline.value_ms, best.precision),
        )

    def write(self, figures: FinalFigures, recipe_name: str) -> PipelineResult:
        """The report and the artifact, written; the partial report of an earlier run removed."""
        record = self.record
        report = optimize_report(record, figures)
        section = report["optimize"]
        record.status(f"writing the artifact to {record.out_dir}")
        write_artifact(
            record.out_dir,
            candidate=figures.best,
            input_spec=self.baseline.input_spec.to_json(),
            outputs=self.baseline.outputs_spec,
            history=[r.to_json() for r in record.records],
            accuracy=section["accuracy"],
            chain_details=figures.kept_chain,
            report=report,
            report_md=render_markdown(report),
            extra={
                "source_model": report["model"],
                "target": section["target"],
                "speedup": figures.speedup,
                "speedup_ci95": list(figures.speedup_ci),
                "recipe": recipe_name,
                "numerics": figures.numerics,
                "lifted": section["best"]["lifted"],
            },
            report_writer=write_report,
            force=record.request.force,
        )
        partial_report_path(record.out_dir).unlink(missing_ok=True)
        return PipelineResult(
            report, record.records, figures.best, figures.exit_code, record.out_dir, figures.verdict
        )

    def _numerics(self, best: Candidate) -> str:
        """The artifact's numerics as its row saw them (pipeline/evaluate.numerics_of)."""
        return next(
            (r.numerics for r in reversed(self.record.records) if r.label == best.label and r.numerics),
            numerics(best.precision, False, False),
        )

    def _accuracy_section(self, accuracy: dict[str, Any]) -> dict[str, Any]:
        """The artifact's accuracy with the thresholds and metrics that judged it, for the report
        and the manifest."""
        baseline = self.baseline
        return {
            **accuracy,
            "thresholds": self.record.recipe.accuracy.to_json(),
            "metrics": {name: choice.to_json() for name, choice in baseline.choices.items()},
            "sample_source": baseline.rows.source,
            "rows": baseline.rows.purposes,
            "evidence": baseline.evidence.to_json(),
        }

    def _efficiency(self, latency_ms: float, precision: str) -> dict[str, Any] | None:
        """The artifact's G ops/s against the machine's measured rate; None where either is unknown
        (rates off, dynamic dims): a figure for the report, never a reason for a run to fail."""
        baseline = self.baseline
        if self.machine is None or baseline.external_data:
            return None
        shapes = {name: tuple(array.shape) for name, array in baseline.feeds.items()}
        try:
            flops = model_flops(baseline.model_path, shapes)
        except Exception:  # an uncountable graph costs the report one line, nothing more
            return None
        return peaks.efficiency(flops, latency_ms, precision, self.machine) if flops else None

    def _unverified_section(self, candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The faster candidates left out, what data would verify them, and the command."""
        if not candidates:
            return None
        evidence = self.baseline.evidence
        return {
            "candidates": candidates,
            "why": evidence.why_not(),
            "needs": evidence.needs(),
            "command": self.record.request.verify_command(),
        }


__all__ = ["FinalStep", "Headline", "side_interval"]
