"""pipeline/request.py: a request is checked before any work, and the command line's flags fold
into the recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optimize.errors import UsageError
from optimize.pipeline.request import (
    OptimizeRequest,
    apply_overrides,
    partial_report_path,
    stage_disabled_reason,
)
from optimize.recipes import StageSpec
from tests.pipeline.values import recipe


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"target_ms": -1.0}, "--target-ms must be a positive number"),
        ({"target_ms": float("inf")}, "--target-ms must be a positive number"),
        ({"target_percentile": "p42"}, "--target-percentile 'p42' is not supported"),
        ({"quantize": "sometimes"}, "--quantize 'sometimes'"),
        ({"runtime": "tflite"}, "--runtime 'tflite'"),
        ({"search_order": "random"}, "--search-order 'random'"),
        ({"time_budget_s": 0.0}, "--time-budget must be positive"),
        ({"batch": 0}, "--batch must be at least 1"),
        ({"stop_at_target": True}, "--stop-at-target needs --target-ms"),
    ],
)
def test_a_request_is_refused_before_any_work(tmp_path: Path, fields: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError, match=said.replace("(", r"\(")):
        OptimizeRequest(model_path=tmp_path / "m.onnx", **fields).validate()


def test_missing_data_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--calib-data file not found"):
        OptimizeRequest(model_path=tmp_path / "m.onnx", calib_data=tmp_path / "none.npz").validate()
    with pytest.raises(UsageError, match="--eval-data file not found"):
        OptimizeRequest(model_path=tmp_path / "m.onnx", eval_data=tmp_path / "none.npz").validate()


def test_a_plain_request_passes(tmp_path: Path) -> None:
    OptimizeRequest(model_path=tmp_path / "m.onnx", target_ms=5.0, stop_at_target=True).validate()


def test_the_flags_fold_into_the_recipe_and_say_so() -> None:
    unit = recipe(
        StageSpec("graph-fusion", enabled=False), StageSpec("quantize"), StageSpec("openvino-convert")
    )
    request = OptimizeRequest(
        model_path=Path("m.onnx"), enable=["graph-fusion"], quantize="never", runtime="onnxruntime"
    )
    notes = apply_overrides(unit, request)
    assert [(s.name, s.enabled) for s in unit.stages] == [
        ("graph-fusion", True), ("quantize", False), ("openvino-convert", False)
    ]  # fmt: skip
    assert "graph-fusion enabled on the command line" in notes
    assert "--runtime onnxruntime: openvino-convert off" in notes
    assert stage_disabled_reason(unit.stages[1], request, unit) == "--quantize never"
    assert stage_disabled_reason(unit.stages[2], request, unit) == (
        "--runtime onnxruntime (this stage makes openvino candidates)"
    )


def test_an_unknown_stage_and_contradicting_flags_are_refused() -> None:
    with pytest.raises(UsageError, match="stage 'nope' is not in recipe unit"):
        apply_overrides(
            recipe(StageSpec("graph-fusion")), OptimizeRequest(model_path=Path("m"), disable=["nope"])
        )
    both = OptimizeRequest(model_path=Path("m"), enable=["openvino-convert"], runtime="onnxruntime")
    with pytest.raises(UsageError, match="--enable openvino-convert makes openvino candidates"):
        apply_overrides(recipe(StageSpec("openvino-convert")), both)


def test_the_partial_report_lies_beside_the_artifact() -> None:
    assert partial_report_path(Path("reports/m-1")) == Path("reports/m-1.partial-report.json")
