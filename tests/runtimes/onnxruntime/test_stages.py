"""The four CPU stages on the sample models: what they produce, and that it still computes the same."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.env import cpu_isa_flags, physical_cores
from optimize.errors import InputError
from optimize.inputs import resolve_inputs
from optimize.onnx_utils import (
    NCHWC_DOMAIN,
    nchwc_block_width,
    op_counts,
    read_model,
    strip_unused_opsets,
    used_domains,
)
from optimize.runtimes.onnxruntime.backend import OrtBackend
from optimize.runtimes.onnxruntime.graph_fusion import GraphFusionStage, detect_transformer
from optimize.runtimes.onnxruntime.memory_layout import MemoryLayoutStage
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.runtimes.onnxruntime.quant_sensitivity import backoff_sizes
from optimize.runtimes.onnxruntime.quantize import QuantizeStage, load_calibration
from optimize.stage import AccuracyResult, Candidate, StageContext, StageSkipped
from tests.conftest import SAMPLES

BERT = SAMPLES / "bert_tiny.onnx"
RESNET = SAMPLES / "resnet_tiny.onnx"
MLP = SAMPLES / "mlp_small.onnx"
SHAPES = {BERT: {"sequence": (16,)}, RESNET: {}, MLP: {}}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def _outputs(cand: Candidate, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return OrtBackend(cand.model_path, cand.runtime_config).run(feeds)


def _reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return OrtBackend(model, {}).run(feeds)


class Checker:
    """A stand-in for the pipeline's accuracy gate: cosine per output, optionally failing the first calls."""

    def __init__(self, model: Path, feeds: dict[str, np.ndarray], fail_first: int = 0, min_cos: float = 0.99):
        self.ref = _reference(model, feeds)
        self.feeds = feeds
        self.fail_first = fail_first
        self.min_cos = min_cos
        self.calls: list[Candidate] = []

    def __call__(self, cand: Candidate) -> AccuracyResult:
        self.calls.append(cand)
        got = _outputs(cand, self.feeds)
        per = {k: {"cosine": _cosine(v, got[k])} for k, v in self.ref.items()}
        if len(self.calls) <= self.fail_first:
            return AccuracyResult(False, "forced failure", per)
        ok = all(v["cosine"] >= self.min_cos for v in per.values())
        return AccuracyResult(ok, "" if ok else "cosine too low", per)


def make_ctx(
    model: Path,
    workdir: Path,
    options: dict[str, Any] | None = None,
    check: Callable[[Candidate], AccuracyResult] | None = None,
) -> tuple[Candidate, StageContext, list[str]]:
    _, feeds = resolve_inputs(model, dict(SHAPES.get(model, {})), batch=1)
    workdir.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    base = Candidate("baseline", model)
    ctx = StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options=dict(options or {}),
        best_standard=base,
        best_latency_ms=None,
        target_ms=None,
        deadline=None,
        check_accuracy=check or Checker(model, feeds),
        log=log.append,
    )
    return base, ctx, log


def assert_opsets_clean(path: Path) -> None:
    model = read_model(path, load_external_data=False)
    declared = {("" if o.domain == "ai.onnx" else o.domain) for o in model.opset_import}
    assert declared == used_domains(model), f"{path.name} declares {declared}"
    assert "ai.onnx.ml" not in declared


def assert_close(cand: Candidate, model: Path, feeds: dict[str, np.ndarray], atol: float = 1e-3) -> None:
    ref, got = _reference(model, feeds), _outputs(cand, feeds)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=1e-3, err_msg=f"{cand.label}: {name}")


def nchwc_nodes(path: Path) -> int:
    return sum(n for op, n in op_counts(read_model(path, False)).items() if op.startswith(NCHWC_DOMAIN + ":"))


# --- graph fusion


@pytest.fixture(scope="module")
def bert_fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Candidate, StageContext]:
    base, ctx, _ = make_ctx(BERT, tmp_path_factory.mktemp("graph-fusion"))
    assert GraphFusionStage().skip_reason(base, ctx) is None
    (cand,) = GraphFusionStage().run(base, ctx)
    return cand, ctx


