"""The operator-fusion stage (optimize/runtimes/onnxruntime/operator_fusion.py) on the sample
models: what it saves, and that it still computes the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimize.model.onnx_file import op_counts, read_model
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.stage import Candidate
from tests.runtimes.onnxruntime.helpers import (
    BERT,
    MLP,
    RESNET,
    assert_close,
    assert_opsets_clean,
    nchwc_nodes,
    outputs,
    sample_context,
)


def test_operator_fusion_saves_a_portable_extended_file_for_a_cnn(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(RESNET, tmp_path)
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
    base, ctx, _ = sample_context(BERT, tmp_path)
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
    outputs(raised, dict(ctx.feeds))
    assert op_counts(read_model(tmp_path / "r.onnx"))["com.microsoft:SkipLayerNormalization"] == 0
    for cand in cands.values():
        assert_opsets_clean(cand.model_path)
        assert_close(cand, BERT, dict(ctx.feeds))


def test_operator_fusion_rejects_unknown_levels(tmp_path: Path) -> None:
    base, ctx, _ = sample_context(MLP, tmp_path, options={"levels": ["extended", "turbo"]})
    with pytest.raises(Exception, match="unknown level 'turbo'"):
        OperatorFusionStage().run(base, ctx)
