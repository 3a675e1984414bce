"""Per-output figures of a candidate against the reference: whole output, worst slice, task metric,
padded positions left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import numpy as np

from optimize.accuracy.result import Outputs
from optimize.accuracy.task_metrics import (
    MetricChoice,
    batch_first,
    check_metric_shape,
    choose_metric,
    classifier_counts,
    cosines,
    ctc_counts,
    detection_agreement,
    detection_counts,
    mask_counts,
    override_choice,
    vector_cosines,
)
from optimize.accuracy.thresholds import Thresholds
from optimize.errors import UsageError

SLICE_MAX_LEN = 256  # axes up to this long are sliced (channels, classes, fields), longer ones not


# A sample whose largest |reference| is below this share of the output's over all judging rows
# carries no signal there: its cosine is the angle between two noise floors (a text map with no
# text: cosine 0.966 for an fp32 error of 2e-5). It is judged by its error against the output's
# range instead, which must stay under verdict.QUIET_MAX_REL.
NO_SIGNAL_SHARE = 0.01


# An fp32 candidate (exact or reassociated) whose error is within this share of the range of the
# output, and of each live slice of it, over the judging rows is the same computation done in
# another order: never inaccurate, whatever a metric on near-zero values says.
FP32_TOLERANCE = 1e-4


SLICE_MIN_ELEMENTS = 64  # fewer elements per sample in a slice: its cosine is pooled over samples


NEGLIGIBLE_SLICE = 1e-4  # a slice whose max |reference| is below this share of the output's is skipped


def padding_masks(inputs: Sequence[Outputs] | None) -> list[np.ndarray | None]:
    """Per sample, which [batch, sequence] positions hold tokens: from an integer or boolean input
    named like a mask (attention_mask, input_mask) that is 2-D and holds only 0 and 1, with at
    least one 1 in each row. None for a sample without one (or with several that disagree)."""
    masks: list[np.ndarray | None] = []
    for feed in inputs or []:
        found: np.ndarray | None = None
        for name, value in feed.items():
            arr = np.asarray(value)
            if "mask" not in name.lower() or arr.ndim != 2 or arr.dtype.kind not in "biu":
                continue
            if not np.isin(arr, (0, 1)).all() or not arr.any(axis=1).all():
                continue
            real = arr.astype(bool)
            if found is not None and not np.array_equal(found, real):
                found = None
                break
            found = real
        masks.append(found)
    return masks


def _unpadded(ref: np.ndarray, got: np.ndarray, real: np.ndarray | None) -> tuple[np.ndarray, int]:
    """`got` with its padded positions set to the reference's, and how many positions that was;
    only for an output of three or more axes that starts with the mask's [batch, sequence]."""
    if real is None or got.ndim < 3 or got.shape[:2] != real.shape or real.all():
        return got, 0
    out = np.array(got, copy=True)
    out[~real] = ref[~real]
    return out, int((~real).sum())


def as_samples(value: Outputs | Sequence[Outputs]) -> list[Outputs]:
    if isinstance(value, Mapping):
        return [value]
    return list(value)


# The share of maps the judging rows did not show that a candidate may put under min_mask_iou,
# projected from the IoUs it did show (a normal fit per binarization level): above this, its worst
# judged map clearing the threshold is luck. An OpenVINO int8 text detector judged at worst 0.951
# (mean 0.960) over 16 maps fell to 0.949 on 32 fresh pages (2026-12-06): projected, 5.1%.
MASK_UNSEEN_SHARE = 0.005


_MIN_MAPS_TO_PROJECT = 8  # fewer, and the spread of the IoUs says little


def unseen_share_below(ious_by_level: Mapping[float, Sequence[float]], threshold: float) -> float:
    """The largest, over levels, projected share of unseen maps whose IoU falls under `threshold`
    (0 where too few maps or no spread)."""
    worst = 0.0
    for values in ious_by_level.values():
        if len(values) < _MIN_MAPS_TO_PROJECT:
            continue
        mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
        if sd > 0:
            worst = max(worst, NormalDist(mean, sd).cdf(threshold))
    return worst


def _cosine(ref: np.ndarray, got: np.ndarray) -> float:
    a = ref.ravel()
    b = got.ravel()
    return float(cosines(np.dot(a, b), np.dot(a, a), np.dot(b, b)))


