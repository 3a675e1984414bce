"""What lto hands Triton for one model: its runtime's settings and the tensors its file declares.

Each runtime folder maps its artifacts onto these (its `triton.py`, named in its spec) and says,
per setting, what Triton cannot express; `optimize.export` writes the model repository from them.
Triton needs the declared shapes, not the pinned ones lto measured with: a dynamic leading dim
is what lets it batch requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimize.errors import ModelError
from optimize.triton.pbtxt import Enum, Map


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


def lost(runtime: TritonRuntime, setting: str, value: Any, consequence: str) -> None:
    runtime.warnings.append(f"{setting}={value!r} has no Triton equivalent: {consequence}")


@dataclass(frozen=True)
class TritonModel:
    """An artifact as Triton runs it: the runtime's part of the configuration and the model's I/O."""

    runtime: TritonRuntime
    io: ModelIO


def instance_group(runtime: TritonRuntime, count: int) -> list[dict[str, Any]]:
    return [{"count": count, "kind": Enum(runtime.instance_kind)}]


__all__ = ["ModelIO", "Tensor", "TritonModel", "TritonRuntime", "instance_group", "lost", "onnx_io"]
