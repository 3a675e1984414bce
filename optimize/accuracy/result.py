"""An accuracy check's result, and its summary and JSON for the report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimize.errors import UsageError

Outputs = Mapping[str, np.ndarray]


FEW_SAMPLES = 16  # below this many samples the report says the figures are weak


@dataclass
class AccuracyResult:
    ok: bool
    reason: str  # empty when ok
    # name -> figures: cosine, max_abs, max_rel (numbers, worst sample), "slice" (the worst slice),
    # "metric"/"metric_why"/"metric_source" and the task metric's own figures.
    per_output: dict[str, dict[str, Any]]
    user_metric: dict[str, Any] | None = None  # {"name", "score", "ok"} of --metric
    samples: int = 0
    # Why these rows cannot verify the candidate (pipeline/judge.weigh_evidence): a reduced or
    # quantized candidate judged on rows whose metrics cannot tell. It may be measured, never shipped.
    unverified: str = ""

    def attempt_summary(self) -> dict[str, Any]:
        """The short record a searching stage keeps of one gate check: ok, worst cosine, reason."""
        worst = min((m.get("cosine", 1.0) for m in self.per_output.values()), default=None)
        summary: dict[str, Any] = {"accuracy_ok": self.ok}
        if worst is not None:
            summary["worst_cosine"] = round(float(worst), 6)
        if self.reason:
            summary["reason"] = self.reason
        if self.unverified:
            summary["unverified"] = self.unverified
        return summary


class MetricError(UsageError):
    """The user's --metric file failed (import, signature, a raise, a bad return): a usage error."""


_WORST_MIN = (
    "mask_iou",
    "top1_agreement",
    "top1_agreement_tolerant",
    "top5_agreement",
    "embedding_cosine",
    "decode_agreement",
    "detection_agreement",
)


def summarize_accuracy(result: AccuracyResult) -> dict[str, Any]:
    """The worst figures over all outputs, for a one-cell summary in tables."""
    if not result.per_output:
        return {}
    figs = list(result.per_output.values())
    out: dict[str, Any] = {
        "cosine": min(f["cosine"] for f in figs),
        "max_abs": max(f["max_abs"] for f in figs),
        "max_rel": max(f["max_rel"] for f in figs),
    }
    slices = [f["slice"]["value"] for f in figs if f.get("slice")]
    if slices:
        out["slice_cosine"] = min(slices)
    for key in _WORST_MIN:
        values = [f[key] for f in figs if key in f]
        if values:
            out[key] = min(values)
    if result.user_metric is not None:
        out["metric_score"] = result.user_metric["score"]
    return out


def _clean(value: Any) -> Any:
    """JSON-safe: inf/nan become strings, which JSON cannot hold as numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def accuracy_json(result: AccuracyResult) -> dict[str, Any]:
    """JSON-safe form of a result, for records and reports."""
    out: dict[str, Any] = {
        "ok": result.ok,
        "reason": result.reason,
        "per_output": _clean(result.per_output),
        "worst": _clean(summarize_accuracy(result)),
    }
    if result.samples:
        out["samples"] = result.samples
    if result.user_metric is not None:
        out["user_metric"] = _clean(result.user_metric)
    if result.unverified:
        out["unverified"] = result.unverified
    return out
