"""Task metrics on arrays: is the candidate still right about what an output *means*?

A cosine over a whole tensor says how close the numbers are; it does not say whether the class,
the transcript or the boxes are still the same, and it is blind to a small part of an output
that sits next to a large one. Each task here compares a reference and a candidate array of one
output, with the batch axis first, and returns counts that add up over samples:

- classifier [batch, classes]: top-1 agreement (near-ties the reference does not decide can be
  tolerated), and top-5: the reference's top class among the candidate's five best;
- embedding [batch, hidden] or [batch, seq, hidden]: the cosine of every vector (the last axis);
- ctc [batch, time, classes]: the greedy CTC decode (argmax per frame, repeats collapsed, blank 0
  dropped) of every sequence must be equal; per-frame argmax agreement is reported beside it;
- detection [batch, N, 4 box + objectness + classes] (or [batch, 4 + classes, N] without
  objectness): the candidates scoring above a threshold, matched one to one by class and IoU;
- mask [batch, (channels,) H, W] with values in [0, 1] (a text detector's probability map, a
  segmentation mask): the IoU of the regions above each threshold, on the rows where either side
  has any; what a user keeps of such an output is its regions, not its values near zero.

`choose_metric` picks one from the output's shape and values; the pipeline lets the user override
it per output. Nothing here loads a model: every function works on numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METRICS = ("classifier", "embedding", "ctc", "detection", "mask", "none")
CTC_BLANK = 0
# A reference (or candidate) detection this close above the score threshold that finds no partner
# is a borderline case, not an error: int8 noise moves scores by a few hundredths.
DETECTION_MARGIN = 0.05
# At most this many candidates per image take part in matching (pre-NMS heads hold thousands).
DETECTION_MAX_CANDIDATES = 2000

_EMBEDDING_HINTS = ("embed", "hidden", "pool", "feature", "sentence", "vector", "encod")
_SEQUENCE_HINTS = ("logit", "log_prob", "logprob", "ctc", "token")
_DETECTION_HINTS = ("box", "det", "yolo", "anchor")
_MASK_HINTS = ("mask", "prob", "seg", "map", "sigmoid", "heat", "alpha", "matte")
MASK_MIN_SIDE = 16  # a probability map's two last axes (height, width) are each at least this long
MASK_MAX_CHANNELS = 4  # [batch, channels, H, W] with at most this many channels


@dataclass(frozen=True)
class MetricChoice:
    """The task metric of one output, why it was chosen, and how to read the array."""

    metric: str  # one of METRICS, or "exact" for integer and boolean outputs
    why: str
    source: str = "auto"  # "auto" (from shape and values) or "override" (recipe / --task-metric)
    batch_axis: int | None = 0
    fields_last: bool = True  # detection: [batch, N, fields] (True) or [batch, fields, N]
    objectness: bool = True  # detection: field 4 is the objectness score

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"metric": self.metric, "why": self.why, "source": self.source}
        if self.metric == "detection":
            out["layout"] = ("[batch, N, fields]" if self.fields_last else "[batch, fields, N]") + (
                ", objectness at field 4" if self.objectness else ", no objectness"
            )
        return out


def batch_first(array: np.ndarray, batch_axis: int | None) -> np.ndarray:
    """The array with its batch axis first (a batch of one added when it has none)."""
    if batch_axis is None:
        return array[np.newaxis]
    return np.moveaxis(array, batch_axis, 0) if batch_axis else array


def distribution_kind(rows: np.ndarray) -> str:
    """ "softmax" or "log-softmax" when every row along the last axis is a probability
    distribution (or its log), else ""."""
    if rows.size == 0 or not np.all(np.isfinite(rows)):
        return ""
    r = rows.astype(np.float64)
    if r.min() >= 0 and np.allclose(r.sum(axis=-1), 1.0, atol=1e-3):
        return "softmax"
    if r.max() <= 1e-6:
        top = r.max(axis=-1, keepdims=True)
        lse = top[..., 0] + np.log(np.exp(r - top).sum(axis=-1))
        if np.allclose(lse, 0.0, atol=1e-3):
            return "log-softmax"
    return ""


def detection_layout(name: str, arrays: Sequence[np.ndarray]) -> tuple[bool, bool] | None:
    """(fields_last, objectness) when batch-first 3-D arrays look like a raw detection head.

    [batch, N, F] with many more candidates than fields (N > F >= 5), box fields 0..3 with
    non-negative width and height (2, 3), every score field (4..) within [0, 1], rows that are not
    probability distributions, and boxes in pixels (some coordinate above 1) or a name that says
    detection. Fields last means YOLOv5-style objectness at field 4; fields first
    ([batch, 4 + classes, N], YOLOv8-style) has none.
    """
    lowered = name.lower()
    for fields_last in (True, False):
        rows = [a if fields_last else np.swapaxes(a, 1, 2) for a in arrays]
        n, f = rows[0].shape[1:]
        if not (5 <= f < n and f <= 1024):
            continue
        stacked = np.concatenate([r.reshape(-1, f) for r in rows]).astype(np.float64)
        if not np.all(np.isfinite(stacked)):
            return None
        scores, boxes = stacked[:, 4:], stacked[:, :4]
        if scores.min() < 0 or scores.max() > 1 or boxes[:, 2:4].min() < 0:
            continue
        if distribution_kind(stacked):
            continue
        if np.abs(boxes).max() <= 1.0 and not any(h in lowered for h in _DETECTION_HINTS):
            continue
        return fields_last, fields_last and f >= 6
    return None


def choose_metric(name: str, samples: Sequence[np.ndarray], batch_axis: int | None) -> MetricChoice:
    """The task metric for one output, from its dtype, shape, values (a few reference samples)
    and name; `why` says which of these decided."""
    first = np.asarray(samples[0])
    if not np.issubdtype(first.dtype, np.floating):
        return MetricChoice("exact", f"{first.dtype} output: must match exactly", batch_axis=batch_axis)
    arrays = [batch_first(np.asarray(s), batch_axis) for s in samples[:4]]
    core = arrays[0].shape[1:]
    lowered = name.lower()
    if len(core) == 0:
        return MetricChoice("none", "one value per row: judged by cosine", batch_axis=batch_axis)
    mask = mask_layout(name, arrays)
    if mask:
        return MetricChoice("mask", mask, batch_axis=batch_axis)
    if len(core) == 1:
        if core[0] == 1:
            return MetricChoice("none", "[batch, 1]: a single value per row", batch_axis=batch_axis)
        if any(h in lowered for h in _EMBEDDING_HINTS):
            return MetricChoice("embedding", "[batch, hidden] named like an embedding", batch_axis=batch_axis)
        return MetricChoice(
            "classifier", f"[batch, {core[0]}] float: scores over classes", batch_axis=batch_axis
        )
    if len(core) == 2:
        layout = detection_layout(name, arrays)
        if layout is not None:
            fields_last, objectness = layout
            n, f = core if fields_last else core[::-1]
            shape = f"[batch, {n}, {f}]" if fields_last else f"[batch, {f}, {n}]"
            why = f"{shape}: 4 box fields and {f - 4} score fields in [0, 1] for {n} candidates" + (
                " (objectness at field 4)" if objectness else ""
            )
            return MetricChoice(
                "detection", why, batch_axis=batch_axis, fields_last=fields_last, objectness=objectness
            )
        kind = distribution_kind(np.concatenate([a.reshape(-1, core[-1]) for a in arrays]))
        if kind:
            why = f"[batch, time, {core[-1]}] whose rows are {kind} distributions over classes"
            return MetricChoice("ctc", why, batch_axis=batch_axis)
        if any(h in lowered for h in _SEQUENCE_HINTS) and not any(h in lowered for h in _EMBEDDING_HINTS):
            return MetricChoice(
                "ctc", f"[batch, time, {core[-1]}] named like per-step logits", batch_axis=batch_axis
            )
        values = np.concatenate([a.reshape(-1) for a in arrays])
        named_embedding = any(h in lowered for h in _EMBEDDING_HINTS)
        if not named_embedding and values.size and np.all(np.isfinite(values)) and values.min() >= 0.0 \
                and values.max() <= 1.0:  # fmt: skip
            return MetricChoice(
                "none",
                f"[batch, {core[0]}, {core[1]}] of independent scores in [0, 1] (a detector's class "
                "scores, without boxes): judged by cosine, whole and per class",
                batch_axis=batch_axis,
            )
        return MetricChoice(
            "embedding", f"[batch, seq, {core[-1]}] float: one vector per position", batch_axis=batch_axis
        )
    return MetricChoice(
        "none", f"rank-{first.ndim} output: no task metric, judged by cosine", batch_axis=batch_axis
    )


def mask_layout(name: str, arrays: Sequence[np.ndarray]) -> str:
    """Why batch-first arrays look like a probability map or mask ("" when they do not): the last
    two axes at least MASK_MIN_SIDE long, at most MASK_MAX_CHANNELS channels before them, every
    value in [0, 1], and no distribution along the last axis; a 2-D map per row also needs a
    name that says so (a [batch, time, classes] of sigmoid scores is not a picture)."""
    core = arrays[0].shape[1:]
    if len(core) not in (2, 3) or min(core[-2:]) < MASK_MIN_SIDE:
        return ""
    if len(core) == 3 and core[0] > MASK_MAX_CHANNELS:
        return ""
    if len(core) == 2 and not any(h in name.lower() for h in _MASK_HINTS):
        return ""
    values = np.concatenate([a.reshape(-1) for a in arrays])
    if values.size == 0 or not np.all(np.isfinite(values)) or values.min() < 0.0 or values.max() > 1.0:
        return ""
    if distribution_kind(np.concatenate([a.reshape(-1, core[-1]) for a in arrays])):
        return ""
    shape = "[batch, " + ", ".join(str(d) for d in core) + "]"
    return f"{shape} with every value in [0, 1]: a probability map, judged by the IoU of its regions"


def mask_counts(ref: np.ndarray, got: np.ndarray, thresholds: Sequence[float]) -> dict[str, Any]:
    """Per threshold, the IoU of the regions above it on every row (and channel) where either side
    has any ([batch, ...] arrays); rows where neither has any carry no signal and are counted."""
    r = ref.reshape(ref.shape[0], -1, *ref.shape[-2:]).astype(np.float64)
    g = got.reshape(got.shape[0], -1, *got.shape[-2:]).astype(np.float64)
    out: dict[str, Any] = {"ious": [], "empty": 0, "maps": int(r.shape[0] * r.shape[1])}
    for t in thresholds:
        a, b = r > t, g > t
        inter = np.logical_and(a, b).sum(axis=(-2, -1))
        union = np.logical_or(a, b).sum(axis=(-2, -1))
        live = union > 0
        out["ious"] += [(float(t), float(x)) for x in (inter[live] / union[live]).ravel()]
        out["empty"] += int(np.count_nonzero(~live))
    return out


def override_choice(choice: MetricChoice, metric: str, sample: np.ndarray) -> MetricChoice:
    """The user's metric for an output in place of the chosen one (layout re-read for detection)."""
    why = "set by the user (recipe accuracy.task_metrics or --task-metric)"
    if metric == "detection":
        arr = batch_first(np.asarray(sample), choice.batch_axis)
        fields_last, objectness = True, True
        if arr.ndim == 3:
            layout = detection_layout("det", [arr])
            if layout is not None:
                fields_last, objectness = layout
            else:  # fewer fields than candidates is how heads are laid out
                fields_last = arr.shape[2] <= arr.shape[1]
                objectness = fields_last and (arr.shape[2] if fields_last else arr.shape[1]) >= 6
        return MetricChoice("detection", why, "override", choice.batch_axis, fields_last, objectness)
    return MetricChoice(metric, why, "override", choice.batch_axis)


