"""The verdict on a candidate's figures: which outputs fail, and why, in words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from optimize.accuracy.compare import (
    FP32_TOLERANCE,
    MASK_UNSEEN_SHARE,
    as_samples,
    choose_metrics,
    compare_outputs,
    padding_masks,
)
from optimize.accuracy.result import AccuracyResult, Outputs
from optimize.accuracy.task_metrics import (
    MetricChoice,
)
from optimize.accuracy.thresholds import Thresholds
from optimize.accuracy.user_metric import UserMetric

QUIET_MAX_REL = 0.1


def _slice_text(sl: Mapping[str, Any]) -> str:
    where = "over all samples" if sl.get("pooled") else f"sample {sl.get('sample')}"
    return f"slice {sl['index']} of axis {sl['axis']} (length {sl['length']}, {where})"


def _task_reason(fig: Mapping[str, Any], th: Thresholds) -> str:
    """The task metric's failure in words ("" when it passes or did not run)."""
    metric = fig.get("metric")
    if (
        metric == "classifier"
        and th.min_top1 is not None
        and fig.get("top1_agreement_tolerant", 1.0) < th.min_top1
    ):
        what = "top-1 agreement" if th.top1_tolerance == 0 else "top-1 agreement outside near-ties"
        return f"{what} {fig['top1_agreement_tolerant']:.3f} < {th.min_top1}"
    if metric == "embedding" and fig.get("embedding_cosine", 1.0) < th.min_cosine:
        at = fig.get("embedding_worst", {})
        return (
            f"embedding cosine {fig['embedding_cosine']:.6f} < {th.min_cosine} "
            f"(sample {at.get('sample')}, vector {at.get('vector')})"
        )
    if metric == "ctc" and th.min_ctc is not None and fig.get("decode_agreement", 1.0) < th.min_ctc:
        return (
            f"greedy CTC decode equal on {fig['decode_agreement']:.3f} of {fig['sequences']} "
            f"sequences < {th.min_ctc}"
        )
    if metric == "mask" and th.min_mask_iou is not None and fig.get("mask_iou", 1.0) < th.min_mask_iou:
        return (
            f"mask IoU {fig['mask_iou']:.3f} < {th.min_mask_iou} (regions above {fig.get('mask_iou_at')}, "
            f"worst of {fig.get('mask_maps', '?')} maps)"
        )
    if metric == "mask" and fig.get("mask_unseen_below", 0.0) > MASK_UNSEEN_SHARE:
        return (
            f"mask IoU at worst {fig['mask_iou']:.3f}, mean {fig['mask_iou_mean']:.3f}: about "
            f"{fig['mask_unseen_below']:.1%} of maps like these would fall under {th.min_mask_iou} "
            f"(at most {MASK_UNSEEN_SHARE:.1%})"
        )
    if (
        metric == "detection"
        and th.min_detection is not None
        and fig.get("detection_agreement", 1.0) < th.min_detection
    ):
        d = fig.get("detections", {})
        return (
            f"detection agreement {fig['detection_agreement']:.3f} < {th.min_detection} "
            f"({d.get('matched', 0)} of {d.get('reference', 0)} reference detections matched, "
            f"{d.get('missing', 0)} missing, {d.get('extra', 0)} extra)"
        )
    return ""


