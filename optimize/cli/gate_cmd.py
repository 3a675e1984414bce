"""`lto gate`: fail CI on a latency regression, and only on a real one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from optimize import gate as g
from optimize.cli.common import (
    DURATION_UNITS_HELP,
    InputDataOption,
    JsonOption,
    ShapeOption,
    console,
    deprecated_alias,
    err_console,
    print_json,
)
from optimize.data import parse_shape_args
from optimize.errors import UsageError
from optimize.files import check_output_file, write_markdown_atomic
from optimize.gate import RerunRequest, gate_rerun, rerun_bench_settings
from optimize.render.markdown import gate_section
from optimize.render.terminal import BudgetProgress, render_gate
from optimize.report import write_report
from optimize.units import duration_parser, percentile_key_parser

if TYPE_CHECKING:
    from optimize.gate import GateResult, GateSettings, RerunRequest

EPILOG = """
[bold]Exit codes[/]: pass 0 · improved 10 · regressed 11 · inconclusive 12 · error 1 · usage 2

Inconclusive = too noisy to decide, or not comparable (other machine, inputs or batch; no baseline).

Two saved reports are compared repetition against repetition: make each with
[bold]lto bench --repeat 5[/] or more (each repetition a fresh process). Fewer repetitions, an
unstable report, or a machine loaded differently during the two reports: inconclusive.

