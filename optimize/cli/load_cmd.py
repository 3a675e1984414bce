"""`lto load`: parse flags, drive a server (or an in-process batcher) with load, report the verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from optimize.cli.common import (
    InputDataOption,
    JsonOption,
    ShapeOption,
    console,
    deprecated_alias,
    err_console,
    print_json,
)
from optimize.cli.serve_cmd import (
    InstancesOption,
    MaxBatchOption,
    MaxQueueOption,
    MaxWaitOption,
    OldReportOption,
    TargetLatencyOption,
    duration_option,
    percentile_option,
)
from optimize.data import parse_shape_args
from optimize.errors import UsageError
from optimize.files import check_output_file
from optimize.render.terminal import render_load
from optimize.report import write_report
from optimize.serve.app import EXIT_SLO_MISSED, LoadOptions, run_load_command
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.loadgen import LoadSettings

EPILOG = """
[bold]Examples[/]

  lto load http://127.0.0.1:8000 --qps 200 --duration 30s --slo-ms 10   [dim](open-loop Poisson, p99 SLO)[/]
  lto load http://127.0.0.1:8000 --model bert_tiny --shape sequence=128 --concurrency 8 --requests 5000
  lto load http://127.0.0.1:8000 --find-max-qps --slo-ms 5 --percentile p99 -o load.json
  lto load --artifact out/bert/ --qps 500 --requests 5000 --slo-ms 20          [dim](in-process, no HTTP)[/]
  lto load sample_models/mlp_small.onnx --concurrency 16 --requests 2000 --json

  lto load http://127.0.0.1:8000 --qps 200 --slo-ms 15 --floor out/model/   [dim](with the floor beside it)[/]
  lto load --artifact out/model/ --search-config --slo-ms 15 --duration 5s
      [dim](serves each configuration, keeps the one that carries the most within the SLO)[/]

