"""`lto optimize`: parse flags, run optimize.pipeline with a progress display, print the verdict."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from optimize.accuracy import METRICS
from optimize.cli.common import (
    DURATION_UNITS_HELP,
    INPUT_DATA_HELP,
    SHAPE_HELP,
    command_started,
    console,
    err_console,
    print_json,
)
from optimize.data import split_shape_args
from optimize.errors import UsageError
from optimize.pipeline import OptimizeRequest, optimize
from optimize.pipeline import Progress as Base
from optimize.pipeline.request import DEFAULT_TIME_BUDGET_S, parse_accuracy_spec
from optimize.render.terminal import optimize_row_line, render_optimize_summary
from optimize.runtimes.registry import BASELINE_RUNTIME, parse_runtime_options, runtime_options
from optimize.system import interrupts
from optimize.units import clock_text, limit_parser, percentile_key_parser

if TYPE_CHECKING:
    from optimize.pipeline.record import StageRecord

COMMON = "Common"
SEARCH = "The search"
ACCURACY = "Inputs and accuracy"
# Options each runtime declares in its spec (optimize.runtimes.spec.RuntimeOption).
RUNTIME_OPTIONS = "Runtime options"

EPILOG = """
[bold]Examples[/]

  lto optimize sample_models/resnet_tiny.onnx --target-ms 5
  lto optimize sample_models/bert_tiny.onnx --shape sequence=128 --target-ms 3
  lto optimize model.onnx --target-ms 3 --target-percentile p99 --batch 8
  lto optimize model.onnx --recipe strict -o reports/model-strict/
  lto optimize model.onnx --recipe my.toml --quantize always --calib-data calib.npz
  lto optimize model.onnx --target-ms 2 --stop-at-target --time-budget 10m --json
  lto optimize model.onnx --time-budget none   [dim](the full search; the default bound is 2 minutes)[/]
  lto optimize model.onnx --enable tvm-tune          [dim](also try TVM tuning; slow)[/]
  lto optimize model.onnx --enable tvm-tune --runtime-option tvm.trials=200 \\
    --runtime-option tvm.target=x86-64-v3
  lto optimize model.onnx --enable tvm-tune --runtime-option tvm.rpc_tracker=127.0.0.1:9190 \\
    --runtime-option tvm.rpc_key=cpu  [dim](measure on a fleet)[/]
  lto optimize model.onnx --enable tensorrt-build --shape input_ids=1x128:8x128:32x128
  lto optimize model.onnx --runtime openvino   [dim](OpenVINO candidates only)[/]
  lto optimize yolo.onnx --calib-data calib.npz --eval-data eval.npz --accuracy 'detection>=0.95'
  lto optimize resnet.onnx --data photos/ --preprocess imagenet   [dim](half calibrates, half judges)[/]
  lto optimize yolo.onnx --data photos/ --preprocess yolo
  lto optimize bert.onnx --shape sequence=128 --data texts.txt --tokenizer tokenizer.json
  lto optimize vad.onnx --data clips/      [dim](wav files, cut into windows of the input's length)[/]
  lto optimize asr.onnx --task-metric logits=ctc --metric wer.py:score --eval-data speech.npz

[bold]Exit codes[/]

  0  the artifact is written and meets the target, or no --target-ms was given
  3  the artifact misses the target (it is still written)
  4  the artifact misses the target and a faster candidate the rows could not verify would
     meet it; with --fail-on-unverified, whenever a faster candidate was left unverified (the
     last lines and report.md say which data would verify it)
  1  failure
  2  usage error: bad flags, model, inputs or recipe

[bold]Which rows judge accuracy[/]

  --eval-data when given; else half of --calib-data or --data (the other half calibrates,
  split with --seed); else --input-data; generated inputs only when no rows are given. A
  bf16, fp16 or int8 candidate ships only when judged on at least 8 real samples on which
  every output's metric can tell (a detector that detects something, a classifier that is
  not a near-tie): otherwise the best fp32 candidate ships.

