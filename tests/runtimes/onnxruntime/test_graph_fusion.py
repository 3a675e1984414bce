"""The graph-fusion stage (optimize/runtimes/onnxruntime/graph_fusion.py) on the sample models:
what it finds and fuses, when it skips, and that the fused graph still computes the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from optimize.model.onnx_file import op_counts, read_model
from optimize.runtimes.onnxruntime.graph_fusion import GraphFusionStage, detect_transformer
from optimize.stage import Candidate, StageContext, StageSkipped
from tests.runtimes.onnxruntime.helpers import (
    BERT,
    MLP,
    RESNET,
    assert_close,
    assert_opsets_clean,
    sample_context,
)


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
        base, ctx, _ = sample_context(model, tmp_path / model.stem)
        reason = GraphFusionStage().skip_reason(base, ctx)
        assert reason is not None and "no transformer structure found" in reason


def test_graph_fusion_skips_an_already_fused_graph(
    bert_fused: tuple[Candidate, StageContext], tmp_path: Path
) -> None:
    fused, _ = bert_fused
    _, ctx, _ = sample_context(BERT, tmp_path)
    assert GraphFusionStage().skip_reason(fused, ctx) == "attention is already fused"


def test_graph_fusion_with_an_explicit_type_but_nothing_to_fuse_is_skipped(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(RESNET, tmp_path, options={"model_type": "bert"})
    with pytest.raises(StageSkipped, match=r"nothing to fuse.*; onnxscript: found nothing to fuse"):
        list(GraphFusionStage().run(base, ctx))


def test_onnxscript_fuser_keeps_the_outputs_and_declares_its_ops(tmp_path: Path) -> None:
    # The sample BERT's attention is TorchScript-shaped: whatever onnxscript fuses in it
    # (SkipLayerNormalization at least) must compute the same and declare com.microsoft.
    from optimize.runtimes.onnxruntime.graph_fusion import fuse_with_onnxscript

    _, ctx, _ = sample_context(BERT, tmp_path)
    details, _ = fuse_with_onnxscript(BERT, tmp_path / "fused.onnx")
    assert details["fused_ops"] and details["nodes_after"] < details["nodes_before"]
    cand = Candidate(label="onnxscript", model_path=tmp_path / "fused.onnx")
    onnx.checker.check_model(read_model(cand.model_path))
    assert_close(cand, BERT, dict(ctx.feeds))


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
