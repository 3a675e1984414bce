"""OpenVINO on the CPU: an IR (`model.xml` + `model.bin`) or an `.onnx` file, compiled with its
configuration.

The runtime configuration is a dict of OpenVINO CPU properties under their own names, so an
artifact's manifest says exactly what any OpenVINO host (Triton's `openvino` backend, say) must
pass to compile_model. INFERENCE_PRECISION_HINT is always set: on a CPU with avx512_bf16 or AMX,
OpenVINO's default is bf16, so a model compiled without the hint is not fp32 there
(docs/openvino.md). A bf16 configuration is refused, with the reason, on a CPU without
native bf16 instructions, rather than running at another precision than the one that was
accuracy-checked and measured.

Keys: PERFORMANCE_HINT (LATENCY | THROUGHPUT), INFERENCE_NUM_THREADS (0: OpenVINO picks),
NUM_STREAMS, INFERENCE_PRECISION_HINT (f32 | bf16), ENABLE_CPU_PINNING (null: OpenVINO's default),
SNIPPETS_MODE (null: OpenVINO's default, or DISABLE). The last is the CPU plugin's switch for its
JIT-fused subgraphs ("snippets", attention among them): on an AMX Xeon, OpenVINO 2026.4.1's fused
attention gave a MiniLM's tokens cosine 0.54 at bf16 and 0.31 as NNCF int8, and 0.9999 / 0.995
with it off (measured here, 2 December 2026), so the stages fall back to it when a candidate fails
the accuracy gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.data import model_input_specs
from optimize.errors import BackendUnavailable, ModelError, UsageError, message_line
from optimize.model.onnx_file import load_model
from optimize.system import env
from optimize.system.env import BF16_FLAGS, check_thread_count, has_bf16_isa
from optimize.system.interrupts import ensure_signal_stack

DEFAULT_CONFIG: dict[str, Any] = {
    "PERFORMANCE_HINT": "LATENCY",
    "INFERENCE_NUM_THREADS": 0,
    "NUM_STREAMS": 1,
    "INFERENCE_PRECISION_HINT": "f32",
    "ENABLE_CPU_PINNING": None,
    "SNIPPETS_MODE": None,
}
PRECISIONS = ("f32", "bf16")
HINTS = ("LATENCY", "THROUGHPUT")
# CPU flags (as /proc/cpuinfo names them) that give OpenVINO native bf16 kernels.
# Where the ONNX model's dynamic dim names travel inside an IR (OpenVINO keeps no dim names), and
# its output names: a compiled port carries every name its tensor had, and get_any_name() may
# return an inner one ("/LayerNormalization_4_output_0" for "last_hidden_state").
DIM_NAMES_KEY = "lto_dim_names"
OUTPUT_NAMES_KEY = "lto_output_names"


def has_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU runs bf16 natively (the ISA reader is optimize.system.env.cpu_isa_flags)."""

    return has_bf16_isa(env.cpu_isa_flags() if flags is None else flags)


