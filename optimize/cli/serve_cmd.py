"""`lto serve`: parse flags, then serve a model over KServe v2 HTTP with dynamic batching."""

from __future__ import annotations

from pathlib import Path

import typer

from optimize.cli.common import (
    DURATION_UNITS_HELP,
    PERCENTILE_UNITS_HELP,
    ShapeOption,
    console,
    deprecated_alias,
    given_on_command_line,
)
from optimize.data import parse_shape_args
from optimize.errors import UsageError
from optimize.files import check_output_file
from optimize.serve.app import LoadOptions, run_serve
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.config_search import searched_defaults
from optimize.serve.loadgen import LoadSettings
from optimize.serve.server import ServerConfig
from optimize.system.env import machine_fingerprint
from optimize.units import duration_parser, percentile_parser

EPILOG = """
[bold]Examples[/]

  lto serve sample_models/mlp_small.onnx          [dim](http://127.0.0.1:8000, model "mlp_small")[/]
  lto serve --artifact out/bert/ --target-latency-ms 20 --max-batch 16
  lto serve sample_models/bert_tiny.onnx --shape sequence=128 --max-wait-ms 1 --port 9000
  lto serve --artifact out/bert/ --validate --qps 200 --requests 4000 --slo-ms 15
      [dim](for CI: serves, runs lto load against itself, exit code = the SLO verdict)[/]
  lto serve sample_models/mlp_small.onnx --validate --find-max-qps --slo-ms 5 -o load.json

Protocol: KServe v2 / Open Inference Protocol (tritonclient.http, KServe SDKs, curl work):
  GET /v2/health/live | /v2/health/ready | /v2 | /v2/models/NAME | /v2/models/NAME/ready | /metrics
  POST /v2/models/NAME/infer   (JSON tensors or the binary tensor data extension)
Answers: 400 bad input (names the input), 408 request not sent in time (or too
slowly), 413 body or JSON too large, 414/431 request line or header fields too
large, 503 overloaded (Retry-After; on the head when the server is full),
504 deadline missed: only requests with a deadline (`deadline_ms`, Triton's
`timeout` in us, or --queue-timeout-ms) get it; one that the queue ahead would
make miss its deadline gets 503 at once. --target-latency-ms steers batch
sizes; it never rejects a request.
SIGTERM or Ctrl-C drains: everything accepted is answered, then the process exits.
"""

LIMITS = "HTTP limits (what one client may cost; docs/serving-limits.md)"
# The flags `lto load --search-config` searches (their parameter names); the search's values stand in
# for those not given.
SEARCHED = ("max_batch", "max_wait_ms", "instances", "threads", "busy_poll_us")
MIB = 1024 * 1024

# Batching options, shared with `lto load --artifact` (in-process runs use the same batcher).
MaxBatchOption = typer.Option(32, "--max-batch", min=1, help="Most rows in one model call.")
MaxWaitOption = typer.Option(
    1.0, "--max-wait-ms", min=0.0, help="Longest a request waits for others to join its batch."
)
TargetLatencyOption = typer.Option(
    50.0, "--target-latency-ms", min=0.001, help="Latency batch sizes aim for; never rejects a request."
)
QueueTimeoutOption = typer.Option(
    None, "--queue-timeout-ms", min=0.001, help="Deadline for requests that bring none (default: none)."
)
MaxQueueOption = typer.Option(
    256, "--max-queue", min=1, help="Rows waiting beyond which requests are shed (503)."
)
InstancesOption = typer.Option(1, "--instances", min=1, help="Model instances, each with its own thread.")

# Load options, shared with `lto load` (--validate runs it).
# `--report` was the old name of --output (-o): hidden, it still works, with a warning.
OldReportOption = typer.Option(None, "--report", hidden=True)


def duration_option(help_text: str) -> typer.models.OptionInfo:
    return typer.Option(
        "10s",
        "--duration",
        parser=duration_parser("--duration", minimum=0.01),
        metavar="DURATION",
        help=f"{help_text}: {DURATION_UNITS_HELP}.",
    )


def percentile_option(help_text: str) -> typer.models.OptionInfo:
    return typer.Option(
        "p99",
        "--percentile",
        parser=percentile_parser("--percentile"),
        metavar="PERCENTILE",
        help=f"{help_text}: {PERCENTILE_UNITS_HELP}.",
    )