def output_figures(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Whole-output error figures for one output of one sample (shapes must already match)."""
    if not np.issubdtype(ref.dtype, np.floating):
        mismatched = int(np.count_nonzero(ref != got))
        return {
            "cosine": 1.0 if mismatched == 0 else 0.0,
            "max_abs": float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
            if ref.size
            else 0.0,
            "max_rel": 0.0 if mismatched == 0 else float("inf"),
            "mismatched": float(mismatched),
        }
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    # NaN/inf where the reference has them too is the model's behaviour, not an error.
    both_nonfinite = ~np.isfinite(r) & ~np.isfinite(g) & ((r == g) | (np.isnan(r) & np.isnan(g)))
    new_nonfinite = ~np.isfinite(g) & ~both_nonfinite
    if np.any(new_nonfinite):
        return {"cosine": 0.0, "max_abs": float("inf"), "max_rel": float("inf"), "nonfinite": 1.0}
    keep = ~both_nonfinite
    r, g = r[keep], g[keep]
    if r.size == 0:
        return {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0}
    diff = np.abs(r - g)
    max_abs = float(diff.max())
    scale = float(np.abs(r).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return {"cosine": _cosine(r, g), "max_abs": max_abs, "max_rel": max_rel}


def _sliced_axes(shape: Sequence[int], batch_axis: int | None, spatial: bool) -> list[int]:
    """The axes an output is sliced along: length 2..SLICE_MAX_LEN (channels, classes, fields), not
    the batch axis, nor a probability map's height and width (`spatial`: its last two axes)."""
    ndim = len(shape)
    return [
        axis
        for axis, length in enumerate(shape)
        if axis != batch_axis and 2 <= length <= SLICE_MAX_LEN and not (spatial and axis >= ndim - 2)
    ]


def _worst_slices(
    cos: np.ndarray, diff: np.ndarray, ref_peak: np.ndarray, floor: float
) -> tuple[tuple[float, int, float], tuple[int, float], int] | None:
    """Among the slices whose reference peak is above `floor` (negligible ones are judged in the
    whole output only): (lowest cosine, its index, its max_rel), (index and value of the highest
    max_rel), and how many slices counted. None when no slice counts."""
    live = ref_peak > floor
    if not np.any(live):
        return None
    cos = np.where(live, cos, np.inf)
    rel = np.where(live, diff / np.where(ref_peak > 0, ref_peak, 1.0), -np.inf)
    i, j = int(np.argmin(cos)), int(np.argmax(rel))
    return (float(cos[i]), i, float(rel[i])), (j, float(rel[j])), int(np.count_nonzero(live))


def slice_figures(
    refs: Sequence[np.ndarray], gots: Sequence[np.ndarray], batch_axis: int | None, spatial: bool = False
) -> dict[str, Any] | None:
    """The worst slice of one float output over all samples: along each axis of length 2..256
    other than the batch axis, every slice's cosine and max_rel; None when no axis qualifies or a
    sample holds NaN/inf (the whole-output figures judge those).

    `spatial`: the last two axes are a picture's height and width (a probability map): not sliced.

    Returns {"cosine": {axis, index, length, value, sample, pooled}, "max_rel": {...}, "slices"}.
    """
    ndim = refs[0].ndim
    if not all(np.all(np.isfinite(r)) and np.all(np.isfinite(g)) for r, g in zip(refs, gots, strict=True)):
        return None
    worst_cos: dict[str, Any] | None = None
    worst_rel: dict[str, Any] | None = None
    checked = 0
    for axis in _sliced_axes(refs[0].shape, batch_axis, spatial):
        length = refs[0].shape[axis]
        others = tuple(a for a in range(ndim) if a != axis)
        pooled = refs[0].size // length < SLICE_MIN_ELEMENTS
        sums = np.zeros((3, length))
        peak_ref = np.zeros(length)
        peak_diff = np.zeros(length)
        scale = 0.0
        per_sample: list[tuple[float, int, int, float]] = []  # (cosine, index, sample, max_rel)
        for s, (ref, got) in enumerate(zip(refs, gots, strict=True)):
            r, g = ref.astype(np.float64), got.astype(np.float64)
            dot, rr, gg = (np.sum(x, axis=others) for x in (r * g, r * r, g * g))
            mref = np.max(np.abs(r), axis=others)
            mdiff = np.max(np.abs(r - g), axis=others)
            if pooled:
                sums += np.stack([dot, rr, gg])
                peak_ref, peak_diff = np.maximum(peak_ref, mref), np.maximum(peak_diff, mdiff)
                scale = max(scale, float(mref.max()))
                continue
            found = _worst_slices(cosines(dot, rr, gg), mdiff, mref, NEGLIGIBLE_SLICE * float(mref.max()))
            if found is not None:
                (cos_value, i, rel_i), (j, rel_j), live = found
                per_sample.append((cos_value, i, s, rel_i))
                if worst_rel is None or rel_j > worst_rel["value"]:
                    worst_rel = {"axis": axis, "index": j, "length": length, "value": rel_j,
                                 "sample": s, "pooled": False}  # fmt: skip
                checked += live
        if pooled:
            found = _worst_slices(cosines(*sums), peak_diff, peak_ref, NEGLIGIBLE_SLICE * scale)
            if found is None:
                continue
            (cos_value, i, rel_i), (j, rel_j), live = found
            per_sample.append((cos_value, i, -1, rel_i))
            if worst_rel is None or rel_j > worst_rel["value"]:
                worst_rel = {"axis": axis, "index": j, "length": length, "value": rel_j,
                             "sample": None, "pooled": True}  # fmt: skip
            checked += live
        for cos_value, index, sample, _ in per_sample:
            if worst_cos is None or cos_value < worst_cos["value"]:
                worst_cos = {
                    "axis": axis,
                    "index": index,
                    "length": length,
                    "value": cos_value,
                    "sample": None if sample < 0 else sample,
                    "pooled": sample < 0,
                }
    if worst_cos is None or worst_rel is None:
        return None
    return {"cosine": worst_cos, "max_rel": worst_rel, "slices": checked}


def _peak(ref: np.ndarray) -> float:
    """The largest finite |value| of a float sample (0.0 for other dtypes or none)."""
    if not np.issubdtype(ref.dtype, np.floating) or ref.size == 0:
        return 0.0
    finite = np.abs(ref[np.isfinite(ref)])
    return float(finite.max()) if finite.size else 0.0


def _span(refs: Sequence[np.ndarray]) -> float:
    """The range (max - min) of an output's finite values over all judging rows."""
    lows, highs = [], []
    for ref in refs:
        if not np.issubdtype(ref.dtype, np.floating):
            return 0.0
        finite = ref[np.isfinite(ref)]
        if finite.size:
            lows.append(float(finite.min()))
            highs.append(float(finite.max()))
    return max(highs) - min(lows) if lows else 0.0


def within_float_tolerance(
    refs: Sequence[np.ndarray], gots: Sequence[np.ndarray], batch_axis: int | None, spatial: bool = False
) -> bool:
    """Whether the candidate's error is within FP32_TOLERANCE of the output's range over all the
    rows, and of each live slice's range along every short axis (a class-score field next to box
    coordinates in pixels has its own scale). `spatial`: the last two axes are a picture's height
    and width (a probability map), whose rows and columns are not fields with scales of their own.
    NaN/inf must match exactly."""
    span = _span(refs)
    for ref, got in zip(refs, gots, strict=True):
        if not np.array_equal(np.isfinite(ref), np.isfinite(got)):
            return False
        finite = np.isfinite(ref)
        if np.any(
            np.abs(ref[finite].astype(np.float64) - got[finite].astype(np.float64)) > FP32_TOLERANCE * span
        ):
            return False
    ndim = refs[0].ndim
    if not all(np.all(np.isfinite(r)) for r in refs):
        return True  # slices of non-finite outputs: the whole-output test above decides
    for axis in _sliced_axes(refs[0].shape, batch_axis, spatial):
        others = tuple(a for a in range(ndim) if a != axis)
        lo = np.min([np.min(r, axis=others) for r in refs], axis=0).astype(np.float64)
        hi = np.max([np.max(r, axis=others) for r in refs], axis=0).astype(np.float64)
        diff = np.max(
            [
                np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)), axis=others)
                for r, g in zip(refs, gots, strict=True)
            ],
            axis=0,
        )
        live = (hi - lo) > NEGLIGIBLE_SLICE * span
        if np.any(diff[live] > FP32_TOLERANCE * (hi - lo)[live]):
            return False
    return True


