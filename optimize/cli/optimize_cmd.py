"""`lto optimize`: parse flags, run optimize.pipeline with a progress display, print the verdict."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from optimize.cli.common import (
    DURATION_UNITS_HELP,
    SHAPE_HELP,
    InputDataOption,
    JsonOption,
    console,
    err_console,
    print_json,
)
from optimize.units import duration_parser, percentile_key_parser

if TYPE_CHECKING:
    from optimize.pipeline import StageRecord

EPILOG = """
[bold]Examples[/]

  lto optimize sample_models/resnet_tiny.onnx --target-ms 5
  lto optimize sample_models/bert_tiny.onnx --shape sequence=128 --target-ms 3
  lto optimize model.onnx --target-ms 3 --target-percentile p99 --batch 8
  lto optimize model.onnx --recipe strict -o reports/model-strict/
  lto optimize model.onnx --recipe my.toml --quantize always --calib-data calib.npz
  lto optimize model.onnx --target-ms 2 --stop-at-target --time-budget 10m --json
  lto optimize model.onnx --tvm          [dim](also try TVM tuning; slow)[/]
  lto optimize model.onnx --tvm --tvm-trials 200 --tvm-target x86-64-v3
  lto optimize model.onnx --tvm --rpc-tracker 127.0.0.1:9190 --rpc-key cpu  [dim](measure on a fleet)[/]
  lto optimize model.onnx --enable tensorrt-build --shape input_ids=1x128:8x128:32x128

[bold]Exit codes[/]

  0  target met, or no --target-ms given
  3  the best artifact misses the target (the artifact is still written)
  1  failure
  2  usage error: bad flags, model, inputs or recipe

[bold]Output[/]

  DIR/model.onnx      the optimized model (+ its external data)
  DIR/manifest.json   runtime config, sha256 of every file, CPU requirements
  DIR/report.json     the shared report schema; DIR/report.md for people
  -o replaces only an empty folder or an artifact lto wrote (--force: also one that looks
  like a damaged artifact); anything else is refused before work starts, exit code 2.
  Ctrl-C (exit 130) or SIGTERM (exit 143) writes no artifact and leaves the previous one
  whole; DIR.partial-report.json says what was done and the best candidate found so far.
