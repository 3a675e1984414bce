"""ONNX Runtime on NVIDIA GPUs: the CUDA and TensorRT execution providers, failing closed.

onnxruntime-gpu fails open (docs/onnxruntime.md#gpu-providers): it lists CUDA and TensorRT
providers on a machine with no GPU, and a session asked for CUDA quietly runs on the CPU when
the provider cannot load. Here:
  * the driver is asked first (optimize.system.gpu): no usable GPU -> BackendUnavailable with its reason
    (not `ort.get_ep_devices()`: whether it lists GPUs depends on the ORT build's device discovery);
  * the installed onnxruntime must offer the provider (the CPU wheel does not);
  * `session.disable_cpu_ep_fallback=1`, so a graph that would land on the CPU EP is an error;
  * after loading, the session's first provider must be the one asked for.
Set `allow_cpu_nodes: true` for a model whose shape-only nodes ONNX Runtime places on the CPU
on purpose; the provider check still holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from optimize.errors import BackendUnavailable, ModelError
from optimize.files import cache_root
from optimize.runtimes.onnxruntime.backend import DEFAULT_CONFIG as ORT_DEFAULTS
from optimize.runtimes.onnxruntime.backend import OrtBackend
from optimize.system import gpu

_ORT_GPU_HINT = (
    "install onnxruntime-gpu in place of onnxruntime: "
    "pip uninstall -y onnxruntime && pip install onnxruntime-gpu"
)

# Keys this module adds on top of OrtBackend's runtime configuration.
GPU_KEYS: dict[str, Any] = {
    "device_id": 0,
    "allow_cpu_nodes": False,
    "provider_options": {},
}


class _OrtGpuBackend(OrtBackend):
    provider: ClassVar[str]
    # Providers listed after the main one (TensorRT EP hands unsupported nodes to CUDA, never to the CPU).
    companions: ClassVar[list[str]] = []

    def _provider_options(self) -> dict[str, Any]:
        return {"device_id": int(self.gpu_config["device_id"]), **dict(self.gpu_config["provider_options"])}

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:

        cfg = {**GPU_KEYS, **dict(config or {})}
        gpu.require_gpu(f"the {self.kind} backend")
        import onnxruntime as ort

        available = ort.get_available_providers()
        if self.provider not in available:
            raise BackendUnavailable(
                f"onnxruntime {ort.__version__} has no {self.provider} (it offers {', '.join(available)})",
                _ORT_GPU_HINT,
            )
        self.gpu_config = {k: cfg.pop(k) for k in GPU_KEYS}
        entries = dict(cfg.get("config_entries", {}))
        if not self.gpu_config["allow_cpu_nodes"]:
            entries["session.disable_cpu_ep_fallback"] = "1"
        cfg["config_entries"] = entries
        providers: list[Any] = [(self.provider, self._provider_options())]
        providers += [(name, {"device_id": int(self.gpu_config["device_id"])}) for name in self.companions]
        cfg["providers"] = providers
        try:
            super().__init__(model_path, cfg)
        except ModelError as exc:
            if "fallback to CPU EP has been explicitly disabled" in exc.message:
                raise BackendUnavailable(
                    f"{self.provider} would leave nodes of {Path(model_path).name} on the CPU, "
                    "and CPU fallback is off",
                    "if the provider failed to load, ONNX Runtime's log names the missing library; "
                    "if only some nodes are CPU-only, set allow_cpu_nodes: true",
                ) from exc
            raise
        got = self.session.get_providers()
        if not got or got[0] != self.provider:
            raise BackendUnavailable(
                f"onnxruntime did not load {self.provider} (session providers: {', '.join(got)})",
                "check the CUDA/cuDNN/TensorRT libraries onnxruntime-gpu needs (ORT logs the missing .so)",
            )
        self.config = {**self.config, **self.gpu_config}

    def describe(self) -> dict[str, Any]:

        info = super().describe()
        device = gpu.gpu_status().device
        info.update(
            {
                "backend": self.kind,
                "device": f"cuda:{self.gpu_config['device_id']}" + (f" {device.name}" if device else ""),
                "gpu": device.to_json() if device else None,
                # session.run takes and returns numpy arrays: ORT copies them to and from the GPU.
                "host_device_copies_in_timing": True,
                "cpu_fallback_allowed": bool(self.gpu_config["allow_cpu_nodes"]),
                "config": {**ORT_DEFAULTS, **self.config},
            }
        )
        return info


class OrtCudaBackend(_OrtGpuBackend):
    """ONNX Runtime, CUDA execution provider."""

    kind: ClassVar[str] = "onnxruntime-cuda"
    provider: ClassVar[str] = "CUDAExecutionProvider"


class OrtTensorrtBackend(_OrtGpuBackend):
    """ONNX Runtime, TensorRT execution provider (CUDA EP for what TensorRT does not take)."""

    kind: ClassVar[str] = "onnxruntime-trt"
    provider: ClassVar[str] = "TensorrtExecutionProvider"
    companions: ClassVar[list[str]] = ["CUDAExecutionProvider"]

    def _provider_options(self) -> dict[str, Any]:

        cache = cache_root() / "ort-trt"
        defaults = {
            "device_id": int(self.gpu_config["device_id"]),
            # Engines and timings survive between runs: the first session builds, later ones load.
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
        }
        return {**defaults, **dict(self.gpu_config["provider_options"])}
