"""The accuracy gate: whole and per-slice figures, task metrics chosen from the output, the user's metric.

The concatenated-head case reproduces a shipped failure: a YOLO-style output [1, N, 6] holds box
pixels next to 0..1 scores, so a whole-tensor cosine stays ~1 however wrong the scores are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.accuracy import MetricError, Thresholds, accuracy_json, check, load_user_metric
from optimize.accuracy.compare import choose_metrics, compare_outputs, output_figures
from optimize.accuracy.task_metrics import (
    MetricChoice,
    box_iou,
    choose_metric,
    ctc_counts,
    detection_agreement,
    greedy_decode,
    match_detections,
)
from optimize.errors import UsageError

# --- a detector head that concatenates boxes and scores ------------------------------------------


def make_head_model(path: Path, candidates: int = 512, score_seed: int = 0) -> Path:
    """x [1, N, 4] -> output0 [1, N, 6]: boxes (cx, cy, w, h, 20..~400 pixels) concatenated along the
    last axis with objectness and one class score in 0..1 (sigmoids), like a YOLO head. The box
    fields never depend on `score_seed`; the score weights do: a model built with another seed has
    intact boxes and scores that are noise against this one's."""
    rng = np.random.default_rng(score_seed)
    inits = [
        numpy_helper.from_array(np.full((1, 1, 4), 100.0, np.float32), "box_scale"),
        numpy_helper.from_array(np.full((1, 1, 4), 20.0, np.float32), "box_offset"),
        numpy_helper.from_array((rng.standard_normal((4, 2)) * 1.5).astype(np.float32), "score_w"),
        numpy_helper.from_array(np.full((2,), -2.5, np.float32), "score_b"),
    ]
    nodes = [
        helper.make_node("Abs", ["x"], ["ax"]),
        helper.make_node("Mul", ["ax", "box_scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "box_offset"], ["boxes"]),
        helper.make_node("MatMul", ["x", "score_w"], ["logits"]),
        helper.make_node("Add", ["logits", "score_b"], ["biased"]),
        helper.make_node("Sigmoid", ["biased"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=2),
    ]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", candidates, 4])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", candidates, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="lto-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _run(model: Path, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return [{"output0": session.run(None, s)[0]} for s in samples]


def test_concatenated_head_fails_on_its_score_slice_while_the_whole_cosine_passes(tmp_path: Path) -> None:
    reference = make_head_model(tmp_path / "ref.onnx", score_seed=0)
    candidate = make_head_model(tmp_path / "cand.onnx", score_seed=1)  # boxes intact, scores noise
    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal((1, 512, 4)).astype(np.float32)} for _ in range(32)]
    ref, got = _run(reference, samples), _run(candidate, samples)

    # A whole-tensor cosine alone would pass even the strict recipe's old 0.999 threshold ...
    assert (
        min(output_figures(r["output0"], g["output0"])["cosine"] for r, g in zip(ref, got, strict=True))
        > 0.9999
    )
    # ... the same model against itself passes the gate ...
    assert check(ref, ref, Thresholds()).ok
    # ... and the gate fails it, naming the output, the axis and the slice.
    result = check(ref, got, Thresholds())
    assert not result.ok
    fig = result.per_output["output0"]
    assert fig["cosine"] > 0.9999
    assert fig["slice"]["axis"] == 2 and fig["slice"]["index"] in (4, 5)
    assert fig["slice"]["value"] < 0.8
    assert result.reason.startswith("output 'output0': ")
    assert f"slice {fig['slice']['index']} of axis 2 (length 6" in result.reason
    assert "while the whole output's is 0.99" in result.reason
    # The head was recognised as one, and the report says why.
    assert fig["metric"] == "detection"
    assert "4 box fields and 2 score fields" in fig["metric_why"]


# --- whole-output figures, structure, integers ---------------------------------------------------


def test_accuracy_figures_and_worst_case_over_samples() -> None:
    rng = np.random.default_rng(0)
    ref = [{"logits": rng.standard_normal((4, 10)).astype(np.float32)} for _ in range(3)]
    same = check(ref, [dict(r) for r in ref], Thresholds())
    assert same.ok and same.per_output["logits"]["cosine"] == pytest.approx(1.0)
    assert same.per_output["logits"]["top1_agreement"] == 1.0
    assert same.per_output["logits"]["metric"] == "classifier"
    noisy = [{"logits": r["logits"] + 0.5} for r in ref[:2]] + [{"logits": -ref[2]["logits"]}]
    per, problems = compare_outputs(ref, noisy)
    assert not problems
    assert per["logits"]["cosine"] < 0  # the worst sample (negated) decides
    assert per["logits"]["worst_sample"] == 2
    assert per["logits"]["max_abs"] == pytest.approx(float(np.abs(2 * ref[2]["logits"]).max()))
    assert not check(ref, noisy, Thresholds()).ok


def test_accuracy_structural_and_integer_problems() -> None:
    ref = {"y": np.ones((2, 3), np.float32), "ids": np.arange(4)}
    assert (
        "has shape [3, 2]"
        in check(ref, {"y": np.ones((3, 2), np.float32), "ids": np.arange(4)}, Thresholds()).reason
    )
    assert "is missing" in check(ref, {"y": ref["y"]}, Thresholds()).reason
    assert "differs in 1 integer elements" in check(ref, {"y": ref["y"], "ids": np.array([0, 1, 2, 4])},
                                                     Thresholds()).reason  # fmt: skip
    nan = ref["y"].copy()
    nan[0, 0] = np.nan
    assert "NaN/inf" in check(ref, {"y": nan, "ids": ref["ids"]}, Thresholds()).reason
    assert check(ref, dict(ref), Thresholds()).per_output["ids"]["metric"] == "exact"


def test_top1_counts_real_flips_and_near_ties_separately() -> None:
    ref = np.array([[5.0, 4.999, 0.0], [5.0, 1.0, 0.0]], dtype=np.float32)
    tie_flip = np.array([[4.999, 5.0, 0.0], [5.0, 1.0, 0.0]], dtype=np.float32)
    real_flip = np.array([[5.0, 4.999, 0.0], [1.0, 5.0, 0.0]], dtype=np.float32)
    loose = Thresholds(min_cosine=0.0, min_task_cosine=0.0, min_top1=1.0, top1_tolerance=0.01)
    strict = Thresholds(min_cosine=0.0, min_task_cosine=0.0, min_top1=1.0, top1_tolerance=0.0)
    result = check({"p": ref}, {"p": tie_flip}, loose)
    assert result.ok and result.per_output["p"]["top1_agreement"] == 0.5
    assert result.per_output["p"]["top1_agreement_tolerant"] == 1.0
    assert not check({"p": ref}, {"p": tie_flip}, strict).ok
    flipped = check({"p": ref}, {"p": real_flip}, loose)
    assert not flipped.ok and "top-1 agreement outside near-ties 0.500 < 1.0" in flipped.reason
    # Top-5: the reference's top class among the candidate's five best.
    many = np.arange(10, dtype=np.float32)[None]
    shuffled = many.copy()
    shuffled[0, [9, 5]] = shuffled[0, [5, 9]]  # class 9 drops to 5th place
    figures = check({"p": many}, {"p": shuffled}, loose).per_output["p"]
    assert figures["top1_agreement"] == 0.0 and figures["top5_agreement"] == 1.0


def test_default_thresholds_accept_a_classifier_whose_logits_drift_but_whose_top1_holds() -> None:
    """int8 logits at cosine ~0.985 (what users accept of per-channel int8 BERT) pass when the
    classes agree; the same drift on an embedding fails its 0.99."""
    rng = np.random.default_rng(1)
    ref = [{"logits": np.array([[4.0, -4.0]], np.float32) * rng.choice([-1, 1])} for _ in range(32)]
    drift = [{"logits": r["logits"] + np.array([[0.8, 0.5]], np.float32)} for r in ref]
    result = check(ref, drift, Thresholds())
    assert 0.97 < result.per_output["logits"]["cosine"] < 0.99
    assert result.ok, result.reason
    as_embedding = check(ref, drift, Thresholds(task_metrics={"logits": "embedding"}))
    assert not as_embedding.ok and "embedding cosine" in as_embedding.reason


def test_an_embedding_with_one_ruined_vector_fails_on_it() -> None:
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((1, 128, 64)).astype(np.float32)
    got = ref.copy()
    got[0, 17] = rng.standard_normal(64)
    result = check({"last_hidden_state": ref}, {"last_hidden_state": got}, Thresholds())
    fig = result.per_output["last_hidden_state"]
    assert fig["metric"] == "embedding" and fig["cosine"] > 0.99  # the whole output hides it
    assert not result.ok
    assert fig["embedding_worst"]["vector"] == 17
    assert fig["slice"]["axis"] == 1 and fig["slice"]["index"] == 17


def test_negligible_slices_are_skipped_and_short_ones_pooled() -> None:
    ref = np.ones((1, 4, 100), np.float32)
    ref[0, 3] = 0.0  # an all-zero channel: no direction to compare
    got = ref.copy()
    got[0, 3] = 1e-7
    fig = check({"y": ref}, {"y": got}, Thresholds()).per_output["y"]
    assert fig["slice"]["value"] == pytest.approx(1.0)
    pooled = check({"p": np.ones((1, 3), np.float32)}, {"p": np.ones((1, 3), np.float32)}, Thresholds())
    assert pooled.per_output["p"]["slice"]["pooled"] is True


def test_accuracy_json_keeps_infinities_as_strings() -> None:
    ref = {"y": np.ones((1, 4), np.float32)}
    got = {"y": np.array([[1, 1, np.inf, 1]], np.float32)}
    data = accuracy_json(check(ref, got, Thresholds()))
    assert data["per_output"]["y"]["max_abs"] == "inf" and data["ok"] is False
    assert data["worst"]["max_rel"] == "inf"


# --- the task metric chosen for each output -----------------------------------------------------


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    ("name", "array", "metric", "why"),
    [
        ("logits", np.zeros((1, 10), np.float32), "classifier", "scores over classes"),
        ("pooler_output", np.zeros((1, 128), np.float32), "embedding", "named like an embedding"),
        ("score", np.zeros((1, 1), np.float32), "none", "a single value per row"),
        ("hidden", np.ones((1, 16, 64), np.float32), "embedding", "one vector per position"),
        ("out", _softmax(np.random.default_rng(0).standard_normal((1, 50, 30))), "ctc", "softmax"),
        (
            "out",
            np.log(_softmax(np.random.default_rng(0).standard_normal((1, 50, 30)))),
            "ctc",
            "log-softmax",
        ),
        (
            "logits",
            np.random.default_rng(0).standard_normal((1, 50, 30)),
            "ctc",
            "named like per-step logits",
        ),
        ("feature_map", np.zeros((1, 8, 4, 4), np.float32), "none", "rank-4 output"),
        ("ids", np.zeros((1, 4), np.int64), "exact", "must match exactly"),
    ],
)
def test_metric_is_chosen_from_shape_values_and_name(
    name: str, array: np.ndarray, metric: str, why: str
) -> None:
    choice = choose_metric(name, [array], 0)
    assert choice.metric == metric and why in choice.why