def check_metric_shape(name: str, choice: MetricChoice, sample: np.ndarray) -> str:
    """Why `choice` cannot judge this output ("" when it can): e.g. ctc on a 2-D output."""
    rank = np.asarray(sample).ndim + (1 if choice.batch_axis is None else 0)
    need = {"classifier": (2,), "ctc": (3,), "detection": (3,), "embedding": (2, 3), "mask": (3, 4)}.get(
        choice.metric
    )
    if need is not None and rank not in need:
        return (
            f"output {name!r} has rank {np.asarray(sample).ndim}; the {choice.metric} metric needs "
            f"{' or '.join(str(n) for n in need)} axes with the batch axis"
        )
    return ""


# --- classifier ---------------------------------------------------------------------------------


def classifier_counts(ref: np.ndarray, got: np.ndarray, tolerance: float) -> dict[str, int]:
    """Rows whose argmax is unchanged (strict), unchanged or a near-tie the reference does not
    decide (tolerant: the candidate's pick within `tolerance` x the row's spread of the reference's
    top), and whose reference top class is among the candidate's five best. [batch, classes]."""
    r = ref.reshape(ref.shape[0], -1).astype(np.float64)
    g = got.reshape(got.shape[0], -1).astype(np.float64)
    rows = np.arange(r.shape[0])
    ref_top, got_top = np.argmax(r, axis=1), np.argmax(g, axis=1)
    same = ref_top == got_top
    drop = r[rows, ref_top] - r[rows, got_top]
    spread = r.max(axis=1) - r.min(axis=1)
    tolerant = same | (drop <= tolerance * spread)
    k = min(5, g.shape[1])
    top5 = np.argpartition(-g, k - 1, axis=1)[:, :k]
    in_top5 = np.any(top5 == ref_top[:, None], axis=1)
    return {
        "strict": int(np.count_nonzero(same)),
        "tolerant": int(np.count_nonzero(tolerant)),
        "top5": int(np.count_nonzero(in_top5)),
        "rows": int(r.shape[0]),
    }


