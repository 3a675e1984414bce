"""Helpers for the TVM kernel-tuning stage and the TVM backend (apache-tvm 0.27, Relax era).

Nothing here imports TVM at module import time: the base install of lto does not need it.
`import_tvm()` is the single door through which every TVM user in lto goes, so that the
environment TVM reads at import time (thread pool size) is set before the first import and
a missing extra becomes a one-line `BackendUnavailable` instead of a traceback.

Measured facts behind the choices made in this package live in docs/tvm.md.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

from optimize.errors import BackendUnavailable, message_line
from optimize.system.env import physical_cores

INSTALL_HINT = "install the TVM extra: pip install 'lto-onnx[tvm]'"

# GPU tensor intrinsics that `tvm.s_tir.tensor_intrin` registers on import. Importing the package
# takes ~40 s on a loaded 2-core box, 33 s of it in `.cuda` (measured with `python -X importtime`),
# and MetaSchedule's TuneContext and its LocalBuilder workers import it for every task and every
# build batch. CPU tuning never uses these intrinsics, so they are replaced by empty modules.
_GPU_INTRIN_MODULES = ("cuda", "rocm", "hexagon", "metal", "riscv_cpu")


def tvm_available() -> bool:
    """Whether apache-tvm can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("tvm") is not None


def worker_initializer() -> Callable[[], None]:
    """An initializer for MetaSchedule's popen workers that skips the GPU intrinsics there too.

    The function is built inside this one so that cloudpickle ships it by value: the workers
    then need nothing of lto on their import path.
    """
    names = tuple(f"tvm.s_tir.tensor_intrin.{name}" for name in _GPU_INTRIN_MODULES)

    def _init() -> None:
        import sys as _sys
        import types as _types

        for full in names:
            _sys.modules.setdefault(full, _types.ModuleType(full))

    return _init


def _stub_gpu_intrinsics_here() -> None:
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return  # already imported in full; nothing to save
    for name in _GPU_INTRIN_MODULES:
        full = f"tvm.s_tir.tensor_intrin.{name}"
        sys.modules.setdefault(full, types.ModuleType(full))


def import_tvm(num_threads: int | None = None, *, for_tuning: bool = False) -> Any:
    """Import and return the `tvm` module, or raise BackendUnavailable naming the extra.

    Sets, before TVM's thread pool first starts (it reads them once; MetaSchedule's builder and
    runner workers inherit them):
    - TVM_NUM_THREADS: `num_threads`, else the physical cores. TVM's own default is half the
      logical CPUs, i.e. ONE thread on a 2-vCPU machine.
    - TVM_BIND_THREADS=0: by default TVM pins the calling thread to core 0 on its first parallel
      call (measured: this process's affinity went from {0, 1} to {0}); that would confine ONNX
      Runtime in the same process, and every child process started afterwards, to one core.
    """
    if num_threads:
        os.environ["TVM_NUM_THREADS"] = str(int(num_threads))
    else:
        os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    if for_tuning:
        _stub_gpu_intrinsics_here()
    try:
        import tvm
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("tvm", "tvm_ffi"):
            raise BackendUnavailable("apache-tvm is not installed", INSTALL_HINT) from exc
        raise BackendUnavailable(f"apache-tvm cannot be imported: {exc}", INSTALL_HINT) from exc
    except ImportError as exc:
        first = message_line(exc)
        raise BackendUnavailable(f"apache-tvm cannot be imported: {first}", INSTALL_HINT) from exc
    return tvm


def tvm_version() -> str:
    from importlib import metadata

    for dist in ("apache-tvm", "tlcpack", "tvm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    tvm = sys.modules.get("tvm")
    return str(getattr(tvm, "__version__", "unknown"))


def tvm_ffi_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("apache-tvm-ffi")
    except metadata.PackageNotFoundError:
        return None


# apache-tvm-ffi 0.1.15.x segfaults in ToJSONGraph when MetaSchedule saves a tuning record
# (docs/tvm.md#packages-and-toolchain).
_BAD_FFI_PREFIXES = ("0.1.15",)


def check_tuning_dependencies() -> str | None:
    """Why MetaSchedule tuning cannot run here (None: it can). Checked before any tuning starts,
    because each of these fails late, deep inside a tuning run, or crashes the process."""
    import importlib.util

    ffi = tvm_ffi_version()
    if ffi and ffi.startswith(_BAD_FFI_PREFIXES):
        return (
            f"apache-tvm-ffi {ffi} segfaults when MetaSchedule saves tuning records; "
            "install apache-tvm-ffi==0.1.14.post1 (pip install 'lto-onnx[tvm]')"
        )
    for module, why in (
        ("cloudpickle", "MetaSchedule's local builder/runner workers"),
        ("psutil", "MetaSchedule's local builder/runner workers"),
        ("xgboost", "the XGBoost cost model"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({why} need it); {INSTALL_HINT}"
    return None