def test_detection_heads_are_recognised_in_both_layouts() -> None:
    rng = np.random.default_rng(0)
    boxes = np.abs(rng.standard_normal((1, 3549, 4))) * 200
    scores = rng.uniform(0, 1, (1, 3549, 2))
    v5 = np.concatenate([boxes, scores], axis=2)
    choice = choose_metric("output0", [v5], 0)
    assert choice.metric == "detection" and choice.fields_last and choice.objectness
    v8 = np.swapaxes(np.concatenate([boxes, rng.uniform(0, 1, (1, 3549, 80))], axis=2), 1, 2)
    choice = choose_metric("output0", [v8], 0)
    assert choice.metric == "detection" and not choice.fields_last and not choice.objectness
    assert "[batch, 84, 3549]" in choice.why
    # Boxes in 0..1 and no name that says so: not taken for a detector.
    assert choose_metric("probs", [rng.uniform(0, 1, (1, 500, 6))], 0).metric != "detection"


def test_overrides_win_and_are_checked() -> None:
    ref = {"logits": np.zeros((1, 10), np.float32), "seq": np.zeros((1, 5, 4), np.float32)}
    choices = choose_metrics(ref, {"logits": "none", "seq": "ctc"})
    assert choices["logits"].metric == "none" and choices["logits"].source == "override"
    assert choices["seq"].metric == "ctc"
    with pytest.raises(UsageError, match="'nope', which is not an output"):
        choose_metrics(ref, {"nope": "classifier"})
    with pytest.raises(UsageError, match="the ctc metric needs 3 axes"):
        choose_metrics(ref, {"logits": "ctc"})


