"""What the user asked `lto optimize` for, and the recipe that carries it out.

The request is checked before any work starts (`OptimizeRequest.validate`); the recipe is the
named or detected one with the command line's --enable/--disable/--quantize folded in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.files import check_output_dir, check_output_file
from optimize.recipes import Recipe, StageSpec

PERCENTILES = ("p50", "p90", "p95", "p99")
QUANTIZE_MODES = ("auto", "always", "never")


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
    # tvm-tune options given as flags (--tvm-target, --tvm-trials, --rpc-tracker, --rpc-key).
    tvm_options: dict[str, Any] = field(default_factory=dict)
    input_data: Path | None = None
    # A dynamic leading dim nothing else pins runs at this batch (real-time latency: 1).
    batch: int | None = 1
    out_dir: Path | None = None
    # Replace an out_dir that looks like a damaged artifact (fsio.check_output_dir).
    force: bool = False
    time_budget_s: float | None = None
    stop_at_target: bool = False
    enable: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    seed: int = 0

    def validate(self) -> None:
        if self.target_ms is not None and not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            raise UsageError(f"--target-ms must be a positive number, got {self.target_ms}")
        if self.target_percentile not in PERCENTILES:
            raise UsageError(
                f"--target-percentile {self.target_percentile!r} is not supported",
                f"choose one of: {', '.join(PERCENTILES)}",
            )
        if self.quantize not in QUANTIZE_MODES:
            raise UsageError(f"--quantize {self.quantize!r}", f"choose one of: {', '.join(QUANTIZE_MODES)}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise UsageError("--time-budget must be positive")
        if self.batch is not None and self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.calib_data is not None and not Path(self.calib_data).is_file():
            raise UsageError(f"--calib-data file not found: {self.calib_data}")
        if self.stop_at_target and self.target_ms is None:
            raise UsageError("--stop-at-target needs --target-ms")
        if self.out_dir is not None:
            # Before any work: a run that ends by refusing to write its artifact wastes the user's time.
            inputs = [self.model_path, self.calib_data, self.input_data]
            check_output_dir(self.out_dir, inputs=inputs, force=self.force)
            check_output_file(partial_report_path(Path(self.out_dir)), flag="-o")


def default_out_dir(model_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{model_path.stem}-{stamp}"


def partial_report_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".partial-report.json")


def choose_recipe(request: OptimizeRequest, known_stages: Sequence[str] | None = None) -> tuple[Recipe, str]:
    """The recipe to run (request.recipe, or the one for the model's kind) and the model kind."""
    from optimize.onnx_file import load_model
    from optimize.recipes import detect_model_kind, load_recipe, recipe_for_kind

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
    tvm = recipe.stage("tvm-tune")
    if tvm is not None:
        for key, value in request.tvm_options.items():
            tvm.options[key] = value
            notes.append(f"tvm-tune {key}={value} from the command line")
    trt = recipe.stage("tensorrt-build")
    if trt is not None and request.shape_ranges:
        trt.options["shapes"] = list(request.shape_ranges)
        notes.append("tensorrt-build profile ranges from --shape: " + ", ".join(request.shape_ranges))
    quant = recipe.stage("quantize")
    if quant is not None:
        if request.quantize == "never":
            quant.enabled = False
        elif request.quantize == "always":
            quant.enabled = True
            quant.run_when = "always"
        if request.calib_data is not None:
            quant.options["calib_data"] = str(Path(request.calib_data).absolute())
    if request.calib_data is not None:
        from optimize.inputs import check_data_file

        # Checked before any stage runs (0 rows is an error; NaN/inf a warning in the report):
        # the quantize stage reads the file only late in the run.
        notes += check_data_file(request.calib_data, "--calib-data")
    return notes


def stage_disabled_reason(spec: StageSpec, request: OptimizeRequest, recipe: Recipe) -> str:
    if spec.name == "quantize" and request.quantize == "never":
        return "--quantize never"
    if spec.name in request.disable:
        return "disabled with --disable"
    return f"disabled in recipe {recipe.name} (turn on with --enable {spec.name})"
