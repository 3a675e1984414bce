"""TensorRT: engines built for an NVIDIA GPU (or, with TensorRT-RTX, built without one)."""

from __future__ import annotations

from optimize.options import boolean, integer, string, string_list
from optimize.runtimes.spec import BackendInfo, RuntimeSpec, StageInfo

_HERE = "optimize.runtimes.tensorrt"

SPEC = RuntimeSpec(
    name="tensorrt",
    title="TensorRT",
    backends=(BackendInfo("tensorrt", f"{_HERE}.backend:TensorrtBackend", "tensorrt_plan", device="gpu"),),
    stages=(
        StageInfo(
            "tensorrt-build",
            f"{_HERE}.build_stage:TensorrtBuildStage",
            {
                "runtime": string(),
                "precisions": string_list("fp32", "fp16"),
                "shapes": string_list(),  # NAME=MIN:OPT:MAX profile ranges; --shape sets them
                "workspace_mb": integer(),
                "builder_optimization_level": integer(),
                "hardware_compatibility": string(),
                "timing_cache": boolean(),
                "cuda_graph": boolean(),
                "cache_dir": string(),
            },
        ),
    ),
    triton=f"{_HERE}.triton:triton_model",
)