def test_ctc_time_major_output_uses_its_batch_axis() -> None:
    rng = np.random.default_rng(0)
    ref = _softmax(rng.standard_normal((40, 2, 12)))  # [time, batch, classes]
    got = ref.copy()
    got[:, 1] = _softmax(rng.standard_normal((40, 12)))  # the second sequence decodes differently
    choices = choose_metrics({"y": ref}, batch_axes={"y": 1})
    assert choices["y"].metric == "ctc" and choices["y"].batch_axis == 1
    fig = check({"y": ref}, {"y": got}, Thresholds(min_task_cosine=0.0), choices=choices).per_output["y"]
    assert fig["sequences"] == 2 and fig["decode_agreement"] == 0.5


def test_a_ctc_step_whose_near_tie_moved_is_judged_by_the_decodes_not_by_its_slice() -> None:
    """PP-OCRv6's recognizer at bf16: 48 of 48 decodes equal, one step's distribution cosine 0.25
    (two classes near a tie traded places below the winner). The decodes judge a CTC head."""
    rng = np.random.default_rng(4)
    classes = 80  # 64 or more per step: each step is judged on its own, as 18,710 classes are
    ref = [{"seq": _softmax(rng.standard_normal((1, 80, classes)) * 3)} for _ in range(8)]
    near_tie = np.full(classes, 0.05 / (classes - 2))
    near_tie[[7, 9]] = 0.5, 0.45  # class 7 wins step 10 by a hair
    ref[0]["seq"][0, 10] = near_tie
    got = [{"seq": r["seq"].copy()} for r in ref]
    sure = np.full(classes, 0.09 / (classes - 2))
    sure[[7, 9]] = 0.9, 0.01  # still class 7, now sure of it: the step's cosine falls to 0.75
    got[0]["seq"][0, 10] = sure
    choices = choose_metrics(ref)
    assert choices["seq"].metric == "ctc"
    result = check(ref, got, Thresholds(), choices=choices)
    assert result.ok, result.reason
    assert "slice" not in result.per_output["seq"] and result.per_output["seq"]["decode_agreement"] == 1.0
    # A step whose winner changes changes the decode: that fails.
    flipped = [{"seq": r["seq"].copy()} for r in ref]
    flipped[0]["seq"][0, 10] = near_tie[[*range(7), 9, 8, 7, *range(10, classes)]]  # class 9 wins
    result = check(ref, flipped, Thresholds(), choices=choices)
    assert not result.ok and "greedy CTC decode equal" in result.reason


