"""`lto bench`: parse flags, call optimize.bench.command, show and save the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from optimize.bench import BenchSettings
from optimize.bench.apart import PROCESS_SETS
from optimize.bench.command import BenchRequest, parse_batches, run_bench, run_compare
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
from optimize.model.runtime_model import BASELINE_BACKEND
from optimize.render.markdown import render_markdown
from optimize.render.terminal import BudgetProgress, render_measurements
from optimize.report import write_report
from optimize.system import interrupts
from optimize.system.env import check_thread_count
from optimize.units import duration_parser

EPILOG = """
[bold]Examples[/]

  lto bench sample_models/bert_tiny.onnx --shape sequence=128
  lto bench sample_models/mlp_small.onnx --shape features=1x256
  lto bench sample_models/bert_tiny.onnx --shape sequence=128 --batch 1,8,32
  lto bench sample_models/resnet_tiny.onnx --compare reports/resnet_tiny/   [dim](interleaved A/B)[/]
  lto bench --artifact reports/resnet_tiny/ -o reports/artifact-bench.json
  lto bench model.onnx --input-data inputs.npz --threads 2 --time 30s --ci-target 0.01 --json
  lto bench model.onnx --repeat 10 --time 2s -o main.json   [dim](a baseline for lto gate)[/]
  lto bench model.onnx --min-runs 3688 --time 5m   [dim](enough runs for a p99.9)[/]

