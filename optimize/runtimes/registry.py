"""The runtimes lto knows: one line per runtime folder.

Each folder's `spec.py` says what the runtime offers (optimize.runtimes.spec); `FOLDERS` is the
only place that names them all, so adding a runtime is its folder and one line here. Specs are
light: nothing here imports a runtime library.
"""

from __future__ import annotations

import importlib

from optimize.errors import UsageError
from optimize.runtime_model import BASELINE_BACKEND
from optimize.runtimes.spec import BackendInfo, RuntimeSpec, StageInfo

# In the order a full recipe runs their stages.
FOLDERS = (
    "onnxruntime",
    "openvino",
    "tvm",
    "tensorrt",
)
RUNTIMES: list[RuntimeSpec] = [importlib.import_module(f"optimize.runtimes.{f}.spec").SPEC for f in FOLDERS]


def backend_infos() -> dict[str, BackendInfo]:
    return {info.kind: info for spec in RUNTIMES for info in spec.backends}


def backend_info(kind: str) -> BackendInfo:
    try:
        return backend_infos()[kind]
    except KeyError:
        raise UsageError(
            f"unknown backend {kind!r}", f"choose one of: {', '.join(sorted(backend_infos()))}"
        ) from None


def runtime_of_backend(kind: str) -> RuntimeSpec:
    """The runtime whose folder holds backend `kind`."""
    for spec in RUNTIMES:
        if any(info.kind == kind for info in spec.backends):
            return spec
    backend_info(kind)  # raises, naming the known kinds
    raise AssertionError("unreachable")


def stage_infos() -> dict[str, StageInfo]:
    """Every stage a runtime declares, by name, in the order a full recipe runs them."""
    return {stage.name: stage for spec in RUNTIMES for stage in spec.stages}


def stage_runtime(name: str) -> str | None:
    """The runtime whose candidates stage `name` makes."""
    return next((spec.name for spec in RUNTIMES for stage in spec.stages if stage.name == name), None)


def searched_runtimes() -> tuple[str, ...]:
    """The CPU runtimes `lto optimize --runtime auto` searches side by side."""
    return tuple(spec.name for spec in RUNTIMES if spec.searched)


def quantize_stages() -> tuple[str, ...]:
    """Stages that quantize, whatever the runtime: --quantize and --calib-data apply to each."""
    return tuple(name for name, stage in stage_infos().items() if stage.quantizes)


# The runtime the baseline runs on (optimize.runtime_model.BASELINE_BACKEND), for its title in help
# texts and reports.
BASELINE_RUNTIME: RuntimeSpec = runtime_of_backend(BASELINE_BACKEND)

__all__ = [
    "BASELINE_BACKEND",
    "BASELINE_RUNTIME",
    "FOLDERS",
    "RUNTIMES",
    "backend_info",
    "backend_infos",
    "quantize_stages",
    "runtime_of_backend",
    "searched_runtimes",
    "stage_infos",
    "stage_runtime",
]