# --- task metrics on arrays ---------------------------------------------------------------------


def test_greedy_decode_collapses_repeats_and_drops_blanks() -> None:
    assert greedy_decode(np.array([0, 3, 3, 0, 3, 5, 5, 0])) == [3, 3, 5]
    assert greedy_decode(np.array([], dtype=np.int64)) == []
    ref = np.eye(4)[[0, 1, 1, 0, 2]][None]  # decodes to [1, 2]
    stretched = np.eye(4)[[1, 1, 1, 0, 2]][None]  # frames differ, the decode does not
    counts = ctc_counts(ref, stretched)
    assert counts["decoded_equal"] == 1 and counts["frames_equal"] == 4


def test_box_iou() -> None:
    a = np.array([[10.0, 10.0, 4.0, 4.0]])
    b = np.array([[10.0, 10.0, 4.0, 4.0], [12.0, 10.0, 4.0, 4.0], [100.0, 100.0, 4.0, 4.0]])
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 8 / 24, 0.0]])


def _rows(*dets: tuple[float, float, float, float, float, float]) -> np.ndarray:
    return np.array(dets, dtype=np.float64)


def test_match_detections_by_class_iou_and_borderline_scores() -> None:
    ref = _rows(
        (50, 50, 20, 20, 0.9, 0.9),  # a firm detection
        (200, 200, 30, 30, 0.9, 0.8),  # another
        (300, 300, 10, 10, 0.27, 1.0),  # just above the 0.25 threshold
        (400, 400, 10, 10, 0.01, 0.5),  # below: not a detection
    )
    same = match_detections(ref, ref, objectness=True, score_threshold=0.25, iou_threshold=0.5)
    assert same["matched"] == 3 and same["missing"] == same["extra"] == 0
    moved = ref.copy()
    moved[0, 0] += 2  # a small shift: still the same detection
    moved[1, 0] += 40  # a box gone elsewhere: missing here, extra there
    moved[2, 4] = 0.2  # the borderline one drops under the threshold: not counted
    counts = match_detections(ref, moved, objectness=True, score_threshold=0.25, iou_threshold=0.5)
    assert counts == {"matched": 1, "missing": 1, "extra": 1, "borderline": 1, "reference": 3, "candidate": 2}
    assert detection_agreement(counts) == pytest.approx(1 / 3)
    assert detection_agreement({"matched": 0, "missing": 0, "extra": 0}) == 1.0


