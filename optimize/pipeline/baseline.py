"""Before any stage runs: the inputs, the judging rows, the reference outputs and what they can
tell, frozen into one `Baseline` that every candidate is judged against.

Every data file is checked against the model here, before any work is spent (the data package's
row plan decides which rows calibrate and which judge); the original model's outputs on the
judging rows are the reference; each output's task metric is chosen and the evidence weighed
(the accuracy package's evidence): whether these rows can tell a right reduced or quantized
candidate from a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimize.accuracy import (
    FEW_SAMPLES,
    MIN_ROWS,
    Evidence,
    MetricChoice,
    UserMetric,
    assess,
    check,
    choose_metrics,
)
from optimize.backend import Backend, TensorSpec
from optimize.data import (
    InputSpec,
    RealRows,
    RowPlan,
    batch_axes,
    generated_samples,
    model_input_specs,
    output_batch_axes,
    plan_rows,
    read_data,
    read_real_rows,
    resolve_inputs,
)
from optimize.errors import UsageError
from optimize.model.onnx_file import file_has_external_data
from optimize.pipeline.record import RunRecord
from optimize.recipes import Recipe, StageSpec
from optimize.runtimes.registry import quantize_stages

Samples = list[dict[str, np.ndarray]]


@dataclass(frozen=True)
class Baseline:
    """What every candidate of a run is judged against; set once, before the first stage."""

    model_path: Path  # absolute: stages run inside their scratch directories
    input_spec: InputSpec
    feeds: dict[str, np.ndarray]  # the benchmark inputs (dynamic dims pinned)
    rows: RowPlan  # the judging rows and where they came from
    inputs: list[TensorSpec]  # the original model's inputs, as its runtime reads them
    outputs_spec: list[dict[str, Any]]
    reference: Samples  # the original model's outputs on the judging rows
    choices: dict[str, MetricChoice]  # each output's task metric
    evidence: Evidence
    user_metric: UserMetric | None
    external_data: bool

    @property
    def samples(self) -> Samples:
        return self.rows.samples

    @property
    def labels(self) -> dict[str, np.ndarray] | None:
        return self.rows.labels

    def outputs_of(self, backend: Backend) -> Samples:
        return [backend.run(sample) for sample in self.samples]


@dataclass(frozen=True)
class PreparedInputs:
    """The inputs and the judging rows (before the reference is known)."""

    input_spec: InputSpec
    feeds: dict[str, np.ndarray]
    rows: RowPlan


def calibration_readers(recipe: Recipe) -> list[StageSpec]:
    """The enabled stages that calibrate on --calib-data (ONNX Runtime's and OpenVINO's int8)."""
    stages = (recipe.stage(name) for name in quantize_stages())
    return [spec for spec in stages if spec is not None and spec.enabled]


def calibration_unused_reason(recipe: Recipe, quantize: str) -> str:
    """Why no stage will read --calib-data ("" when one will)."""
    present = [name for name in quantize_stages() if recipe.stage(name) is not None]
    if not present:
        return f"recipe {recipe.name} has no quantize stage"
    readers = calibration_readers(recipe)
    if not readers:
        if quantize == "never":
            return "the quantize stage is off (--quantize never)"
        return f"the quantize stage is off in recipe {recipe.name} (--quantize always turns it on)"
    modes = {str(spec.options.get("mode", "auto")).lower() for spec in readers if spec.name == "quantize"}
    if [spec.name for spec in readers] == ["quantize"] and modes == {"dynamic"}:
        return "quantize searches dynamic int8 only (mode dynamic), whose ranges are computed at run time"
    return ""


def prepare_inputs(record: RunRecord, model_path: Path, workdir: Path) -> PreparedInputs:
    """The benchmark feeds and the judging rows, with every data file checked against the model
    before any stage runs (the data package's row plan decides which rows do what). Stages that
    calibrate are pointed at the calibration rows."""
    record.status("resolving inputs")
    req, recipe = record.request, record.recipe
    th = recipe.accuracy
    input_spec, feeds = resolve_inputs(
        model_path, req.shapes, req.input_data, seed=req.seed, batch=req.batch, first_rows=True
    )
    specs = model_input_specs(model_path)
    axes = batch_axes(specs)
    calibration = _real_calibration_rows(record, model_path, specs, feeds, axes)
    unused = calibration_unused_reason(recipe, req.quantize)
    if calibration is not None and unused:
        record.warn(f"{calibration.flag} is not used to calibrate: {unused}")

    def generated() -> tuple[Samples, str]:
        gen_spec, _ = resolve_inputs(model_path, input_spec.shapes(), None, seed=req.seed)
        return generated_samples(gen_spec, req.seed, th.samples), f"seed {req.seed}, {th.samples} samples"

    plan = plan_rows(
        specs=specs,
        feeds=feeds,
        axes=axes,
        seed=req.seed,
        workdir=workdir,
        eval_data=req.eval_data,
        input_data=req.input_data,
        calibration=calibration,
        calibrates=not unused,
        generated=generated,
    )
    for warning in plan.warnings:
        if warning not in input_spec.warnings:
            record.warn(warning)
    for note in [*(calibration.notes if calibration is not None else []), *plan.notes]:
        record.log(note)
    if plan.calibration_file is not None:
        for spec in calibration_readers(recipe):
            spec.options["calib_data"] = str(plan.calibration_file)
    if plan.real and MIN_ROWS <= len(plan.samples) < FEW_SAMPLES:  # fewer: the row plan said so
        record.warn(
            f"accuracy is judged on {len(plan.samples)} samples ({plan.source}), fewer than "
            f"{FEW_SAMPLES}: a rare failure can pass unseen; give more rows"
        )
    record.input_spec = input_spec
    record.accuracy_samples = len(plan.samples)
    return PreparedInputs(input_spec, feeds, plan)


def _real_calibration_rows(
    record: RunRecord,
    model_path: Path,
    specs: list[Any],
    feeds: dict[str, np.ndarray],
    axes: Any,
) -> RealRows | None:
    """--calib-data, or --data turned into rows, read and checked against the model now (the
    quantize stages read them late)."""
    req = record.request
    if req.data is not None:
        record.status(f"reading --data {req.data}")
        return read_data(
            req.data, model_path, specs, feeds, axes, preprocess=req.preprocess, tokenizer=req.tokenizer
        )
    if req.calib_data is None:
        return None
    return read_real_rows("--calib-data", Path(req.calib_data), specs, feeds, axes)


def _choose_metrics(
    record: RunRecord, reference: Samples, prepared: PreparedInputs, backend: Backend
) -> tuple[dict[str, MetricChoice], Evidence, UserMetric | None]:
    """Each output's task metric (the recipe's / --task-metric's overrides win), the evidence the
    rows give, and the user's metric checked on the original model against itself."""
    thresholds = record.recipe.accuracy
    axes = output_batch_axes(backend.outputs, backend.inputs, reference[0], prepared.input_spec.batch_size)
    choices = choose_metrics(reference, thresholds.task_metrics, axes)
    evidence = assess(reference, choices, thresholds, source=prepared.rows.source, real=prepared.rows.real)
    for test in evidence.outputs:
        verdict = "can tell" if test.can_tell else "cannot tell"
        record.log(f"evidence: output {test.name!r} ({test.metric}) {verdict}: {test.finding}")
    if not evidence.can_tell:
        record.warn(
            "no reduced or quantized candidate can ship from this run: "
            f"{evidence.why_not()}; to verify them, give {evidence.needs()}"
        )
    user_metric = record.request.user_metric()
    if user_metric is not None:
        samples, labels = prepared.rows.samples, prepared.rows.labels
        score, passed = user_metric(reference, reference, samples, labels)
        if not passed:
            raise UsageError(
                f"--metric {user_metric.spec} fails the original model's own outputs (score {score:.6g})",
                "it must pass when the candidate's outputs equal the reference's",
            )
    return choices, evidence, user_metric


def prepare_baseline(
    record: RunRecord, model_path: Path, prepared: PreparedInputs, backend: Backend
) -> Baseline:
    """The frozen baseline: the reference outputs of the original model (`backend`, loaded on
    ONNX Runtime defaults) on the prepared rows, and what they can tell."""
    backend.check_feeds(prepared.feeds)
    record.status(f"baseline: reference outputs on {len(prepared.rows.samples)} samples")
    reference = [backend.run(sample) for sample in prepared.rows.samples]
    choices, evidence, user_metric = _choose_metrics(record, reference, prepared, backend)
    repeat = check(
        reference[0], backend.run(prepared.rows.samples[0]), record.recipe.accuracy, choices=choices
    )
    if not repeat.ok:
        record.warn(
            f"the original model is not deterministic on the same input ({repeat.reason}); "
            "accuracy checks compare against one run of it"
        )
    return Baseline(
        model_path=model_path,
        input_spec=prepared.input_spec,
        feeds=prepared.feeds,
        rows=prepared.rows,
        inputs=backend.inputs,
        outputs_spec=[o.to_json() for o in backend.outputs],
        reference=reference,
        choices=choices,
        evidence=evidence,
        user_metric=user_metric,
        external_data=file_has_external_data(model_path),
    )


__all__ = [
    "Baseline",
    "PreparedInputs",
    "calibration_readers",
    "calibration_unused_reason",
    "prepare_baseline",
    "prepare_inputs",
]
