"""The machine a measurement came from, and whether anything else was using it."""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.system.gpu import gpu_status

# ISA flags that decide which kernels a runtime picks (and which compiled code can run).
ISA_FLAGS_OF_INTEREST = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve", "i8mm", "bf16",
)  # fmt: skip

PACKAGES = (
    "lto-onnx",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "numpy",
    "openvino",
    "nncf",
    "apache-tvm",
    "tensorrt",
    "tensorrt-rtx-cu12",
)


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty off Linux)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    if info:
                        break
                    continue
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine()


def cpu_isa_flags() -> set[str]:
    """All CPU feature flags the kernel reports (x86 'flags', Arm 'Features')."""
    info = _cpuinfo()
    return set((info.get("flags") or info.get("Features") or "").split())


def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads don't help GEMM-bound latency)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count() or 1
    info = _cpuinfo()
    try:
        siblings, cores = int(info["siblings"]), int(info["cpu cores"])
        if siblings > cores > 0:
            return max(1, available * cores // siblings)
    except (KeyError, ValueError):
        pass
    return max(1, available)


def max_threads() -> int:
    """Most threads a thread option may ask for: 4x the logical cores.

    More only adds contention; and a typo such as 100000 would start that many threads and
    reserve a stack for each (gigabytes) before the first run.
    """
    return 4 * (os.cpu_count() or 1)


def check_thread_count(value: Any, what: str, *, minimum: int = 0) -> int:
    """`value` if it is a sane thread count, else a UsageError naming `what` and the bound.

    The one bound for every thread option (flags, recipes, runtime configurations). With
    `minimum` 0, 0 means the runtime's default.
    """

    bound, cores = max_threads(), os.cpu_count() or 1
    default = "0 lets the runtime choose; " if minimum == 0 else f"at least {minimum}, "
    hint = f"{default}at most {bound}, 4x the {cores} logical cores here"
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{what} must be a whole number, got {value!r}", hint)
    if value < minimum:
        wrong = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
        raise UsageError(f"{what} {wrong}, got {value}", hint)
    if value > bound:
        raise UsageError(
            f"{what} {value} is more than {bound} threads, 4x the {cores} logical cores here",
            "0 lets the runtime choose" if minimum == 0 else None,
        )
    return value


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by a cgroup v2 memory limit
    and an address-space limit.

    None where nothing says (then callers skip memory checks rather than guess low).
    """
    available: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
        except Exception:  # psutil missing or unsupported here
            available = None
    if available is None:
        # Generous on purpose: all of physical memory, as if nothing else used any.
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            available = None
    # In a container MemAvailable is the host's; the cgroup's limit is what ends in an OOM kill.
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text(encoding="ascii").strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text(encoding="ascii").strip())
            room = max(0, int(limit) - used)
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    # An address-space limit (ulimit -v) fails allocations past it whatever the machine has free.
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            status = Path("/proc/self/status").read_text(encoding="ascii")
            mapped = next(int(ln.split()[1]) * 1024 for ln in status.splitlines() if ln.startswith("VmSize:"))
        except (OSError, ValueError, StopIteration):
            mapped = 0
        room = max(0, soft - mapped)
        available = room if available is None else min(available, room)
    return available


def _package_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def machine_fingerprint() -> str:
    """A short hash of what makes timings comparable: CPU model, ISA, core count, architecture.

    Package versions are left out on purpose: upgrading a runtime is exactly the kind of
    change a latency gate should compare on the same machine.
    """
    flags = sorted(cpu_isa_flags() & set(ISA_FLAGS_OF_INTEREST))
    key = "|".join([platform.machine(), cpu_model(), str(os.cpu_count()), ",".join(flags)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def environment() -> dict[str, Any]:
    """The environment block of every report."""

    return {
        "fingerprint": machine_fingerprint(),
        "cpu": {
            "model": cpu_model(),
            "arch": platform.machine(),
            "logical_cores": os.cpu_count() or 1,
            "physical_cores": physical_cores(),
            "isa": sorted(cpu_isa_flags() & set(ISA_FLAGS_OF_INTEREST)),
        },
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": _package_versions(),
        # null without a usable GPU; the reason is kept so a report says why.
        "gpu": _gpu_block(gpu_status()),
    }


@dataclass
class CpuSample:
    wall: float
    busy_ticks: int  # whole machine, non-idle jiffies
    own_cpu_s: float  # this process (and its threads)


class CpuLoadMonitor:
    """Estimates how much CPU *other* processes used during a measurement.

    /proc/stat gives the machine's busy time; our own rusage is subtracted. What remains,
    as a fraction of all cores' wall time, is foreign load that makes timings untrustworthy.
    """

    def __init__(self) -> None:
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cores = os.cpu_count() or 1
        self._start: CpuSample | None = None

    @staticmethod
    def _busy_ticks() -> int | None:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                fields = fh.readline().split()[1:]
        except OSError:
            return None
        values = [int(v) for v in fields[:8]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values) - idle

    def _sample(self) -> CpuSample | None:
        busy = self._busy_ticks()
        if busy is None:
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime
        return CpuSample(time.monotonic(), busy, own)

    def start(self) -> None:
        self._start = self._sample()

    def foreign_fraction(self) -> float | None:
        """Fraction of total core time used by other processes since start() (None if unknown)."""
        end = self._sample()
        if self._start is None or end is None:
            return None
        wall = end.wall - self._start.wall
        if wall <= 0:
            return None
        busy_s = (end.busy_ticks - self._start.busy_ticks) / self._hz
        own_s = end.own_cpu_s - self._start.own_cpu_s
        return max(0.0, min(1.0, (busy_s - own_s) / (wall * self._cores)))


def _gpu_block(status: Any) -> dict[str, Any] | None:
    if not status.usable and status.kernel_driver_version is None:
        return None
    return status.to_json()


# -- instruction sets that decide kernels and their results ---------------------------------------

# int8 dot-product instructions: without them u8*s8 products can saturate in 16 bits (x86).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def process_age_s() -> float:
    """Seconds since this process started (the interpreter's start, imports included), from the
    kernel's record of it; 0.0 where that cannot be read (not Linux)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def has_vnni(flags: set[str]) -> bool:
    """int8 dot-product instructions: without them u8*s8 products can saturate in 16 bits (x86)."""
    return bool(flags & set(VNNI_FLAGS))


BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def has_bf16_isa(flags: set[str]) -> bool:
    """Native bf16 arithmetic: AVX-512 BF16 dot products or AMX tiles."""
    return bool(flags & set(BF16_FLAGS))


# The classes the search prior is kept by (optimize/bench/peaks.py places a machine in one).
MACHINE_CLASSES = ("amx", "bf16", "vnni", "avx2", "other")


def cpu_class(flags: set[str]) -> str:
    """What decides which candidates win on a CPU, in one word, from its ISA flags: bf16 in a matrix
    engine (amx), bf16 as vector dot products (bf16), int8 dot products (vnni), AVX2 only, or other
    (ARM and older x86). optimize.bench.peaks places a machine by measured rates instead."""
    if "amx_bf16" in flags:
        return "amx"
    if has_bf16_isa(flags):
        return "bf16"
    if has_vnni(flags):
        return "vnni"
    if "avx2" in flags:
        return "avx2"
    return "other"


def nchwc_block_width(flags: set[str]) -> int | None:
    """Channel block ORT's NchwcTransformer uses on this CPU (None: no NCHWc kernels).

    MLAS picks 16 floats on AVX-512F and 8 on AVX2+FMA; other CPUs get no NCHWc rewrite.
    """
    if "avx512f" in flags:
        return 16
    if {"avx2", "fma"} <= flags:
        return 8
    return None


def nchwc_isa_requires(block: int) -> list[str]:
    return ["avx512f"] if block == 16 else ["avx2", "fma"]