# --- embedding ----------------------------------------------------------------------------------


def vector_cosines(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Cosine of every vector along the last axis (1.0 where both are zero, 0.0 where one is)."""
    r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    g = got.reshape(-1, got.shape[-1]).astype(np.float64)
    return cosines(np.sum(r * g, axis=1), np.sum(r * r, axis=1), np.sum(g * g, axis=1))


def cosines(dot: np.ndarray, ref_sq: np.ndarray, got_sq: np.ndarray) -> np.ndarray:
    """Cosines from dot products and squared norms, element-wise, with the zero-vector cases."""
    norm = np.sqrt(ref_sq * got_sq)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(norm > 0, dot / np.where(norm > 0, norm, 1.0), 0.0)
    out = np.where((ref_sq == 0) & (got_sq == 0), 1.0, out)
    return np.clip(out, -1.0, 1.0)


# --- ctc / sequence argmax ----------------------------------------------------------------------


def greedy_decode(ids: np.ndarray, blank: int = CTC_BLANK) -> list[int]:
    """CTC greedy decode of one sequence of per-frame argmax ids: collapse repeats, drop blanks."""
    if ids.size == 0:
        return []
    keep = np.ones(ids.shape, dtype=bool)
    keep[1:] = ids[1:] != ids[:-1]
    return [int(i) for i in ids[keep] if i != blank]


def ctc_counts(ref: np.ndarray, got: np.ndarray, blank: int = CTC_BLANK) -> dict[str, int]:
    """Sequences whose greedy decode is equal, and frames whose argmax is. [batch, time, classes]."""
    ref_ids, got_ids = np.argmax(ref, axis=-1), np.argmax(got, axis=-1)
    ref_ids = ref_ids.reshape(ref_ids.shape[0], -1)
    got_ids = got_ids.reshape(got_ids.shape[0], -1)
    equal = sum(
        greedy_decode(a, blank) == greedy_decode(b, blank) for a, b in zip(ref_ids, got_ids, strict=True)
    )
    return {
        "decoded_equal": int(equal),
        "sequences": int(ref_ids.shape[0]),
        "frames_equal": int(np.count_nonzero(ref_ids == got_ids)),
        "frames": int(ref_ids.size),
    }


# --- detection ----------------------------------------------------------------------------------


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in `a` [n, 4] with every box in `b` [m, 4], boxes as (cx, cy, w, h)."""

    def corners(x: np.ndarray) -> tuple[np.ndarray, ...]:
        cx, cy, w, h = (x[:, i].astype(np.float64) for i in range(4))
        return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2

    ax1, ay1, ax2, ay2 = corners(a)
    bx1, by1, bx2, by2 = corners(b)
    iw = np.clip(np.minimum(ax2[:, None], bx2[None]) - np.maximum(ax1[:, None], bx1[None]), 0, None)
    ih = np.clip(np.minimum(ay2[:, None], by2[None]) - np.maximum(ay1[:, None], by1[None]), 0, None)
    inter = iw * ih
    union = ((ax2 - ax1) * (ay2 - ay1))[:, None] + ((bx2 - bx1) * (by2 - by1))[None] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def detections(rows: np.ndarray, objectness: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes [N, 4], class ids [N], scores [N]) of one image's candidates [N, fields]: the score is
    objectness x the best class score (or the objectness alone for a single-score head)."""
    rows = rows.astype(np.float64)
    boxes = rows[:, :4]
    classes = rows[:, 5:] if objectness else rows[:, 4:]
    if classes.shape[1] == 0:
        return boxes, np.zeros(len(rows), dtype=np.int64), rows[:, 4]
    best = classes.max(axis=1)
    score = best * rows[:, 4] if objectness else best
    return boxes, np.argmax(classes, axis=1), score


def match_detections(
    ref: np.ndarray,
    got: np.ndarray,
    *,
    objectness: bool,
    score_threshold: float,
    iou_threshold: float,
    margin: float = DETECTION_MARGIN,
) -> dict[str, int]:
    """Candidate-set agreement of one image ([N, fields] each): the reference's detections (score
    >= threshold) matched greedily, best score first, to the candidate's of the same class with the
    highest IoU >= iou_threshold. Unmatched ones count as missing (reference) or extra (candidate)
    unless their score is within `margin` above the threshold (borderline, not counted)."""
    rb, rc, rs = detections(ref, objectness)
    gb, gc, gs = detections(got, objectness)
    r_idx = np.flatnonzero(rs >= score_threshold)
    g_idx = np.flatnonzero(gs >= score_threshold)
    r_idx = r_idx[np.argsort(-rs[r_idx], kind="stable")][:DETECTION_MAX_CANDIDATES]
    g_idx = g_idx[np.argsort(-gs[g_idx], kind="stable")][:DETECTION_MAX_CANDIDATES]
    matched_r = np.zeros(len(r_idx), dtype=bool)
    matched_g = np.zeros(len(g_idx), dtype=bool)
    if len(r_idx) and len(g_idx):
        iou = box_iou(rb[r_idx], gb[g_idx])
        iou[rc[r_idx][:, None] != gc[g_idx][None, :]] = 0.0
        for i in range(len(r_idx)):
            row = np.where(matched_g, -1.0, iou[i])
            j = int(np.argmax(row))
            if row[j] >= iou_threshold:
                matched_r[i] = matched_g[j] = True
    firm = score_threshold + margin
    missing = int(np.count_nonzero(~matched_r & (rs[r_idx] >= firm)))
    extra = int(np.count_nonzero(~matched_g & (gs[g_idx] >= firm)))
    borderline = int(np.count_nonzero(~matched_r)) - missing + int(np.count_nonzero(~matched_g)) - extra
    return {
        "matched": int(np.count_nonzero(matched_r)),
        "missing": missing,
        "extra": extra,
        "borderline": borderline,
        "reference": len(r_idx),
        "candidate": len(g_idx),
    }


def detection_counts(
    ref: np.ndarray,
    got: np.ndarray,
    choice: MetricChoice,
    score_threshold: float,
    iou_threshold: float,
) -> dict[str, int]:
    """match_detections summed over the images of a batch-first [batch, N, F] (or [batch, F, N])."""
    total: dict[str, int] = {}
    for r, g in zip(ref, got, strict=True):
        if not choice.fields_last:
            r, g = r.T, g.T
        counts = match_detections(
            r, g, objectness=choice.objectness, score_threshold=score_threshold, iou_threshold=iou_threshold
        )
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return total


def detection_agreement(counts: dict[str, int]) -> float:
    """matched / (matched + missing + extra); 1.0 when neither side detects anything."""
    denominator = counts.get("matched", 0) + counts.get("missing", 0) + counts.get("extra", 0)
    return counts.get("matched", 0) / denominator if denominator else 1.0


__all__ = [
    "METRICS",
    "MetricChoice",
    "batch_first",
    "box_iou",
    "check_metric_shape",
    "choose_metric",
    "classifier_counts",
    "ctc_counts",
    "detection_agreement",
    "detection_counts",
    "detection_layout",
    "detections",
    "distribution_kind",
    "greedy_decode",
    "mask_counts",
    "mask_layout",
    "match_detections",
    "override_choice",
    "vector_cosines",
]