def test_detection_metric_through_the_gate() -> None:
    rng = np.random.default_rng(4)
    n = 200
    boxes = rng.uniform(20, 400, (1, n, 4))
    obj = np.where(rng.uniform(0, 1, (1, n, 1)) > 0.9, 0.95, 0.01)
    ref = np.concatenate([boxes, obj, rng.uniform(0.5, 1, (1, n, 1)), rng.uniform(0, 0.4, (1, n, 1))], axis=2)
    got = ref.copy()
    got[..., [5, 6]] = got[..., [6, 5]]  # every class flipped, boxes and objectness intact
    th = Thresholds(min_task_cosine=0.0)
    result = check({"det": ref.astype(np.float32)}, {"det": got.astype(np.float32)}, th)
    fig = result.per_output["det"]
    assert fig["metric"] == "detection" and fig["detections"]["reference"] > 0
    assert fig["detection_agreement"] == 0.0
    assert "detection agreement 0.000 < 0.9" in result.reason
    assert check({"det": ref}, {"det": ref}, th).per_output["det"]["detection_agreement"] == 1.0


def test_metric_choice_json() -> None:
    choice = MetricChoice("detection", "why", fields_last=False, objectness=False)
    assert choice.to_json()["layout"] == "[batch, fields, N], no objectness"


# --- the user's metric --------------------------------------------------------------------------

GOOD_METRIC = """
import numpy as np

def score(reference, candidate, inputs, labels):
    hits = sum(int(np.argmax(r["logits"]) == np.argmax(c["logits"])) for r, c in zip(reference, candidate))
    share = hits / len(reference)
    if labels is not None:
        assert labels["label"].shape == (len(inputs),)
    return share, share >= 0.9
"""