def serve(
    ctx: typer.Context,
    model: Path | None = typer.Argument(
        None, help="ONNX model file (run with ONNX Runtime).", show_default=False
    ),
    artifact: Path | None = typer.Option(
        None, "--artifact", help="Artifact directory written by `lto optimize`."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Model name in URLs (default: file or directory name)."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; 0.0.0.0 exposes it to the network."
    ),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port (0 picks a free one)."),
    max_batch: int = MaxBatchOption,
    max_wait_ms: float = MaxWaitOption,
    target_latency_ms: float = TargetLatencyOption,
    max_queue: int = MaxQueueOption,
    instances: int = InstancesOption,
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="Threads per instance, ONNX Runtime or OpenVINO (default: cores/N)."
    ),
    queue_timeout_ms: float | None = QueueTimeoutOption,
    max_inflight: int = typer.Option(
        256,
        "--max-inflight",
        min=1,
        help="Whole requests in flight beyond which new ones get 503.",
        rich_help_panel=LIMITS,
    ),
    max_body_mb: float = typer.Option(
        64.0, "--max-body-mb", min=0.001, help="Largest request body: 413.", rich_help_panel=LIMITS
    ),
    max_json_mb: float = typer.Option(
        8.0,
        "--max-json-mb",
        min=0.001,
        rich_help_panel=LIMITS,
        help="Largest JSON text in a request (decoding costs ~17x it): 413. Binary tensors: --max-body-mb.",
    ),
    max_inflight_mb: float = typer.Option(
        256.0,
        "--max-inflight-mb",
        min=0.001,
        rich_help_panel=LIMITS,
        help="Body bytes held (charged as they arrive) beyond which: 503.",
    ),
    max_client_mb: float = typer.Option(
        128.0,
        "--max-client-mb",
        min=0.001,
        rich_help_panel=LIMITS,
        help="... per client address.",
    ),
    max_head_kb: float = typer.Option(
        64.0,
        "--max-head-kb",
        min=1.0,
        rich_help_panel=LIMITS,
        help="Request line + header fields, wire bytes: 431 (414 for the request line).",
    ),
    max_header_fields: int = typer.Option(
        100,
        "--max-header-fields",
        min=1,
        rich_help_panel=LIMITS,
        help="Header fields in a request (and trailer fields): 431.",
    ),
    max_chunk_ext_kb: float = typer.Option(
        16.0,
        "--max-chunk-ext-kb",
        min=0.001,
        rich_help_panel=LIMITS,
        help="Chunk extensions over a chunked body, wire bytes: 413 (Node's cap, CVE-2024-22019).",
    ),
    read_timeout_s: float = typer.Option(
        30.0,
        "--read-timeout-s",
        min=0.001,
        rich_help_panel=LIMITS,
        help="A request not whole this long after its first byte: 408, closed.",
    ),
    min_body_rate_kb: float = typer.Option(
        1.0,
        "--min-body-rate-kb",
        min=0.0,
        rich_help_panel=LIMITS,
        help="A body arriving slower than this (KiB/s over 5 s): 408, closed. 0: off.",
    ),
    send_timeout_s: float = typer.Option(
        30.0,
        "--send-timeout-s",
        min=0.001,
        rich_help_panel=LIMITS,
        help="Answer bytes a client does not read for this long: connection aborted.",
    ),
    max_connections: int = typer.Option(
        1024,
        "--max-connections",
        min=1,
        rich_help_panel=LIMITS,
        help="Open connections beyond which new ones get 503 and are closed.",
    ),
    max_client_connections: int = typer.Option(
        512,
        "--max-client-conns",
        min=1,
        rich_help_panel=LIMITS,
        help="... per client address (behind a proxy, all clients are one).",
    ),
    first_request_timeout_s: float = typer.Option(
        10.0,
        "--header-timeout-s",
        min=0.001,
        rich_help_panel=LIMITS,
        help="A new connection without a whole request head this long: closed.",
    ),
    keepalive_s: float = typer.Option(
        75.0,
        "--keepalive-s",
        min=0.001,
        rich_help_panel=LIMITS,
        help="An idle keep-alive connection is closed after this long.",
    ),
    busy_poll_us: float = typer.Option(
        300.0,
        "--busy-poll-us",
        min=0.0,
        help="When idle, poll this long before sleeping, while that catches requests (0: never; Linux only).",
    ),
    shape: list[str] = ShapeOption,
    validate: bool = typer.Option(
        False, "--validate", help="Run `lto load` against the server, exit with its verdict."
    ),
    qps: float | None = typer.Option(None, "--qps", help="--validate: open-loop Poisson rate."),
    concurrency: int = typer.Option(
        1, "--concurrency", min=1, help="--validate: closed-loop requests in flight."
    ),
    duration: float = duration_option("--validate: how long to load"),
    requests: int | None = typer.Option(None, "--requests", min=1, help="--validate: exact request count."),
    slo_ms: float | None = typer.Option(None, "--slo-ms", help="--validate: latency SLO in ms."),
    percentile: float = percentile_option("--validate: percentile the SLO applies to"),
    find_max: bool = typer.Option(
        False, "--find-max-qps", help="--validate: search the highest rate within the SLO."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="--validate: write the load report (JSON) here."
    ),
    old_report: Path | None = OldReportOption,
) -> None:
    """Serve a model or artifact over HTTP (KServe v2) with deadline-aware dynamic batching."""

    if (model is None) == (artifact is None):
        raise UsageError("give a MODEL.onnx or --artifact DIR (one of them)", "see lto serve --help")
    report = deprecated_alias(output, old_report, "--output", "--report")
    check_output_file(report, flag="-o")
    load_options = None
    if validate:
        load_options = LoadOptions(
            LoadSettings(qps=qps, concurrency=concurrency, duration_s=duration, requests=requests,
                         slo_ms=slo_ms, percentile=percentile),
            find_max_qps=find_max,
            report=report,
        )  # fmt: skip
        load_options.settings.validate()
    elif any(v is not None for v in (qps, requests, slo_ms, report)) or find_max:
        raise UsageError(
            "--qps/--requests/--slo-ms/--find-max-qps/--output apply to --validate", "add --validate"
        )
    server_config = ServerConfig(host=host, port=port, model_name=name or "", max_inflight=max_inflight,
                     max_json_bytes=int(max_json_mb * MIB), busy_poll_us=busy_poll_us,
                     max_body_bytes=int(max_body_mb * MIB), max_inflight_bytes=int(max_inflight_mb * MIB),
                     max_client_bytes=int(max_client_mb * MIB), read_timeout_s=read_timeout_s,
                     min_body_rate=min_body_rate_kb * 1024, max_head_bytes=int(max_head_kb * 1024),
                     max_header_fields=max_header_fields, send_timeout_s=send_timeout_s,
                     max_chunk_ext_bytes=int(max_chunk_ext_kb * 1024),
                     max_connections=max_connections, max_client_connections=max_client_connections,
                     first_request_timeout_s=first_request_timeout_s, keepalive_s=keepalive_s)  # fmt: skip
    try:
        server_config.http_limits().check()
    except ValueError as exc:
        raise UsageError(str(exc), "see the HTTP limits in lto serve --help") from None
    # An artifact's searched configuration (lto load --search-config) stands in for flags not given.
    given = {name for name in SEARCHED if given_on_command_line(ctx, name)}
    searched, notes = searched_defaults(artifact or (model if model and model.is_dir() else None), given,
                                        machine_fingerprint())  # fmt: skip
    for note in notes:
        console.print(f"[dim]{note}[/]", highlight=False)
    max_batch = searched.get("max_batch", max_batch)
    max_wait_ms = searched.get("max_wait_ms", max_wait_ms)
    instances = searched.get("instances", instances)
    threads = searched.get("threads", threads)
    server_config.busy_poll_us = searched.get("busy_poll_us", busy_poll_us)
    code = run_serve(
        model,
        artifact,
        BatcherConfig(max_batch=max_batch, max_wait_ms=max_wait_ms, target_latency_ms=target_latency_ms,
                      queue_timeout_ms=queue_timeout_ms, max_queue=max_queue, instances=instances),
        server_config,
        shapes=parse_shape_args(shape),
        validate=load_options,
        console=console,
        threads=threads,
    )  # fmt: skip
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("serve", epilog=EPILOG)(serve)
