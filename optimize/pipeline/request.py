"""What the user asked `lto optimize` for, and the recipe that carries it out.

The request is checked before any work starts (`OptimizeRequest.validate`); the recipe is the
named or detected one with the command line's --enable/--disable/--quantize folded in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.accuracy import Thresholds, load_user_metric
from optimize.data import check_data_file
from optimize.errors import UsageError
from optimize.files import check_output_dir, check_output_file
from optimize.model.onnx_file import load_model
from optimize.recipes import (
    OPTIONAL_THRESHOLDS,
    Recipe,
    StageSpec,
    detect_model_kind,
    load_recipe,
    parse_thresholds,
    recipe_for_kind,
)
from optimize.runtimes.registry import quantize_stages, searched_runtimes, stage_runtime
from optimize.stats import PERCENTILES
from optimize.units import PERCENTILE_HINT, clock_text

if TYPE_CHECKING:
    from optimize.accuracy import UserMetric

# The search's bound when none is given: stages run by expected gain per second (pipeline/order.py),
# so the first two minutes hold the candidates that win on the corpus; `--time-budget none` runs all.
DEFAULT_TIME_BUDGET_S = 120.0
SEARCH_ORDERS = ("gain", "recipe")
QUANTIZE_MODES = ("auto", "always", "never")
# --runtime: which CPU runtime's stages make candidates (auto: every one, chosen by measurement).
RUNTIME_CHOICES = ("auto", *searched_runtimes())


@dataclass
class OptimizeRequest:
    model_path: Path
    target_ms: float | None = None
    target_percentile: str = "p50"
    recipe: str | None = None  # name or path; None: picked by model kind
    quantize: str = "auto"  # auto (recipe decides) | always | never
    calib_data: Path | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # `--shape NAME=MIN:OPT:MAX` strings: optimization-profile ranges for stages that build
    # for a range of shapes (TensorRT); the benchmark runs at OPT, which `shapes` holds.
    shape_ranges: list[str] = field(default_factory=list)
    # Stage options given on the command line ({stage: {option: value}}, from --runtime-option).
    stage_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_data: Path | None = None
    # A dynamic leading dim nothing else pins runs at this batch (real-time latency: 1).
    batch: int | None = 1
    out_dir: Path | None = None
    # Replace an out_dir that looks like a damaged artifact (fsio.check_output_dir).
    force: bool = False
    time_budget_s: float | None = None  # None: no bound, the full search
    # The bound is DEFAULT_TIME_BUDGET_S because none was given (the first line says how to widen it).
    default_budget: bool = False
    # --search-order: gain (expected gain per second, pipeline/order.py) | recipe (the recipe's order)
    search_order: str = "gain"
    stop_at_target: bool = False
    # Exit 4 whenever a faster candidate was left out unverified (else only when a target is given
    # and only an unverified candidate would meet it).
    fail_on_unverified: bool = False
    # When the command began (time.monotonic()): the --time-budget counts from there, the process's
    # own start and imports included (None: from when the run starts).
    started: float | None = None
    enable: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    seed: int = 0
    # Accuracy samples from a file (its arrays that are not model inputs are labels for `metric`).
    eval_data: Path | None = None
    # Thresholds over the recipe's: an --accuracy spec string ("cosine>=0.99,top1>=0.99") or a
    # dict of Thresholds fields (--min-cosine, --min-top1 land here).
    accuracy: str | dict[str, Any] = field(default_factory=dict)
    task_metrics: dict[str, str] = field(default_factory=dict)  # output -> metric (--task-metric)
    metric: str | None = None  # --metric FILE.py:FUNCTION
    runtime: str = "auto"  # --runtime: auto | onnxruntime | openvino
    # --data: images, text lines or wav files (or an .npz) turned into real rows, split into
    # calibration and judging rows like --calib-data alone (optimize/data/datasets.py).
    data: Path | None = None
    preprocess: str | None = None  # --preprocess: how images become tensors
    tokenizer: Path | None = None  # --tokenizer tokenizer.json: how text lines become token ids
    command: list[str] | None = None  # the command line as typed, for the commands lto suggests

    def budget_line(self) -> str:
        """The run's first line: its time bound and how to change it."""
        if self.time_budget_s is None:
            return "time budget: none, the full search (--time-budget none)"
        shown = clock_text(self.time_budget_s)
        if self.default_budget:
            return (
                f"time budget: {shown}, the default (--time-budget 10m searches longer, "
                "--time-budget none searches everything)"
            )
        return f"time budget: {shown} (--time-budget)"

    def validate(self) -> None:
        if self.target_ms is not None and not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            raise UsageError(f"--target-ms must be a positive number, got {self.target_ms}")
        if self.target_percentile not in PERCENTILES:  # the report's keys (stats.PERCENTILES)
            raise UsageError(
                f"--target-percentile {self.target_percentile!r} is not supported", PERCENTILE_HINT
            )
        if self.quantize not in QUANTIZE_MODES:
            raise UsageError(f"--quantize {self.quantize!r}", f"choose one of: {', '.join(QUANTIZE_MODES)}")
        if self.runtime not in RUNTIME_CHOICES:
            raise UsageError(f"--runtime {self.runtime!r}", f"choose one of: {', '.join(RUNTIME_CHOICES)}")
        if self.search_order not in SEARCH_ORDERS:
            raise UsageError(
                f"--search-order {self.search_order!r}", f"choose one of: {', '.join(SEARCH_ORDERS)}"
            )
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise UsageError("--time-budget must be positive")
        if self.batch is not None and self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.calib_data is not None and not Path(self.calib_data).is_file():
            raise UsageError(f"--calib-data file not found: {self.calib_data}")
        if self.eval_data is not None:
            self.eval_data = Path(self.eval_data)
            if not self.eval_data.is_file():
                raise UsageError(f"--eval-data file not found: {self.eval_data}")
        self._validate_data()
        overrides = self.accuracy_overrides()
        if overrides:
            parse_thresholds(overrides, "--accuracy ", base=Thresholds())  # ranges, before any work
        if self.metric is not None:
            self.user_metric()
        if self.stop_at_target and self.target_ms is None:
            raise UsageError("--stop-at-target needs --target-ms")
        if self.out_dir is not None:
            # Before any work: a run that ends by refusing to write its artifact wastes the user's time.
            inputs = [self.model_path, self.calib_data, self.input_data, self.eval_data, self.data]
            check_output_dir(self.out_dir, inputs=inputs, force=self.force)
            check_output_file(partial_report_path(Path(self.out_dir)), flag="-o")

    def _validate_data(self) -> None:
        if self.data is not None:
            self.data = Path(self.data)
            if not self.data.exists():
                raise UsageError(f"--data not found: {self.data}")
            if self.calib_data is not None:
                raise UsageError("--data and --calib-data both give calibration rows", "give one of them")
        else:
            for flag, value in (("--preprocess", self.preprocess), ("--tokenizer", self.tokenizer)):
                if value is not None:
                    raise UsageError(f"{flag} applies to --data only", f"give --data PATH with {flag}")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise UsageError(f"--tokenizer file not found: {self.tokenizer}")

    def verify_command(self) -> str:
        """The command that would verify what this run could not: this one with --eval-data."""
        import shlex

        args = list(self.command or [])
        if not args:
            args = ["lto", "optimize", str(self.model_path)]
            for name, dims in self.shapes.items():
                args += ["--shape", f"{name}={'x'.join(str(d) for d in dims)}"]
            for flag, value in (("--calib-data", self.calib_data), ("--data", self.data)):
                if value is not None:
                    args += [flag, str(value)]
        out: list[str] = []
        skip = False
        for arg in args:
            if skip:
                skip = False
                continue
            if arg == "--eval-data":
                skip = True
                continue
            if arg.startswith("--eval-data="):
                continue
            out.append(arg)
        return shlex.join([*out, "--eval-data", "EVAL.npz"])

    def accuracy_overrides(self) -> dict[str, Any]:
        """The Thresholds fields the request sets (checked; ranges are checked with the recipe's)."""
        values = parse_accuracy_spec(self.accuracy) if isinstance(self.accuracy, str) else dict(self.accuracy)
        if self.task_metrics:
            values["task_metrics"] = dict(self.task_metrics)
        return values

    def user_metric(self) -> UserMetric | None:
        """--metric loaded once (its file runs once), or None."""
        if self.metric is None:
            return None
        cached = self.__dict__.get("_user_metric")  # (spec, loaded): not a dataclass field
        if cached is None or cached[0] != self.metric:
            cached = (self.metric, load_user_metric(self.metric))
            self.__dict__["_user_metric"] = cached
        return cached[1]


