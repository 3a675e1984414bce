"""A cheap look for an NVIDIA GPU, for the environment block (no CUDA libraries imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gpu_summary() -> dict[str, Any] | None:
    """The driver version and GPU names the kernel module reports, or None without one."""
    version_file = Path("/proc/driver/nvidia/version")
    if not version_file.exists():
        return None
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    first = version_file.read_text(errors="replace").splitlines()[0] if version_file.stat().st_size else ""
    return {"driver": first.strip(), "devices": names}