[bold]Output[/]

  DIR/model.onnx      the optimized model (+ its external data); an OpenVINO winner is
                      DIR/model.xml + model.bin (IR), its compile settings in the manifest
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
        rich_help_panel=COMMON,
    ),
    target_percentile: str = typer.Option(
        "p50",
        "--target-percentile",
        parser=percentile_key_parser("--target-percentile"),
        metavar="PERCENTILE",
        help="Which latency the target applies to: p50, p90, p95, p99 or p99.9",
        rich_help_panel=SEARCH,
    ),
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        help="Recipe name (default, transformer, cnn, strict) or a .toml path; default: by model kind.",
        rich_help_panel=SEARCH,
    ),
    quantize: str = typer.Option(
        "auto", "--quantize", help="auto: only while above the target; always; never.", rich_help_panel=SEARCH
    ),
    calib_data: Path | None = typer.Option(
        None,
        "--calib-data",
        help="Real rows as .npz (one array per input): half calibrate, half judge accuracy (16+); see below",
        metavar="FILE.npz",
        rich_help_panel=COMMON,
    ),
    shape: list[str] = typer.Option(
        [],
        "--shape",
        "-s",
        help=SHAPE_HELP + " A range NAME=1x128:8x128:32x128 (min:opt:max) sets the TensorRT "
        "optimization profile; the benchmark runs at opt.",
        metavar="NAME=DxD",
        rich_help_panel=ACCURACY,
    ),
    input_data: Path | None = typer.Option(
        None, "--input-data", help=INPUT_DATA_HELP, metavar="FILE.npz", rich_help_panel=ACCURACY
    ),
    batch: int = typer.Option(
        1,
        "--batch",
        "-b",
        help="Batch size for a dynamic batch dim (found from the model) --shape leaves open.",
        rich_help_panel=ACCURACY,
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Artifact directory (default reports/<model>-<time>/).",
        rich_help_panel=COMMON,
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an -o folder that looks like a damaged artifact. Never replaces a folder of "
        "other files, a file, a symlink or a folder that holds the model.",
        rich_help_panel=SEARCH,
    ),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        parser=limit_parser("--time-budget"),
        metavar="DURATION",
        help=f"Bound the search ({DURATION_UNITS_HELP}; none: the full search). "
        f"Default {clock_text(DEFAULT_TIME_BUDGET_S)}",
        rich_help_panel=COMMON,
    ),
    stop_at_target: bool = typer.Option(
        False,
        "--stop-at-target",
        help="Stop once the target is met with 95% confidence.",
        rich_help_panel=SEARCH,
    ),
    fail_on_unverified: bool = typer.Option(
        False,
        "--fail-on-unverified",
        help="Exit 4 when faster reduced or quantized candidates were left out because the rows given "
        "could not verify them (by default only when a target is given that only they would meet).",
        rich_help_panel=SEARCH,
    ),
    enable: list[str] = typer.Option(
        [],
        "--enable",
        help="Turn on a stage the recipe has off (repeatable).",
        metavar="STAGE",
        rich_help_panel=SEARCH,
    ),
    disable: list[str] = typer.Option(
        [], "--disable", help="Turn off a stage (repeatable).", metavar="STAGE", rich_help_panel=SEARCH
    ),
    runtime: str = typer.Option(
        "auto",
        "--runtime",
        help="CPU runtime of the candidates: auto (ONNX Runtime and OpenVINO, the faster accurate one "
        f"wins), onnxruntime, or openvino. The baseline is always the original on {BASELINE_RUNTIME.title}.",
        metavar="RUNTIME",
        rich_help_panel=SEARCH,
    ),
    search_order: str = typer.Option(
        "gain",
        "--search-order",
        help="The order stages run in: gain (the likeliest win per second first, from the corpus "
        "and this machine's past runs) or recipe (the recipe's order).",
        metavar="ORDER",
        rich_help_panel=SEARCH,
    ),
    runtime_option: list[str] = typer.Option(
        [],
        "--runtime-option",
        "-R",
        help="Set a runtime's option, RUNTIME.NAME=VALUE (repeatable): "
        + "; ".join(
            f"{name} ({option.help}, e.g. {option.example})" for name, option in runtime_options().items()
        )
        + ".",
        metavar="RUNTIME.NAME=VALUE",
        rich_help_panel=RUNTIME_OPTIONS,
    ),
    # Hidden: the flags that came before --runtime-option, kept so that scripts using them still
    # run; each is the --runtime-option (or --enable) named in its help.
    tvm: bool = typer.Option(False, "--tvm", help="--enable tvm-tune", hidden=True),
    tvm_target: str | None = typer.Option(None, "--tvm-target", help="tvm.target", hidden=True),
    tvm_trials: int | None = typer.Option(None, "--tvm-trials", min=1, help="tvm.trials", hidden=True),
    rpc_tracker: str | None = typer.Option(None, "--rpc-tracker", help="tvm.rpc_tracker", hidden=True),
    rpc_key: str | None = typer.Option(None, "--rpc-key", help="tvm.rpc_key", hidden=True),
    seed: int = typer.Option(0, "--seed", help="Seed for generated inputs.", rich_help_panel=ACCURACY),
    eval_data: Path | None = typer.Option(
        None,
        "--eval-data",
        help="Accuracy samples: .npz with one array per model input (rows along its batch axis, or "
        "samples stacked on a new first axis); other arrays are labels for --metric. Rows that are "
        "also --calib-data rows are not used.",
        metavar="FILE.npz",
        rich_help_panel=ACCURACY,
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="Real data: a folder of images, a text file (with --tokenizer), wav files or an .npz; "
        "split like --calib-data",
        metavar="PATH",
        rich_help_panel=COMMON,
    ),
    preprocess: str | None = typer.Option(
        None,
        "--preprocess",
        help="How images become tensors: imagenet, unit, signed, raw or yolo, then keys "
        "(bgr, resize=, mean=, std=)",
        metavar="SPEC",
        rich_help_panel=COMMON,
    ),
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="The model's tokenizer.json (Hugging Face tokenizers) for --data text lines.",
        metavar="FILE.json",
        rich_help_panel=ACCURACY,
    ),
    min_cosine: float | None = typer.Option(
        None,
        "--min-cosine",
        help="Worst-sample, worst-slice cosine every embedding or plain float output must keep "
        "(recipe default 0.99; strict 0.99999).",
        rich_help_panel=ACCURACY,
    ),
    min_top1: float | None = typer.Option(
        None,
        "--min-top1",
        help="Share of rows whose top-1 class a classifier output must keep, near-ties aside "
        "(recipe default 0.99).",
        rich_help_panel=ACCURACY,
    ),
    accuracy: str | None = typer.Option(
        None,
        "--accuracy",
        help="Thresholds in one spec, e.g. 'cosine>=0.99,top1>=0.99' (keys: cosine, task-cosine, top1, "
        "top1-tolerance, ctc, detection, detection-score, detection-iou, mask, rel, abs, samples); "
        "rel=off switches one off.",
        metavar="SPEC",
        rich_help_panel=ACCURACY,
    ),
    task_metric: list[str] = typer.Option(
        [],
        "--task-metric",
        help="Judge output NAME by this metric instead of the one chosen from its shape: "
        "classifier, embedding, ctc, detection or none (repeatable).",
        metavar="NAME=METRIC",
        rich_help_panel=ACCURACY,
    ),
    metric: str | None = typer.Option(
        None,
        "--metric",
        help="Your own accuracy check: FUNCTION in FILE.py, called as f(reference, candidate, inputs, "
        "labels) with lists of per-sample dicts of arrays (labels: --eval-data's other arrays, or None); "
        "returns (score, passed).",
        metavar="FILE.py:FUNCTION",
        rich_help_panel=ACCURACY,
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print machine-readable JSON instead of tables.", rich_help_panel=COMMON
    ),
) -> None:
    """Make a model faster on this machine, stage by stage, keeping only measured, accurate wins."""

    pins, ranges = split_shape_args(shape)
    thresholds = _accuracy_flags(accuracy, min_cosine, min_top1)

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
        time_budget_s=DEFAULT_TIME_BUDGET_S if time_budget is None else _bounded(time_budget),
        default_budget=time_budget is None,
        search_order=search_order,
        stop_at_target=stop_at_target,
        fail_on_unverified=fail_on_unverified,
        started=command_started(),
        enable=[*enable, *(["tvm-tune"] if tvm else [])],
        stage_options=parse_runtime_options(
            [
                *(
                    f"tvm.{key}={value}"
                    for key, value in (
                        ("target", tvm_target),
                        ("trials", tvm_trials),
                        ("rpc_tracker", rpc_tracker),
                        ("rpc_key", rpc_key),
                    )
                    if value is not None
                ),
                *runtime_option,
            ]
        ),
        disable=list(disable),
        seed=seed,
        eval_data=eval_data,
        accuracy=thresholds,
        task_metrics=_task_metric_flags(task_metric),
        metric=metric,
        runtime=runtime,
        data=data,
        preprocess=preprocess,
        tokenizer=tokenizer,
        command=["lto", *sys.argv[1:]] if sys.argv and sys.argv[0] else None,
    )
    request.validate()
    display = _RichProgress(
        show_rows=not json_out, budget_s=request.time_budget_s, first_line=request.budget_line()
    )
    with display as progress:
        result = optimize(request, progress=progress)
    if json_out:
        print_json(result.report)
    else:
        render_optimize_summary(
            result.report, result.artifact_dir, result.verdict, result.exit_code, console, err_console,
            shown=display.shown_warnings,
        )  # fmt: skip
    raise typer.Exit(result.exit_code)