def _add(totals: dict[str, int], counts: Mapping[str, int]) -> None:
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value


def _task_figures(
    choice: MetricChoice, refs: Sequence[np.ndarray], gots: Sequence[np.ndarray], th: Thresholds | None
) -> dict[str, Any]:
    """The chosen task metric's figures over all samples."""
    pairs = [
        (batch_first(r, choice.batch_axis), batch_first(g, choice.batch_axis))
        for r, g in zip(refs, gots, strict=True)
    ]
    out: dict[str, Any] = {}
    totals: dict[str, int] = {}
    if choice.metric == "classifier":
        tolerance = th.top1_tolerance if th is not None else 0.0
        for ref, got in pairs:
            _add(totals, classifier_counts(ref, got, tolerance))
        if totals.get("rows"):
            out["top1_agreement"] = totals["strict"] / totals["rows"]
            out["top1_agreement_tolerant"] = totals["tolerant"] / totals["rows"]
            out["top5_agreement"] = totals["top5"] / totals["rows"]
            out["rows"] = totals["rows"]
    elif choice.metric == "embedding":
        worst, where = 1.0, (0, 0)
        for s, (ref, got) in enumerate(pairs):
            cos = vector_cosines(ref, got)
            if cos.size and float(cos.min()) < worst:
                worst, where = float(cos.min()), (s, int(np.argmin(cos)))
        out["embedding_cosine"] = worst
        out["embedding_worst"] = {"sample": where[0], "vector": where[1]}
    elif choice.metric == "ctc":
        for ref, got in pairs:
            _add(totals, ctc_counts(ref, got))
        if totals.get("sequences"):
            out["decode_agreement"] = totals["decoded_equal"] / totals["sequences"]
            out["frame_agreement"] = totals["frames_equal"] / max(totals["frames"], 1)
            out["sequences"] = totals["sequences"]
    elif choice.metric == "mask":
        levels = th.mask_thresholds if th is not None else (0.3, 0.5)
        ious: list[tuple[float, float]] = []
        empty = maps = 0
        for ref, got in pairs:
            counts = mask_counts(ref, got, levels)
            ious += counts["ious"]
            empty += counts["empty"]
            maps += counts["maps"]
        out["mask_maps"] = maps
        out["mask_empty"] = {"maps": empty, "of": maps * len(levels)}
        if ious:
            level, worst = min(ious, key=lambda item: item[1])
            out["mask_iou"] = worst
            out["mask_iou_at"] = level
            out["mask_iou_mean"] = float(np.mean([v for _, v in ious]))
            if th is not None and th.min_mask_iou is not None:
                out["mask_unseen_below"] = unseen_share_below(
                    {t: [v for at, v in ious if at == t] for t in levels}, th.min_mask_iou
                )
    elif choice.metric == "detection":
        score = th.detection_score if th is not None else 0.25
        iou = th.detection_iou if th is not None else 0.5
        for ref, got in pairs:
            _add(totals, detection_counts(ref, got, choice, score, iou))
        out["detection_agreement"] = detection_agreement(totals)
        out["detections"] = totals
    return out


