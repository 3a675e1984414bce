"""What the ONNX Runtime stages share: the files they write declare exactly the opsets they use,
and every stage handles weights in an external data file and weights inside control flow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.data import resolve_inputs
from optimize.model.onnx_file import read_model
from optimize.runtimes.onnxruntime.graph_fusion import GraphFusionStage
from optimize.runtimes.onnxruntime.memory_layout import MemoryLayoutStage
from optimize.runtimes.onnxruntime.operator_fusion import OperatorFusionStage
from optimize.runtimes.onnxruntime.quantize import QuantizeStage
from optimize.stage import StageSkipped
from tests.runtimes.onnxruntime.helpers import (
    RESNET,
    assert_close,
    cosine,
    outputs,
    reference,
    sample_context,
)


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
        base, ctx, _ = sample_context(src, tmp_path / stage.name, options={"calib_samples": 2})
        base.extra_files = [tmp_path / "resnet_ext.onnx.data"]
        for cand in stage.run(base, ctx):
            model = read_model(cand.model_path, load_external_data=False)
            if cand.model_path != src:  # written by the stage: weights stay in a side file
                assert any(i.data_location == TensorProto.EXTERNAL for i in model.graph.initializer)
                assert cand.extra_files and all(
                    f.is_file() and f.parent == ctx.workdir for f in cand.extra_files
                )
            ref, got = reference(RESNET, feeds), outputs(cand, feeds)
            assert cosine(ref["logits"], got["logits"]) > 0.99, cand.label


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
    base, ctx, _ = sample_context(model, tmp_path / "w")
    assert "no transformer structure" in (GraphFusionStage().skip_reason(base, ctx) or "")
    for cand in [*OperatorFusionStage().run(base, ctx), *MemoryLayoutStage().run(base, ctx)]:
        assert_close(cand, model, feeds, atol=1e-4)
    assert QuantizeStage().skip_reason(base, ctx) is None  # there is a MatMul, in a subgraph
    with pytest.raises(StageSkipped, match="found nothing to quantize"):
        list(QuantizeStage().run(base, ctx))