def _bounded(seconds: float) -> float | None:
    """--time-budget none parses as infinity: no bound."""
    return None if math.isinf(seconds) else seconds


def _accuracy_flags(spec: str | None, min_cosine: float | None, min_top1: float | None) -> dict[str, Any]:
    """--accuracy's spec with --min-cosine and --min-top1 folded in (each threshold set once)."""

    values = parse_accuracy_spec(spec) if spec else {}
    for flag, key, value in (
        ("--min-cosine", "min_cosine", min_cosine),
        ("--min-top1", "min_top1", min_top1),
    ):
        if value is None:
            continue
        if key in values:
            raise UsageError(f"{flag} and --accuracy both set {key}", "give it once")
        values[key] = value
    return values


def _task_metric_flags(items: list[str]) -> dict[str, str]:

    out: dict[str, str] = {}
    for item in items:
        name, sep, metric = item.partition("=")
        name, metric = name.strip(), metric.strip().lower()
        if not sep or not name or metric not in METRICS:
            raise UsageError(
                f"bad --task-metric {item!r}", f"write NAME=METRIC with METRIC one of {', '.join(METRICS)}"
            )
        if name in out:
            raise UsageError(f"--task-metric given twice for {name!r}")
        out[name] = metric
    return out


class _RichProgress:
    """A spinner with the current step on stderr; each finished row printed as it lands. With a
    --time-budget, the time left of it: a column on a terminal, a plain line at most every
    `every_s` seconds when piped (a CI log shows no live spinner).

    `first_line` (the time budget and how to widen it) is printed before the run's first line of
    its own: a run that ends in a usage or input error before any work prints that one line only."""

    def __init__(
        self, show_rows: bool, budget_s: float | None = None, every_s: float = 30.0, first_line: str = ""
    ) -> None:
        from rich.progress import Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        self.show_rows = show_rows
        self.budget_s = budget_s
        self.every_s = every_s
        self._started = command_started()  # the budget counts from the command's start
        self._last_line = -1e9
        outer = self

        class BudgetLeft(ProgressColumn):
            """The time left of the budget, read at every refresh: it ticks while a long step
            (the final comparison, a quantizer) sends no status."""

            def render(self, task: Any) -> Text:
                return Text(outer.budget_left())

        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BudgetLeft(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task: Any = None
        self._first_line = first_line
        self._working = False
        self.shown_warnings: set[str] = set()  # printed as the run went: not again in the summary

        class Sink(Base):
            def status(self, text: str) -> None:
                interrupts.set_activity(text)
                outer._bar.update(outer._task, description=text)
                outer.plain_line(text, outer.budget_left())

            def record(self, record: StageRecord) -> None:
                outer.begin()
                if outer.show_rows:
                    outer._bar.console.print(
                        optimize_row_line(record.to_json()), highlight=False, soft_wrap=True
                    )

            def log(self, text: str) -> None:
                outer.begin()
                if text.startswith("warning: "):
                    outer.shown_warnings.add(text.removeprefix("warning: "))
                outer._bar.console.print(f"[dim]{text}[/]", highlight=False, soft_wrap=True)

        self.sink = Sink()

    def budget_left(self) -> str:
        """Like "2m10s of the 3m00s budget left" (the budget includes the final comparison and
        the artifact's write), or "12s over the 3m00s budget" once a step runs past it."""
        if not self.budget_s:
            return ""
        left = self.budget_s - (time.monotonic() - self._started)
        if left < 0:
            return f"{clock_text(-left)} over the {clock_text(self.budget_s)} budget"
        return f"{clock_text(left)} of the {clock_text(self.budget_s)} budget left"

    def begin(self) -> None:
        """The run's first printed line, once: the work has started."""
        if not self._working:
            self._working = True
            if self._first_line:
                self._bar.console.print(self._first_line, highlight=False, markup=False, soft_wrap=True)

    def plain_line(self, text: str, left: str) -> None:
        if not left or not self.show_rows or err_console.is_terminal or not self._working:
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            err_console.print(f"{text} ({left})", highlight=False, markup=False, soft_wrap=True)

    def __enter__(self) -> Any:
        self._bar.__enter__()
        self._task = self._bar.add_task("starting")
        return self.sink

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    app.command("optimize", epilog=EPILOG)(optimize_command)
