"""`lto export`: parse flags, then write an artifact as a Triton model and a KServe InferenceService."""

from __future__ import annotations

from pathlib import Path

import typer

from optimize.bench.command import parse_batches
from optimize.cli.common import (
    DURATION_UNITS_HELP,
    PERCENTILE_UNITS_HELP,
    JsonOption,
    console,
    err_console,
    given_on_command_line,
    print_json,
)
from optimize.errors import UsageError
from optimize.export import ExportRequest, export_triton
from optimize.export.batching import measure_profile, profile_from_report
from optimize.export.triton import preflight
from optimize.serve.config_search import searched_defaults
from optimize.system import interrupts
from optimize.system.env import check_thread_count, machine_fingerprint
from optimize.units import duration_parser, percentile_parser

EPILOG = """
[bold]Examples[/]

  lto export out/m/ --triton models/ --slo-ms 20 --measure-batches 1,2,4,8,16
  lto bench --artifact out/m/ --batch 1,2,4,8,16 -o bench.json
  lto export out/m/ --triton models/ --batch-profile bench.json --slo-ms 20
  lto export out/m/ --triton models/ --name bert --storage-uri s3://b/models
  lto export out/m/ --triton models/ --backend python --measure-batches 1,2,4,8

Writes models/NAME/: config.pbtxt, 1/<model file>, inferenceservice.yaml and
lto-export.json (what lto decided, and why). Then:
  docker run --rm -p 8000:8000 -v $PWD/models:/models \\
      nvcr.io/nvidia/tritonserver:<yy.mm>-py3 \\
      tritonserver --model-repository=/models
  kubectl apply -f models/NAME/inferenceservice.yaml  [dim](models/ uploaded)[/]

Batching: of the measured batch sizes B with 2 x latency(B) within the SLO,
the one with the highest throughput is max_batch_size and preferred size;
the queue delay is what the SLO leaves. No profile: no dynamic batching.
Refused: TVM artifacts (Triton has no TVM backend: --backend python serves them with lto's own
runtime inside Triton), TensorRT-RTX engines.
"""