[bold]Examples[/]

  lto bench model.onnx --repeat 10 --time 2s -o main.json   [dim](a report to gate with)[/]
  lto gate --baseline main.json --candidate pr.json --max-regression 5%   [dim](p50, 5% budget)[/]
  lto gate --baseline main.json --candidate pr.json -m p99 --markdown sum.md  [dim](tail, CI summary)[/]
  lto gate --baseline opt.json --candidate opt2.json --label final   [dim](the shipped artifact's row)[/]
  lto gate --baseline-dir .lto-baselines --candidate pr.json --update-baseline  [dim](per machine)[/]
  lto gate --rerun --baseline model.onnx --candidate artifact/ --time 10s --json  [dim](A/B/A/B here)[/]
"""


def register(app: typer.Typer) -> None:
    @app.command("gate", epilog=EPILOG)
    def gate(
        candidate: Path = typer.Option(
            ..., "--candidate", help="Candidate report (.json), or model/artifact with --rerun."
        ),
        baseline: Path | None = typer.Option(
            None, "--baseline", help="Baseline report (.json), or model/artifact with --rerun."
        ),
        baseline_dir: Path | None = typer.Option(
            None,
            "--baseline-dir",
            help="Read the baseline from DIR/<machine fingerprint>/<name>.json instead of --baseline.",
        ),
        name: str | None = typer.Option(
            None, "--name", help="Baseline name under --baseline-dir (default: the model file's stem)."
        ),
        update_baseline: bool = typer.Option(
            False,
            "--update-baseline",
            help="Store the candidate as the baseline when none exists for this machine or it improved.",
        ),
        force_update_baseline: bool = typer.Option(
            False,
            "--force-update-baseline",
            help="Store the candidate as the baseline whatever the verdict (accept a slowdown on purpose).",
        ),
        percentile: str | None = typer.Option(
            None,
            "--percentile",
            parser=percentile_key_parser("--percentile", extra=("throughput",)),
            metavar="PERCENTILE",
            help="What is compared: p50 (default), p90, p95, p99, p99.9 or throughput.",
        ),
        old_metric: str | None = typer.Option(
            None,
            "--metric",
            "-m",
            hidden=True,
            parser=percentile_key_parser("--metric", extra=("throughput",)),
        ),
        max_regression: str = typer.Option(
            "5%", "--max-regression", help="Largest allowed slowdown: 5% or 0.05."
        ),
        min_improvement: str | None = typer.Option(
            None, "--min-improvement", help="Smallest speed-up reported as improved (default: the budget)."
        ),
        alpha: float = typer.Option(0.01, "--alpha", help="Significance level of the Mann-Whitney U test."),
        min_repetitions: int = typer.Option(
            5,
            "--min-repetitions",
            help="Reports: fewest process-level repetitions a side (lto bench --repeat) to decide on.",
        ),
        label: str | None = typer.Option(
            None,
            "--label",
            help="Measurement to use (default: an optimize report's artifact, else 'final', else the last).",
        ),
        baseline_label: str | None = typer.Option(
            None, "--baseline-label", help="Measurement to use in the baseline report (default: --label)."
        ),
        rerun: bool = typer.Option(
            False, "--rerun", help="Measure --baseline and --candidate models interleaved here, then decide."
        ),
        max_time: float = typer.Option(
            "10s",
            "--time",
            parser=duration_parser("--time"),
            metavar="DURATION",
            help=f"--rerun: most time of timed runs per interleaved run: {DURATION_UNITS_HELP}.",
        ),
        no_confirm: bool = typer.Option(
            False, "--no-confirm", help="--rerun: do not confirm a regression with a second run."
        ),
        shape: list[str] = ShapeOption,
        input_data: Path | None = InputDataOption,
        batch: int | None = typer.Option(
            None, "--batch", help="--rerun: batch size for a dynamic batch dim."
        ),
        markdown: Path | None = typer.Option(
            None, "--markdown", help="Write a Markdown summary (e.g. for $GITHUB_STEP_SUMMARY) to FILE."
        ),
        output: Path | None = typer.Option(
            None, "--output", "-o", help="Write the decision as an lto report of kind 'gate' to FILE."
        ),
        as_json: bool = JsonOption,
    ) -> None:
        """Compare latency against a baseline and exit with the verdict's code.

        Reports: a Mann-Whitney U test and a Hodges-Lehmann 95% CI of the ratio over the repetitions.

        --rerun: both measured here, interleaved; the CI resamples whole chunk pairs.

        It fails only when the slowdown is significant and its whole CI lies beyond --max-regression.

        A noisy comparison is "inconclusive", never "regressed"; with --rerun a regression must show twice.
        """

        metric = deprecated_alias(percentile, old_metric, "--percentile", "--metric") or "p50"
        settings = g.GateSettings(
            metric=metric,
            max_regression=g.parse_fraction(max_regression),
            min_improvement=(
                g.parse_fraction(min_improvement, "--min-improvement")
                if min_improvement is not None
                else None
            ),
            alpha=alpha,
            min_repetitions=min_repetitions,
        )
        for path, flag in ((markdown, "--markdown"), (output, "-o")):
            check_output_file(path, flag=flag, inputs=(baseline, candidate))
        source_report = None
        if rerun:
            if baseline is None or baseline_dir is not None:
                raise UsageError("--rerun needs --baseline MODEL (a model or artifact, not --baseline-dir)")
            if update_baseline or force_update_baseline or name or label or baseline_label:
                raise UsageError(
                    "--update-baseline, --name and --label apply to reports, not to --rerun",
                    "--rerun measures both models now; store a report from `lto bench` as a baseline instead",
                )
            request = _rerun_request(baseline, candidate, shape, input_data, batch, max_time, not no_confirm)
            result, source_report = _run_with_progress(request, settings, quiet=as_json)
        else:
            if shape or input_data is not None or batch is not None:
                raise UsageError("--shape, --input-data and --batch apply to --rerun only")
            result = g.gate_reports(
                candidate,
                baseline_file=baseline,
                baseline_dir=baseline_dir,
                name=name,
                label=label,
                baseline_label=baseline_label,
                settings=settings,
                update_baseline=update_baseline,
                force_update_baseline=force_update_baseline,
            )
        if markdown is not None:
            write_markdown_atomic(markdown, gate_section(result.to_json()))
        if output is not None:
            write_report(output, g.gate_report(result, source_report))
        if as_json:
            print_json(result.to_json())
        else:
            render_gate(result.to_json(), console)
        raise typer.Exit(result.exit_code)


def _rerun_request(
    baseline: Path,
    candidate: Path,
    shape: list[str],
    input_data: Path | None,
    batch: int | None,
    max_time: float,
    confirm: bool,
) -> RerunRequest:

    if max_time <= 0:
        raise UsageError("--time must be more than 0 seconds")
    if batch is not None and batch < 1:
        raise UsageError("--batch must be at least 1")
    return RerunRequest(
        baseline=baseline,
        candidate=candidate,
        shapes=parse_shape_args(shape),
        input_data=input_data,
        batch=batch,
        bench=rerun_bench_settings(max_time),
        confirm=confirm,
    )


def _run_with_progress(
    request: RerunRequest, settings: GateSettings, quiet: bool
) -> tuple[GateResult, dict[str, Any]]:

    # Each interleaved run takes at most --time; a regression is confirmed by a second one.
    budget = request.bench.max_time_s * (2 if request.confirm else 1)
    with BudgetProgress(err_console, total_s=budget, quiet=quiet) as progress:

        def tick(what: str, runs: int, elapsed: float) -> None:
            progress.update(f"interleaved A/B {what}", runs, elapsed)

        return gate_rerun(request, settings, tick)