def _metric_file(tmp_path: Path, text: str, name: str = "metric.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_user_metric_scores_and_decides(tmp_path: Path) -> None:
    metric = load_user_metric(f"{_metric_file(tmp_path, GOOD_METRIC)}:score")
    assert metric.spec == "metric.py:score"
    rng = np.random.default_rng(0)
    ref = [{"logits": rng.standard_normal((1, 5)).astype(np.float32)} for _ in range(10)]
    inputs = [{"x": np.zeros((1, 2), np.float32)} for _ in ref]
    labels = {"label": np.arange(10)}
    loose = Thresholds(min_cosine=-1.0, min_task_cosine=-1.0, min_top1=None)  # only the metric decides
    result = check(ref, ref, loose, user_metric=metric, inputs=inputs, labels=labels)
    assert result.ok and result.user_metric == {"name": "metric.py:score", "score": 1.0, "ok": True}
    flipped = [{"logits": -r["logits"]} for r in ref]
    failed = check(ref, flipped, loose, user_metric=metric, inputs=inputs, labels=labels)
    assert not failed.ok and failed.reason == "--metric metric.py:score: score 0 fails"
    assert accuracy_json(failed)["user_metric"]["ok"] is False


@pytest.mark.parametrize(
    ("text", "spec_tail", "needle"),
    [
        (GOOD_METRIC, ":nope", "has no function 'nope' (its functions: score)"),
        ("def score(:\n", ":score", "syntax error on line 1"),
        ("raise RuntimeError('no GPU here')\n", ":score", "importing it raised RuntimeError: no GPU here"),
        ("def score(reference, candidate):\n    return 1.0, True\n", ":score", "does not take 4 arguments"),
        (GOOD_METRIC, "", "bad --metric"),
    ],
)
def test_user_metric_file_problems_are_one_line_usage_errors(
    tmp_path: Path, text: str, spec_tail: str, needle: str
) -> None:
    path = _metric_file(tmp_path, text)
    with pytest.raises(UsageError) as info:
        load_user_metric(f"{path}{spec_tail}")
    message = info.value.one_line()
    assert needle in message and "\n" not in message
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="file not found"):
        load_user_metric(f"{tmp_path / 'missing.py'}:score")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("    return {}['missing']\n", "raised KeyError"),
        ("    return 0.5\n", "returned 0.5"),
        ("    return 'high', True\n", "returned ('high', True)"),
        ("    reference[0]['y'][0] = 5\n    return 1.0, True\n", "read-only"),
    ],
)
def test_user_metric_that_breaks_at_run_time_is_a_metric_error(
    tmp_path: Path, body: str, needle: str
) -> None:
    path = _metric_file(tmp_path, "def score(reference, candidate, inputs, labels):\n" + body)
    metric = load_user_metric(f"{path}:score")
    ref = [{"y": np.ones((1, 3), np.float32)}]
    with pytest.raises(MetricError) as info:
        check(ref, ref, Thresholds(), user_metric=metric, inputs=[{}])
    assert needle in info.value.one_line() and "metric.py:score" in info.value.one_line()
    assert ref[0]["y"][0, 0] == 1.0  # the reference is never changed by the user's code


# --- outputs that carry no signal: probability maps, near-zero samples, fp32 within tolerance ------


def _text_map(rng: np.random.Generator, regions: bool) -> np.ndarray:
    """A DBNet-like [1, 1, 64, 64] probability map: ~0 everywhere, with text-like blocks or not."""
    prob = np.abs(rng.normal(0.0, 1e-4, (1, 1, 64, 64)))
    if regions:
        for _ in range(3):
            y, x = rng.integers(0, 48, 2)
            prob[0, 0, y : y + 8, x : x + 14] = rng.uniform(0.6, 0.99)
    return prob.astype(np.float32)


def test_a_probability_map_is_judged_by_its_regions() -> None:
    from optimize.accuracy import check, choose_metrics

    rng = np.random.default_rng(0)
    maps = [{"map": _text_map(rng, regions=i % 2 == 0)} for i in range(8)]
    choices = choose_metrics(maps)
    assert choices["map"].metric == "mask"
    # A candidate that loses one text block on one row fails on its regions, whatever its cosine.
    broken = [dict(m) for m in maps]
    lost = broken[0]["map"].copy()
    lost[lost > 0.5] = 0.0
    broken[0] = {"map": lost}
    result = check(maps, broken, Thresholds(), choices=choices)
    assert not result.ok and "mask IoU 0.000 < 0.95" in result.reason
    # Rows where neither side has a region carry no signal and are counted, not scored as 1.0.
    figures = result.per_output["map"]
    assert figures["mask_empty"]["maps"] >= 4


def _eroded(prob: np.ndarray, share: float) -> np.ndarray:
    """The map with `share` of its region pixels (the first ones) dropped below every threshold:
    its IoU with the original is 1 - share, to the pixel."""
    out = prob.copy().reshape(-1)
    region = np.flatnonzero(out > 0.5)
    out[region[: int(share * region.size)]] = 0.0
    return out.reshape(prob.shape)