# `--accuracy` keys: (Thresholds field, the comparison it takes, integer).
ACCURACY_SPEC_KEYS: dict[str, tuple[str, str, bool]] = {
    "cosine": ("min_cosine", ">=", False),
    "task-cosine": ("min_task_cosine", ">=", False),
    "top1": ("min_top1", ">=", False),
    "top1-tolerance": ("top1_tolerance", "=", False),
    "ctc": ("min_ctc", ">=", False),
    "detection": ("min_detection", ">=", False),
    "detection-score": ("detection_score", "=", False),
    "detection-iou": ("detection_iou", "=", False),
    "mask": ("min_mask_iou", ">=", False),
    "rel": ("max_rel", "<=", False),
    "abs": ("max_abs", "<=", False),
    "samples": ("samples", "=", True),
}
_SPEC_ITEM = re.compile(r"^\s*([a-z0-9_-]+)\s*(>=|<=|=)\s*([^\s,]+)\s*$")


def parse_accuracy_spec(text: str) -> dict[str, Any]:
    """`--accuracy "cosine>=0.99,top1>=0.99,rel=off"` as Thresholds fields.

    Items are KEY>=X for minimums, KEY<=X for maxima, KEY=X for settings; `off` switches an
    optional threshold off (rel, abs, top1, ctc, detection).
    """
    values: dict[str, Any] = {}
    hint = "e.g. --accuracy 'cosine>=0.99,top1>=0.99'; keys: " + ", ".join(ACCURACY_SPEC_KEYS)
    for item in (part for part in text.split(",") if part.strip()):
        match = _SPEC_ITEM.match(item.lower().replace("_", "-"))
        if not match:
            raise UsageError(f"bad --accuracy item {item.strip()!r}", hint)
        key, op, raw = match.groups()
        if key not in ACCURACY_SPEC_KEYS:
            raise UsageError(f"--accuracy: unknown key {key!r}", hint)
        name, want, integer = ACCURACY_SPEC_KEYS[key]
        if op != want and not (want == "=" and integer and op == ">=") and not (raw == "off" and op == "="):
            raise UsageError(f"--accuracy: {key} takes {want}, e.g. {key}{want}{'32' if integer else '0.99'}")
        if name in values:
            raise UsageError(f"--accuracy: {key} given twice")
        if raw == "off":
            if name not in OPTIONAL_THRESHOLDS:
                raise UsageError(f"--accuracy: {key} cannot be off")
            values[name] = None
            continue
        try:
            values[name] = int(raw) if integer else float(raw)
        except ValueError:
            raise UsageError(
                f"--accuracy: {key} needs {'a whole' if integer else 'a'} number, got {raw!r}"
            ) from None
        if not integer and not math.isfinite(values[name]):
            raise UsageError(f"--accuracy: {key} needs a finite number, got {raw!r}")
    return values