def test_graph_fusion_reads_heads_and_hidden_size_from_the_graph() -> None:
    shape = detect_transformer(read_model(BERT))
    assert shape is not None
    assert (shape.model_type, shape.num_heads, shape.hidden_size, shape.attention_blocks) == (
        "bert",
        4,
        128,
        2,
    )


def test_graph_fusion_fuses_attention_and_skip_layernorm(bert_fused: tuple[Candidate, StageContext]) -> None:
    cand, ctx = bert_fused
    ops = op_counts(read_model(cand.model_path))
    assert ops["com.microsoft:Attention"] == 2
    assert ops["com.microsoft:SkipLayerNormalization"] >= 2
    assert cand.details["fused_ops"]["Attention"] == 2
    assert cand.details["shape_source"] == "graph" and cand.details["num_heads"] == 4
    assert cand.standard_ops is False
    assert cand.details["nodes_after"] < cand.details["nodes_before"]
    assert_opsets_clean(cand.model_path)
    onnx.checker.check_model(read_model(cand.model_path))  # the com.microsoft import is declared
    assert_close(cand, BERT, dict(ctx.feeds))


def test_graph_fusion_skips_models_without_attention(tmp_path: Path) -> None:
    for model in (RESNET, MLP):
        base, ctx, _ = make_ctx(model, tmp_path / model.stem)
        reason = GraphFusionStage().skip_reason(base, ctx)
        assert reason is not None and "no transformer structure found" in reason


def test_graph_fusion_skips_an_already_fused_graph(
    bert_fused: tuple[Candidate, StageContext], tmp_path: Path
) -> None:
    fused, _ = bert_fused
    _, ctx, _ = make_ctx(BERT, tmp_path)
    assert GraphFusionStage().skip_reason(fused, ctx) == "attention is already fused"


