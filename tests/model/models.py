"""Small ONNX models the tests of optimize/model build by hand."""

from __future__ import annotations

from pathlib import Path

from onnx import TensorProto, helper


def write_mixed_types_model(path: Path) -> Path:
    """A graph load_model accepts but type inference refuses: float + int64 in one Add."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "mixed",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("b", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path
