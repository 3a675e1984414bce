"""ONNX Runtime on the CPU execution provider."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.backend import Backend, TensorSpec, check_thread_settings
from optimize.errors import ModelError, UsageError, message_line

# ONNX type strings as ORT reports them -> numpy dtype names.
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(int32)": "int32",
    "tensor(uint32)": "uint32",
    "tensor(int64)": "int64",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}

OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")

# The runtime configuration keys this backend understands, with ORT's defaults.
DEFAULT_CONFIG: dict[str, Any] = {
    "graph_optimization_level": "all",
    "intra_op_num_threads": 0,  # 0 = ORT picks (physical cores)
    "inter_op_num_threads": 0,
    "execution_mode": "sequential",
    "allow_spinning": True,
    "enable_mem_pattern": True,
    "enable_cpu_mem_arena": True,
    "disabled_optimizers": [],
    "config_entries": {},
}


def _opt_level(ort: Any, name: str) -> Any:
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    # ORT_ENABLE_LAYOUT exists from ORT 1.2x on; older builds only reach the layout transformers via ALL.
    layout = getattr(
        ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT", ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    levels["layout"] = layout
    try:
        return levels[name]
    except KeyError:
        raise UsageError(
            f"unknown graph optimization level {name!r}", f"choose one of: {', '.join(OPT_LEVELS)}"
        ) from None


def session_options(config: Mapping[str, Any]) -> Any:
    """Build ort.SessionOptions from a runtime configuration (unknown keys are rejected)."""
    import onnxruntime as ort

    unknown = sorted(set(config) - set(DEFAULT_CONFIG) - {"optimized_model_filepath", "providers"})
    if unknown:
        raise UsageError(
            f"unknown onnxruntime setting {unknown[0]!r}", f"known settings: {', '.join(DEFAULT_CONFIG)}"
        )
    check_thread_settings("onnxruntime", config)
    cfg = {**DEFAULT_CONFIG, **config}
    so = ort.SessionOptions()
    so.graph_optimization_level = _opt_level(ort, str(cfg["graph_optimization_level"]))
    so.intra_op_num_threads = int(cfg["intra_op_num_threads"])
    so.inter_op_num_threads = int(cfg["inter_op_num_threads"])
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL
        if cfg["execution_mode"] == "parallel"
        else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.enable_mem_pattern = bool(cfg["enable_mem_pattern"])
    so.enable_cpu_mem_arena = bool(cfg["enable_cpu_mem_arena"])
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if cfg["allow_spinning"] else "0")
    for key, value in dict(cfg["config_entries"]).items():
        so.add_session_config_entry(str(key), str(value))
    if cfg.get("optimized_model_filepath"):
        so.optimized_model_filepath = str(cfg["optimized_model_filepath"])
    so.log_severity_level = 3  # errors only: ORT's warnings are noise on a terminal
    return so


def ort_type_to_dtype(type_str: str) -> str:
    return _ORT_TYPES.get(type_str, type_str)


class OrtBackend(Backend):
    """ONNX Runtime, CPU execution provider, configured from plain JSON settings."""

    kind: ClassVar[str] = "onnxruntime"
    providers: ClassVar[list[str]] = ["CPUExecutionProvider"]

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(model_path, config)
        import onnxruntime as ort

        so = session_options(self.config)
        disabled = list(self.config.get("disabled_optimizers", []))
        try:
            kwargs: dict[str, Any] = {"providers": list(self.config.get("providers", self.providers))}
            if disabled:
                kwargs["disabled_optimizers"] = disabled
            self.session = ort.InferenceSession(str(self.model_path), so, **kwargs)
        except Exception as exc:  # ORT raises its own exception types for every load failure
            first = message_line(exc)
            raise ModelError(f"onnxruntime cannot load {self.model_path.name}: {first}") from exc
        self._input_names = [i.name for i in self.session.get_inputs()]
        self._output_names = [o.name for o in self.session.get_outputs()]

    @property
    def inputs(self) -> list[TensorSpec]:
        return [
            TensorSpec(i.name, ort_type_to_dtype(i.type), tuple(_dim(d) for d in i.shape))
            for i in self.session.get_inputs()
        ]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [
            TensorSpec(o.name, ort_type_to_dtype(o.type), tuple(_dim(d) for d in o.shape))
            for o in self.session.get_outputs()
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # None = every output in graph order: the binding's fastest path (no name lookups).
        values = self.session.run(None, feeds if type(feeds) is dict else dict(feeds))
        return dict(zip(self._output_names, values))  # noqa: B905 - ORT returns exactly these

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort

        return {
            "backend": self.kind,
            "runtime": "onnxruntime",
            "runtime_version": ort.__version__,
            "device": "cpu",
            "providers": self.session.get_providers(),
            "config": {**DEFAULT_CONFIG, **self.config},
        }

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]


def _dim(d: Any) -> int | str | None:
    if isinstance(d, int):
        return d
    if isinstance(d, str) and d:
        return d
    return None
