"""OpenVINO artifacts as Triton models: Triton's openvino backend with the IR (or the ONNX file,
which it reads directly) and the CPU properties it can take as parameters."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.errors import ModelError
from optimize.triton.model import ModelIO, Tensor, TritonModel, TritonRuntime, lost, onnx_io


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
        lost(
            runtime,
            "INFERENCE_PRECISION_HINT",
            wanted,
            "Triton's openvino backend can only ask for bf16 (HINT_BF16); on a host with avx512_bf16 "
            "or AMX, OpenVINO then runs bf16 by default, not the precision lto accuracy-checked",
        )
    if config.get("ENABLE_CPU_PINNING") is not None:
        lost(
            runtime,
            "ENABLE_CPU_PINNING",
            config["ENABLE_CPU_PINNING"],
            "Triton's openvino backend uses OpenVINO's default pinning",
        )
    if str(config.get("SNIPPETS_MODE", "")).upper() == "DISABLE":
        lost(
            runtime,
            "SNIPPETS_MODE",
            config["SNIPPETS_MODE"],
            "lto accuracy-checked this model with OpenVINO's fused subgraphs off because, with them "
            "on, OpenVINO 2026.4 gave wrong outputs on this CPU (docs/openvino.md); Triton's "
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
        lost(runtime, key, config[key], "not passed to Triton's openvino backend")
    return runtime


# OpenVINO IR element types (the Parameter's element_type, a port's precision) -> numpy names.
_IR_TYPES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u64": "uint64",
    "u32": "uint32",
    "u16": "uint16",
    "u8": "uint8",
    "boolean": "bool",
    "string": "object",
}


def openvino_io(path: Path) -> ModelIO:
    """Read the IR's XML (stdlib only: no OpenVINO needed to export).

    Inputs are Parameter layers (name and dims on their output port); outputs are Result layers,
    named by their `output_names` attribute (IR written by OpenVINO 2025+) or else by the names of
    the port that feeds them.
    """
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise ModelError(f"{path.name} is not a readable OpenVINO IR: {exc}") from None
    layers = {layer.get("id"): layer for layer in root.iter("layer")}

    def port_dims(port: ET.Element) -> tuple[int, ...]:
        return tuple(int(d.text or -1) for d in port.findall("dim"))

    def first_name(names: str | None) -> str | None:
        return names.split(",")[0].strip() if names else None

    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    for layer in layers.values():
        kind = layer.get("type")
        if kind == "Parameter":
            port = layer.find("output/port")
            data = layer.find("data")
            if port is None or data is None:
                raise ModelError(f"{path.name}: Parameter {layer.get('name')!r} has no output port")
            name = first_name(port.get("names")) or str(layer.get("name"))
            dtype = _IR_TYPES.get(str(data.get("element_type", "")).lower(), "")
            inputs.append(Tensor(name, dtype or _precision(port), port_dims(port)))
        elif kind == "Result":
            port = layer.find("input/port")
            if port is None:
                raise ModelError(f"{path.name}: Result {layer.get('name')!r} has no input port")
            name = first_name(layer.get("output_names")) or _producer_names(root, layers, layer)
            outputs.append(Tensor(name or str(layer.get("name")), _precision(port), port_dims(port)))
    if not inputs or not outputs:
        raise ModelError(f"{path.name}: an OpenVINO IR with no Parameter or no Result layers")
    return ModelIO(inputs, outputs)


def _precision(port: Any) -> str:
    precision = str(port.get("precision", "")).lower()
    ir = {"fp32": "f32", "fp16": "f16", "fp64": "f64", "bool": "boolean"}.get(precision, precision)
    dtype = _IR_TYPES.get(ir)
    if dtype is None:
        raise ModelError(f"OpenVINO IR port precision {precision!r} has no Triton data type")
    return dtype


def _producer_names(root: Any, layers: dict[str | None, Any], result: Any) -> str | None:
    for edge in root.iter("edge"):
        if edge.get("to-layer") == result.get("id"):
            producer = layers.get(edge.get("from-layer"))
            if producer is None:
                return None
            for port in producer.findall("output/port"):
                if port.get("id") == edge.get("from-port") and port.get("names"):
                    return str(port.get("names")).split(",")[0].strip()
    return None


def triton_model(artifact: Path, manifest: Mapping[str, Any]) -> TritonModel:
    runtime = openvino(dict(manifest["runtime_config"]), str(manifest.get("precision") or "fp32"))
    model_path = artifact / manifest["model_file"]
    if model_path.suffix.lower() == ".onnx":  # OpenVINO reads ONNX directly; so does its Triton backend
        runtime.model_file = "model.onnx"
        return TritonModel(runtime, onnx_io(model_path))
    return TritonModel(runtime, openvino_io(model_path))
