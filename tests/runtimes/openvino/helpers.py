"""Small models and a stage context for the OpenVINO tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optimize.accuracy import AccuracyResult
from optimize.stage import Candidate, StageContext

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_models"


def make_precision_probe(path: Path, width: int = 256, seed: int = 3) -> Path:
    """x[batch, width] -> x @ W with W drawn so that bf16 rounding of W moves the result by ~1e-3
    relative: fp32 and bf16 runs differ far beyond fp32 rounding noise (the f32-hint test's lever)."""
    rng = np.random.default_rng(seed)
    w = (1.0 + rng.random((width, width)) * 1e-2).astype(np.float32) * np.sign(
        rng.standard_normal((width, width))
    ).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def make_mlp(path: Path, width: int = 64, layers: int = 4, seed: int = 0) -> Path:
    """A chain of named MatMul + Relu layers: several nodes for NNCF to quantize and the back-off to rank."""
    rng = np.random.default_rng(seed)
    nodes, inits, last = [], [], "x"
    for i in range(layers):
        inits.append(
            numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.2, f"W{i}")
        )
        nodes.append(helper.make_node("MatMul", [last, f"W{i}"], [f"m{i}"], name=f"layer{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"))
        last = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def context(
    tmp_path: Path,
    model: Path,
    feeds: dict[str, np.ndarray],
    check: Callable[[Candidate], AccuracyResult] | None = None,
    **options: object,
) -> StageContext:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    logs: list[str] = []
    ctx = StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options=dict(options),
        best_standard=Candidate(label="baseline", model_path=model),
        best_latency_ms=None,
        target_ms=None,
        deadline=None,
        check_accuracy=check or (lambda cand: AccuracyResult(True, "", {})),
        log=logs.append,
    )
    ctx.logs = logs  # type: ignore[attr-defined]
    return ctx
