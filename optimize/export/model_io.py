"""The inputs and outputs an artifact's model file declares, with its dynamic dims (-1).

Triton needs the declared shapes, not the pinned ones lto measured with: a dynamic leading dim is
what lets it batch requests. Each runtime's file says them its own way: ONNX graph inputs, the
Parameter/Result layers of an OpenVINO IR, the JSON manifest lto writes beside a TensorRT engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimize.errors import ModelError


@dataclass(frozen=True)
class Tensor:
    """A model input or output: numpy dtype name and dims (-1 where the model leaves it open)."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}


@dataclass(frozen=True)
class ModelIO:
    inputs: list[Tensor]
    outputs: list[Tensor]
    # Largest batch the model file itself accepts (a TensorRT profile's max), None: no limit.
    batch_limit: int | None = None


def onnx_io(path: Path) -> ModelIO:
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise ModelError(f"{path.name} is not a readable ONNX model: {exc}") from None
    initializers = {init.name for init in model.graph.initializer}

    def tensor(value: Any) -> Tensor:
        ttype = value.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in ttype.shape.dim
        )
        try:
            dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type).name
        except (KeyError, ValueError, TypeError):
            raise ModelError(f"{path.name}: tensor {value.name!r} has no tensor element type") from None
        return Tensor(value.name, dtype, dims)

    return ModelIO(
        [tensor(v) for v in model.graph.input if v.name not in initializers],
        [tensor(v) for v in model.graph.output],
    )


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


def tensorrt_io(engine_manifest: Path) -> ModelIO:
    """From the JSON lto writes beside an engine: network I/O (-1 dynamic) and the profile's max."""
    try:
        manifest = json.loads(engine_manifest.read_text(encoding="utf-8"))
        inputs = [
            Tensor(t["name"], t["dtype"], tuple(int(d) for d in t["shape"])) for t in manifest["inputs"]
        ]
        outputs = [
            Tensor(t["name"], t["dtype"], tuple(int(d) for d in t["shape"])) for t in manifest["outputs"]
        ]
        profiles = manifest.get("profiles") or [{}]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{engine_manifest.name}: the engine manifest is unreadable: {exc}") from None
    limits = [int(rng["max"][0]) for rng in (profiles[0] or {}).values() if rng.get("max")]
    return ModelIO(inputs, outputs, min(limits) if limits else None)


__all__ = ["ModelIO", "Tensor", "onnx_io", "openvino_io", "tensorrt_io"]
