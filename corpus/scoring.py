"""Task-level post-processing shared by the corpus metrics: box IoU, NMS, detection matching, CTC.

Each metric turns raw outputs into what the model's package would hand its user (boxes, strings,
embeddings), the way that package does it, so a metric fails exactly when a user would notice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix between boxes a [N,4] and b [M,4], corners x1,y1,x2,y2."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter + 1e-9)  # type: ignore[no-any-return]


def nms(boxes: np.ndarray, scores: np.ndarray, iou_thr: float) -> list[int]:
    """Greedy non-maximum suppression; indexes kept, highest score first."""
    order = list(np.argsort(-scores, kind="stable"))
    keep: list[int] = []
    while order:
        i = order.pop(0)
        keep.append(int(i))
        if order:
            ious = box_iou(boxes[i : i + 1], boxes[np.array(order)])[0]
            order = [j for j, iou in zip(order, ious, strict=True) if iou <= iou_thr]
    return keep


@dataclass
class Detections:
    boxes: np.ndarray  # [N,4] x1,y1,x2,y2
    scores: np.ndarray  # [N]
    classes: np.ndarray  # [N] int

    def above(self, threshold: float) -> Detections:
        keep = self.scores >= threshold
        return Detections(self.boxes[keep], self.scores[keep], self.classes[keep])


def _matched(want: Detections, pool: Detections, iou_thr: float) -> int:
    """How many of `want` find a distinct same-class box in `pool` with IoU >= iou_thr (greedy, by score)."""
    if len(want.scores) == 0:
        return 0
    ious = box_iou(want.boxes, pool.boxes)
    used: set[int] = set()
    hits = 0
    for i in np.argsort(-want.scores, kind="stable"):
        best, best_iou = -1, iou_thr
        for j in range(len(pool.scores)):
            if j in used or pool.classes[j] != want.classes[i]:
                continue
            if ious[i, j] >= best_iou:
                best, best_iou = j, ious[i, j]
        if best >= 0:
            used.add(best)
            hits += 1
    return hits


def match_detections(
    ref: Detections, cand: Detections, score_thr: float, margin: float, iou_thr: float = 0.5
) -> tuple[int, int]:
    """(matched, total) both ways: every detection at or above `score_thr` on one side must find a
    same-class box with IoU >= iou_thr on the other side among those above `score_thr - margin`.
    The margin keeps a box whose score moved from 0.51 to 0.49 from counting as lost."""
    loose = max(0.0, score_thr - margin)
    ref_hi, cand_hi = ref.above(score_thr), cand.above(score_thr)
    hits = _matched(ref_hi, cand.above(loose), iou_thr) + _matched(cand_hi, ref.above(loose), iou_thr)
    return hits, len(ref_hi.scores) + len(cand_hi.scores)


def ctc_greedy(logits: np.ndarray, blank: int = 0) -> tuple[int, ...]:
    """Best-path CTC decode of [T, C] scores: argmax per step, collapse repeats, drop blanks."""
    best = np.argmax(logits, axis=-1)
    out: list[int] = []
    prev = -1
    for idx in best.tolist():
        if idx != prev and idx != blank:
            out.append(int(idx))
        prev = idx
    return tuple(out)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


def decode_picodet(
    scores: list[np.ndarray], dists: list[np.ndarray], input_hw: tuple[int, int],
    conf_thr: float, iou_thr: float = 0.5, strides: tuple[int, ...] = (8, 16, 32, 64),
) -> Detections:  # fmt: skip
    """PicoDet/GFL head outputs for one image -> per-class NMS detections (rapid_layout's PPPostProcess).

    scores[i]: [N_i, classes] sigmoid scores; dists[i]: [N_i, 4*(reg_max+1)] box side distributions.
    """
    boxes_all, scores_all = [], []
    for stride, score, dist in zip(strides, scores, dists, strict=True):
        fh, fw = int(np.ceil(input_hw[0] / stride)), int(np.ceil(input_hw[1] / stride))
        ww, hh = np.meshgrid(np.arange(fw), np.arange(fh))
        cx, cy = (ww.ravel() + 0.5) * stride, (hh.ravel() + 0.5) * stride
        center = np.stack([cx, cy, cx, cy], axis=1)[: len(score)]
        reg = dist.shape[-1] // 4
        d = softmax(dist.reshape(-1, reg), axis=1) @ np.arange(reg, dtype=np.float64)
        d = d.reshape(-1, 4) * stride
        boxes_all.append(center + np.array([-1, -1, 1, 1]) * d)
        scores_all.append(score)
    boxes, conf = np.concatenate(boxes_all), np.concatenate(scores_all)
    out_b, out_s, out_c = [], [], []
    for c in range(conf.shape[1]):
        mask = conf[:, c] > conf_thr
        if not mask.any():
            continue
        keep = nms(boxes[mask], conf[mask, c], iou_thr)[:100]
        out_b.append(boxes[mask][keep])
        out_s.append(conf[mask, c][keep])
        out_c.append(np.full(len(keep), c))
    if not out_b:
        return Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, dtype=int))
    return Detections(np.concatenate(out_b), np.concatenate(out_s), np.concatenate(out_c))


def decode_yolox(pred: np.ndarray, size: int, conf_thr: float, iou_thr: float = 0.45) -> Detections:
    """ddddocr's detector head [N, 4+1+classes] -> class-agnostic NMS detections (its get_bbox).

    Boxes are grid offsets and log sizes at strides 8/16/32 (YOLOX-style), scores objectness x class.
    """
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack([xv, yv], axis=2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride_col = np.concatenate(grids), np.concatenate(strides)
    xy = (pred[:, :2] + grid) * stride_col
    wh = np.exp(np.clip(pred[:, 2:4], -20, 20)) * stride_col
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
    cls_scores = pred[:, 4:5] * pred[:, 5:]
    classes = cls_scores.argmax(1)
    scores = cls_scores[np.arange(len(classes)), classes]
    mask = scores > conf_thr
    keep = nms(boxes[mask], scores[mask], iou_thr)
    return Detections(boxes[mask][keep], scores[mask][keep], classes[mask][keep])