def test_a_map_candidate_whose_worst_row_clears_the_threshold_by_luck_fails() -> None:
    """An int8 text detector: worst judged IoU 0.951, mean 0.960 over 16 maps, then 0.949 on fresh
    pages. Its IoUs project a few percent of unseen maps under 0.95: refused. A candidate whose IoUs
    sit well above the threshold passes."""
    from optimize.accuracy import check
    from optimize.accuracy.compare import MASK_UNSEEN_SHARE, choose_metrics, unseen_share_below

    rng = np.random.default_rng(3)
    maps = [{"map": _text_map(rng, regions=True)} for _ in range(16)]
    choices = choose_metrics(maps)
    # IoUs from 0.970 down to 0.952: mean 0.961, as the detector's were.
    shares = np.linspace(0.03, 0.048, len(maps))
    marginal = [{"map": _eroded(m["map"], share)} for m, share in zip(maps, shares, strict=True)]
    result = check(maps, marginal, Thresholds(), choices=choices)
    fig = result.per_output["map"]
    assert fig["mask_iou"] >= 0.95  # every judged map clears the threshold ...
    assert fig["mask_unseen_below"] > MASK_UNSEEN_SHARE  # ... yet the spread says the next may not
    assert not result.ok and "would fall under 0.95" in result.reason
    shares = np.linspace(0.0, 0.01, len(maps))
    close = [{"map": _eroded(m["map"], share)} for m, share in zip(maps, shares, strict=True)]
    assert check(maps, close, Thresholds(), choices=choices).ok
    # Too few maps or no spread project nothing.
    assert unseen_share_below({0.3: [0.96] * 20, 0.5: [0.951, 0.96, 0.97]}, 0.95) == 0.0


def test_fp32_noise_on_a_near_zero_map_is_never_inaccurate() -> None:
    """The DBNet of the issue: photos without text, a map ~1e-4 everywhere on most rows, an fp32
    candidate off by 2e-5 (cosine 0.97 on such a row) was rejected."""
    from optimize.accuracy import check, choose_metrics

    rng = np.random.default_rng(1)
    maps = [{"map": _text_map(rng, regions=i < 2)} for i in range(8)]
    noisy = [{"map": (m["map"] + rng.uniform(-2.3e-5, 2.3e-5, m["map"].shape)).astype(np.float32)}
             for m in maps]  # fmt: skip
    choices = choose_metrics(maps)
    result = check(maps, noisy, Thresholds(), choices=choices, fp32=True)
    assert result.ok, result.reason
    fig = result.per_output["map"]
    assert fig["fp32_tolerance"] and set(fig["no_signal_samples"]) == set(range(2, 8))
    # The same noise is judged on the rows' signal, not on near-zero rows' cosine, for bf16 too.
    assert check(maps, noisy, Thresholds(), choices=choices).ok
    # fp32 is not a licence: an error well beyond float tolerance is still judged.
    wrong = [{"map": np.where(m["map"] > 0.5, 0.2, m["map"]).astype(np.float32)} for m in maps]
    assert not check(maps, wrong, Thresholds(), choices=choices, fp32=True).ok


def test_fp32_tolerance_holds_each_slice_to_its_own_scale() -> None:
    """Box coordinates in pixels beside 0..1 class scores: an error of 1e-3 is nothing for the boxes
    and a real change for the scores; the output's range alone would let it through."""
    from optimize.accuracy import check

    rng = np.random.default_rng(2)
    heads = []
    for _ in range(8):
        head = np.zeros((1, 50, 6), dtype=np.float32)
        head[..., :4] = rng.uniform(0, 640, (1, 50, 4))
        head[..., 4:] = rng.uniform(0, 1, (1, 50, 2))
        heads.append({"y": head})
    scores_off = [{"y": h["y"] + np.array([0, 0, 0, 0, 0, 0.05], dtype=np.float32)} for h in heads]
    boxes_off = [{"y": h["y"] + np.array([0.01, 0, 0, 0, 0, 0], dtype=np.float32)} for h in heads]
    loose = Thresholds(min_cosine=0.9999999, min_task_cosine=0.9999999)
    assert check(heads, boxes_off, loose, fp32=True).ok  # 0.01 px: within 1e-4 of the box range
    assert not check(heads, scores_off, loose, fp32=True).ok  # 0.05 of a [0, 1] score is not


