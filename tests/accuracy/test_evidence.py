"""Whether rows can tell a right candidate from a wrong one (optimize/accuracy/evidence.py), and
what the judge does with a reduced or quantized candidate they cannot verify
(pipeline/judge.weigh_evidence)."""

from __future__ import annotations

import numpy as np
import pytest

from optimize.accuracy import AccuracyResult, MetricChoice, Thresholds, check
from optimize.accuracy.evidence import (
    MIN_ROWS,
    Evidence,
    OutputTest,
    assess,
    is_lossy,
    numerics,
    output_evidence,
)
from optimize.pipeline import judge

CLASSIFIER = MetricChoice("classifier", "test")
DETECTION = MetricChoice("detection", "test", fields_last=True, objectness=True)


def _rows(array: np.ndarray) -> list[np.ndarray]:
    """One sample per row, batch 1, as the pipeline keeps reference outputs."""
    return [row[None] for row in array]


def test_a_classifier_of_near_ties_cannot_tell_and_one_of_clear_margins_can() -> None:
    rng = np.random.default_rng(0)
    near_uniform = 5.0 + 0.001 * rng.standard_normal((16, 10))  # random bytes into a byte CNN
    test = output_evidence("logits", _rows(near_uniform), CLASSIFIER)
    assert not test.can_tell
    assert "near-tie" in test.finding and "of 16 rows" in test.finding
    assert "confidence" in test.needs

    confident = rng.standard_normal((16, 10))
    confident[np.arange(16), np.arange(16) % 10] += 8.0
    assert output_evidence("logits", _rows(confident), CLASSIFIER).can_tell


def test_a_classifier_that_picks_one_class_on_every_row_cannot_tell() -> None:
    logits = np.random.default_rng(1).standard_normal((12, 5))
    logits[:, 2] += 10.0
    test = output_evidence("logits", _rows(logits), CLASSIFIER)
    assert not test.can_tell and "class 2 on all 12 rows" in test.finding
    assert test.needs == "rows of more than one class"


def _detector_rows(count: int, objects: int) -> np.ndarray:
    """[count, 50, 6] YOLO-style rows: cx, cy, w, h in pixels, objectness, one class score."""
    rng = np.random.default_rng(2)
    rows = np.zeros((count, 50, 6))
    rows[..., :2] = rng.uniform(20, 300, (count, 50, 2))
    rows[..., 2:4] = rng.uniform(5, 40, (count, 50, 2))
    rows[..., 4:] = rng.uniform(0.0, 0.05, (count, 50, 2))
    for i in range(objects):
        rows[i % count, i, 4:] = 0.95
    return rows


def test_a_detector_that_detects_nothing_cannot_tell_and_one_that_detects_can() -> None:
    empty = output_evidence("boxes", _rows(_detector_rows(16, 0)), DETECTION, Thresholds())
    assert not empty.can_tell
    assert "detects 0 object(s)" in empty.finding and "objects" in empty.needs
    found = output_evidence("boxes", _rows(_detector_rows(16, 12)), DETECTION, Thresholds())
    assert found.can_tell and "12 objects" in found.finding


def test_a_raw_yolo_head_judged_per_vector_must_still_find_something() -> None:
    """YOLOX/YOLOv5 raw heads: box offsets (negative too), objectness, class scores, in one tensor."""
    rows = _detector_rows(16, 0)
    rows[..., :4] -= 150.0  # grid offsets, not pixels: the detection metric does not read them
    embedding = MetricChoice("embedding", "test")
    blank = output_evidence("output", _rows(rows), embedding, Thresholds())
    assert not blank.can_tell and "detection-style head (4 box fields, 2 score fields)" in blank.finding
    rows[:, :6, 4:] = 0.9
    assert output_evidence("output", _rows(rows), embedding, Thresholds()).can_tell
    # A recurrent state where a few of 128 values happen to lie in [0, 1] is not such a head.
    state = np.random.default_rng(7).standard_normal((16, 2, 128))
    state[..., 5] = 0.1
    assert output_evidence("stateN", _rows(state), embedding, Thresholds()).can_tell


def test_an_output_that_is_the_same_on_every_row_cannot_tell() -> None:
    same = np.tile(np.linspace(-1, 1, 20), (10, 1))
    test = output_evidence("y", _rows(same), MetricChoice("none", "test"))
    assert not test.can_tell and "the same on all 10 rows" in test.finding


def test_a_probability_that_never_fires_cannot_tell() -> None:
    low = np.random.default_rng(3).uniform(0.0, 0.2, (10, 1))  # speech probability on silence
    test = output_evidence("speech", _rows(low), MetricChoice("none", "test"))
    assert not test.can_tell and "never fires" in test.finding
    fires = low.copy()
    fires[3] = 0.9
    assert output_evidence("speech", _rows(fires), MetricChoice("none", "test")).can_tell


def test_ctc_that_decodes_nothing_cannot_tell() -> None:
    blank = np.random.default_rng(6).uniform(0, 1, (8, 20, 5))
    blank[..., 0] = 10.0  # every frame confidently blank
    test = output_evidence("logits", _rows(blank), MetricChoice("ctc", "test"))
    assert not test.can_tell and "decodes nothing on 8 of 8" in test.finding
    text = blank.copy()
    for i in range(8):
        text[i, 3 + i, 0], text[i, 3 + i, 1 + i % 4] = 0.0, 10.0
    assert output_evidence("logits", _rows(text), MetricChoice("ctc", "test")).can_tell


def test_integer_outputs_are_compared_exactly_and_need_no_test() -> None:
    ids = np.zeros((4, 3), dtype=np.int64)
    assert output_evidence("ids", _rows(ids), MetricChoice("exact", "int")).can_tell


