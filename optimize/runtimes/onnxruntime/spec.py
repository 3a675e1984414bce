"""ONNX Runtime: the baseline every run is measured against, and the stages that rewrite the
ONNX graph for it (fusion, layout, int8)."""

from __future__ import annotations

from optimize.options import boolean, choice, integer, string, string_list, threads
from optimize.runtimes.spec import BackendInfo, RuntimeSpec, StageInfo

_HERE = "optimize.runtimes.onnxruntime"
_CPU_SERVE = {"platform": "onnxruntime_onnx", "threads_setting": "intra_op_num_threads"}

SPEC = RuntimeSpec(
    name="onnxruntime",
    title="ONNX Runtime",
    backends=(
        BackendInfo("onnxruntime", f"{_HERE}.backend:OrtBackend", **_CPU_SERVE),
        BackendInfo(
            "onnxruntime-cuda", f"{_HERE}.gpu_backend:OrtCudaBackend", "onnxruntime_onnx", device="gpu"
        ),
        BackendInfo(
            "onnxruntime-trt", f"{_HERE}.gpu_backend:OrtTensorrtBackend", "onnxruntime_onnx", device="gpu"
        ),
    ),
    stages=(
        StageInfo(
            "graph-fusion",
            f"{_HERE}.graph_fusion:GraphFusionStage",
            {
                # Detected from the graph when absent; set them only to override the detection.
                "model_type": choice(
                    "bert", "bart", "gpt2", "t5", "vit", "clip", "unet", "vae", "swin", "phi", "sam2"
                ),
                "num_heads": integer(),
                "hidden_size": integer(),
                "gelu_approximation": boolean(),
                "embed_layer_norm": boolean(),
            },
        ),
        StageInfo(
            "operator-fusion",
            f"{_HERE}.operator_fusion:OperatorFusionStage",
            # ORT levels to save offline / apply at load
            {"levels": string_list("basic", "extended", "layout", "all")},
        ),
        StageInfo(
            "memory-layout",
            f"{_HERE}.memory_layout:MemoryLayoutStage",
            {
                "layout": boolean(),  # try ORT's NCHWc/NHWC layout transformers on conv nets
                "search_threads": boolean(),
                "search_spinning": boolean(),
                "threads": threads(),  # intra-op threads; default: the physical cores
            },
        ),
        StageInfo(
            "quantize",
            f"{_HERE}.quantize:QuantizeStage",
            {
                "mode": choice("auto", "dynamic", "static"),
                "calibration": choice("minmax", "entropy", "percentile"),
                "calib_data": string(),  # .npz path; --calib-data sets it
                "calib_samples": integer(),
                "per_channel": boolean(),
                "points": string_list(),  # search exactly these points, in order ("dynamic-pc-matmul")
                "max_points": integer(),
                "max_backoff_rounds": integer(),
                "exclude_nodes": string_list(),
                "fp16": boolean(),
                "fused_variant": boolean(),
            },
            quantizes=True,
        ),
    ),
    searched=True,
    triton=f"{_HERE}.triton:triton_model",
)