def export(
    ctx: typer.Context,
    artifact_arg: Path | None = typer.Argument(
        None, metavar="ARTIFACT", help="Artifact folder written by `lto optimize`.", show_default=False
    ),
    artifact_opt: Path | None = typer.Option(
        None, "--artifact", help="The artifact folder, as bench, serve and load also take it.", hidden=True
    ),
    triton: Path = typer.Option(
        ..., "--triton", help="Triton model repository: lto writes only its NAME/ folder.", show_default=False
    ),
    name: str | None = typer.Option(None, "--name", help="Model name (default: the artifact folder's name)."),
    slo_ms: float | None = typer.Option(
        None, "--slo-ms", min=0.001, help="Latency SLO per request (default: the artifact's --target-ms)."
    ),
    percentile: float | None = typer.Option(
        None,
        "--percentile",
        parser=percentile_parser("--percentile"),
        metavar="PERCENTILE",
        help=f"Percentile the SLO applies to (default: the artifact's, else p99): {PERCENTILE_UNITS_HELP}.",
    ),
    batch_profile: Path | None = typer.Option(
        None, "--batch-profile", help="A `lto bench --batch 1,2,4,...` report of this artifact (JSON)."
    ),
    measure_batches: str | None = typer.Option(
        None, "--measure-batches", help="Measure these batch sizes now, on this machine: 1,2,4,8,16,32."
    ),
    measure_time: float = typer.Option(
        "3s",
        "--measure-time",
        parser=duration_parser("--measure-time", minimum=0.01),
        metavar="DURATION",
        help=f"--measure-batches: most timed runs per size: {DURATION_UNITS_HELP}.",
    ),
    instances: int = typer.Option(
        1, "--instances", min=1, help="Triton model instances (instance_group count)."
    ),
    backend: str = typer.Option(
        "native",
        "--backend",
        help="native: the runtime's own Triton backend (onnxruntime, openvino, tensorrt); python: lto's "
        "runtime inside Triton's python backend, with every setting lto measured (also TVM artifacts).",
        metavar="BACKEND",
    ),
    storage_uri: str | None = typer.Option(
        None, "--storage-uri", help="Where the cluster reads the repository (default: a placeholder)."
    ),
    json_out: bool = JsonOption,
) -> None:
    """Export an artifact as a Triton model (config.pbtxt + model) and a KServe InferenceService."""

    if (artifact_arg is None) == (artifact_opt is None):
        raise UsageError("give the artifact folder (once)", "e.g. lto export out/model --triton repo/")
    artifact: Path = artifact_arg if artifact_arg is not None else artifact_opt  # type: ignore[assignment]
    if batch_profile is not None and measure_batches is not None:
        raise UsageError("give --batch-profile or --measure-batches, not both")
    check_thread_count(instances, "--instances", minimum=1)
    batches = parse_batches(measure_batches)
    # Before any measuring: what lto would refuse to export or replace is refused now, not after minutes.
    target_name, manifest = preflight(artifact, triton, name, backend)
    profile = None
    if batch_profile is not None:
        profile = profile_from_report(batch_profile, manifest["files"][manifest["model_file"]]["sha256"])
    elif batches:
        interrupts.set_activity(f"measuring {artifact} at batch sizes {measure_batches}")
        if json_out:
            profile = measure_profile(artifact, batches, measure_time)
        else:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            with Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                console=err_console, transient=True,
            ) as bar:  # fmt: skip
                task = bar.add_task("loading")

                def tick(label: str, runs: int, elapsed: float) -> None:
                    bar.update(task, description=f"measuring {label}: {runs} runs, {elapsed:.1f}s")

                profile = measure_profile(artifact, batches, measure_time, tick)
    # The serving configuration searched here (lto load --search-config) fills the flags not given.
    given = {"instances"} if given_on_command_line(ctx, "instances") else set()
    searched, notes = searched_defaults(artifact, given, machine_fingerprint())
    for note in notes:
        err_console.print(f"[dim]{note}[/]", highlight=False)
    instances = int(searched.get("instances", instances))
    serving = (
        {"max_batch": searched["max_batch"], "max_wait_ms": searched["max_wait_ms"]}
        if "max_batch" in searched and "max_wait_ms" in searched
        else None
    )
    interrupts.set_activity(f"writing {triton / target_name}")
    result = export_triton(
        ExportRequest(
            artifact=artifact,
            repository=triton,
            name=name,
            slo_ms=slo_ms,
            percentile=percentile,
            instances=instances,
            profile=profile,
            storage_uri=storage_uri,
            backend=backend,
            serving=serving,
        )
    )
    from rich.markup import escape

    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if json_out:
        print_json(result.to_json())
        return
    config = result.config
    where = config.get("platform") or f"backend {config.get('backend')}"
    console.print(f"wrote {escape(str(result.model_dir))}/ ({where})", highlight=False)
    console.print(
        f"  config.pbtxt, {config['default_model_filename']} in 1/, inferenceservice.yaml", highlight=False
    )
    batching = config.get("dynamic_batching")
    line = f"  max_batch_size {config['max_batch_size']}"
    if batching:
        line += f", dynamic batching: preferred {batching.get('preferred_batch_size') or '-'}"
        line += f", queue delay {batching['max_queue_delay_microseconds']} us"
    console.print(line, highlight=False)
    for note in result.notes:
        console.print(f"  {escape(note)}", highlight=False, soft_wrap=True)
    if result.runtime_settings:
        shown = ", ".join(f"{k}={v}" for k, v in result.runtime_settings.items())
        console.print(f"  runtime settings passed on: {escape(shown)}", highlight=False, soft_wrap=True)
    if result.schema_checked:
        console.print("  config.pbtxt parsed with Triton's ModelConfig schema", highlight=False)
    if result.kserve.get("storage_uri_is_placeholder"):
        console.print(
            f"  inferenceservice.yaml: set storageUri (now {result.kserve['storage_uri']}) "
            "or pass --storage-uri",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("export", epilog=EPILOG)(export)
