"""What accuracy a candidate must keep: the thresholds the accuracy checks (optimize.accuracy)
apply, which recipes and command-line flags set. Plain data; imports nothing of lto's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """Accuracy a candidate must keep against the reference (baseline) outputs (optimize.accuracy).

    Every float output is judged whole and per slice (along each short axis) on its worst sample:
    by `min_cosine` when it is an embedding or has no task metric, by `min_task_cosine` (a floor
    that still catches a wrecked part) when a task metric judges it: top-1 agreement for
    classifiers, greedy-decode equality for CTC outputs, candidate-set agreement for detection
    heads, the IoU of the regions above `mask_thresholds` for probability maps and masks.
    max_rel is max|candidate - reference| divided by max|reference| of that output (or slice):
    an error relative to its scale, which stays meaningful where elements are ~0.
    The defaults are what users accept of int8 models; the strict recipe tightens them.
    """

    min_cosine: float = 0.99
    min_task_cosine: float = 0.8
    max_abs: float | None = None
    max_rel: float | None = None
    min_top1: float | None = 0.99
    top1_tolerance: float = 0.01
    min_ctc: float | None = 0.99
    min_detection: float | None = 0.9
    detection_score: float = 0.25
    detection_iou: float = 0.5
    # probability maps and masks: the IoU of the regions above each of mask_thresholds
    min_mask_iou: float | None = 0.95
    mask_thresholds: tuple[float, ...] = (0.3, 0.5)
    samples: int = 32
    task_metrics: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            **values,
            "mask_thresholds": list(self.mask_thresholds),
            "task_metrics": dict(self.task_metrics),
        }
