"""pipeline/evaluate.py's best so far: one object holds the best candidate, its worker, the row it
was kept on and its measurement alone; a stage starts from its own runtime's best."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimize.accuracy import AccuracyResult
from optimize.pipeline.evaluate import BestSoFar
from optimize.stage import Candidate, Status
from tests.pipeline.values import measurement, row


class _Worker:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _adopt(best: BestSoFar, cand: Candidate, speedup: float, alone_ms: float) -> _Worker:
    worker = _Worker()
    kept_on = row(cand.label, Status.KEPT, speedup=speedup)
    best.adopt(
        cand,
        worker,
        row=kept_on,
        accuracy=AccuracyResult(True, "", {}),
        alone=measurement(cand.label, alone_ms),
    )  # type: ignore[arg-type]
    return worker


def test_the_best_so_far_holds_its_row_its_worker_and_its_measurement_alone(tmp_path: Path) -> None:
    original = Candidate(label="baseline", model_path=tmp_path / "m.onnx")
    best = BestSoFar(original)
    with pytest.raises(RuntimeError):
        best.alone_ms("p50")  # not measured yet
    start = row("baseline", Status.BASELINE, speedup=1.0)
    best.begin(start, measurement("baseline", 10.0))
    assert best.speedup == 1.0 and best.alone_ms("p50") == 10.0 and best.row is start
    fused = Candidate(label="fuse", model_path=tmp_path / "f.onnx", details={"fused": 3})
    first = _adopt(best, fused, speedup=1.5, alone_ms=6.0)
    assert best.candidate is fused and best.speedup == 1.5 and best.alone_ms("p50") == 6.0
    assert best.row is not None and best.row.label == "fuse" and best.worker is first
    assert best.kept_chain == [{"stage": "fuse", "fused": 3}]
    second = _adopt(best, Candidate(label="fuse2", model_path=tmp_path / "g.onnx"), speedup=2.0, alone_ms=5.0)
    assert first.closed and not second.closed  # the previous best's worker is never timed again
    best.close()
    assert second.closed and best.worker is None


def test_a_stage_starts_from_its_own_runtimes_best(tmp_path: Path) -> None:
    original = Candidate(label="baseline", model_path=tmp_path / "m.onnx")
    best = BestSoFar(original)
    ir = Candidate(label="openvino-convert:bf16", model_path=tmp_path / "m.xml", backend="openvino")
    _adopt(best, ir, speedup=2.5, alone_ms=4.0)
    assert best.candidate is ir
    assert best.of_runtime("onnxruntime") is original  # not an IR it cannot read
    assert best.of_runtime("openvino") is ir and best.of_runtime("tvm") is ir
    fused = Candidate(label="operator-fusion", model_path=tmp_path / "f.onnx")
    _adopt(best, fused, speedup=2.6, alone_ms=3.9)
    assert best.of_runtime("onnxruntime") is fused and best.of_runtime("openvino") is ir
