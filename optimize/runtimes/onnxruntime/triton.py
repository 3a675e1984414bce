"""ONNX Runtime artifacts as Triton models: Triton's onnxruntime backend (platform
onnxruntime_onnx) with the artifact's session options, and what it cannot express."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.triton.model import TritonModel, TritonRuntime, lost, onnx_io
from optimize.triton.pbtxt import Map

# ONNX Runtime graph levels -> the Triton onnxruntime backend's `optimization.graph.level`
# (its source: -1 basic, 1 extended, 2 disable; no graph block: ORT_ENABLE_ALL).
_ORT_GRAPH_LEVELS = {"basic": -1, "extended": 1, "disable": 2}
# The session.use_device_allocator_for_initializers entry is the only session config entry the
# backend passes through.
_ORT_PASSED_ENTRIES = ("session.use_device_allocator_for_initializers",)


def onnxruntime(config: Mapping[str, Any], backend: str, precision: str) -> TritonRuntime:
    """Triton's onnxruntime backend (platform onnxruntime_onnx) with the artifact's session options."""
    runtime = TritonRuntime(platform="onnxruntime_onnx", model_file="model.onnx", kserve_format="onnx")
    params = runtime.parameters
    level = str(config.get("graph_optimization_level", "all"))
    if level in _ORT_GRAPH_LEVELS:
        runtime.optimization["graph"] = {"level": _ORT_GRAPH_LEVELS[level]}
    elif level == "layout":
        lost(
            runtime,
            "graph_optimization_level",
            level,
            "Triton runs ORT_ENABLE_ALL, the nearest level that keeps the layout optimizations",
        )
    runtime.applied["graph_optimization_level"] = level if level != "layout" else "all"
    for ours, theirs in (
        ("intra_op_num_threads", "intra_op_thread_count"),
        ("inter_op_num_threads", "inter_op_thread_count"),
    ):
        threads = int(config.get(ours) or 0)
        if threads > 0:  # 0: ORT picks (the host's physical cores), which is also the backend's default
            params[theirs] = str(threads)
            runtime.applied[ours] = threads
    if "execution_mode" in config:
        params["execution_mode"] = "1" if config["execution_mode"] == "parallel" else "0"
        runtime.applied["execution_mode"] = config["execution_mode"]
    for ours, theirs in (
        ("enable_mem_pattern", "enable_mem_pattern"),
        ("enable_cpu_mem_arena", "enable_mem_arena"),
    ):
        if ours in config:
            params[theirs] = "1" if config[ours] else "0"
            runtime.applied[ours] = bool(config[ours])
    if config.get("allow_spinning") is False:
        lost(
            runtime,
            "allow_spinning",
            False,
            "Triton's onnxruntime backend keeps ORT's spinning intra-op threads, which use more CPU "
            "between requests than lto measured",
        )
    if config.get("disabled_optimizers"):
        lost(
            runtime,
            "disabled_optimizers",
            list(config["disabled_optimizers"]),
            "Triton runs those graph optimizers; lto turned them off (for accuracy or speed), so check "
            "the outputs",
        )
    for key, value in dict(config.get("config_entries") or {}).items():
        if key in _ORT_PASSED_ENTRIES:
            params[key] = str(value)
            runtime.applied[key] = value
        else:
            lost(runtime, f"config_entries.{key}", value, "Triton's onnxruntime backend does not pass it on")
    if backend in ("onnxruntime-cuda", "onnxruntime-trt"):
        runtime.instance_kind = "KIND_GPU"
    if backend == "onnxruntime-trt":
        accelerator: dict[str, Any] = {"name": "tensorrt"}
        mode = {"fp16": "FP16", "int8": "INT8"}.get(precision.partition("+")[0])
        if mode:
            accelerator["parameters"] = Map({"precision_mode": mode})
        runtime.optimization["execution_accelerators"] = {"gpu_execution_accelerator": [accelerator]}
    known = {
        "graph_optimization_level",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "execution_mode",
        "enable_mem_pattern",
        "enable_cpu_mem_arena",
        "allow_spinning",
        "disabled_optimizers",
        "config_entries",
        "optimized_model_filepath",  # where ORT saves its optimized graph: a debugging aid, not a setting
        "providers",
    }
    for key in sorted(set(config) - known):
        lost(runtime, key, config[key], "not passed to Triton's onnxruntime backend")
    return runtime


def triton_model(artifact: Path, manifest: Mapping[str, Any]) -> TritonModel:
    runtime = onnxruntime(
        dict(manifest["runtime_config"]), str(manifest["backend"]), str(manifest.get("precision") or "fp32")
    )
    return TritonModel(runtime, onnx_io(artifact / manifest["model_file"]))