MLPerf LoadGen schedules the load and judges the run: Server scenario for --qps (Poisson arrivals,
each latency from its scheduled arrival, so queueing is never hidden), SingleStream for one query
at a time, Offline with --offline; its verdict (VALID: long enough, enough queries, the percentile
and its early-stopping estimate within --slo-ms) is part of the pass. --concurrency N > 1 has no
LoadGen scenario and runs lto's own closed loop; --scheduler lto runs lto's loop for all.
A run lasts --duration (30s, 2m) and at least --min-queries requests (default: ten beyond the
percentile, 1000 for p99), or exactly --requests.
The floor: the same model in this process behind one worker that batches whatever has arrived,
no HTTP, at the same load, printed beside the target's figures with the model's batch-1
throughput alone (in-process targets always; a server with --floor MODEL).
Exit code: 0 the SLO verdict passes, 1 it does not, 2 bad usage, 3 the server cannot be reached.
"""


def load(
    target: str | None = typer.Argument(
        None, help="Server URL (http://HOST:PORT), or an ONNX model to drive in-process.", show_default=False
    ),
    artifact: Path | None = typer.Option(None, "--artifact", help="Drive an artifact in-process (no HTTP)."),
    model: str | None = typer.Option(
        None, "--model", help="Model name on the server (default: the one it serves)."
    ),
    qps: float | None = typer.Option(
        None, "--qps", help="Open-loop Poisson arrival rate (LoadGen Server scenario)."
    ),
    concurrency: int = typer.Option(
        1, "--concurrency", "-c", min=1, help="Closed loop: requests kept in flight."
    ),
    duration: float = duration_option("How long to load (and --min-queries at least)"),
    requests: int | None = typer.Option(None, "--requests", "-n", min=1, help="Exactly this many requests."),
    min_queries: int | None = typer.Option(
        None, "--min-queries", min=1, help="Least requests in a --duration run."
    ),
    warmup: int = typer.Option(20, "--warmup", min=0, help="Requests sent first and not counted."),
    slo_ms: float | None = typer.Option(None, "--slo-ms", help="Latency objective in ms at --percentile."),
    percentile: float = percentile_option("Percentile the SLO applies to"),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", min=0.0, max=1.0, help="Errors allowed."),
    find_max: bool = typer.Option(
        False, "--find-max-qps", help="Search the highest rate whose latency meets the SLO."
    ),
    shape: list[str] = ShapeOption,
    input_data: Path | None = InputDataOption,
    seed: int = typer.Option(0, "--seed", help="Seed for arrivals and generated inputs."),
    max_batch: int = MaxBatchOption,
    max_wait_ms: float = MaxWaitOption,
    target_latency_ms: float = TargetLatencyOption,
    max_queue: int = MaxQueueOption,
    instances: int = InstancesOption,
    scheduler: str = typer.Option(
        "loadgen",
        "--scheduler",
        help="loadgen: MLPerf LoadGen schedules and judges (Server for --qps, "
        "SingleStream for -c 1); lto: lto's own loop.",
        case_sensitive=False,
    ),
    offline: bool = typer.Option(
        False, "--offline", help="LoadGen's Offline scenario: every query at once (in-process only)."
    ),
    loadgen_log: Path | None = typer.Option(None, "--loadgen-log", help="Keep LoadGen's own logs in DIR."),
    floor: Path | None = typer.Option(
        None,
        "--floor",
        help="For a server: the model or artifact it serves, run in this process "
        "behind one greedy worker at the same load (the floor; in-process targets get it anyway).",
    ),
    no_floor: bool = typer.Option(False, "--no-floor", help="Do not measure the floor."),
    search_config: bool = typer.Option(
        False,
        "--search-config",
        help="Serve the artifact with each batching/instance configuration, "
        "search each one's highest rate within --slo-ms, keep the best in DIR/serving.json "
        "(lto serve --artifact DIR then uses it).",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the JSON report (kind load) here."
    ),
    old_report: Path | None = OldReportOption,
    json_out: bool = JsonOption,
) -> None:
    """Validate a server or artifact under load: latency percentiles, throughput, errors, SLO verdict."""

    if (target is None) == (artifact is None):
        raise UsageError("give a URL, a MODEL.onnx or --artifact DIR (one of them)", "see lto load --help")
    if target is not None and looks_like_host_port(target):
        raise UsageError(
            f"{target} is not a file; it looks like a server address", f"write it as a URL: http://{target}"
        )
    report = deprecated_alias(output, old_report, "--output", "--report")
    check_output_file(report, flag="-o")
    options = LoadOptions(
        LoadSettings(qps=qps, concurrency=concurrency, duration_s=duration, requests=requests,
                     min_queries=min_queries, warmup=warmup, slo_ms=slo_ms, percentile=percentile,
                     max_error_rate=max_error_rate, seed=seed),
        find_max_qps=find_max,
        report=report,
        scheduler=_scheduler(scheduler),
        offline=offline,
        loadgen_log=loadgen_log,
        floor=not no_floor,
        floor_model=floor,
        search_config=search_config,
    )  # fmt: skip
    config = BatcherConfig(max_batch=max_batch, max_wait_ms=max_wait_ms, target_latency_ms=target_latency_ms,
                           max_queue=max_queue, instances=instances)  # fmt: skip
    quiet = console if not json_out else err_console

    def step(line: str) -> None:
        err_console.print(f"[dim]{line}[/]", highlight=False)

    with err_console.status("running load", spinner="dots"):
        result = run_load_command(
            target, artifact, model_name=model, shapes=parse_shape_args(shape), input_data=input_data,
            options=options, batcher_config=config, console=quiet, progress=step,
        )  # fmt: skip
    if report is not None:
        write_report(report, result)
    if json_out:
        print_json(result)
    else:
        render_load(result, console)
        if report is not None:
            console.print(f"report: {report}")
    if not result["load"]["verdict"]["passed"]:
        raise typer.Exit(EXIT_SLO_MISSED)


def _scheduler(name: str) -> str:
    if name.lower() not in ("loadgen", "lto"):
        raise UsageError(f"--scheduler {name}: not a scheduler", "choose loadgen or lto")
    return name.lower()


def looks_like_host_port(target: str) -> bool:
    """`localhost:8000`, `10.0.0.5:8000`, `[::1]:8000`: a server address without its scheme (and
    no file of that name)."""
    import re

    if Path(target).exists() or "://" in target:
        return False
    return re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}(/.*)?", target) is not None


def register(app: typer.Typer) -> None:
    app.command("load", epilog=EPILOG)(load)
