"""The runtimes lto runs models on, one folder each, registered here and imported lazily.

A runtime folder holds everything that only makes sense for that runtime: its backend (how
to run a model or artifact), the stages that make candidates for it, and its helpers. Adding
a runtime is adding a folder and its lines below. Modules are named as "module:Class" and
imported only when used, so `lto --help` never pays for TVM or TensorRT, and a stage whose
module or dependency is missing is reported as skipped, not a crash.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.errors import BackendUnavailable, UsageError, message_line
from optimize.runtimes.base import Backend, TensorSpec
from optimize.stage import Stage, StageSkipped

# kind -> "module:Class". A backend module may raise BackendUnavailable at import or load time.
BACKENDS: dict[str, str] = {
    "onnxruntime": "optimize.runtimes.onnxruntime.backend:OrtBackend",
    "onnxruntime-cuda": "optimize.runtimes.onnxruntime.gpu_backend:OrtCudaBackend",
    "onnxruntime-trt": "optimize.runtimes.onnxruntime.gpu_backend:OrtTensorrtBackend",
    "tensorrt": "optimize.runtimes.tensorrt.backend:TensorrtBackend",
    "tvm": "optimize.runtimes.tvm.backend:TvmBackend",
    "openvino": "optimize.runtimes.openvino.backend:OpenVinoBackend",
}

# stage name -> "module:Class", in the order a full recipe runs them.
STAGES: dict[str, str] = {
    "graph-fusion": "optimize.runtimes.onnxruntime.graph_fusion:GraphFusionStage",
    "operator-fusion": "optimize.runtimes.onnxruntime.operator_fusion:OperatorFusionStage",
    "memory-layout": "optimize.runtimes.onnxruntime.memory_layout:MemoryLayoutStage",
    "quantize": "optimize.runtimes.onnxruntime.quantize:QuantizeStage",
    "openvino-convert": "optimize.runtimes.openvino.convert:OpenVinoConvertStage",
    "openvino-quantize": "optimize.runtimes.openvino.quantize:OpenVinoQuantizeStage",
    "tvm-tune": "optimize.runtimes.tvm.tune_stage:TvmTuneStage",
    "tensorrt-build": "optimize.runtimes.tensorrt.build_stage:TensorrtBuildStage",
}


# stage name -> the runtime its candidates run on (`lto optimize --runtime` turns stages on and
# off by it without importing them).
STAGE_RUNTIMES: dict[str, str] = {
    "graph-fusion": "onnxruntime",
    "operator-fusion": "onnxruntime",
    "memory-layout": "onnxruntime",
    "quantize": "onnxruntime",
    "openvino-convert": "openvino",
    "openvino-quantize": "openvino",
    "tvm-tune": "tvm",
    "tensorrt-build": "tensorrt",
}
# The CPU runtimes `--runtime` chooses between (auto: all of them, measured).
CPU_RUNTIMES = ("onnxruntime", "openvino")


def backend_class(kind: str) -> type[Backend]:
    try:
        target = BACKENDS[kind]
    except KeyError:
        raise UsageError(
            f"unknown backend {kind!r}", f"choose one of: {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, class_name = target.split(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return cls


def open_backend(kind: str, model_path: str | Path, config: Mapping[str, Any] | None = None) -> Backend:
    """Load `model_path` into the runtime named `kind` with its runtime configuration."""
    return backend_class(kind)(model_path, config)


def load_stage(name: str) -> Stage:
    """Instantiate the stage registered as `name`.

    Raises StageSkipped (with the reason) when its module or a library it needs is not
    installed, and UsageError for a name nobody registered.
    """
    try:
        target = STAGES[name]
    except KeyError:
        raise UsageError(f"unknown stage {name!r}", f"known stages: {', '.join(STAGES)}") from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing == module_name:
            raise StageSkipped(
                f"stage {name} is not available in this build ({module_name} is missing)"
            ) from exc
        raise StageSkipped(f"needs the Python package {missing!r}, which is not installed") from exc
    except ImportError as exc:
        raise StageSkipped(f"cannot import {module_name}: {message_line(exc)}") from exc
    except BackendUnavailable as exc:
        raise StageSkipped(exc.one_line()) from exc
    cls = getattr(module, class_name, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise StageSkipped(f"{module_name} defines no stage class {class_name}")
    try:
        return cls()
    except BackendUnavailable as exc:
        raise StageSkipped(exc.one_line()) from exc


__all__ = [
    "BACKENDS",
    "CPU_RUNTIMES",
    "STAGES",
    "STAGE_RUNTIMES",
    "Backend",
    "TensorSpec",
    "backend_class",
    "load_stage",
    "open_backend",
]
