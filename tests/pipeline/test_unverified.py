"""A reduced or quantized candidate ships only on evidence that can tell (issue: the int8 detector
whose class scores were zero on photos shipped on images with nothing to detect).

The stages are fakes whose candidates say they are int8; the measuring seam is FakeBench, so every
decision here is the judge's and none depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.artifact import load_artifact
from optimize.pipeline import OptimizeRequest, PipelineResult, optimize
from optimize.pipeline.judge import EXIT_TARGET_MET, EXIT_TARGET_MISSED, EXIT_UNVERIFIED
from optimize.stage import Candidate, Stage, StageContext
from tests.pipeline.test_pipeline import FakeBench, FakeStage, write_recipe


def _save(path: Path, nodes: list[Any], x: Any, y: Any, inits: list[Any]) -> Path:
    graph = helper.make_graph(nodes, path.stem, [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="lto-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def classifier_model(path: Path, nudge: float = 0.0) -> Path:
    """x[batch, 8] -> logits[batch, 4] = x @ W: feature i votes for class i % 4. `nudge` shifts W,
    as int8 rounding would."""
    w = np.zeros((8, 4), dtype=np.float32)
    w[np.arange(8), np.arange(8) % 4] = 1.0
    w += nudge
    return _save(
        path,
        [helper.make_node("MatMul", ["x", "W"], ["logits"])],
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4]),
        [numpy_helper.from_array(w, "W")],
    )


def detector_model(path: Path, class_gain: float = 1.0) -> Path:
    """x[1, 50, 6] -> boxes[1, 50, 6] = x * (1, 1, 1, 1, 1, class_gain): a YOLO-style head (box,
    objectness, one class score in one tensor). class_gain 0 is the broken int8 of the issue."""
    gain = np.array([1, 1, 1, 1, 1, class_gain], dtype=np.float32)
    return _save(
        path,
        [helper.make_node("Mul", ["x", "G"], ["boxes"])],
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 50, 6]),
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 50, 6]),
        [numpy_helper.from_array(gain, "G")],
    )


def int8_stage(label: str, build: Any) -> Stage:
    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        return [Candidate(label=label, model_path=build(ctx.workdir / f"{label}.onnx"), precision="int8")]

    return FakeStage(make)


def run(
    tmp_path: Path, model: Path, stages: dict[str, Stage], speeds: dict[str, float], **kw: Any
) -> PipelineResult:
    recipe = write_recipe(tmp_path, list(stages))
    bench = FakeBench({"baseline": 1.0, **speeds})
    request = OptimizeRequest(
        model_path=model, recipe=str(recipe), out_dir=tmp_path / "out", force=True, **kw
    )
    return optimize(request, stage_factory=stages.__getitem__, measure_fn=bench.measure,
                    compare_fn=bench.compare, open_worker_fn=bench.open_worker,
                    known_stages=list(stages))  # fmt: skip


def confident_rows(path: Path, count: int, seed: int = 0) -> Path:
    """Rows a classifier decides: one feature well above the rest, classes mixed."""
    rng = np.random.default_rng(seed)
    x = 0.1 * rng.standard_normal((count, 1, 8)).astype(np.float32)
    x[np.arange(count), 0, np.arange(count) % 8] += 3.0
    np.savez(path, x=x)
    return path


def detector_rows(path: Path, count: int, objects: bool) -> Path:
    rng = np.random.default_rng(1)
    x = np.zeros((count, 1, 50, 6), dtype=np.float32)
    x[..., :2] = rng.uniform(20, 300, (count, 1, 50, 2))
    x[..., 2:4] = rng.uniform(5, 40, (count, 1, 50, 2))
    x[..., 4:] = rng.uniform(0.0, 0.05, (count, 1, 50, 2))
    if objects:
        x[:, 0, :3, 4:] = 0.95  # three objects per image
    np.savez(path, x=x)
    return path


def test_with_no_data_a_faster_int8_is_measured_listed_and_not_shipped(tmp_path: Path) -> None:
    model = classifier_model(tmp_path / "cls.onnx")
    stages = {"fake-int8": int8_stage("fake-int8", lambda p: classifier_model(p, 0.001))}
    result = run(tmp_path, model, stages, {"fake-int8": 0.5})
    record = next(r for r in result.records if r.label == "fake-int8")
    assert record.status == "unverified" and record.numerics == "quantized"
    assert "generated" in record.reason and "not shipped: unverified" in record.reason
    # No --target-ms and an artifact written: a success, whatever was left out (CI's `|| exit 1`).
    assert result.best.label == "baseline" and result.exit_code == EXIT_TARGET_MET
    section = result.report["optimize"]
    left_out = section["unverified"]
    assert [c["label"] for c in left_out["candidates"]] == ["fake-int8"]
    assert left_out["candidates"][0]["speedup"] > 1.5
    assert left_out["command"].endswith("--eval-data EVAL.npz") and str(model) in left_out["command"]
    assert "not shipped, unverified" in result.verdict
    assert section["best"]["numerics"] == "exact"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["numerics"] == "exact"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Faster candidates not shipped" in md and "--eval-data EVAL.npz" in md
    # The summary leads with the answer: the original shipped, what was left out, what would verify it.
    summary = md[md.index("## Summary") : md.index("## Run")]
    assert "**Shipped the original model**" in summary
    assert "**Left out**: 1 faster candidate(s)" in summary and "--eval-data EVAL.npz" in summary


@pytest.mark.parametrize(
    ("target_ms", "fail_on_unverified", "code"),
    [
        (None, False, EXIT_TARGET_MET),  # no target: the written artifact is the answer
        (None, True, EXIT_UNVERIFIED),  # asked to fail on what was left out
        (2.0, False, EXIT_TARGET_MET),  # the shipped original (1 ms) meets the target
        (2.0, True, EXIT_UNVERIFIED),
        (0.7, False, EXIT_UNVERIFIED),  # missed; the unverified int8 (0.5 ms) would meet it
        (0.3, False, EXIT_TARGET_MISSED),  # missed, and nothing left out would meet it either
        (0.3, True, EXIT_TARGET_MISSED),  # a missed target says more than what was left out
    ],
)
def test_each_exit_code_of_a_run_with_an_unverified_faster_candidate(
    tmp_path: Path, target_ms: float | None, fail_on_unverified: bool, code: int
) -> None:
    model = classifier_model(tmp_path / "cls.onnx")
    stages = {"fake-int8": int8_stage("fake-int8", lambda p: classifier_model(p, 0.001))}
    result = run(tmp_path, model, stages, {"fake-int8": 0.5}, target_ms=target_ms,
                 fail_on_unverified=fail_on_unverified)  # fmt: skip
    assert result.best.label == "baseline"
    assert result.exit_code == code, result.verdict
    if code == EXIT_UNVERIFIED and target_ms is not None and not fail_on_unverified:
        assert "fake-int8 would meet the target" in result.verdict


def test_on_real_rows_that_can_tell_the_int8_ships_with_its_evidence(tmp_path: Path) -> None:
    model = classifier_model(tmp_path / "cls.onnx")
    stages = {"fake-int8": int8_stage("fake-int8", lambda p: classifier_model(p, 0.001))}
    result = run(
        tmp_path, model, stages, {"fake-int8": 0.5}, eval_data=confident_rows(tmp_path / "e.npz", 16)
    )
    assert result.best.label == "fake-int8" and result.exit_code == EXIT_TARGET_MET
    accuracy = result.report["optimize"]["accuracy"]
    assert result.report["optimize"]["best"]["numerics"] == "quantized"
    assert accuracy["evidence"]["can_tell"] is True
    assert accuracy["evidence"]["outputs"]["logits"]["metric"] == "classifier"
    assert accuracy["rows"]["judge"]["flag"] == "--eval-data" and accuracy["rows"]["judge"]["samples"] == 16
    assert load_artifact(tmp_path / "out").precision == "int8"


def test_calibration_rows_alone_are_split_and_the_int8_ships_judged_on_the_held_out_half(
    tmp_path: Path,
) -> None:
    model = classifier_model(tmp_path / "cls.onnx")
    seen: list[tuple[str, np.ndarray]] = []

    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        with np.load(ctx.options["calib_data"]) as npz:
            seen.append((str(ctx.options["calib_data"]), npz["x"]))
        path = classifier_model(ctx.workdir / "q.onnx", 0.001)
        return [Candidate(label="quantize:fake", model_path=path, precision="int8")]

    calib = confident_rows(tmp_path / "calib.npz", 32)
    result = run(tmp_path, model, {"quantize": FakeStage(make)}, {"quantize:fake": 0.5}, calib_data=calib)
    assert result.best.label == "quantize:fake"
    rows = result.report["optimize"]["accuracy"]["rows"]
    assert rows["judge"]["samples"] == 16 and rows["calibration"]["samples"] == 16
    assert not set(rows["judge"]["indices"]) & set(rows["calibration"]["indices"])
    # The stage calibrated from lto's file of the calibration half, not from the user's whole file.
    assert seen and seen[0][0] != str(calib.absolute())
    with np.load(calib) as whole:
        assert np.array_equal(seen[0][1], whole["x"][rows["calibration"]["indices"]])


def test_a_detector_given_images_with_nothing_to_detect_ships_no_int8(tmp_path: Path) -> None:
    model = detector_model(tmp_path / "det.onnx")
    stages = {"fake-int8": int8_stage("fake-int8", lambda p: detector_model(p, class_gain=0.0))}
    empty = detector_rows(tmp_path / "empty.npz", 16, objects=False)
    result = run(tmp_path, model, stages, {"fake-int8": 0.5}, eval_data=empty)
    record = next(r for r in result.records if r.label == "fake-int8")
    # It failed on these rows (its class scores are zero): inaccurate, not "unverified", and never
    # offered for verification, though the rows cannot tell and the reason says so.
    assert record.status == "rejected" and record.inaccurate and result.best.label == "baseline"
    assert "on rows that cannot tell" in record.reason and "detects 0 object(s)" in record.reason
    assert result.report["optimize"]["unverified"] is None
    evidence = result.report["optimize"]["accuracy"]["evidence"]
    assert "rows in which the original detects objects" in evidence["needs"]
    assert result.exit_code == 0  # no --target-ms: a written artifact is a success


def test_a_detector_given_real_detections_ships_int8_only_if_it_keeps_them(tmp_path: Path) -> None:
    model = detector_model(tmp_path / "det.onnx")
    photos = detector_rows(tmp_path / "photos.npz", 16, objects=True)
    broken = {"fake-int8": int8_stage("fake-int8", lambda p: detector_model(p, class_gain=0.0))}
    result = run(tmp_path, model, broken, {"fake-int8": 0.5}, eval_data=photos)
    record = next(r for r in result.records if r.label == "fake-int8")
    assert record.status == "rejected" and record.reason.startswith("inaccurate")
    assert "detection agreement" in record.reason and result.best.label == "baseline"

    faithful = {"fake-int8": int8_stage("fake-int8", lambda p: detector_model(p, class_gain=0.999))}
    result = run(tmp_path, model, faithful, {"fake-int8": 0.5}, eval_data=photos)
    assert result.best.label == "fake-int8" and result.exit_code == EXIT_TARGET_MET