def choose_metrics(
    reference: Outputs | Sequence[Outputs],
    overrides: Mapping[str, str] | None = None,
    batch_axes: Mapping[str, int | None] | None = None,
) -> dict[str, MetricChoice]:
    """The task metric of every output, from the reference samples; `overrides` (output name ->
    metric) win. An override naming no output, or a metric the output's rank cannot carry, is a
    usage error."""
    refs = as_samples(reference)
    if not refs:
        return {}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(refs[0]))
    if unknown:
        raise UsageError(
            f"task metric set for {unknown[0]!r}, which is not an output of the model",
            f"its outputs: {', '.join(refs[0])}",
        )
    choices: dict[str, MetricChoice] = {}
    for name in refs[0]:
        axis = (batch_axes or {}).get(name, 0 if np.asarray(refs[0][name]).ndim else None)
        samples = [np.asarray(r[name]) for r in refs if name in r]
        choice = choose_metric(name, samples, axis)
        if name in overrides:
            choice = override_choice(choice, overrides[name], samples[0])
            if choice.metric != "none" and not np.issubdtype(samples[0].dtype, np.floating):
                raise UsageError(f"output {name!r} is {samples[0].dtype}: a task metric needs a float output")
            problem = check_metric_shape(name, choice, samples[0])
            if problem:
                raise UsageError(problem, f"choose another metric for it, e.g. --task-metric {name}=none")
        choices[name] = choice
    return choices