def import_openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailable(
            "OpenVINO is not installed", "pip install 'lto-onnx[openvino]' (openvino>=2026.4)"
        ) from exc
    return openvino


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration over the defaults, each value checked; a bad one is a one-line UsageError."""

    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise UsageError(
            f"unknown openvino setting {unknown[0]!r}", f"known settings: {', '.join(DEFAULT_CONFIG)}"
        )
    cfg = {**DEFAULT_CONFIG, **config}
    if cfg["INFERENCE_PRECISION_HINT"] not in PRECISIONS:
        raise UsageError(
            f"openvino INFERENCE_PRECISION_HINT {cfg['INFERENCE_PRECISION_HINT']!r} is not supported",
            f"choose one of: {', '.join(PRECISIONS)}",
        )
    if cfg["PERFORMANCE_HINT"] not in HINTS:
        raise UsageError(
            f"openvino PERFORMANCE_HINT {cfg['PERFORMANCE_HINT']!r} is not supported",
            f"choose one of: {', '.join(HINTS)}",
        )
    check_thread_count(cfg["INFERENCE_NUM_THREADS"], "openvino setting INFERENCE_NUM_THREADS")
    check_thread_count(cfg["NUM_STREAMS"], "openvino setting NUM_STREAMS", minimum=1)
    if cfg["ENABLE_CPU_PINNING"] is not None and not isinstance(cfg["ENABLE_CPU_PINNING"], bool):
        raise UsageError("openvino setting ENABLE_CPU_PINNING must be true, false or null")
    if cfg["SNIPPETS_MODE"] not in (None, "ENABLE", "DISABLE"):
        raise UsageError("openvino setting SNIPPETS_MODE must be ENABLE, DISABLE or null")
    return cfg


def compile_properties(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """OpenVINO compile_model properties from a checked configuration (strings, as the C++ API takes)."""
    props: dict[str, Any] = {
        "PERFORMANCE_HINT": cfg["PERFORMANCE_HINT"],
        "NUM_STREAMS": str(int(cfg["NUM_STREAMS"])),
        "INFERENCE_PRECISION_HINT": cfg["INFERENCE_PRECISION_HINT"],
    }
    if int(cfg["INFERENCE_NUM_THREADS"]):
        props["INFERENCE_NUM_THREADS"] = str(int(cfg["INFERENCE_NUM_THREADS"]))
    if cfg["ENABLE_CPU_PINNING"] is not None:
        props["ENABLE_CPU_PINNING"] = "YES" if cfg["ENABLE_CPU_PINNING"] else "NO"
    if cfg["SNIPPETS_MODE"] is not None:
        props["SNIPPETS_MODE"] = cfg["SNIPPETS_MODE"]
    return props


def refuse_without_bf16(cfg: Mapping[str, Any], what: str) -> None:
    if cfg["INFERENCE_PRECISION_HINT"] == "bf16" and not has_bf16():
        raise ModelError(
            f"{what} runs at bf16 precision, and this CPU has no native bf16 instructions "
            f"(needs {' or '.join(BF16_FLAGS)}); OpenVINO would run it at another precision than the "
            "one that was accuracy-checked",
            "use an fp32 artifact, or re-run lto optimize on this machine",
        )


def _rt_json(model: Any, key: str) -> Any:
    import json

    if not model.has_rt_info(key):
        return None
    try:
        return json.loads(str(model.get_rt_info(key).astype(str)))
    except (ValueError, TypeError):
        return None


def dim_names_of(model: Any, path: Path) -> dict[str, list[str | None]]:
    """Input name -> per-axis dim names: from the IR's rt_info, or from the ONNX file itself."""
    if path.suffix.lower() == ".onnx":
        return {s.name: [d if isinstance(d, str) else None for d in s.shape] for s in model_input_specs(path)}
    raw = _rt_json(model, DIM_NAMES_KEY)
    return {str(k): list(v) for k, v in raw.items() if isinstance(v, list)} if isinstance(raw, dict) else {}


def onnx_output_names(path: Path) -> list[str]:

    return [o.name for o in load_model(path, load_external_data=False).graph.output]


def port_names(model: Any, path: Path) -> tuple[list[str], list[str]]:
    """(input names, output names) as the source ONNX model spelled them, in port order."""
    known: list[str] = []
    if path.suffix.lower() == ".onnx":
        known = onnx_output_names(path)
    else:
        raw = _rt_json(model, OUTPUT_NAMES_KEY)
        known = [str(n) for n in raw] if isinstance(raw, list) else []

    def pick(port: Any) -> str:
        names = port.get_names()
        return next((n for n in known if n in names), None) or port.get_any_name()

    return [pick(p) for p in model.inputs], [pick(p) for p in model.outputs]


def _spec(port: Any, name: str, dim_names: list[str | None] | None) -> TensorSpec:
    shape = port.get_partial_shape()
    dims: list[int | str | None] = []
    for axis, dim in enumerate(shape):
        if dim.is_static:
            dims.append(int(dim.get_length()))
        else:
            named = dim_names[axis] if dim_names and axis < len(dim_names) else None
            dims.append(named)
    return TensorSpec(name, np.dtype(port.get_element_type().to_dtype()).name, tuple(dims))


MAX_STATIC_SHAPES = 64  # shapes `prepare` compiles the model for, at most (a server's batch sizes)


def _shape_key(names: list[str], feeds: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], ...]:
    """The feeds' shapes in the model's input order."""
    return tuple(tuple(int(d) for d in np.shape(feeds[name])) for name in names)


