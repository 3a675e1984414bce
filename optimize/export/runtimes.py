"""What each lto runtime becomes in Triton: platform or backend, model file names, parameters.

One function per runtime turns an artifact's runtime configuration into Triton settings and says,
per setting, what Triton cannot express (a warning naming what is lost). A runtime Triton cannot
run at all is refused here with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimize.errors import UsageError
from optimize.export.pbtxt import Enum, Map


@dataclass
class TritonRuntime:
    """The runtime-specific part of a Triton model: where the model lives and how it is configured."""

    platform: str | None = None  # ModelConfig.platform (onnxruntime_onnx, tensorrt_plan)
    backend: str | None = None  # ModelConfig.backend (openvino)
    model_file: str = "model.onnx"  # the name Triton looks for in the version folder
    instance_kind: str = "KIND_CPU"
    parameters: dict[str, str] = field(default_factory=dict)
    optimization: dict[str, Any] = field(default_factory=dict)
    kserve_format: str = "triton"
    warnings: list[str] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)  # lto setting -> what Triton gets

    def config_fields(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "backend": self.backend,
            "default_model_filename": self.model_file,
        }

    def parameter_map(self) -> Map | None:
        if not self.parameters:
            return None
        return Map({key: {"string_value": value} for key, value in self.parameters.items()})


def _lost(runtime: TritonRuntime, setting: str, value: Any, consequence: str) -> None:
    runtime.warnings.append(f"{setting}={value!r} has no Triton equivalent: {consequence}")


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
        _lost(
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
        _lost(
            runtime,
            "allow_spinning",
            False,
            "Triton's onnxruntime backend keeps ORT's spinning intra-op threads, which use more CPU "
            "between requests than lto measured",
        )
    if config.get("disabled_optimizers"):
        _lost(
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
            _lost(runtime, f"config_entries.{key}", value, "Triton's onnxruntime backend does not pass it on")
    if backend in ("onnxruntime-cuda", "onnxruntime-trt"):
        runtime.instance_kind = "KIND_GPU"
    if backend == "onnxruntime-trt":
        accelerator: dict[str, Any] = {"name": "tensorrt"}
        mode = {"fp16": "FP16", "int8": "INT8"}.get(precision)
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
        _lost(runtime, key, config[key], "not passed to Triton's onnxruntime backend")
    return runtime


def openvino(config: Mapping[str, Any], precision: str) -> TritonRuntime:
    """Triton's openvino backend: an IR (model.xml + model.bin) and its CPU properties as parameters."""
    runtime = TritonRuntime(backend="openvino", model_file="model.xml", kserve_format="triton")
    params = runtime.parameters
    hint = config.get("PERFORMANCE_HINT")
    if hint:
        params["PERFORMANCE_HINT"] = str(hint)
        runtime.applied["PERFORMANCE_HINT"] = hint
    threads = int(config.get("INFERENCE_NUM_THREADS") or 0)
    if threads > 0:
        params["INFERENCE_NUM_THREADS"] = str(threads)
        runtime.applied["INFERENCE_NUM_THREADS"] = threads
    if config.get("NUM_STREAMS") is not None:
        params["NUM_STREAMS"] = str(config["NUM_STREAMS"])
        runtime.applied["NUM_STREAMS"] = config["NUM_STREAMS"]
    wanted = str(config.get("INFERENCE_PRECISION_HINT") or ("bf16" if precision == "bf16" else "f32"))
    if wanted == "bf16":
        params["HINT_BF16"] = "YES"
        runtime.applied["INFERENCE_PRECISION_HINT"] = "bf16"
    else:
        _lost(
            runtime,
            "INFERENCE_PRECISION_HINT",
            wanted,
            "Triton's openvino backend can only ask for bf16 (HINT_BF16); on a host with avx512_bf16 "
            "or AMX, OpenVINO then runs bf16 by default, not the precision lto accuracy-checked",
        )
    if config.get("ENABLE_CPU_PINNING") is not None:
        _lost(
            runtime,
            "ENABLE_CPU_PINNING",
            config["ENABLE_CPU_PINNING"],
            "Triton's openvino backend uses OpenVINO's default pinning",
        )
    if str(config.get("SNIPPETS_MODE", "")).upper() == "DISABLE":
        _lost(
            runtime,
            "SNIPPETS_MODE",
            config["SNIPPETS_MODE"],
            "lto accuracy-checked this model with OpenVINO's fused subgraphs off because, with them "
            "on, OpenVINO 2026.4 gave wrong outputs on this CPU (shared notes: openvino.md); Triton's "
            "openvino backend cannot turn them off: check its outputs before serving",
        )
    known = {
        "PERFORMANCE_HINT",
        "INFERENCE_NUM_THREADS",
        "NUM_STREAMS",
        "INFERENCE_PRECISION_HINT",
        "ENABLE_CPU_PINNING",
        "SNIPPETS_MODE",
    }
    for key in sorted(set(config) - known):
        _lost(runtime, key, config[key], "not passed to Triton's openvino backend")
    return runtime


def tensorrt(config: Mapping[str, Any], engine: Mapping[str, Any]) -> TritonRuntime:
    """Triton's TensorRT backend (platform tensorrt_plan): the serialized engine as model.plan."""
    if engine.get("runtime") == "tensorrt-rtx":
        raise UsageError(
            "this artifact is a TensorRT-RTX engine; Triton's TensorRT backend runs TensorRT engines only",
            "build with the tensorrt runtime (lto optimize --tensorrt on the serving GPU) to export it",
        )
    runtime = TritonRuntime(
        platform="tensorrt_plan", model_file="model.plan", instance_kind="KIND_GPU", kserve_format="tensorrt"
    )
    if config.get("cuda_graph"):
        runtime.optimization["cuda"] = {"graphs": True}
        runtime.applied["cuda_graph"] = True
    runtime.warnings.append(
        f"a TensorRT engine loads only under TensorRT {engine.get('runtime_version', '(unknown)')}: "
        "run a Triton release that ships that version"
        + (
            f", on a GPU of compute capability {', '.join(map(str, engine['compute_capabilities']))}"
            if engine.get("compute_capabilities")
            else ""
        )
    )
    for key in sorted(set(config) - {"cuda_graph", "runtime"}):
        _lost(runtime, key, config[key], "not passed to Triton's TensorRT backend")
    return runtime


def refuse(backend: str) -> None:
    """Raise, with the reason, for a runtime Triton cannot run as exported."""
    if backend == "tvm":
        raise UsageError(
            "Triton has no TVM backend, so a TVM artifact (a compiled model.so) cannot be exported to it",
            "export an ONNX Runtime or OpenVINO artifact of the same model, or serve this one with lto serve",
        )
    raise UsageError(
        f"lto cannot export a {backend!r} artifact to Triton",
        "exportable runtimes: onnxruntime, openvino, tensorrt",
    )


def instance_group(runtime: TritonRuntime, count: int) -> list[dict[str, Any]]:
    return [{"count": count, "kind": Enum(runtime.instance_kind)}]


__all__ = ["TritonRuntime", "instance_group", "onnxruntime", "openvino", "refuse", "tensorrt"]