def compare_outputs(
    reference: Outputs | Sequence[Outputs],
    outputs: Outputs | Sequence[Outputs],
    top1_tolerance: float = 0.0,
    *,
    thresholds: Thresholds | None = None,
    choices: Mapping[str, MetricChoice] | None = None,
    padding: Sequence[np.ndarray | None] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Worst-case figures per output over all samples, and the structural problems found.
    `padding`: per sample, the token positions of an attention mask (`padding_masks`); the
    others are not judged."""
    refs, gots = as_samples(reference), as_samples(outputs)
    padding = list(padding or [])
    if len(refs) != len(gots):
        return {}, [f"{len(gots)} output samples for {len(refs)} reference samples"]
    if thresholds is not None:
        top1_tolerance = thresholds.top1_tolerance
    elif top1_tolerance:
        thresholds = Thresholds(top1_tolerance=top1_tolerance)
    if choices is None:
        choices = choose_metrics(refs)
    problems: list[str] = []
    per_output: dict[str, dict[str, Any]] = {}
    names = list(dict.fromkeys(name for sample in refs for name in sample))
    for name in names:
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        padded = 0
        for index, (ref_sample, got_sample) in enumerate(zip(refs, gots, strict=True)):
            if name not in ref_sample:
                continue
            if name not in got_sample:
                problems.append(f"output {name!r} is missing")
                continue
            ref, got = np.asarray(ref_sample[name]), np.asarray(got_sample[name])
            if got.shape != ref.shape:
                problems.append(
                    f"output {name!r} has shape {list(got.shape)}, the reference {list(ref.shape)}"
                )
                continue
            got, ignored = _unpadded(ref, got, padding[index] if index < len(padding) else None)
            padded += ignored
            pairs.append((ref, got))
        if not pairs:
            continue
        worst: dict[str, Any] = {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0}
        peaks = [_peak(ref) for ref, _ in pairs]
        floor = NO_SIGNAL_SHARE * max(peaks, default=0.0)
        span = _span([ref for ref, _ in pairs])
        quiet: list[int] = []
        for s, (ref, got) in enumerate(pairs):
            figures = output_figures(ref, got)
            is_float = np.issubdtype(ref.dtype, np.floating)
            if is_float and peaks[s] < floor and "nonfinite" not in figures:
                # No signal on this sample: its error counts against the output's range only.
                quiet.append(s)
                rel = figures["max_abs"] / span if span > 0 else 0.0
                worst["quiet_rel"] = max(worst.get("quiet_rel", 0.0), rel)
                worst["max_abs"] = max(worst["max_abs"], figures["max_abs"])
                continue
            if figures["cosine"] < worst["cosine"]:
                worst["cosine"], worst["worst_sample"] = figures["cosine"], s
            worst["max_abs"] = max(worst["max_abs"], figures["max_abs"])
            worst["max_rel"] = max(worst["max_rel"], figures["max_rel"])
            if "mismatched" in figures:
                worst["mismatched"] = worst.get("mismatched", 0.0) + figures["mismatched"]
            if "nonfinite" in figures:
                worst["nonfinite"] = 1.0
        if quiet:
            worst["no_signal_samples"] = quiet
        if padded:
            worst["padded_positions_ignored"] = padded
        if np.issubdtype(pairs[0][0].dtype, np.floating) and "nonfinite" not in worst:
            worst["range"] = span
            worst["range_rel"] = (
                worst["max_abs"] / span if span > 0 else (0.0 if worst["max_abs"] == 0 else 1.0)
            )
        choice = choices.get(name) or choose_metric(
            name, [p[0] for p in pairs], 0 if pairs[0][0].ndim else None
        )
        if choice.metric != "exact" and not np.issubdtype(pairs[0][0].dtype, np.floating):
            choice = replace(choice, metric="exact", why=f"{pairs[0][0].dtype} output: must match exactly")
        worst.update({"metric": choice.metric, "metric_why": choice.why, "metric_source": choice.source})
        if choice.metric != "exact" and "nonfinite" not in worst:
            refs_n, gots_n = [p[0] for p in pairs], [p[1] for p in pairs]
            worst["fp32_tolerance"] = within_float_tolerance(
                refs_n, gots_n, choice.batch_axis, spatial=choice.metric == "mask"
            )
            # A CTC head's axes are the steps of one sequence and its classes, not separate heads or
            # fields: the decodes judge it, and a step whose near-tie moved is no wrecked part.
            sliced = (
                None
                if choice.metric == "ctc"
                else slice_figures(refs_n, gots_n, choice.batch_axis, spatial=choice.metric == "mask")
            )
            if sliced is not None:
                worst["slice"] = sliced["cosine"]
                worst["slice_rel"] = sliced["max_rel"]
            if choice.metric != "none":
                worst.update(_task_figures(choice, refs_n, gots_n, thresholds))
        per_output[name] = worst
    return per_output, sorted(set(problems))
