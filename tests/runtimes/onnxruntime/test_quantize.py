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

from optimize.errors import InputError
from optimize.inputs import resolve_inputs
from optimize.onnx_file import op_counts, read_model
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.runtimes.onnxruntime.quant_sensitivity import backoff_sizes
from optimize.runtimes.onnxruntime.quantize import QuantizeStage, load_calibration
from optimize.stage import Candidate, StageContext
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


def test_quantize_cnn_is_static_qdq_and_close(tmp_path: Path) -> None:
    base, ctx, log = sample_context(RESNET, tmp_path, options={"calib_samples": 4})
    (cand,) = QuantizeStage().run(base, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert cand.label == "quantize:static-qdq" and cand.precision == "int8"
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    assert "ConvInteger" not in ops and "DynamicQuantizeLinear" not in ops  # never dynamic on convs
    assert cand.details["calibration"] == {"source": "generated", "samples": 4}
    assert any("generated inputs" in line for line in log), "generated calibration must warn"
    assert cand.details["activation_type"] == "uint8" and cand.details["weight_type"] == "int8"
    assert_opsets_clean(cand.model_path)
    ref, got = reference(RESNET, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["logits"], got["logits"]) > 0.99


def test_quantize_transformer_is_dynamic_int8_and_close(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(BERT, tmp_path)
    cands = {c.label: c for c in QuantizeStage().run(base, ctx)}
    assert set(cands) == {"quantize:dynamic-int8", "quantize:dynamic-int8-fused"}
    plain = op_counts(read_model(cands["quantize:dynamic-int8"].model_path))
    assert plain["MatMulInteger"] > 0 and plain["DynamicQuantizeLinear"] > 0
    assert cands["quantize:dynamic-int8"].standard_ops is True
    fused = op_counts(read_model(cands["quantize:dynamic-int8-fused"].model_path))
    assert fused["com.microsoft:QAttention"] == 2  # the unfused transformer also gets its fused int8 variant
    ref = reference(BERT, dict(ctx.feeds))
    for cand in cands.values():
        assert cand.details["accuracy_gate"] == "passed" and cand.details["excluded_nodes"] == []
        assert_opsets_clean(cand.model_path)
        got = outputs(cand, dict(ctx.feeds))
        for name in ref:
            assert cosine(ref[name], got[name]) > 0.99, (cand.label, name)


def test_quantize_fused_graph_gives_qattention(
    bert_fused: tuple[Candidate, StageContext], tmp_path: Path
) -> None:
    fused, _ = bert_fused
    _, ctx, _ = sample_context(BERT, tmp_path)
    (cand,) = QuantizeStage().run(fused, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert ops["com.microsoft:QAttention"] == 2 and cand.standard_ops is False
    ref, got = reference(BERT, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["last_hidden_state"], got["last_hidden_state"]) > 0.99


def test_quantize_backs_off_by_excluding_sensitive_nodes(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(RESNET, {}, batch=1)
    checker = Checker(RESNET, feeds, fail_first=1)
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"calib_samples": 4}, check=checker)
    (cand,) = QuantizeStage().run(base, ctx)
    first, final = checker.calls[0], checker.calls[-1]
    assert final is cand and len(checker.calls) == 2
    excluded = cand.details["excluded_nodes"]
    assert excluded and excluded == [s["node"] for s in cand.details["sensitivity"][: len(excluded)]]
    assert cand.details["accuracy_gate"] == "passed"
    assert [a["accuracy_ok"] for a in cand.details["attempts"]] == [False, True]
    # The excluded nodes run in float: fewer quantize/dequantize pairs than the first attempt.
    before = op_counts(read_model(first.model_path))["DequantizeLinear"]
    after = op_counts(read_model(cand.model_path))["DequantizeLinear"]
    assert after < before
    graph = read_model(cand.model_path)
    producer = {o: n.op_type for n in graph.graph.node for o in n.output}
    for node in graph.graph.node:
        if node.name in excluded:
            assert all(producer.get(i) != "DequantizeLinear" for i in node.input), node.name


def test_quantize_back_off_stops_after_its_rounds(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(MLP, {}, batch=1)
    checker = Checker(MLP, feeds, fail_first=100)
    base, ctx, _ = sample_context(MLP, tmp_path, options={"max_backoff_rounds": 2}, check=checker)
    (cand,) = QuantizeStage().run(base, ctx)
    assert len(checker.calls) == 3  # first attempt + 2 back-off rounds
    assert cand.details["accuracy_gate"] == "failed"
    sizes = [a["excluded"] for a in cand.details["attempts"]]
    assert sizes == sorted(sizes) and sizes[0] == 0 and sizes[-1] > sizes[1] > 0
    # Every excluded node really runs in float, Gemms included (the quantizer renames them).
    first = op_counts(read_model(checker.calls[0].model_path))["MatMulInteger"]
    last = op_counts(read_model(cand.model_path))["MatMulInteger"]
    assert any(n.startswith("/Gemm") for n in cand.details["excluded_nodes"])
    assert last == first - len(cand.details["excluded_nodes"]) >= 1


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
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["calibration"]["samples"] == 3
    assert not any("generated inputs" in line for line in log)


def test_quantize_falls_back_when_a_variant_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optimize.runtimes.onnxruntime import quantize

    real = quantize._Quantizer._static_one

    def entropy_breaks(self: Any, out: Path, excluded: list[str], fmt: str, method: str) -> None:
        if method == "entropy":
            raise ValueError("Too many bins for data range")
        real(self, out, excluded, fmt, method)

    monkeypatch.setattr(quantize._Quantizer, "_static_one", entropy_breaks)
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"calibration": "entropy", "calib_samples": 2})
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["failed_variants"] == {"qdq-entropy": "Too many bins for data range"}
    assert cand.details["calibration_method"] == "minmax"


def test_quantize_skips_what_it_cannot_help(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(MLP, tmp_path, options={"fp16": True})
    (cand,) = QuantizeStage().run(base, ctx)
    assert "fp16 skipped" in cand.details["fp16"]
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
    base, ctx, log = sample_context(RESNET, tmp_path, options={"calib_samples": 2})
    extended = OperatorFusionStage().run(base, ctx)[0]
    assert op_counts(read_model(extended.model_path))["com.microsoft:FusedConv"] > 0
    (cand,) = QuantizeStage().run(extended, ctx)
    assert "original model" in cand.details["source"] and any("FusedConv" in line for line in log)
    ops = op_counts(read_model(cand.model_path))
    assert ops["QuantizeLinear"] > 0 and "com.microsoft:FusedConv" not in ops
    assert cand.runtime_config["graph_optimization_level"] == "all"  # ORT fuses the QDQ graph at load
    ref, got = reference(RESNET, dict(ctx.feeds)), outputs(cand, dict(ctx.feeds))
    assert cosine(ref["logits"], got["logits"]) > 0.99


def test_quantize_back_off_respects_the_stage_deadline(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(MLP, {}, batch=1)
    checker = Checker(MLP, feeds, fail_first=100)
    base, ctx, _ = sample_context(MLP, tmp_path, check=checker)
    ctx.deadline = time.monotonic() - 1.0  # already spent: quantize once, then stop
    (cand,) = QuantizeStage().run(base, ctx)
    assert len(checker.calls) == 1
    assert cand.details["attempts"][-1] == {"attempt": 1, "skipped": "stage deadline reached"}
    assert cand.details["accuracy_gate"] == "failed"


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
    base, ctx, _ = sample_context(model, tmp_path / "w", check=checker)
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["sensitivity"][0]["node"] == "layer1"  # ranked by the error it adds itself
    assert cand.details["excluded_nodes"] == ["layer1"]
    assert cand.details["accuracy_gate"] == "passed"
    assert [a["accuracy_ok"] for a in cand.details["attempts"]] == [False, True]
    assert op_counts(read_model(cand.model_path))["MatMulInteger"] == 2