def test_graph_fusion_with_an_explicit_type_but_nothing_to_fuse_is_skipped(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(RESNET, tmp_path, options={"model_type": "bert"})
    with pytest.raises(StageSkipped, match="nothing to fuse"):
        GraphFusionStage().run(base, ctx)


# --- operator fusion


def test_operator_fusion_saves_a_portable_extended_file_for_a_cnn(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(RESNET, tmp_path)
    cands = OperatorFusionStage().run(base, ctx)
    labels = [c.label for c in cands]
    assert labels[:2] == ["operator-fusion:extended", "operator-fusion:extended+layout-at-load"]
    assert len(cands) <= 3
    for cand in cands:
        assert nchwc_nodes(cand.model_path) == 0, "a shipped file must not carry NCHWc kernels"
        assert cand.details["isa"] == []
        assert_opsets_clean(cand.model_path)
        assert_close(cand, RESNET, dict(ctx.feeds))
    assert cands[0].runtime_config["graph_optimization_level"] == "disable"
    assert cands[1].runtime_config["graph_optimization_level"] == "all"  # layout on the target CPU
    assert cands[0].details["fused_ops"].get("com.microsoft:FusedConv", 0) > 0


def test_operator_fusion_offers_a_variant_without_skip_layernorm_fusion(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(BERT, tmp_path)
    cands = {c.label: c for c in OperatorFusionStage().run(base, ctx)}
    fused = op_counts(read_model(cands["operator-fusion:extended"].model_path))
    unfused = op_counts(read_model(cands["operator-fusion:extended-no-skipln"].model_path))
    assert fused["com.microsoft:SkipLayerNormalization"] > 0
    assert unfused["com.microsoft:SkipLayerNormalization"] == 0
    no_skip = cands["operator-fusion:extended-no-skipln"]
    assert no_skip.details["disabled_fusions"] == ["SkipLayerNormFusion"]
    assert no_skip.runtime_config["disabled_optimizers"] == ["SkipLayerNormFusion"]
    # Even at runtime level ALL (what quantize sets), ORT must not fuse it back.
    raised = Candidate(
        "raised",
        no_skip.model_path,
        runtime_config={
            **no_skip.runtime_config,
            "graph_optimization_level": "all",
            "optimized_model_filepath": str(tmp_path / "r.onnx"),
        },
    )
    _outputs(raised, dict(ctx.feeds))
    assert op_counts(read_model(tmp_path / "r.onnx"))["com.microsoft:SkipLayerNormalization"] == 0
    for cand in cands.values():
        assert_opsets_clean(cand.model_path)
        assert_close(cand, BERT, dict(ctx.feeds))


def test_operator_fusion_rejects_unknown_levels(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(MLP, tmp_path, options={"levels": ["extended", "turbo"]})
    with pytest.raises(Exception, match="unknown level 'turbo'"):
        OperatorFusionStage().run(base, ctx)


# --- memory layout


def test_memory_layout_on_a_cnn(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(RESNET, tmp_path)
    cands = MemoryLayoutStage().run(base, ctx)
    assert 1 <= len(cands) <= 4
    cores = physical_cores()
    for cand in cands:
        cfg = cand.runtime_config
        assert cfg["intra_op_num_threads"] == cores and cfg["inter_op_num_threads"] == 1
        assert cfg["execution_mode"] == "sequential"
        assert_close(cand, RESNET, dict(ctx.feeds), atol=1e-4)
    portable = [c for c in cands if c.details.get("portable", True)]
    assert portable and all(nchwc_nodes(c.model_path) == 0 for c in portable)
    assert all(c.runtime_config["graph_optimization_level"] == "all" for c in portable)
    if cores > 1:
        assert {c.runtime_config["allow_spinning"] for c in portable} == {True, False}
    block = nchwc_block_width(cpu_isa_flags())
    saved = [c for c in cands if not c.details.get("portable", True)]
    if block is None:
        assert saved == []
    else:
        assert len(saved) == len(portable)  # the same spinning choices, layout saved offline
        for cand in saved:
            assert nchwc_nodes(cand.model_path) > 0
            assert cand.details["nchwc_block_width"] == block and cand.details["isa_requires"]
            assert cand.details["isa_exact"] == {"nchwc_block_width": block}
            assert cand.runtime_config["graph_optimization_level"] == "disable"


def test_memory_layout_on_an_mlp_only_proposes_session_settings(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(MLP, tmp_path)
    cands = MemoryLayoutStage().run(base, ctx)
    assert all(c.model_path == MLP for c in cands)
    assert all(c.details["conv_net"] is False for c in cands)
    assert all(c.details["layout"] == "no layout change" for c in cands)
    greedy = MemoryLayoutStage().run(base, make_ctx(MLP, tmp_path, options={"threads": 64})[1])
    assert {c.runtime_config["intra_op_num_threads"] for c in greedy} == {
        physical_cores()
    }  # never oversubscribe
    with pytest.raises(StageSkipped):
        MemoryLayoutStage().run(base, make_ctx(MLP, tmp_path, options={"search_threads": False})[1])


# --- quantize


def test_quantize_cnn_is_static_qdq_and_close(tmp_path: Path) -> None:
    base, ctx, log = make_ctx(RESNET, tmp_path, options={"calib_samples": 4})
    (cand,) = QuantizeStage().run(base, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert cand.label == "quantize:static-qdq" and cand.precision == "int8"
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    assert "ConvInteger" not in ops and "DynamicQuantizeLinear" not in ops  # never dynamic on convs
    assert cand.details["calibration"] == {"source": "generated", "samples": 4}
    assert any("generated inputs" in line for line in log), "generated calibration must warn"
    assert cand.details["activation_type"] == "uint8" and cand.details["weight_type"] == "int8"
    assert_opsets_clean(cand.model_path)
    ref, got = _reference(RESNET, dict(ctx.feeds)), _outputs(cand, dict(ctx.feeds))
    assert _cosine(ref["logits"], got["logits"]) > 0.99


def test_quantize_transformer_is_dynamic_int8_and_close(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(BERT, tmp_path)
    cands = {c.label: c for c in QuantizeStage().run(base, ctx)}
    assert set(cands) == {"quantize:dynamic-int8", "quantize:dynamic-int8-fused"}
    plain = op_counts(read_model(cands["quantize:dynamic-int8"].model_path))
    assert plain["MatMulInteger"] > 0 and plain["DynamicQuantizeLinear"] > 0
    assert cands["quantize:dynamic-int8"].standard_ops is True
    fused = op_counts(read_model(cands["quantize:dynamic-int8-fused"].model_path))
    assert fused["com.microsoft:QAttention"] == 2  # the unfused transformer also gets its fused int8 variant
    ref = _reference(BERT, dict(ctx.feeds))
    for cand in cands.values():
        assert cand.details["accuracy_gate"] == "passed" and cand.details["excluded_nodes"] == []
        assert_opsets_clean(cand.model_path)
        got = _outputs(cand, dict(ctx.feeds))
        for name in ref:
            assert _cosine(ref[name], got[name]) > 0.99, (cand.label, name)


def test_quantize_fused_graph_gives_qattention(
    bert_fused: tuple[Candidate, StageContext], tmp_path: Path
) -> None:
    fused, _ = bert_fused
    _, ctx, _ = make_ctx(BERT, tmp_path)
    (cand,) = QuantizeStage().run(fused, ctx)
    ops = op_counts(read_model(cand.model_path))
    assert ops["com.microsoft:QAttention"] == 2 and cand.standard_ops is False
    ref, got = _reference(BERT, dict(ctx.feeds)), _outputs(cand, dict(ctx.feeds))
    assert _cosine(ref["last_hidden_state"], got["last_hidden_state"]) > 0.99


def test_quantize_backs_off_by_excluding_sensitive_nodes(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(RESNET, {}, batch=1)
    checker = Checker(RESNET, feeds, fail_first=1)
    base, ctx, _ = make_ctx(RESNET, tmp_path, options={"calib_samples": 4}, check=checker)
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
    base, ctx, _ = make_ctx(MLP, tmp_path, options={"max_backoff_rounds": 2}, check=checker)
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
    base, ctx, log = make_ctx(RESNET, tmp_path / "work", options={"calib_data": str(tmp_path / "calib.npz")})
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
    base, ctx, _ = make_ctx(RESNET, tmp_path, options={"calibration": "entropy", "calib_samples": 2})
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["failed_variants"] == {"qdq-entropy": "Too many bins for data range"}
    assert cand.details["calibration_method"] == "minmax"


def test_quantize_skips_what_it_cannot_help(tmp_path: Path) -> None:
    base, ctx, _ = make_ctx(MLP, tmp_path, options={"fp16": True})
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


# --- helpers


def test_strip_unused_opsets_drops_and_declares() -> None:
    node = helper.make_node("FusedMatMul", ["a", "b"], ["c"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "unused")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 5)]
    )
    removed = strip_unused_opsets(model)
    assert removed == ["ai.onnx.ml"]
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("com.microsoft", 1)}


def test_heads_are_read_through_a_dynamic_reshape_concat() -> None:
    """Dynamic-shape exports build the Q reshape target with Concat(batch, seq, heads, head_size)."""
    model = read_model(BERT)
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    rewritten = 0
    for node in list(model.graph.node):
        if node.op_type != "Reshape" or node.input[1] not in consts:
            continue
        value = numpy_helper.to_array(consts[node.input[1]].attribute[0].t)
        if value.size != 4:
            continue
        parts = []
        for i, dim in enumerate(value):
            name = f"{node.name}_dim{i}"
            model.graph.initializer.append(numpy_helper.from_array(np.array([dim], np.int64), name))
            parts.append(name)
        model.graph.node.append(helper.make_node("Concat", parts, [f"{node.name}_shape"], axis=0))
        node.input[1] = f"{node.name}_shape"
        rewritten += 1
    assert rewritten >= 6
    shape = detect_transformer(model)
    assert shape is not None and (shape.num_heads, shape.hidden_size) == (4, 128)


def test_stages_keep_external_data_beside_the_model(tmp_path: Path) -> None:
    src = tmp_path / "resnet_ext.onnx"
    onnx.save_model(
        read_model(RESNET),
        str(src),
        save_as_external_data=True,
        location="resnet_ext.onnx.data",
        size_threshold=1024,
    )
    _, feeds = resolve_inputs(RESNET, {}, batch=1)
    for stage in (MemoryLayoutStage(), QuantizeStage()):
        base, ctx, _ = make_ctx(src, tmp_path / stage.name, options={"calib_samples": 2})
        base.extra_files = [tmp_path / "resnet_ext.onnx.data"]
        for cand in stage.run(base, ctx):
            model = read_model(cand.model_path, load_external_data=False)
            if cand.model_path != src:  # written by the stage: weights stay in a side file
                assert any(i.data_location == TensorProto.EXTERNAL for i in model.graph.initializer)
                assert cand.extra_files and all(
                    f.is_file() and f.parent == ctx.workdir for f in cand.extra_files
                )
            ref, got = _reference(RESNET, feeds), _outputs(cand, feeds)
            assert _cosine(ref["logits"], got["logits"]) > 0.99, cand.label


def _control_flow_model(path: Path) -> Path:
    """y = If(sum(x) > 0, x @ W, -(x @ W)): the only weights live inside the branches."""
    rng = np.random.default_rng(0)

    def branch(name: str, scale: float) -> onnx.GraphProto:
        nodes = [
            helper.make_node("MatMul", ["x", "W"], [f"{name}_mm"], name=f"{name}_mm"),
            helper.make_node("Mul", [f"{name}_mm", f"{name}_s"], [f"{name}_y"], name=f"{name}_mul"),
        ]
        out = [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 32])]
        scale_init = [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s")]
        return helper.make_graph(nodes, name, [], out, scale_init)

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node(
            "If", ["c"], ["y"], then_branch=branch("then", 1.0), else_branch=branch("else", -1.0)
        ),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
    ]
    graph = helper.make_graph(
        nodes,
        "control_flow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_stages_on_a_control_flow_model(tmp_path: Path) -> None:
    model = _control_flow_model(tmp_path / "cf.onnx")
    _, feeds = resolve_inputs(model, {}, batch=1)
    base, ctx, _ = make_ctx(model, tmp_path / "w")
    assert "no transformer structure" in (GraphFusionStage().skip_reason(base, ctx) or "")
    for cand in [*OperatorFusionStage().run(base, ctx), *MemoryLayoutStage().run(base, ctx)]:
        assert_close(cand, model, feeds, atol=1e-4)
    assert QuantizeStage().skip_reason(base, ctx) is None  # there is a MatMul, in a subgraph
    with pytest.raises(StageSkipped, match="found nothing to quantize"):
        QuantizeStage().run(base, ctx)


def test_quantize_reaches_past_ort_fused_kernels(tmp_path: Path) -> None:
    """A kept operator-fusion file holds FusedConv, which the quantizer cannot read: use the original."""
    base, ctx, log = make_ctx(RESNET, tmp_path, options={"calib_samples": 2})
    extended = OperatorFusionStage().run(base, ctx)[0]
    assert op_counts(read_model(extended.model_path))["com.microsoft:FusedConv"] > 0
    (cand,) = QuantizeStage().run(extended, ctx)
    assert "original model" in cand.details["source"] and any("FusedConv" in line for line in log)
    ops = op_counts(read_model(cand.model_path))
    assert ops["QuantizeLinear"] > 0 and "com.microsoft:FusedConv" not in ops
    assert cand.runtime_config["graph_optimization_level"] == "all"  # ORT fuses the QDQ graph at load
    ref, got = _reference(RESNET, dict(ctx.feeds)), _outputs(cand, dict(ctx.feeds))
    assert _cosine(ref["logits"], got["logits"]) > 0.99


def test_quantize_back_off_respects_the_stage_deadline(tmp_path: Path) -> None:
    _, feeds = resolve_inputs(MLP, {}, batch=1)
    checker = Checker(MLP, feeds, fail_first=100)
    base, ctx, _ = make_ctx(MLP, tmp_path, check=checker)
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
    base, ctx, _ = make_ctx(model, tmp_path / "w", check=checker)
    (cand,) = QuantizeStage().run(base, ctx)
    assert cand.details["sensitivity"][0]["node"] == "layer1"  # ranked by the error it adds itself
    assert cand.details["excluded_nodes"] == ["layer1"]
    assert cand.details["accuracy_gate"] == "passed"
    assert [a["accuracy_ok"] for a in cand.details["attempts"]] == [False, True]
    assert op_counts(read_model(cand.model_path))["MatMulInteger"] == 2
