"""The tensorrt-build stage (optimize/runtimes/tensorrt/build_stage.py): when it skips and why,
and (where the `tensorrt-rtx` extra is installed) the engines it builds without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from optimize.stage import Candidate
from optimize.system.gpu import GpuDevice, GpuStatus
from tests.runtimes.tensorrt.helpers import (
    FAKE_GPU,
    HAS_RTX,
    HAS_TRT,
    NO_GPU,
    SAMPLES,
    mlp_model,
    needs_rtx_build,
    qdq_model,
    tensorrt_context,
    unsupported_op_model,
)

# ---------------------------------------------------------------------------------------------
# skip reasons


@pytest.mark.skipif(not HAS_RTX or HAS_TRT, reason="needs TensorRT-RTX as the only TensorRT")
def test_stage_skips_a_gpu_tensorrt_rtx_cannot_target(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    hopper = GpuStatus(True, devices=(GpuDevice(0, "NVIDIA H200", (9, 0)),))
    ctx = tensorrt_context(tmp_path, mlp_model(tmp_path / "m.onnx"), {"x": np.zeros((1, 16), np.float32)})
    reason = TensorrtBuildStage(gpu_probe=lambda: hopper).skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "cannot target NVIDIA H200 (compute capability 9.0)" in reason


def test_stage_is_skipped_with_the_reason_without_a_gpu(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = mlp_model(tmp_path / "m.onnx")
    ctx = tensorrt_context(tmp_path, model, {"x": np.zeros((1, 16), np.float32)})
    reason = TensorrtBuildStage(gpu_probe=lambda: NO_GPU).skip_reason(ctx.best_standard, ctx)
    assert reason == "no usable NVIDIA GPU: no NVIDIA driver library (libcuda.so.1: not found)"


def test_stage_is_skipped_for_a_non_standard_graph(tmp_path: Path) -> None:
    if not HAS_TRT:
        pytest.importorskip("tensorrt_rtx")
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = mlp_model(tmp_path / "m.onnx")
    ctx = tensorrt_context(tmp_path, model, {"x": np.zeros((1, 16), np.float32)})
    ctx.best_standard = Candidate("fused", model, standard_ops=False)
    reason = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "standard-op ONNX graph" in reason and "'fused'" in reason


# ---------------------------------------------------------------------------------------------
# real engine builds through TensorRT-RTX (no GPU needed)


@needs_rtx_build
def test_stage_builds_fp32_and_fp16_engines(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = SAMPLES / "mlp_small.onnx"
    if not model.is_file():
        model = mlp_model(tmp_path / "m.onnx", features=256, out=10)
    feeds = (
        {"features": np.zeros((1, 256), np.float32)}
        if "mlp_small" in model.name
        else {"x": np.zeros((1, 256), np.float32)}
    )
    name = next(iter(feeds))
    ctx = tensorrt_context(
        tmp_path, model, feeds, runtime="tensorrt-rtx", shapes=[f"{name}=1x256:4x256:16x256"]
    )
    stage = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU)
    assert stage.skip_reason(ctx.best_standard, ctx) is None
    out = stage.run(ctx.best_standard, ctx)
    assert [c.label for c in out] == ["tensorrt:fp32", "tensorrt:fp16"]
    for cand in out:
        assert cand.backend == "tensorrt" and cand.model_path.is_file() and not cand.standard_ops
        assert cand.details["gpu"] == "NVIDIA Fake A10" and cand.details["compute_capability"] == "8.6"
        assert cand.details["runtime"] == "tensorrt-rtx" and cand.details["runtime_version"]
        assert cand.details["hardware_compatibility_level"] == "none"
        assert json.loads(cand.extra_files[0].read_text())["compute_capabilities"] == ["8.6"]
        assert cand.details["profile"][name] == {"min": [1, 256], "opt": [4, 256], "max": [16, 256]}
        assert cand.extra_files[0].is_file()
    # The fp16 graph really is float16 inside and float32 at its edges.
    fp16 = onnx.load(str(ctx.workdir / "model_fp16.onnx"))
    assert fp16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert fp16.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(init.data_type == TensorProto.FLOAT16 for init in fp16.graph.initializer)
    # Both builds shared one timing cache in the cache dir.
    caches = list((tmp_path / "cache" / "tensorrt").glob("timing-tensorrt-rtx-*-nvidia-fake-a10-sm8-6.cache"))
    assert len(caches) == 1


@needs_rtx_build
def test_stage_builds_qdq_graphs_as_int8(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = qdq_model(tmp_path / "q.onnx")
    ctx = tensorrt_context(tmp_path, model, {"x": np.zeros((2, 16), np.float32)}, runtime="tensorrt-rtx")
    out = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).run(ctx.best_standard, ctx)
    assert [c.label for c in out] == ["tensorrt:int8"] and out[0].precision == "int8"
    assert out[0].details["profile"]["x"] == {"min": [2, 16], "opt": [2, 16], "max": [2, 16]}


@needs_rtx_build
def test_stage_build_failure_surfaces_the_node(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage
    from optimize.runtimes.tensorrt.engine import EngineBuildError

    model = unsupported_op_model(tmp_path / "bad.onnx")
    ctx = tensorrt_context(
        tmp_path, model, {"x": np.zeros((1, 4), np.float32)}, runtime="tensorrt-rtx", precisions=["fp32"]
    )
    with pytest.raises(EngineBuildError, match="/bad/FancyThing"):
        TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).run(ctx.best_standard, ctx)
    assert (ctx.workdir / "tensorrt_fp32.log").is_file()