def test_evidence_needs_real_rows_enough_of_them_and_every_output() -> None:
    ok = OutputTest("y", "classifier", True, "fine")
    bad = OutputTest("boxes", "detection", False, "detects nothing", "rows with objects")
    assert Evidence("--eval-data e.npz", True, MIN_ROWS, (ok,)).can_tell
    generated = Evidence("generated (seed 0)", False, 32, (ok,))
    assert not generated.can_tell and "generated" in generated.why_not()
    assert f"at least {MIN_ROWS} real samples" in generated.needs()
    few = Evidence("--input-data x.npz", True, MIN_ROWS - 1, (ok,))
    assert not few.can_tell and f"only {MIN_ROWS - 1} real sample" in few.why_not()
    blind = Evidence("--eval-data e.npz", True, 16, (ok, bad))
    assert not blind.can_tell
    assert blind.why_not() == "output 'boxes': detects nothing" and blind.needs() == "rows with objects"
    assert blind.to_json()["outputs"]["boxes"]["can_tell"] is False


def test_numerics_from_precision_graph_and_outputs() -> None:
    assert numerics("int8", False, False) == "quantized"
    # Layers at two precisions, whichever they are, are mixed, and mixed is lossy.
    assert numerics("int8+bf16", False, False) == "mixed" and numerics("int8+fp32", True, True) == "mixed"
    assert is_lossy("int8+fp32")
    assert numerics("bf16", False, False) == "reduced" and numerics("fp16", True, True) == "reduced"
    assert numerics("fp32", True, True) == "exact"
    assert numerics("fp32", True, False) == "reassociated"  # same graph, yet the outputs moved
    assert numerics("fp32", False, True) == "reassociated"
    assert is_lossy("int8") and is_lossy("bf16") and not is_lossy("fp32")


def _samples(array: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"y": row} for row in _rows(array)]


def _check(ref: np.ndarray, got: np.ndarray) -> AccuracyResult:
    return check(_samples(ref), _samples(got), Thresholds(), choices={"y": CLASSIFIER})


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_lossy_candidate_on_rows_that_cannot_tell_is_unverified_if_it_passes_inaccurate_if_not(
    precision: str,
) -> None:
    rng = np.random.default_rng(4)
    ref = 5.0 + 0.001 * rng.standard_normal((16, 10))
    evidence = assess(_samples(ref), {"y": CLASSIFIER}, Thresholds(), source="generated", real=False)
    passing = judge.weigh_evidence(_check(ref, ref), precision, evidence)
    assert passing.ok and "generated" in passing.unverified and "passed" in passing.unverified
    # A failure on any rows is a measured difference: inaccurate, never offered for verification;
    # the reason says the rows could not tell, since others might judge it otherwise.
    failing = judge.weigh_evidence(_check(ref, ref[::-1].copy()), precision, evidence)
    assert not failing.ok and not failing.unverified
    assert "on rows that cannot tell" in failing.reason and "generated" in failing.reason
    # fp32 numerics are judged as they were: a failure stays a failure, a pass is verified.
    assert not judge.weigh_evidence(_check(ref, ref[::-1].copy()), "fp32", evidence).ok
    assert judge.weigh_evidence(_check(ref, ref), "fp32", evidence).unverified == ""


def test_what_no_data_excuses_stays_a_failure() -> None:
    evidence = Evidence("generated", False, 32, ())
    changed = AccuracyResult(False, "the candidate changed the model's inputs (lost x)", {})
    assert not judge.weigh_evidence(changed, "int8", evidence).ok
    ref = np.ones((4, 3))
    nan = ref.copy()
    nan[0, 0] = np.nan
    broken = check(_samples(ref), _samples(nan), Thresholds())
    assert not judge.weigh_evidence(broken, "int8", evidence).ok


def test_a_lossy_candidate_on_rows_that_can_tell_is_judged_as_usual() -> None:
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((16, 10))
    ref[np.arange(16), np.arange(16) % 10] += 8.0
    evidence = assess(_samples(ref), {"y": CLASSIFIER}, Thresholds(), source="--eval-data e.npz", real=True)
    assert evidence.can_tell
    assert judge.weigh_evidence(_check(ref, ref), "int8", evidence).unverified == ""
    wrong = np.roll(ref, 1, axis=1)
    assert not judge.weigh_evidence(_check(ref, wrong), "int8", evidence).ok


def test_a_map_without_regions_on_most_rows_names_them_and_says_what_would_tell() -> None:
    from optimize.accuracy import MetricChoice as Choice

    rng = np.random.default_rng(3)
    mask = Choice("mask", "test")
    rows = []
    for i in range(12):
        prob = np.abs(rng.normal(0, 1e-4, (1, 1, 32, 32))).astype(np.float32)
        if i in (0, 5, 9):
            prob[0, 0, 4:12, 4:20] = 0.9
        rows.append(prob)
    test = output_evidence("map", rows, mask, Thresholds())
    assert not test.can_tell  # 3 rows with regions: too few to tell whether a candidate keeps them
    assert "on 9 of 12 rows" in test.finding and "samples 1, 2, 3, 4, 6, 7, 8, 10 and 1 more" in test.finding
    assert "pages with text" in test.needs
    rows[3][0, 0, 10:20, 10:30] = 0.8
    told = output_evidence("map", rows, mask, Thresholds())
    assert told.can_tell and "regions above 0.3 on 4 of 12 rows" in told.finding
    assert "on 8 of 12 rows" in told.finding  # the quiet rows are still named
