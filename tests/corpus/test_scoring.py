"""The post-processing behind the corpus metrics: CTC decoding, NMS and tolerant detection matching."""

from __future__ import annotations

import re

import numpy as np
import pytest

from corpus.scoring import Detections, box_iou, ctc_greedy, match_detections, nms


def _onehot(ids: list[int], classes: int = 5) -> np.ndarray:
    return np.eye(classes)[ids]


def test_ctc_greedy_collapses_repeats_and_drops_blanks() -> None:
    assert ctc_greedy(_onehot([0, 3, 3, 0, 3, 1, 1, 0])) == (3, 3, 1)
    assert ctc_greedy(_onehot([0, 0, 0])) == ()


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], dtype=float)
    assert nms(boxes, np.array([0.6, 0.9, 0.5]), 0.45) == [1, 2]
    assert box_iou(boxes[:1], boxes[:1])[0, 0] == pytest.approx(1.0)


def _dets(boxes: list[list[float]], scores: list[float], classes: list[int]) -> Detections:
    return Detections(np.array(boxes, dtype=float).reshape(-1, 4), np.array(scores), np.array(classes))


def test_match_detections_tolerates_a_score_near_the_threshold() -> None:
    ref = _dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.52], [0, 1])
    slightly_lower = _dets([[0, 0, 10, 10], [21, 20, 40, 41]], [0.9, 0.48], [0, 1])
    assert match_detections(ref, slightly_lower, 0.5, 0.1) == (3, 3)
    gone = _dets([[0, 0, 10, 10]], [0.9], [0])
    assert match_detections(ref, gone, 0.5, 0.1) == (2, 3)
    wrong_class = _dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.52], [0, 2])
    assert match_detections(ref, wrong_class, 0.5, 0.1) == (2, 4)
    moved = _dets([[0, 0, 10, 10], [32, 32, 52, 52]], [0.9, 0.52], [0, 1])
    assert match_detections(ref, moved, 0.5, 0.1) == (2, 4)


def test_the_encoder_check_passes_small_noise_and_fails_a_scrambled_similarity_ranking() -> None:
    from corpus.entries import _minilm_metric

    rng = np.random.default_rng(0)
    # 24 texts in 6 topics: neighbours within a topic, so the ranking of similarities means something.
    topics = rng.normal(size=(6, 384))
    hidden = [(topics[i % 6] + 1.5 * rng.normal(size=384)) * np.ones((1, 8, 384)) for i in range(24)]
    inputs = [{"attention_mask": np.zeros((1, 1, 1, 8), np.float32)} for _ in hidden]
    ref = [{"hidden": h.astype(np.float32)} for h in hidden]

    def noisy(scale: float) -> list[dict[str, np.ndarray]]:
        return [
            {
                "hidden": (
                    h + scale * np.linalg.norm(h[0, 0]) / np.sqrt(384) * rng.normal(size=(1, 1, 384))
                ).astype(np.float32)
            }
            for h in hidden
        ]

    result = _minilm_metric(ref, noisy(0.01), inputs)
    assert result.passed, result.detail
    # Every text's embedding still close to its own (cosine >= 0.994), but the similarities
    # between texts, which retrieval ranks, move: the ranking catches what the cosine does not.
    result = _minilm_metric(ref, noisy(0.1), inputs)
    cosine = float(re.search(r"cosine min ([\d.]+)", result.detail).group(1))  # type: ignore[union-attr]
    spearman = float(re.search(r"Spearman ([\d.]+)", result.detail).group(1))  # type: ignore[union-attr]
    assert not result.passed and cosine >= 0.99 and spearman < 0.995, result.detail


def test_the_v6_recognizer_inputs_and_check() -> None:
    """PP-OCRv6 lines: height 48, normalized to [-1, 1], padded on the right; the check passes on
    equal decodes and fails when one line's best class changes at one step."""
    from corpus.entries import REC_OUTPUT, get

    entry = get("rapidocr-v6-rec")
    samples = entry.make_inputs(3, seed=0)
    assert all(s["x"].shape == (1, 3, 48, 640) and s["x"].dtype == np.float32 for s in samples)
    assert all(s["x"].min() >= -1.0 and s["x"].max() <= 1.0 for s in samples)
    assert any(np.all(s["x"][..., -8:] == 0) for s in samples)  # short lines are padded with zeros
    rng = np.random.default_rng(0)
    ref = [{REC_OUTPUT: rng.random((1, 80, 50)).astype(np.float32)} for _ in samples]
    assert entry.metric(ref, ref, samples).passed
    changed = [{k: v.copy() for k, v in r.items()} for r in ref]
    step = changed[1][REC_OUTPUT][0, 10]
    step[np.argmin(step)] = 2.0  # another class wins at step 10: another decode
    result = entry.metric(ref, changed, samples)
    assert not result.passed and "2/3 text lines" in result.detail
