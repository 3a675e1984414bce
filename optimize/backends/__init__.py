"""Runtime backends, imported lazily so `lto --help` never pays for TVM or TensorRT."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.backends.base import Backend, TensorSpec
from optimize.errors import UsageError

# kind -> "module:Class". A backend module may raise BackendUnavailable at import or load time.
BACKENDS: dict[str, str] = {
    "onnxruntime": "optimize.backends.onnxruntime:OrtBackend",
    "onnxruntime-cuda": "optimize.backends.onnxruntime_gpu:OrtCudaBackend",
    "onnxruntime-trt": "optimize.backends.onnxruntime_gpu:OrtTensorrtBackend",
    "tensorrt": "optimize.backends.tensorrt:TensorrtBackend",
    "tvm": "optimize.backends.tvm:TvmBackend",
}


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


__all__ = ["BACKENDS", "Backend", "TensorSpec", "backend_class", "open_backend"]
