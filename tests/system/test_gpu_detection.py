"""GPU detection (optimize/system/gpu.py) with a faked driver, and on this machine.

Runs everywhere: the CUDA driver is played by a fake, and the check on this machine accepts
both outcomes as long as they are consistent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from optimize.system.gpu import GpuDevice, detect_gpu
from tests.cli_helpers import ROOT


class FakeDriver:
    """Plays libcuda: each call returns (CUresult, value) like the ctypes wrapper."""

    def __init__(self, init_rc: int = 0, count: int = 1, name: str = "NVIDIA H200", cc=(9, 0)) -> None:
        self.init_rc, self.count, self.name, self.cc = init_rc, count, name, cc

    def init(self) -> int:
        return self.init_rc

    def driver_version(self) -> tuple[int, int]:
        return 0, 12080

    def device_count(self) -> tuple[int, int]:
        return 0, self.count

    def device_name(self, index: int) -> tuple[int, str]:
        return 0, self.name

    def compute_capability(self, index: int) -> tuple[int, tuple[int, int]]:
        return 0, self.cc

    def total_memory(self, index: int) -> tuple[int, int]:
        return 0, 141 << 30

    def error_text(self, code: int) -> str:
        return {100: "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"}.get(code, f"CUresult {code}")


def _proc(tmp_path: Path) -> Path:
    path = tmp_path / "version"
    path.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    return path


def test_detect_reports_a_usable_device(tmp_path: Path) -> None:
    status = detect_gpu(_proc(tmp_path), lambda: FakeDriver())
    assert status.usable and status.reason == ""
    assert status.kernel_driver_version == "550.54.15"
    assert status.cuda_driver_version == "12.8"
    assert status.device == GpuDevice(0, "NVIDIA H200", (9, 0), 141 << 30)
    assert status.to_json()["devices"][0]["compute_capability"] == "9.0"


def test_detect_without_driver_library_gives_the_reason(tmp_path: Path) -> None:
    def missing() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    status = detect_gpu(tmp_path / "absent", missing)
    assert not status.usable
    assert "libcuda.so.1" in status.reason and "kernel driver is not loaded" in status.reason
    assert status.devices == ()


def test_detect_cuinit_failure_names_the_cuda_error(tmp_path: Path) -> None:
    status = detect_gpu(_proc(tmp_path), lambda: FakeDriver(init_rc=100))
    assert not status.usable
    assert "cuInit failed" in status.reason and "CUDA_ERROR_NO_DEVICE" in status.reason
    assert status.kernel_driver_version == "550.54.15"


def test_detect_zero_devices_mentions_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = detect_gpu(_proc(tmp_path), lambda: FakeDriver(count=0))
    assert not status.usable
    assert "no CUDA device" in status.reason and "CUDA_VISIBLE_DEVICES=''" in status.reason


def test_detect_on_this_machine_is_consistent() -> None:
    status = detect_gpu()
    if status.usable:
        assert status.devices and all(d.compute_capability >= (3, 0) for d in status.devices)
    else:
        assert status.reason and status.devices == ()


def test_detection_imports_no_gpu_library() -> None:
    code = (
        "import sys; from optimize.system.gpu import detect_gpu; detect_gpu(); "
        "import optimize.runtimes.tensorrt.build_stage, optimize.runtimes.tensorrt.backend; "
        "import optimize.runtimes.onnxruntime.gpu_backend; "
        "bad = [m for m in ('tensorrt', 'tensorrt_rtx', 'onnxruntime', 'cuda') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
