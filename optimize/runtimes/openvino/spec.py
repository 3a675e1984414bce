"""OpenVINO: the second CPU runtime, searched beside ONNX Runtime (bf16 where the CPU has it,
NNCF int8); reads the ONNX file directly or its own IR."""

from __future__ import annotations

from optimize.options import boolean, choice, integer, string, string_list, threads
from optimize.runtimes.spec import BackendInfo, RuntimeSpec, StageInfo

_HERE = "optimize.runtimes.openvino"

SPEC = RuntimeSpec(
    name="openvino",
    title="OpenVINO",
    backends=(
        BackendInfo(
            "openvino",
            f"{_HERE}.backend:OpenVinoBackend",
            "openvino",
            threads_setting="INFERENCE_NUM_THREADS",
            # Each compiled model pins its threads from the first core up: N instances would share
            # the same cores. Unpinned, the OS spreads them.
            several_instances={"ENABLE_CPU_PINNING": False},
        ),
    ),
    stages=(
        StageInfo(
            "openvino-convert",
            f"{_HERE}.convert:OpenVinoConvertStage",
            {
                "bf16": boolean(),  # also propose bf16 where the CPU has native bf16 (avx512_bf16 / amx_bf16)
                "search_threads": boolean(),  # physical cores vs all logical CPUs, on a CPU with SMT
                "search_pinning": boolean(),  # CPU pinning on vs off, measured
                "threads": threads(),
            },
        ),
        StageInfo(
            "openvino-quantize",
            f"{_HERE}.quantize:OpenVinoQuantizeStage",
            {
                "calib_data": string(),  # .npz path; --calib-data sets it
                "calib_samples": integer(),
                "preset": choice("auto", "performance", "mixed"),
                "smooth_quant": choice("auto", "on", "off"),
                "max_backoff_rounds": integer(),
                "exclude_nodes": string_list(),  # OpenVINO node names kept in float
                "bf16": boolean(),  # also propose the int8 IR with its float parts at bf16
                "threads": threads(),
            },
            quantizes=True,
        ),
    ),
    searched=True,
    triton=f"{_HERE}.triton:triton_model",
)
