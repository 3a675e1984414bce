"""Shared by the GPU tests (TensorRT, and ONNX Runtime's CUDA and TensorRT backends).

What is here is evaluated once, at import: the real GPU of this machine, which GPU libraries
are installed, the skip markers built from them, a fake GPU to pretend with, and tiny models.
Tests marked `needs_gpu` run only where a CUDA device, TensorRT and cuda-python are present:
`scripts/gpu_check.sh` runs them on such a machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize.runtimes.tensorrt.engine import MANIFEST_FORMAT
from optimize.stage import StageContext
from optimize.system import gpu
from optimize.system.gpu import GpuDevice, GpuStatus
from tests.cli_helpers import ROOT
from tests.factories import make_stage_context

SAMPLES = ROOT / "sample_models"

REAL_GPU = gpu.detect_gpu()


def importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


HAS_RTX = importable("tensorrt_rtx")
HAS_TRT = importable("tensorrt")
HAS_CUDA_PY = importable("cuda")
needs_gpu = pytest.mark.skipif(
    not (REAL_GPU.usable and (HAS_TRT or HAS_RTX) and HAS_CUDA_PY),
    reason=f"needs an NVIDIA GPU, TensorRT and cuda-python ({REAL_GPU.reason or 'GPU present'})",
)
# On a GPU machine with full TensorRT, TensorRT-RTX must not be loaded beside it (one flavour per process).
needs_rtx_build = pytest.mark.skipif(
    not HAS_RTX or (REAL_GPU.usable and HAS_TRT),
    reason="needs tensorrt-rtx-cu12 (pip install 'lto-onnx[tensorrt-rtx]') and no full TensorRT on a GPU box",
)

FAKE_GPU = GpuStatus(
    usable=True,
    kernel_driver_version="550.54.15",
    cuda_driver_version="12.4",
    devices=(GpuDevice(0, "NVIDIA Fake A10", (8, 6), 24 << 30),),
)

NO_GPU = GpuStatus(False, "no NVIDIA driver library (libcuda.so.1: not found)")


# ---------------------------------------------------------------------------------------------
# models


def mlp_model(path: Path, features: int = 16, out: int = 8, dynamic: bool = True) -> Path:
    rng = np.random.default_rng(0)
    batch: Any = "batch" if dynamic else 1
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["mm"], name="/fc/MatMul"),
            helper.make_node("Add", ["mm", "B"], ["pre"], name="/fc/Add"),
            helper.make_node("Relu", ["pre"], ["y"], name="/act/Relu"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])],
        [
            numpy_helper.from_array(rng.standard_normal((features, out)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal((out,)).astype(np.float32), "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def unsupported_op_model(path: Path) -> Path:
    """Relu followed by an op no TensorRT implements (a custom-domain op)."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="/ok/Relu"),
            helper.make_node("FancyThing", ["r"], ["y"], name="/bad/FancyThing", domain="com.example"),
        ],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def qdq_model(path: Path) -> Path:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul(W) -> y: the quantization stage's Q/DQ form."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="/q"),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="/dq"),
            helper.make_node("MatMul", ["xd", "W"], ["y"], name="/mm"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [
            numpy_helper.from_array(np.array(0.05, dtype=np.float32), "s"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "z"),
            numpy_helper.from_array(w, "W"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def tensorrt_context(
    tmp_path: Path, model: Path, feeds: dict[str, np.ndarray], **options: Any
) -> StageContext:
    """A context for the tensorrt-build stage: its scratch in tmp_path/work, its timing caches in
    tmp_path/cache (never the user's cache)."""
    return make_stage_context(
        tmp_path / "work", model, feeds, options={"cache_dir": str(tmp_path / "cache"), **options}
    )


# ---------------------------------------------------------------------------------------------
# engine manifests and reference outputs


def manifest(**over: Any) -> dict[str, Any]:
    base = {
        "format": MANIFEST_FORMAT,
        "manifest_version": 1,
        "runtime": "tensorrt",
        "runtime_version": "11.4.0.106",
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "hardware_compatibility_level": "none",
    }
    return {**base, **over}


def reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs on ONNX Runtime's CPU backend: what a GPU run must match."""
    from optimize.runtimes.backends import open_backend

    with open_backend("onnxruntime", model, {}) as ref:
        return ref.run(feeds)