def default_out_dir(model_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{model_path.stem}-{stamp}"


def partial_report_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".partial-report.json")


def choose_recipe(request: OptimizeRequest, known_stages: Sequence[str] | None = None) -> tuple[Recipe, str]:
    """The recipe to run (request.recipe, or the one for the model's kind) and the model kind."""

    model = load_model(request.model_path, load_external_data=False)
    kind = detect_model_kind(model)
    del model
    recipe = load_recipe(request.recipe or recipe_for_kind(kind), known_stages=known_stages)
    return recipe, kind


def apply_overrides(recipe: Recipe, request: OptimizeRequest) -> list[str]:
    """Fold --enable/--disable/--quantize into the recipe; returns notes for the report."""
    notes: list[str] = []
    names = {s.name for s in recipe.stages}
    for name in [*request.enable, *request.disable]:
        if name not in names:
            raise UsageError(
                f"stage {name!r} is not in recipe {recipe.name}",
                f"its stages: {', '.join(s.name for s in recipe.stages)}",
            )
    for spec in recipe.stages:
        if spec.name in request.enable:
            spec.enabled = True
            notes.append(f"{spec.name} enabled on the command line")
        if spec.name in request.disable:
            spec.enabled = False
            notes.append(f"{spec.name} disabled on the command line")
    for stage_name, options in request.stage_options.items():
        stage = recipe.stage(stage_name)
        for key, value in options.items() if stage is not None else ():
            stage.options[key] = value
            notes.append(f"{stage_name} {key}={value} from the command line")
    trt = recipe.stage("tensorrt-build")
    if trt is not None and request.shape_ranges:
        trt.options["shapes"] = list(request.shape_ranges)
        notes.append("tensorrt-build profile ranges from --shape: " + ", ".join(request.shape_ranges))
    for quant in (recipe.stage(name) for name in quantize_stages()):
        if quant is None:
            continue
        if request.quantize == "never":
            quant.enabled = False
        elif request.quantize == "always":
            quant.enabled = True
            quant.run_when = "always"
        if request.calib_data is not None:
            quant.options["calib_data"] = str(Path(request.calib_data).absolute())
    notes += _apply_runtime(recipe, request)
    overrides = request.accuracy_overrides()
    if overrides:
        recipe.accuracy = parse_thresholds(overrides, "--accuracy ", base=recipe.accuracy)
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
        notes.append(f"accuracy thresholds from the command line: {shown}")
    if request.calib_data is not None:
        # Checked before any stage runs (0 rows is an error; NaN/inf a warning in the report):
        # the quantize stage reads the file only late in the run.
        notes += check_data_file(request.calib_data, "--calib-data")
    return notes