"""


def optimize_command(
    model: Path = typer.Argument(..., help="The ONNX model to optimize.", show_default=False),
    target_ms: float | None = typer.Option(
        None,
        "--target-ms",
        help="Latency target in milliseconds at --target-percentile and the pinned batch.",
    ),
    target_percentile: str = typer.Option(
        "p50",
        "--target-percentile",
        parser=percentile_key_parser("--target-percentile"),
        metavar="PERCENTILE",
        help="Which latency the target applies to: p50, p90, p95 or p99 (a bare 99 is still accepted).",
    ),
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        help="Recipe name (default, transformer, cnn, strict) or a .toml path; default: by model kind.",
    ),
    quantize: str = typer.Option(
        "auto", "--quantize", help="auto: only while above the target; always; never."
    ),
    calib_data: Path | None = typer.Option(
        None,
        "--calib-data",
        help="Calibration inputs for static int8: .npz with one array per input.",
        metavar="FILE.npz",
    ),
    shape: list[str] = typer.Option(
        [],
        "--shape",
        "-s",
        help=SHAPE_HELP + " A range NAME=1x128:8x128:32x128 (min:opt:max) sets the TensorRT "
        "optimization profile; the benchmark runs at opt.",
        metavar="NAME=DxD",
    ),
    input_data: Path | None = InputDataOption,
    batch: int = typer.Option(
        1, "--batch", "-b", help="Batch size for a dynamic leading dim --shape leaves open."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Artifact directory (default reports/<model>-<time>/)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an -o folder that looks like a damaged artifact. Never replaces a folder of "
        "other files, a file, a symlink or a folder that holds the model.",
    ),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        parser=duration_parser("--time-budget"),
        metavar="DURATION",
        help=f"Bound the whole run: {DURATION_UNITS_HELP}. Stages left when it runs out are skipped.",
    ),
    stop_at_target: bool = typer.Option(
        False, "--stop-at-target", help="Stop once the target is met with 95% confidence."
    ),
    enable: list[str] = typer.Option(
        [], "--enable", help="Turn on a stage the recipe has off (repeatable).", metavar="STAGE"
    ),
    disable: list[str] = typer.Option(
        [], "--disable", help="Turn off a stage (repeatable).", metavar="STAGE"
    ),
    tvm: bool = typer.Option(False, "--tvm", help="Same as --enable tvm-tune."),
    tvm_target: str | None = typer.Option(
        None,
        "--tvm-target",
        help="CPU to build TVM code for: an LLVM CPU name (znver3), x86-64-v3, or a JSON target. "
        "Default: this machine, validated.",
    ),
    tvm_trials: int | None = typer.Option(None, "--tvm-trials", min=1, help="TVM tuning trials in all."),
    rpc_tracker: str | None = typer.Option(
        None, "--rpc-tracker", help="HOST:PORT of a TVM RPC tracker: measure tuning trials on its devices."
    ),
    rpc_key: str | None = typer.Option(None, "--rpc-key", help="Device key on the RPC tracker."),
    seed: int = typer.Option(0, "--seed", help="Seed for generated inputs."),
    json_out: bool = JsonOption,
) -> None:
    """Make a model faster on this machine, stage by stage, keeping only measured, accurate wins."""
    from optimize.inputs import split_shape_args
    from optimize.pipeline import OptimizeRequest, optimize

    pins, ranges = split_shape_args(shape)

    request = OptimizeRequest(
        model_path=model,
        target_ms=target_ms,
        target_percentile=target_percentile,
        recipe=recipe,
        quantize=quantize,
        calib_data=calib_data,
        shapes=pins,
        shape_ranges=ranges,
        input_data=input_data,
        batch=batch,
        out_dir=output,
        force=force,
        time_budget_s=time_budget,
        stop_at_target=stop_at_target,
        enable=[*enable, *(["tvm-tune"] if tvm else [])],
        tvm_options={
            key: value
            for key, value in (
                ("target", tvm_target),
                ("trials", tvm_trials),
                ("rpc_tracker", rpc_tracker),
                ("rpc_key", rpc_key),
            )
            if value is not None
        },
        disable=list(disable),
        seed=seed,
    )
    request.validate()
    with _RichProgress(show_rows=not json_out) as progress:
        result = optimize(request, progress=progress)
    if json_out:
        print_json(result.report)
    else:
        from optimize.render.terminal import render_optimize_summary

        render_optimize_summary(
            result.report, result.artifact_dir, result.verdict, result.exit_code, console, err_console
        )
    raise typer.Exit(result.exit_code)


class _RichProgress:
    """A spinner with the current step on stderr; each finished row printed as it lands."""

    def __init__(self, show_rows: bool) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from optimize import interrupts
        from optimize.pipeline import Progress as Base
        from optimize.render.terminal import optimize_row_line

        self.show_rows = show_rows
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task: Any = None
        outer = self

        class Sink(Base):
            def status(self, text: str) -> None:
                interrupts.set_activity(text)
                outer._bar.update(outer._task, description=text)

            def record(self, record: StageRecord) -> None:
                if outer.show_rows:
                    outer._bar.console.print(optimize_row_line(record), highlight=False, soft_wrap=True)

            def log(self, text: str) -> None:
                outer._bar.console.print(f"[dim]{text}[/]", highlight=False, soft_wrap=True)

        self.sink = Sink()

    def __enter__(self) -> Any:
        self._bar.__enter__()
        self._task = self._bar.add_task("starting")
        return self.sink

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    app.command("optimize", epilog=EPILOG)(optimize_command)
