"""pipeline/baseline.py: which stages read --calib-data, and why none would (a warning before any
work rather than a calibration file silently unused)."""

from __future__ import annotations

from optimize.pipeline.baseline import calibration_readers, calibration_unused_reason
from optimize.recipes import StageSpec
from tests.pipeline.values import recipe


def test_the_enabled_quantize_stages_read_the_calibration_rows() -> None:
    unit = recipe(
        StageSpec("graph-fusion"), StageSpec("quantize"), StageSpec("openvino-quantize", enabled=False)
    )
    assert [spec.name for spec in calibration_readers(unit)] == ["quantize"]
    assert calibration_unused_reason(unit, "auto") == ""


def test_why_no_stage_reads_the_calibration_rows() -> None:
    assert (
        calibration_unused_reason(recipe(StageSpec("graph-fusion")), "auto")
        == "recipe unit has no quantize stage"
    )
    off = recipe(StageSpec("quantize", enabled=False))
    assert calibration_unused_reason(off, "never") == "the quantize stage is off (--quantize never)"
    assert calibration_unused_reason(off, "auto") == (
        "the quantize stage is off in recipe unit (--quantize always turns it on)"
    )
    dynamic = recipe(StageSpec("quantize", options={"mode": "Dynamic"}))
    assert calibration_unused_reason(dynamic, "auto").startswith("quantize searches dynamic int8 only")
    # OpenVINO's int8 calibrates whatever ONNX Runtime's mode is.
    both = recipe(StageSpec("quantize", options={"mode": "dynamic"}), StageSpec("openvino-quantize"))
    assert calibration_unused_reason(both, "auto") == ""