def _other_runtime(stage: str, request: OptimizeRequest) -> str | None:
    """The CPU runtime `stage` makes candidates for, when --runtime picked another one."""
    runtime = stage_runtime(stage)
    if request.runtime == "auto" or runtime not in searched_runtimes() or runtime == request.runtime:
        return None
    return runtime


def _apply_runtime(recipe: Recipe, request: OptimizeRequest) -> list[str]:
    """--runtime onnxruntime|openvino: turn off the stages that make the other runtime's candidates."""
    off = [spec for spec in recipe.stages if _other_runtime(spec.name, request)]
    for spec in off:
        if spec.name in request.enable:
            raise UsageError(
                f"--enable {spec.name} makes {_other_runtime(spec.name, request)} candidates, "
                f"and --runtime {request.runtime} rules them out",
                "drop one of the two flags",
            )
        spec.enabled = False
    if not off:
        return []
    return [f"--runtime {request.runtime}: {', '.join(s.name for s in off)} off"]


def stage_disabled_reason(spec: StageSpec, request: OptimizeRequest, recipe: Recipe) -> str:
    if spec.name in quantize_stages() and request.quantize == "never":
        return "--quantize never"
    other = _other_runtime(spec.name, request)
    if other:
        return f"--runtime {request.runtime} (this stage makes {other} candidates)"
    if spec.name in request.disable:
        return "disabled with --disable"
    return f"disabled in recipe {recipe.name} (turn on with --enable {spec.name})"