--time and --runs are maxima (the run also ends once the median's CI is narrow enough);
--min-runs and --min-time are minima and win over them.
"""


def bench(
    model: Path | None = typer.Argument(
        None, help="ONNX model file, or an artifact directory.", show_default=False
    ),
    artifact: Path | None = typer.Option(
        None, "--artifact", help="Artifact directory written by `lto optimize`."
    ),
    shape: list[str] = ShapeOption,
    input_data: Path | None = InputDataOption,
    batch: str | None = typer.Option(
        None, "--batch", "-b", help="Batch size(s) for a dynamic leading dim: 1 or 1,8,32 (default 1)."
    ),
    compare: Path | None = typer.Option(
        None,
        "--compare",
        help="Measure against another model/artifact: each in its own process, alternated in blocks.",
    ),
    runtime: str | None = typer.Option(
        None, "--runtime", help=f"Runtime for a model file (default {BASELINE_BACKEND})."
    ),
    old_backend: str | None = typer.Option(None, "--backend", hidden=True),
    threads: int | None = typer.Option(
        None, "--threads", help="Intra-op threads (ORT; 0 = runtime default; at most 4x the logical cores)."
    ),
    inter_threads: int | None = typer.Option(
        None, "--inter-threads", help="Inter-op threads (ORT; at most 4x the logical cores)."
    ),
    opt_level: str | None = typer.Option(
        None, "--opt-level", help="ORT graph level: disable|basic|extended|layout|all."
    ),
    spin: bool | None = typer.Option(
        None, "--spin/--no-spin", help="ORT thread spinning (on trades CPU for latency)."
    ),
    warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed runs first."),
    min_runs: int | None = typer.Option(
        None,
        "--min-runs",
        min=1,
        help="At least this many timed runs, whatever --time and the CI say (default 20, or --runs if "
        "fewer; p99 needs 368, p99.9 3688).",
        show_default=False,
    ),
    max_runs: int = typer.Option(
        5000, "--runs", min=1, help="At most this many timed runs (a maximum, unless a minimum needs more)."
    ),
    max_time: float = typer.Option(
        "10s",
        "--time",
        parser=duration_parser("--time", minimum=0.01),
        metavar="DURATION",
        help="At most this much time of timed runs per measurement (a maximum: the run ends earlier "
        f"at --runs or once the median's CI is within --ci-target): {DURATION_UNITS_HELP}.",
    ),
    min_time: float = typer.Option(
        "0s",
        "--min-time",
        parser=duration_parser("--min-time", minimum=0.0),
        metavar="DURATION",
        help="At least this much time of timed runs per measurement, whatever --runs and the CI say.",
    ),
    ci_target: float | None = typer.Option(
        None,
        "--ci-target",
        min=0.0,
        help="Stop when the median's 95% CI is this narrow (relative); 0 = never. Default 0.02, "
        "and never with --repeat (each repetition then spends its --time).",
        show_default=False,
    ),
    repeat: int = typer.Option(
        1,
        "--repeat",
        min=1,
        help="Independent measurements, each in a fresh process: a report for `lto gate` needs at least "
        "5 (the gate compares the repetitions, since runs inside one process are not independent).",
    ),
    process_sets: int = typer.Option(
        PROCESS_SETS,
        "--process-sets",
        min=1,
        help="With --compare: fresh pairs of worker processes the comparison is pooled over, --time "
        "shared among them (as lto optimize measures its artifact).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for generated inputs."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the JSON report here (atomically)."
    ),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the report as Markdown here."),
    json_out: bool = JsonOption,
) -> None:
    """Measure latency percentiles (with CIs), throughput and stability of a model or artifact."""

    if (model is None) == (artifact is None):
        raise UsageError("give a MODEL or --artifact DIR (one of them)", "see lto bench --help")
    if min_runs is not None and min_runs > max_runs:
        raise UsageError(f"--min-runs {min_runs} is more than --runs {max_runs}", "raise --runs")
    if min_time > max_time:
        raise UsageError(f"--min-time {min_time:g}s is more than --time {max_time:g}s", "raise --time")
    check_output_file(output, flag="-o")
    check_output_file(markdown, flag="--markdown")
    # Before any work: a typo such as --threads 100000 would start that many threads.
    for flag, count in (("--threads", threads), ("--inter-threads", inter_threads)):
        if count is not None:
            check_thread_count(count, flag)
    overrides: dict[str, Any] = {}
    for key, value in (
        ("intra_op_num_threads", threads),
        ("inter_op_num_threads", inter_threads),
        ("graph_optimization_level", opt_level),
        ("allow_spinning", spin),
    ):
        if value is not None:
            overrides[key] = value
    request = BenchRequest(
        model=model or artifact,  # type: ignore[arg-type]
        compare_with=compare,
        backend=deprecated_alias(runtime, old_backend, "--runtime", "--backend"),
        shapes=parse_shape_args(shape),
        input_data=input_data,
        batches=parse_batches(batch),
        seed=seed,
        runtime_overrides=overrides,
        settings=BenchSettings(
            warmup=warmup,
            min_runs=min(20, max_runs) if min_runs is None else min_runs,
            max_runs=max_runs,
            max_time_s=max_time,
            min_time_s=min_time,
            # Repetitions exist for the variation between processes: each spends its --time
            # rather than stopping on its own median's CI, unless asked to.
            target_ci_rel=(None if repeat > 1 else 0.02) if ci_target is None else (ci_target or None),
        ),
        repeat=repeat,
        process_sets=process_sets,
    )
    runner = run_compare if compare is not None else run_bench
    interrupts.set_activity(f"loading {request.model}")

    def note(label: str, runs: int, elapsed: float) -> None:
        interrupts.set_activity(f"measuring {label} ({runs} runs, {elapsed:.1f} s)")

    if json_out:
        report = runner(request, note)
    else:
        # The budget is known: each measurement (and repetition) takes at most --time (plus a
        # process start per repetition), so the bar shows an ETA against that maximum.
        measurements = max(1, len(request.batches)) * repeat
        with BudgetProgress(err_console, total_s=measurements * max(max_time, min_time)) as bar:

            def tick(label: str, runs: int, elapsed: float) -> None:
                note(label, runs, elapsed)
                bar.update(label, runs, elapsed)

            report = runner(request, tick)
    from rich.markup import escape

    # On stderr in every mode: --json keeps stdout for the report, which also lists them.
    for warning in report.get("warnings", []):
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if output is not None:
        write_report(output, report)
    if markdown is not None:
        write_markdown_atomic(markdown, render_markdown(report))
    if json_out:
        print_json(report)
        return

    render_measurements(report, console)
    if output is not None:
        console.print(f"report: {output}")


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EPILOG)(bench)