def output_reasons(name: str, fig: Mapping[str, Any], th: Thresholds) -> list[str]:
    """Every threshold one output violates, in words ([] when it passes)."""
    if fig.get("nonfinite"):
        return ["has NaN/inf values the reference does not have"]
    if fig.get("mismatched", 0) > 0:
        return [f"differs in {int(fig['mismatched'])} integer elements"]
    if fig.get("metric") == "exact":
        return []
    reasons = [r for r in [_task_reason(fig, th)] if r]
    min_cos = th.min_cosine if fig.get("metric", "none") in ("embedding", "none") else th.min_task_cosine
    quiet = fig.get("quiet_rel")
    if min_cos > 0 and quiet is not None and quiet > QUIET_MAX_REL:
        # where the cosine is not judged, its stand-in (off with the cosine)
        reasons.append(
            f"error {quiet:.3g} of the output's range on the {len(fig.get('no_signal_samples', []))} "
            f"sample(s) where it carries no signal > {QUIET_MAX_REL}"
        )
    if fig["cosine"] < min_cos:
        reasons.append(f"cosine {fig['cosine']:.6f} < {min_cos} (sample {fig.get('worst_sample', 0)})")
    sl = fig.get("slice")
    if sl is not None and sl["value"] < min_cos:
        reasons.append(
            f"{_slice_text(sl)}: cosine {sl['value']:.6f} < {min_cos}, "
            f"while the whole output's is {fig['cosine']:.6f}"
        )
    if th.max_abs is not None and fig["max_abs"] > th.max_abs:
        reasons.append(f"max abs error {fig['max_abs']:.3g} > {th.max_abs}")
    if th.max_rel is not None:
        rel = fig.get("slice_rel")
        if fig["max_rel"] > th.max_rel:
            reasons.append(f"max rel error {fig['max_rel']:.3g} > {th.max_rel}")
        elif rel is not None and rel["value"] > th.max_rel:
            reasons.append(f"{_slice_text(rel)}: max rel error {rel['value']:.3g} > {th.max_rel}")
    return reasons


def check(
    reference: Outputs | Sequence[Outputs],
    outputs: Outputs | Sequence[Outputs],
    thresholds: Thresholds,
    *,
    choices: Mapping[str, MetricChoice] | None = None,
    user_metric: UserMetric | None = None,
    inputs: Sequence[Outputs] | None = None,
    labels: Mapping[str, np.ndarray] | None = None,
    fp32: bool = False,
) -> AccuracyResult:
    """Compare candidate outputs with the reference; not ok names the first failing output with
    every threshold it violates. `choices` are the outputs' task metrics (chosen here from the
    reference when not given, with thresholds.task_metrics as overrides). `fp32`: the candidate
    computes in fp32 (exact or reassociated); an output within FP32_TOLERANCE of its range then
    passes whatever its metrics say."""
    refs = as_samples(reference)
    if choices is None:
        choices = choose_metrics(refs, thresholds.task_metrics)
    per_output, problems = compare_outputs(
        refs, outputs, thresholds=thresholds, choices=choices, padding=padding_masks(inputs)
    )
    if problems:
        return AccuracyResult(ok=False, reason=problems[0], per_output=per_output, samples=len(refs))
    failures: list[str] = []
    for name, fig in per_output.items():
        reasons = output_reasons(name, fig, thresholds)
        if reasons and fp32 and _float_equal(fig):
            fig["passed_by"] = f"fp32 error within {FP32_TOLERANCE:g} of the output's range"
            reasons = []
        if reasons:
            fig["ok"] = False
            failures.append(f"output {name!r}: " + "; ".join(reasons))
        else:
            fig["ok"] = True
    verdict: dict[str, Any] | None = None
    if user_metric is not None:
        score, passed = user_metric(refs, as_samples(outputs), list(inputs or []), labels)
        verdict = {"name": user_metric.spec, "score": score, "ok": passed}
        if not passed:
            failures.append(f"--metric {user_metric.spec}: score {score:.6g} fails")
    reason = failures[0] if failures else ""
    if len(failures) > 1:
        reason += f" (and {len(failures) - 1} more)"
    return AccuracyResult(not failures, reason, per_output, user_metric=verdict, samples=len(refs))


def _float_equal(fig: Mapping[str, Any]) -> bool:
    """An output's figures say the same numbers up to float reassociation."""
    if fig.get("nonfinite") or fig.get("mismatched", 0) > 0:
        return False
    return bool(fig.get("fp32_tolerance"))
