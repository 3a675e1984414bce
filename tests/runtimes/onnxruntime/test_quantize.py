"""The quantize stage (optimize/runtimes/onnxruntime/quantize.py, quant_sensitivity.py): the int8
forms it picks, calibration, and backing off nodes that fail the accuracy gate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.data import resolve_inputs
from optimize.errors import InputError
from optimize.model.onnx_file import op_counts, read_model
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.runtimes.onnxruntime.quant_search import output_head
from optimize.runtimes.onnxruntime.quantize import QuantizeStage
from optimize.runtimes.quantization import backoff_sizes, load_calibration
from optimize.stage import LIFT_REFERENCE_KEY, Candidate, StageContext, StageSkipped
from tests.runtimes.onnxruntime.helpers import (
    BERT,
    MLP,
    RESNET,
    Checker,
    assert_opsets_clean,
    cosine,
    outputs,
    reference,
    sample_context,
)

CNN_POINT = "qdq-pc-conv-matmul-minmax"
MATMUL_POINT = "dynamic-pc-matmul"


def _with(ctx: StageContext, **options: Any) -> StageContext:
    ctx.options.update(options)
    return ctx


def _noted(ctx: StageContext) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """The rows the stage records without yielding a candidate: label -> (status, reason, details)."""
    rows: dict[str, tuple[str, str, dict[str, Any]]] = {}
    ctx.note_point_fn = lambda label, status, reason, details: rows.__setitem__(
        label, (status, reason, details)
    )
    return rows


def test_quantize_cnn_is_static_qdq_and_close(tmp_path: Path) -> None:
    base, ctx, log = sample_context(RESNET, tmp_path, options={"calib_samples": 4, "points": [CNN_POINT]})
    (cand,) = QuantizeStage().run(base, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert cand.label == f"quantize:{CNN_POINT}" and cand.precision == "int8"
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    assert "ConvInteger" not in ops and "DynamicQuantizeLinear" not in ops  # never dynamic on convs
    assert cand.details["calibration_data"] == {"source": "generated", "samples": 4}
    assert any("generated inputs" in line for line in log), "generated calibration must warn"
    assert cand.details["activation_type"] == "uint8" and cand.details["weight_type"] == "int8"
    assert cand.details["per_channel"] is True and cand.details["op_types"] == ["Conv", "MatMul", "Gemm"]
    assert_opsets_clean(cand.model_path)
    ref, got = reference(RESNET, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["logits"], got["logits"]) > 0.99


def test_the_search_starts_with_the_usual_winner_and_prunes_what_cannot_win(tmp_path: Path) -> None:
    """A transformer: per-channel dynamic int8 first; per-tensor (same kernels, less accurate) and
    other calibrations of an accurate static point (same kernels) are recorded as skipped."""
    base, ctx, _ = sample_context(BERT, tmp_path, options={"calib_samples": 2})
    rows = _noted(ctx)
    search = QuantizeStage().run(base, ctx)
    first = next(search)
    assert first.label == f"quantize:{MATMUL_POINT}"
    plain = op_counts(read_model(first.model_path))
    assert plain["MatMulInteger"] > 0 and plain["DynamicQuantizeLinear"] > 0 and first.standard_ops
    ctx.outcomes[first.label] = "kept"  # what the pipeline would tell it
    rest = list(search)
    labels = [c.label for c in rest]
    assert "quantize:qdq-pc-matmul-minmax" in labels
    status, reason = rows["quantize:dynamic-pt-matmul"][:2]
    assert status == "skipped" and reason.startswith("per-tensor weights run the same kernels")
    status, reason = rows["quantize:qdq-pc-matmul-percentile"][:2]
    assert status == "skipped" and "only the activation ranges differ from qdq-pc-matmul-minmax" in reason
    ref = reference(BERT, dict(ctx.feeds))
    for cand in [first, *rest]:
        assert cand.details["accuracy_gate"] == "passed" and cand.details["excluded_nodes"] == []
        assert_opsets_clean(cand.model_path)
        got = outputs(cand, dict(ctx.feeds))
        for name in ref:
            assert cosine(ref[name], got[name]) > 0.99, (cand.label, name)


def test_an_inaccurate_verdict_sends_the_search_to_other_ranges(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"calib_samples": 2, "max_points": 2})
    rows = _noted(ctx)
    search = QuantizeStage().run(base, ctx)
    first = next(search)
    assert first.label == f"quantize:{CNN_POINT}"
    ctx.outcomes[first.label] = "inaccurate"  # e.g. the task metric said no
    (second,) = list(search)
    assert second.label == "quantize:qdq-pc-conv-matmul-percentile" and not rows


def test_quantize_fused_graph_gives_qattention(
    bert_fused: tuple[Candidate, StageContext], tmp_path: Path
) -> None:
    fused, _ = bert_fused
    _, ctx, _ = sample_context(BERT, tmp_path, options={"points": [MATMUL_POINT]})
    (cand,) = QuantizeStage().run(fused, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert ops["com.microsoft:QAttention"] == 2 and cand.standard_ops is False
    ref, got = reference(BERT, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["last_hidden_state"], got["last_hidden_state"]) > 0.99


def test_quantize_backs_off_by_keeping_a_cheap_group_in_float(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(RESNET, {}, batch=1)
    checker = Checker(RESNET, feeds, fail_first=1)
    options = {"calib_samples": 4, "points": [CNN_POINT]}
    base, ctx, _ = sample_context(RESNET, tmp_path, options=options, check=checker)
    cand, unlifted = QuantizeStage().run(base, ctx)
    first = checker.calls[0]
    # After the mix, its twin with nothing lifted (the first attempt), for the pipeline to time.
    assert unlifted.label == f"{cand.label}-unlifted" and unlifted.model_path == first.model_path
    assert unlifted.details[LIFT_REFERENCE_KEY] == cand.label and unlifted.precision == "int8"
    attempts = cand.details["attempts"]
    assert attempts[0]["accuracy_ok"] is False and attempts[1]["group"] == "output head"
    assert cand.details["backoff_group"] == "output head" and cand.details["accuracy_gate"] == "passed"
    excluded = cand.details["excluded_nodes"]
    graph = read_model(cand.model_path)
    assert excluded and set(output_head(graph, excluded)) == set(excluded)  # they write the logits
    # The excluded nodes run in float: fewer quantize/dequantize pairs than the first attempt.
    before = op_counts(read_model(first.model_path))["DequantizeLinear"]
    assert op_counts(graph)["DequantizeLinear"] < before
    producer = {o: n.op_type for n in graph.graph.node for o in n.output}
    for node in graph.graph.node:
        if node.name in excluded:
            assert all(producer.get(i) != "DequantizeLinear" for i in node.input), node.name


def test_a_point_that_stays_inaccurate_is_a_rejected_row(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(MLP, {}, batch=1)
    checker = Checker(MLP, feeds, fail_first=100)
    options = {"max_backoff_rounds": 2, "points": [MATMUL_POINT]}
    base, ctx, _ = sample_context(MLP, tmp_path, options=options, check=checker)
    rows = _noted(ctx)
    assert list(QuantizeStage().run(base, ctx)) == []
    status, reason, details = rows[f"quantize:{MATMUL_POINT}"]
    assert status == "rejected" and reason.startswith("inaccurate: forced failure")
    prefixes = [a for a in details["attempts"] if a["group"].startswith("top ")]
    assert 1 <= len(prefixes) <= 2  # the recipe's rounds bound the ranked back-off
    assert details["attempts"][0]["excluded"] == 0
    assert len(checker.calls) == len(details["attempts"])


def test_a_known_onnx_runtime_failure_is_retried_with_its_workaround(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime.quantization as ortq

    real = ortq.quantize_static

    def breaks_without_workaround(*args: Any, **kwargs: Any) -> None:
        if not kwargs["extra_options"].get("QDQDisableWeightAdjustForInt32Bias"):
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        real(*args, **kwargs)

    monkeypatch.setattr(ortq, "quantize_static", breaks_without_workaround)
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"calib_samples": 2, "points": [CNN_POINT]})
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["workarounds"] == ["no-int32-bias-weight-adjust"]
    assert op_counts(read_model(cand.model_path))["QuantizeLinear"] > 0


def test_one_failing_point_does_not_end_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optimize.runtimes.onnxruntime import quantize

    real = quantize._Quantizer._calibrated_ranges

    def entropy_breaks(self: Any) -> Path:
        if self.point.calibration == "entropy":
            raise ValueError("Too many bins for data range")
        return real(self)

    monkeypatch.setattr(quantize._Quantizer, "_calibrated_ranges", entropy_breaks)
    points = ["qdq-pc-conv-matmul-entropy", CNN_POINT]
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"calib_samples": 2, "points": points})
    rows = _noted(ctx)
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.label == f"quantize:{CNN_POINT}"
    status, reason, _ = rows["quantize:qdq-pc-conv-matmul-entropy"]
    assert (status, reason) == ("failed", "Too many bins for data range")


def test_unknown_points_are_a_clear_error(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(MLP, tmp_path, options={"points": ["dynamic-fp4"]})
    with pytest.raises(InputError, match="unknown point 'dynamic-fp4'"):
        list(QuantizeStage().run(base, ctx))


def test_quantize_skips_what_it_cannot_help(tmp_path: Path) -> None:
    base, ctx, log = sample_context(MLP, tmp_path, options={"fp16": True, "points": [MATMUL_POINT]})
    (cand,) = QuantizeStage().run(base, ctx)
    assert any("fp16 skipped" in line for line in log)
    assert QuantizeStage().skip_reason(cand, ctx) == "the model is already int8"
    quantized = Candidate("q", cand.model_path)
    assert QuantizeStage().skip_reason(quantized, ctx) == "the model is already quantized"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    plain = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.save(plain, tmp_path / "relu.onnx")
    reason = QuantizeStage().skip_reason(Candidate("r", tmp_path / "relu.onnx"), ctx)
    assert reason == "no Conv, MatMul, Gemm or Attention to quantize"


def test_backoff_sizes_grow() -> None:
    assert backoff_sizes(30, 3) == [3, 6, 12]
    assert backoff_sizes(3, 3) == [1, 2]  # one node always stays quantized
    assert backoff_sizes(1, 3) == []


def test_quantize_reaches_past_ort_fused_kernels(tmp_path: Path) -> None:
    """A kept operator-fusion file holds FusedConv, which the quantizer cannot read: use the original."""
    base, ctx, log = sample_context(RESNET, tmp_path, options={"calib_samples": 2, "points": [CNN_POINT]})
    extended = OperatorFusionStage().run(base, ctx)[0]
    assert op_counts(read_model(extended.model_path))["com.microsoft:FusedConv"] > 0
    (cand,) = QuantizeStage().run(extended, ctx)
    assert "original model" in cand.details["source"] and any("FusedConv" in line for line in log)
    ops = op_counts(read_model(cand.model_path))
    assert ops["QuantizeLinear"] > 0 and "com.microsoft:FusedConv" not in ops
    assert cand.runtime_config["graph_optimization_level"] == "all"  # ORT fuses the QDQ graph at load
    ref, got = reference(RESNET, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["logits"], got["logits"]) > 0.99


def test_quantize_respects_the_stage_deadline(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(MLP, {}, batch=1)
    checker = Checker(MLP, feeds)
    base, ctx, _ = sample_context(MLP, tmp_path, check=checker)
    rows = _noted(ctx)
    ctx.deadline = time.monotonic() - 1.0  # already spent
    assert list(QuantizeStage().run(base, ctx)) == [] and checker.calls == []
    assert rows and all(r[:2] == ("skipped", "the stage budget was spent") for r in rows.values())


def _opset11_convnet(path: Path) -> Path:
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w0"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b0"),
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w1"),
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "wf"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "opset11",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), path)
    return path


def test_per_channel_static_on_an_old_opset_model(tmp_path: Path) -> None:
    """DequantizeLinear takes a per-channel axis from opset 13: an opset-11 model is converted first."""
    old = _opset11_convnet(tmp_path / "opset11.onnx")
    base, ctx, _ = sample_context(old, tmp_path / "w", options={"calib_samples": 4, "points": [CNN_POINT]})
    (cand,) = QuantizeStage().run(base, ctx)
    assert "opset 11 -> 13" in cand.details["preprocess"]
    assert op_counts(read_model(cand.model_path))["DequantizeLinear"] > 0
    ref, got = reference(old, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["logits"], got["logits"]) > 0.99


def test_nothing_to_quantize_skips_the_stage_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optimize.runtimes.onnxruntime import quantize

    base, ctx, _ = sample_context(MLP, tmp_path, options={"points": [MATMUL_POINT], "exclude_nodes": []})
    rows = _noted(ctx)
    real = quantize._Quantizer.quantize

    def quantizes_nothing(self: Any, base: Candidate, excluded: list[str], index: int) -> Candidate:
        cand = real(self, base, excluded, index)
        cand.details["quantized_ops"] = {}
        return cand

    monkeypatch.setattr(quantize._Quantizer, "quantize", quantizes_nothing)
    with pytest.raises(StageSkipped, match="found nothing to quantize"):
        list(QuantizeStage().run(base, ctx))
    assert rows == {}


def test_quantize_calibration_from_npz(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(RESNET, {}, batch=1)
    stacked = np.random.default_rng(3).standard_normal((3, *feeds["pixel_values"].shape)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", pixel_values=stacked)
    samples = load_calibration(tmp_path / "calib.npz", feeds)
    assert len(samples) == 3 and samples[1]["pixel_values"].shape == feeds["pixel_values"].shape
    np.savez(tmp_path / "batch.npz", pixel_values=stacked[:, 0])  # 3 rows on the batch axis
    assert len(load_calibration(tmp_path / "batch.npz", feeds)) == 3
    np.savez(tmp_path / "bad.npz", pixel_values=stacked[:, :, :2])
    with pytest.raises(InputError, match="pixel_values"):
        load_calibration(tmp_path / "bad.npz", feeds)
    with pytest.raises(InputError, match="not found"):
        load_calibration(tmp_path / "missing.npz", feeds)
    base, ctx, log = sample_context(
        RESNET, tmp_path / "work", options={"calib_data": str(tmp_path / "calib.npz")}
    )
    (cand,) = QuantizeStage().run(base, _with(ctx, points=[CNN_POINT]))
    assert cand.details["calibration_data"]["samples"] == 3
    assert not any("generated inputs" in line for line in log)


def _outlier_mlp(path: Path) -> Path:
    """Three MatMul layers; the middle weight has one huge outlier, so per-tensor int8 zeroes the rest."""
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal((64, 64)).astype(np.float32) * 0.1 for _ in range(3)]
    weights[1][0, 0] = 500.0
    nodes, inits, last = [], [], "x"
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [last, f"w{i}"], [f"mm{i}"], name=f"layer{i}"))
        nodes.append(helper.make_node("Tanh", [f"mm{i}"], [f"t{i}"], name=f"tanh{i}"))
        last = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, 64])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_back_off_finds_the_node_that_quantizes_badly(tmp_path: Path) -> None:
    model = _outlier_mlp(tmp_path / "outlier.onnx")
    _, feeds = resolve_inputs(model, {}, batch=1)
    checker = Checker(model, feeds, min_cos=0.995)
    options = {"points": ["dynamic-pt-matmul"]}  # per-tensor: the outlier wrecks its layer
    base, ctx, _ = sample_context(model, tmp_path / "w", options=options, check=checker)
    cand, unlifted = QuantizeStage().run(base, ctx)
    assert cand.details["sensitivity"][0]["node"] == "layer1"  # ranked by the error it adds itself
    assert cand.details["excluded_nodes"] == ["layer1"]
    (lifted,) = cand.details["lifted"]
    assert lifted["node"] == "layer1" and lifted["precision"] == "fp32" and lifted["added_rel_error"] > 0
    assert unlifted.details["excluded_nodes"] == [] and unlifted.label == f"{cand.label}-unlifted"
    assert cand.details["accuracy_gate"] == "passed"
    assert cand.details["attempts"][0]["accuracy_ok"] is False
    assert op_counts(read_model(cand.model_path))["MatMulInteger"] == 2


def test_weights_held_in_constant_nodes_are_quantized(tmp_path: Path) -> None:
    """paddle2onnx keeps every weight in a Constant node: the stage moves them to initializers,
    where onnxruntime's quantizer looks, and counts them when it picks the family to search first."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "consts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
    )
    path = tmp_path / "consts.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    from optimize.runtimes.onnxruntime.quantize import weight_params

    assert weight_params(read_model(path)) == (0, 32 * 32)
    base, ctx, _ = sample_context(path, tmp_path / "w", options={"points": [MATMUL_POINT]})
    (cand,) = QuantizeStage().run(base, ctx)
    assert "1 Constant nodes made initializers" in cand.details["preprocess"]
    assert op_counts(read_model(cand.model_path))["MatMulInteger"] == 1
    ref, got = reference(path, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["y"], got["y"]) > 0.99
