"""The quantization search space (optimize/runtimes/onnxruntime/quant_search.py): its order, what
earlier outcomes make not worth trying, the known ONNX Runtime workarounds, back-off groups."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from optimize.runtimes.onnxruntime.quant_search import (
    QuantPoint,
    attention_projections,
    dominated_reason,
    late_ffn_outputs,
    node_costs,
    output_head,
    search_space,
    workaround_for,
)
from optimize.stage import Outcome


def labels(points: list[QuantPoint]) -> list[str]:
    return [p.label for p in points]


def test_transformers_start_with_per_channel_dynamic_int8() -> None:
    points = search_space("matmul", has_matmul_weights=True, transformer=True)
    assert labels(points)[:3] == ["dynamic-pc-matmul", "dynamic-pc-matmul-mha", "dynamic-pt-matmul"]
    assert "qdq-pc-matmul-minmax" in labels(points)
    assert all(p.scope == "matmul" for p in points)  # no conv weights: no conv scope
    with_convs = search_space("matmul", has_matmul_weights=True, has_conv_weights=True, transformer=False)
    assert labels(with_convs)[0] == "dynamic-pc-matmul"
    assert labels(with_convs)[-6:][0] == "qdq-pc-conv-matmul-minmax"  # the other family follows


def test_conv_nets_start_with_static_qdq_on_conv_and_matmul() -> None:
    points = search_space("conv", has_matmul_weights=True, transformer=False)
    assert labels(points)[0] == "qdq-pc-conv-matmul-minmax"
    assert "dynamic-pc-matmul" in labels(points)  # CNN + RNN recognizers: their MatMul/LSTM weights
    assert not any(p.mode == "dynamic" and "Conv" in (p.op_types() or []) for p in points)
    without = search_space("conv", has_matmul_weights=False, transformer=False)
    assert "dynamic-pc-matmul" not in labels(without)


def test_recipe_options_narrow_the_space() -> None:
    static = search_space("matmul", has_matmul_weights=True, transformer=False, mode="static")
    assert static and all(p.mode == "static" for p in static)
    entropy = search_space("conv", has_matmul_weights=True, transformer=False, calibration="entropy")
    assert all(p.mode == "dynamic" or p.calibration == "entropy" for p in entropy)
    tensor = search_space("matmul", has_matmul_weights=True, transformer=False, per_channel=False)
    assert tensor and not any(p.per_channel for p in tensor)


def test_what_earlier_outcomes_make_not_worth_trying() -> None:
    minmax = QuantPoint("static", "conv-matmul", calibration="minmax")
    percentile = QuantPoint("static", "conv-matmul", calibration="percentile")
    per_tensor = QuantPoint("static", "conv-matmul", per_channel=False, calibration="minmax")
    # Same kernels as an accurate point: other ranges cannot be faster.
    assert "cannot be faster" in dominated_reason(percentile, {minmax: Outcome.SLOWER})
    assert "cannot be faster" in dominated_reason(percentile, {minmax: Outcome.KEPT})
    # Measured but unverifiable on the data given: another calibration of the same kernels is too.
    assert "could not be verified" in dominated_reason(percentile, {minmax: Outcome.UNVERIFIED})
    # ... but they may be accurate where it was not.
    assert dominated_reason(percentile, {minmax: Outcome.INACCURATE}) == ""
    assert dominated_reason(percentile, {minmax: Outcome.FAILED}) == ""
    # Per-tensor: only when the per-channel twin failed inside ONNX Runtime.
    assert "less accurate" in dominated_reason(per_tensor, {minmax: Outcome.INACCURATE})
    assert dominated_reason(per_tensor, {minmax: Outcome.FAILED}) == ""
    # Fusion after quantization: a speed variant, pointless when the unfused twin was inaccurate.
    dyn, mha = QuantPoint("dynamic", "matmul"), QuantPoint("dynamic", "matmul", fuse_after=True)
    assert "was inaccurate" in dominated_reason(mha, {dyn: Outcome.INACCURATE})
    assert dominated_reason(mha, {dyn: Outcome.SLOWER}) == ""
    # Points the recipe names explicitly are all tried.
    assert dominated_reason(percentile, {minmax: Outcome.SLOWER}, explicit=True) == ""


def test_known_failures_map_to_their_workaround_once() -> None:
    error = "The truth value of an array with more than one element is ambiguous. Use a.any()"
    fix = workaround_for(error, [])
    assert fix is not None and fix.extra_options == {"QDQDisableWeightAdjustForInt32Bias": True}
    assert workaround_for(error, [fix.name]) is None  # applied already: the error stands
    typed = workaround_for("Unable to find data type for weight_name=/m/MatMul_output_0", [])
    assert typed is not None and typed.extra_options == {"DefaultTensorType": TensorProto.FLOAT}
    assert workaround_for("some other error", []) is None


def _mlp_with_ffn() -> object:
    """x -> q (384x384) -> up (384x1536) -> Relu -> down (Gemm, transB: 384x1536) -> head -> y, twice."""
    rng = np.random.default_rng(0)
    inits, nodes, last = [], [], "x"
    for layer in range(2):
        for name, shape, op in (
            (f"q{layer}", (384, 384), "MatMul"),
            (f"up{layer}", (384, 1536), "MatMul"),
            (f"down{layer}", (384, 1536), "Gemm"),
        ):
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w_{name}"))
            attrs = {"transB": 1} if op == "Gemm" else {}
            nodes.append(helper.make_node(op, [last, f"w_{name}"], [name], name=name, **attrs))
            last = name
            if name.startswith("up"):
                nodes.append(helper.make_node("Relu", [last], [f"relu{layer}"], name=f"relu{layer}"))
                last = f"relu{layer}"
    inits.append(numpy_helper.from_array(rng.standard_normal((384, 2)).astype(np.float32), "w_head"))
    nodes += [
        helper.make_node("MatMul", [last, "w_head"], ["h"], name="head"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 384])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_back_off_groups_and_costs() -> None:
    model = _mlp_with_ffn()
    names = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    assert output_head(model, names) == ["head"]  # reaches y through Softmax only
    assert late_ffn_outputs(model, names) == ["down1"]  # the later half's down-projection
    assert attention_projections(model, names) == ["q0", "q1"]
    costs = node_costs(model, names)
    assert costs["up0"] == 4 * 384 * 1536 and costs["head"] == 4 * 384 * 2


def test_a_point_is_expected_to_cost_what_its_calibration_costs_against_those_already_run() -> None:
    from optimize.runtimes.onnxruntime.quantize import CALIBRATION_COST, expected_point_s

    assert expected_point_s("entropy", {}) is None  # nothing ran yet: the first point always runs
    assert expected_point_s("minmax", {"minmax": 3.0}) == 3.0
    entropy = expected_point_s("entropy", {"minmax": 3.0, "percentile": 4.0})
    assert entropy == 3.0 * CALIBRATION_COST["entropy"]  # scaled from the cheapest method seen
    assert expected_point_s("entropy", {"entropy": 40.0, "minmax": 3.0}) == 40.0  # its own, once seen
