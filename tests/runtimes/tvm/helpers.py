"""Shared by the TVM tests: tiny models, the inputs they run on, and the reference
outputs from ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Knobs that keep a tuning run to seconds per task: one search round of 2 candidates, a small
# evolutionary population. Far too small to find fast kernels; enough to exercise every path.
TINY = {"trials_per_iter": 2, "population_size": 16}


def mlp_model(path: Path, two_kernels: bool = False) -> Path:
    """x[batch, 32] -> Relu(x @ W1 + B1) (one fused kernel), optionally @ W2 (a second kernel)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, "W1"),
        numpy_helper.from_array(rng.standard_normal((32,)).astype(np.float32), "B1"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["y" if not two_kernels else "h3"]),
    ]
    out_dim = 32
    if two_kernels:
        inits.append(numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "W2"))
        nodes.append(helper.make_node("MatMul", ["h3", "W2"], ["y"]))
        out_dim = 8
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dim])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def ort_outputs(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


FEEDS = {"x": np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)}