def test_a_detectors_class_score_head_is_not_called_an_embedding() -> None:
    """PicoDet's score heads [1, N, 10] (sigmoid scores, no boxes, named transpose_*.tmp_0) were
    judged as "embeddings"."""
    from optimize.accuracy.task_metrics import choose_metric

    rng = np.random.default_rng(0)
    scores = [rng.uniform(0, 1, (1, 3000, 10)).astype(np.float32) for _ in range(2)]
    choice = choose_metric("transpose_0.tmp_0", scores, 0)
    assert choice.metric == "none" and "class scores" in choice.why
    hidden = [rng.standard_normal((1, 64, 384)).astype(np.float32) for _ in range(2)]
    assert choose_metric("transpose_0.tmp_0", hidden, 0).metric == "embedding"


def _padded_encoder_outputs(seed: int = 0) -> tuple[list[dict], list[dict], list[dict]]:
    """Three texts of 5, 9 and 12 tokens padded to 16: hidden states [1, 16, 32]."""
    rng = np.random.default_rng(seed)
    refs, gots, feeds = [], [], []
    for real in (5, 9, 12):
        mask = np.zeros((1, 16), np.int64)
        mask[0, :real] = 1
        hidden = rng.standard_normal((1, 16, 32)).astype(np.float32)
        got = hidden + rng.standard_normal(hidden.shape).astype(np.float32) * 1e-3
        got[0, real:] = rng.standard_normal((16 - real, 32))  # padded positions: anything at all
        refs.append({"last_hidden_state": hidden})
        gots.append({"last_hidden_state": got})
        feeds.append({"input_ids": np.arange(16, dtype=np.int64)[None], "attention_mask": mask})
    return refs, gots, feeds


def test_positions_an_attention_mask_marks_as_padding_are_not_judged() -> None:
    refs, gots, feeds = _padded_encoder_outputs()
    judged = check(refs, gots, Thresholds(), inputs=feeds)
    assert judged.ok, judged.reason
    figures = judged.per_output["last_hidden_state"]
    assert figures["padded_positions_ignored"] == 11 + 7 + 4
    assert figures["embedding_cosine"] > 0.999
    # Without the mask the same outputs fail on a padded vector: the mask is what passes them.
    blind = check(refs, gots, Thresholds())
    assert not blind.ok and "embedding cosine" in blind.reason


def test_a_real_token_that_changed_still_fails_beside_padding() -> None:
    refs, gots, feeds = _padded_encoder_outputs()
    gots[1]["last_hidden_state"][0, 3] *= -1  # a real token of the second text, ruined
    judged = check(refs, gots, Thresholds(), inputs=feeds)
    assert not judged.ok
    assert judged.per_output["last_hidden_state"]["embedding_worst"] == {"sample": 1, "vector": 3}


def test_only_a_two_axis_zero_one_mask_is_taken_for_padding() -> None:
    from optimize.accuracy.compare import padding_masks

    ones_and_zeros = np.array([[1, 1, 0]], np.int64)
    assert padding_masks([{"attention_mask": ones_and_zeros}])[0].tolist() == [[True, True, False]]
    assert padding_masks([{"attention_mask": ones_and_zeros * 2}]) == [None]  # not 0/1
    assert padding_masks([{"attention_mask": ones_and_zeros.astype(np.float32)}]) == [None]  # a bias
    assert padding_masks([{"pixel_mask": np.ones((1, 1, 4, 4), np.int64)}]) == [None]  # not [batch, seq]
    assert padding_masks([{"attention_mask": np.zeros((1, 3), np.int64)}]) == [None]  # no token at all
    assert padding_masks([{"tokens": ones_and_zeros}]) == [None]  # not named as a mask
