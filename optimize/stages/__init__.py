"""Pipeline stages, registered by name and imported lazily.

A stage module may need a heavy or optional library (onnxruntime.transformers, TVM,
TensorRT). Importing it only when the pipeline reaches the stage keeps `lto --help` fast,
and a stage whose module or dependency is missing is reported as skipped, not a crash.
"""

from __future__ import annotations

import importlib

from optimize.errors import BackendUnavailable, UsageError
from optimize.stages.base import AccuracyResult, Candidate, Stage, StageContext, StageSkipped

# name -> "module:Class", in the order a full recipe runs them.
STAGES: dict[str, str] = {
    "graph-fusion": "optimize.stages.graph_fusion:GraphFusionStage",
    "operator-fusion": "optimize.stages.operator_fusion:OperatorFusionStage",
    "memory-layout": "optimize.stages.memory_layout:MemoryLayoutStage",
    "quantize": "optimize.stages.quantize:QuantizeStage",
    "tvm-tune": "optimize.stages.tvm_tune:TvmTuneStage",
    "tensorrt-build": "optimize.stages.tensorrt_build:TensorrtBuildStage",
}


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
        raise StageSkipped(f"cannot import {module_name}: {str(exc).splitlines()[0]}") from exc
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
    "STAGES",
    "AccuracyResult",
    "Candidate",
    "Stage",
    "StageContext",
    "StageSkipped",
    "load_stage",
]
