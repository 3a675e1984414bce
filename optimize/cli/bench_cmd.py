"""`lto bench`: parse flags, call optimize.bench.command, show and save the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from optimize.cli.common import (
    DURATION_UNITS_HELP,
    InputDataOption,
    JsonOption,
    ShapeOption,
    console,
    err_console,
    print_json,
)
from optimize.units import duration_parser

EPILOG = """
[bold]Examples[/]

  lto bench sample_models/bert_tiny.onnx --shape sequence=128
  lto bench sample_models/mlp_small.onnx --shape features=1x256
  lto bench sample_models/bert_tiny.onnx --shape sequence=128 --batch 1,8,32
  lto bench sample_models/resnet_tiny.onnx --compare reports/resnet_tiny/   [dim](interleaved A/B)[/]
  lto bench --artifact reports/resnet_tiny/ -o reports/artifact-bench.json
  lto bench model.onnx --input-data inputs.npz --threads 2 --time 30s --ci-target 0.01 --json
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
        None, "--compare", help="Measure against another model/artifact, interleaved."
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="Runtime for a model file (default onnxruntime)."
    ),
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
    min_runs: int = typer.Option(
        20, "--min-runs", min=1, help="Timed runs before the adaptive stop may end it."
    ),
    max_runs: int = typer.Option(5000, "--runs", min=1, help="Most timed runs."),
    max_time: float = typer.Option(
        "10s",
        "--time",
        parser=duration_parser("--time", minimum=0.01),
        metavar="DURATION",
        help=f"Most time of timed runs per measurement: {DURATION_UNITS_HELP}.",
    ),
    ci_target: float = typer.Option(
        0.02,
        "--ci-target",
        min=0.0,
        help="Stop when the median's 95% CI is this narrow (relative); 0 = never.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for generated inputs."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the JSON report here (atomically)."
    ),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the report as Markdown here."),
    json_out: bool = JsonOption,
) -> None:
    """Measure latency percentiles (with CIs), throughput and stability of a model or artifact."""
    from optimize import interrupts
    from optimize.bench import BenchSettings
    from optimize.bench.command import BenchRequest, parse_batches, run_bench, run_compare
    from optimize.env import check_thread_count
    from optimize.errors import UsageError
    from optimize.files import check_output_file, write_markdown_atomic
    from optimize.inputs import parse_shape_args
    from optimize.render.markdown import render_markdown
    from optimize.report import write_report

    if (model is None) == (artifact is None):
        raise UsageError("give a MODEL or --artifact DIR (one of them)", "see lto bench --help")
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
        backend=backend,
        shapes=parse_shape_args(shape),
        input_data=input_data,
        batches=parse_batches(batch),
        seed=seed,
        runtime_overrides=overrides,
        settings=BenchSettings(
            warmup=warmup,
            min_runs=min(min_runs, max_runs),
            max_runs=max_runs,
            max_time_s=max_time,
            target_ci_rel=ci_target or None,
        ),
    )
    runner = run_compare if compare is not None else run_bench
    interrupts.set_activity(f"loading {request.model}")

    def note(label: str, runs: int, elapsed: float) -> None:
        interrupts.set_activity(f"measuring {label} ({runs} runs, {elapsed:.1f} s)")

    if json_out:
        report = runner(request, note)
    else:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        ) as bar:
            task = bar.add_task("loading")

            def tick(label: str, runs: int, elapsed: float) -> None:
                note(label, runs, elapsed)
                bar.update(task, description=f"measuring {label}: {runs} runs, {elapsed:.1f}s")

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
    from optimize.render.terminal import render_measurements

    render_measurements(report, console)
    if output is not None:
        console.print(f"report: {output}")


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EPILOG)(bench)
