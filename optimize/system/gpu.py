"""Is there a CUDA device this process can really use? Answered without importing any GPU library.

`lto --help` and every CPU-only run must stay fast, and onnxruntime-gpu's "available providers"
lie on a machine without a GPU (docs/onnxruntime.md#gpu-providers). So detection talks to the
NVIDIA driver directly: the kernel module's version file, then `libcuda.so.1` through ctypes
(`cuInit`, device count, name, compute capability). The answer is a `GpuStatus` that always
carries a reason when the GPU path is unusable, so the pipeline can report why a GPU stage was
skipped.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from optimize.errors import BackendUnavailable

PROC_VERSION = Path("/proc/driver/nvidia/version")

# cuDeviceGetAttribute ids (cuda.h, stable since CUDA 5).
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory_bytes: int | None = None

    @property
    def sm(self) -> str:
        """ "8.6" style compute capability, as NVIDIA writes it."""
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "compute_capability": self.sm,
            "total_memory_bytes": self.total_memory_bytes,
        }


@dataclass(frozen=True)
class GpuStatus:
    """What the driver says. `usable` is False with a one-line `reason` whenever the GPU path cannot run."""

    usable: bool
    reason: str = ""
    kernel_driver_version: str | None = None  # from /proc, e.g. "550.54.15"
    cuda_driver_version: str | None = None  # from cuDriverGetVersion, e.g. "12.4"
    devices: tuple[GpuDevice, ...] = field(default_factory=tuple)

    @property
    def device(self) -> GpuDevice | None:
        """The device lto uses (the first visible one; CUDA_VISIBLE_DEVICES picks it)."""
        return self.devices[0] if self.devices else None

    def to_json(self) -> dict[str, Any]:
        return {
            "usable": self.usable,
            "reason": self.reason,
            "kernel_driver_version": self.kernel_driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "devices": [d.to_json() for d in self.devices],
        }


class CudaDriver(Protocol):
    """The few driver calls detection needs, each returning (CUresult, value). Tests fake this."""

    def init(self) -> int: ...
    def driver_version(self) -> tuple[int, int]: ...
    def device_count(self) -> tuple[int, int]: ...
    def device_name(self, index: int) -> tuple[int, str]: ...
    def compute_capability(self, index: int) -> tuple[int, tuple[int, int]]: ...
    def total_memory(self, index: int) -> tuple[int, int]: ...
    def error_text(self, code: int) -> str: ...


class _CtypesDriver:
    """libcuda.so.1 through ctypes: the driver API, which needs no CUDA toolkit installed."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def init(self) -> int:
        return int(self.lib.cuInit(0))

    def driver_version(self) -> tuple[int, int]:
        v = ctypes.c_int(0)
        return int(self.lib.cuDriverGetVersion(ctypes.byref(v))), v.value

    def device_count(self) -> tuple[int, int]:
        n = ctypes.c_int(0)
        return int(self.lib.cuDeviceGetCount(ctypes.byref(n))), n.value

    def _device(self, index: int) -> tuple[int, ctypes.c_int]:
        dev = ctypes.c_int(0)
        return int(self.lib.cuDeviceGet(ctypes.byref(dev), index)), dev

    def device_name(self, index: int) -> tuple[int, str]:
        rc, dev = self._device(index)
        if rc:
            return rc, ""
        buf = ctypes.create_string_buffer(256)
        rc = int(self.lib.cuDeviceGetName(buf, len(buf), dev))
        return rc, buf.value.decode(errors="replace")

    def compute_capability(self, index: int) -> tuple[int, tuple[int, int]]:
        rc, dev = self._device(index)
        if rc:
            return rc, (0, 0)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        rc = int(self.lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev))
        rc = rc or int(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev))
        return rc, (major.value, minor.value)

    def total_memory(self, index: int) -> tuple[int, int]:
        rc, dev = self._device(index)
        if rc:
            return rc, 0
        size = ctypes.c_size_t(0)
        fn = getattr(self.lib, "cuDeviceTotalMem_v2", None) or self.lib.cuDeviceTotalMem
        return int(fn(ctypes.byref(size), dev)), size.value

    def error_text(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        try:
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            self.lib.cuGetErrorString(code, ctypes.byref(text))
        except AttributeError:
            return f"CUresult {code}"
        label = name.value.decode() if name.value else f"CUresult {code}"
        return f"{label}: {text.value.decode()}" if text.value else label


def load_libcuda() -> CudaDriver:
    """Open the driver library; raises OSError when it is not installed."""
    return _CtypesDriver(ctypes.CDLL("libcuda.so.1"))


def _kernel_driver_version(proc_path: Path) -> str | None:
    try:
        text = proc_path.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text) or re.search(
        r"(\d+\.\d+(?:\.\d+)?)", text
    )
    return match.group(1) if match else "unknown"


def detect_gpu(
    proc_path: Path = PROC_VERSION,
    driver_loader: Callable[[], CudaDriver] = load_libcuda,
) -> GpuStatus:
    """Ask the driver what is here. Never raises: a failure is a status with a reason."""
    kernel = _kernel_driver_version(proc_path)
    # WSL2 has libcuda but no /proc/driver/nvidia, so a missing file alone is not decisive.
    kernel_note = "" if kernel else f"; {proc_path} is missing, so the NVIDIA kernel driver is not loaded"
    try:
        drv = driver_loader()
    except OSError as exc:
        return GpuStatus(False, f"no NVIDIA driver library ({exc}){kernel_note}", kernel)
    rc = drv.init()
    if rc:
        return GpuStatus(False, f"cuInit failed with {drv.error_text(rc)}{kernel_note}", kernel)
    rc, version = drv.driver_version()
    cuda_version = f"{version // 1000}.{(version % 1000) // 10}" if rc == 0 and version else None
    rc, count = drv.device_count()
    if rc:
        return GpuStatus(False, f"cuDeviceGetCount failed with {drv.error_text(rc)}", kernel, cuda_version)
    if count == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return GpuStatus(False, f"the NVIDIA driver sees no CUDA device{hint}", kernel, cuda_version)
    devices = []
    for index in range(count):
        rc, name = drv.device_name(index)
        rc2, cc = drv.compute_capability(index)
        if rc or rc2:
            err = drv.error_text(rc or rc2)
            return GpuStatus(False, f"cannot query CUDA device {index}: {err}", kernel, cuda_version)
        rc, mem = drv.total_memory(index)
        devices.append(GpuDevice(index, name, cc, mem if rc == 0 else None))
    return GpuStatus(True, "", kernel, cuda_version, tuple(devices))


@functools.lru_cache(maxsize=1)
def gpu_status() -> GpuStatus:
    """detect_gpu() once per process: the answer does not change while we run."""
    return detect_gpu()


def require_gpu(what: str) -> GpuStatus:
    """The usable status, or BackendUnavailable naming `what` and the reason."""

    status = gpu_status()
    if not status.usable:
        raise BackendUnavailable(f"{what} needs an NVIDIA GPU: {status.reason}")
    return status