class OpenVinoBackend(Backend):
    """OpenVINO's CPU plugin, one synchronous infer request, configured from plain JSON settings."""

    kind: ClassVar[str] = "openvino"

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(model_path, config)
        self.effective = check_config(self.config)
        refuse_without_bf16(self.effective, self.model_path.name)
        ov = import_openvino()
        if not self.model_path.is_file():
            raise ModelError(f"model not found: {self.model_path}")
        core = ov.Core()
        try:
            model = core.read_model(str(self.model_path))
        except Exception as exc:  # OpenVINO raises RuntimeError with pages of frontend text
            raise ModelError(f"openvino cannot read {self.model_path.name}: {message_line(exc)}") from exc
        self._dim_names = dim_names_of(model, self.model_path)
        self._input_names, self._output_names = port_names(model, self.model_path)
        try:
            self.compiled = core.compile_model(model, "CPU", compile_properties(self.effective))
        except Exception as exc:
            raise ModelError(f"openvino cannot compile {self.model_path.name}: {message_line(exc)}") from exc
        finally:
            ensure_signal_stack()  # the CPU plugin swaps the thread's signal stack (interrupts.py)
        self._request = self.compiled.create_infer_request()
        self._core, self._model = core, model
        # Input shapes -> an infer request of the model compiled for exactly those shapes (`prepare`).
        self._static: dict[tuple[tuple[int, ...], ...], Any] = {}

    def prepare(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Compile the model for exactly these input shapes, and run them on it from now on.

        A model with dynamic dims compiled as such runs slower than compiled for the shape it gets:
        1.19x on PP-OCR's direction classifier at bf16 (1.76 vs 1.48 ms, interleaved), and slower
        still after it has run larger batches (docs/serving.md). Each shape costs a compile (155 ms
        there), so only the shapes a server will form are prepared, up to MAX_STATIC_SHAPES; every
        other shape runs on the dynamic model."""
        key = _shape_key(self._input_names, feeds)
        if key in self._static or len(self._static) >= MAX_STATIC_SHAPES:
            return
        if all(not port.get_partial_shape().is_dynamic for port in self._model.inputs):
            return  # compiled for its one shape already
        model = self._model.clone()
        model.reshape({port: list(shape) for port, shape in zip(model.inputs, key, strict=True)})
        try:
            compiled = self._core.compile_model(model, "CPU", compile_properties(self.effective))
        except Exception as exc:
            raise ModelError(
                f"openvino cannot compile {self.model_path.name} for {key}: {message_line(exc)}"
            ) from exc
        finally:
            ensure_signal_stack()
        self._static[key] = compiled.create_infer_request()

    @property
    def inputs(self) -> list[TensorSpec]:
        return [
            _spec(p, name, self._dim_names.get(name))
            for p, name in zip(self.compiled.inputs, self._input_names, strict=True)
        ]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [
            _spec(p, name, None) for p, name in zip(self.compiled.outputs, self._output_names, strict=True)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # share_inputs: the arrays are read in place (the call is synchronous); outputs are copied,
        # since the request reuses its output buffers on the next call.
        request = self._request
        if self._static:
            request = self._static.get(_shape_key(self._input_names, feeds), request)
        result = request.infer(dict(feeds), share_inputs=True, share_outputs=False)
        return dict(zip(self._output_names, result.to_tuple()))  # noqa: B905 - one value per output

    def describe(self) -> dict[str, Any]:
        ov = import_openvino()
        effective: dict[str, Any] = {}
        for key in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS", "ENABLE_CPU_PINNING"):
            try:
                value = self.compiled.get_property(key)
            except Exception:  # a property this build does not report
                continue
            # An element type reads "f32"/"bf16" by its type name, not "<Type: 'float32'>".
            effective[key] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
        return {
            "backend": self.kind,
            "runtime": "openvino",
            "runtime_version": ov.__version__,
            "device": "cpu",
            "config": dict(self.effective),
            "compiled_properties": effective,
        }

    def close(self) -> None:
        self._request = None
        self._static.clear()
        self.compiled = None
        # A released plugin may put back a signal stack that is already unmapped (interrupts.py).
        ensure_signal_stack()


__all__ = ["DEFAULT_CONFIG", "OpenVinoBackend", "check_config", "has_bf16"]
