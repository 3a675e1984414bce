"""A TVM library exported by the tvm-tune stage, run through the Relax virtual machine.

The library is a `.so` with a `tvm_module.json` sidecar beside it (input/output names and
shapes, the target and the CPU flags its code uses). Loading checks those flags against this
CPU first and refuses with the reason, instead of crashing with SIGILL on the first call.

Runtime configuration (JSON):
    num_threads   TVM's thread pool size (0 or absent: TVM_NUM_THREADS, else the physical cores)
    process       "isolated" (default): run in a child process of its own, so TVM's thread pool
                  never spins against ONNX Runtime's in the same process (see
                  optimize/runtimes/worker.py for what that means for timings);
                  "inline": run in this process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.errors import BackendUnavailable, ModelError, UsageError, message_line
from optimize.runtimes.tvm import import_tvm, tvm_version
from optimize.runtimes.tvm.cpu_target import host_threads, missing_isa
from optimize.runtimes.tvm.relax_build import flatten_outputs
from optimize.runtimes.tvm.sidecar import read_sidecar, specs
from optimize.runtimes.worker import SubprocessBackend

DEFAULT_CONFIG: dict[str, Any] = {"num_threads": 0, "process": "isolated"}
PROCESS_MODES = ("isolated", "inline")


def check_cpu_supports(sidecar: Mapping[str, Any], library: Path, have: set[str] | None = None) -> None:
    """Raise BackendUnavailable when this CPU lacks instructions the library was compiled to use."""

    missing = missing_isa(list(sidecar.get("isa_requires", [])), have)
    if missing:
        mcpu = (sidecar.get("target") or {}).get("mcpu", "another CPU")
        raise BackendUnavailable(
            f"{library.name} was compiled for {mcpu} and uses instructions this CPU lacks: "
            + ", ".join(missing),
            "rebuild it on this machine, or for a portable target with --tvm-target x86-64-v3",
        )


class TvmBackend(Backend):
    """A TVM Relax VM library on the CPU."""

    kind: ClassVar[str] = "tvm"

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(model_path, config)

        cfg = self.config_with_defaults(DEFAULT_CONFIG)
        if cfg["process"] not in PROCESS_MODES:
            raise UsageError(
                f"tvm setting process={cfg['process']!r}", f"choose one of: {', '.join(PROCESS_MODES)}"
            )
        self.num_threads = int(cfg["num_threads"] or 0)
        self.process = str(cfg["process"])
        if not self.model_path.is_file():
            raise ModelError(f"TVM library not found: {self.model_path}")
        self.sidecar = read_sidecar(self.model_path)
        self._inputs = specs(self.sidecar["inputs"])
        self._outputs = specs(self.sidecar["outputs"])
        check_cpu_supports(self.sidecar, self.model_path)
        self._remote: Backend | None = None
        if self.process == "isolated":
            self._remote = SubprocessBackend(
                self.model_path,
                {**self.config, "process": "inline"},
                hosted_kind=self.kind,
                hosted_class=f"{type(self).__module__}:{type(self).__qualname__}",
                env=self.child_env(self.num_threads),
            )
            return
        self._load()

    @staticmethod
    def child_env(num_threads: int) -> dict[str, str]:
        """Environment for a process that only runs TVM libraries: the runtime-only library
        (no 248 MB compiler mapped, ~100 MB less RSS) and the thread pool, read by TVM at import."""

        return {
            "TVM_USE_RUNTIME_LIB": "1",
            "TVM_NUM_THREADS": str(num_threads if num_threads > 0 else host_threads()),
            "TVM_BIND_THREADS": os.environ.get("TVM_BIND_THREADS", "0"),
        }

    def _load(self) -> None:

        tvm = import_tvm(self.num_threads or None)
        if self.num_threads > 0:
            # Effective even when TVM was imported earlier with another pool size.
            tvm.get_global_func("runtime.config_threadpool")(0, self.num_threads)
        try:
            library = tvm.runtime.load_module(str(self.model_path))
            from tvm.runtime.vm import VirtualMachine

            vm = VirtualMachine(library, tvm.cpu())
            self._main = vm["main"]
        except Exception as exc:  # TVM raises TVMError/RuntimeError subclasses for bad libraries
            first = message_line(exc)
            raise ModelError(f"TVM cannot load {self.model_path.name}: {first.strip()}") from exc
        self._vm = vm
        self._tvm = tvm
        device = tvm.cpu()
        # Inputs are copied into tensors allocated once: the hot path allocates nothing.
        self._in_names = [s.name for s in self._inputs]
        self._in_tensors = [
            tvm.runtime.empty(tuple(int(d) for d in s.shape), s.dtype, device)
            for s in self._inputs  # type: ignore[arg-type]
        ]
        self._out_names = [s.name for s in self._outputs]

        self._flatten = flatten_outputs
        self._lock = threading.Lock()

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._remote is not None:
            return self._remote.run(feeds)
        with self._lock:  # the input tensors are shared between calls
            for tensor, name in zip(self._in_tensors, self._in_names, strict=True):
                tensor.copyfrom(np.ascontiguousarray(feeds[name]))
            values = self._flatten(self._main(*self._in_tensors))
        return dict(zip(self._out_names, values, strict=True))

    @property
    def last_overhead_ms(self) -> float | None:
        """Inter-process cost of the last run() when isolated (see SubprocessBackend)."""
        return getattr(self._remote, "last_overhead_ms", None)

    @property
    def host(self) -> Backend | None:
        """The child process hosting the library when isolated (None: in this process)."""
        return self._remote

    def describe(self) -> dict[str, Any]:

        base = {
            "backend": self.kind,
            "runtime": "tvm",
            "runtime_version": tvm_version(),
            "built_with": self.sidecar.get("tvm_version"),
            "device": "cpu",
            "target": self.sidecar.get("target"),
            "isa_requires": self.sidecar.get("isa_requires", []),
            "config": {**DEFAULT_CONFIG, **self.config},
        }
        if self._remote is not None:
            remote = self._remote.describe()
            base.update(
                process="isolated", worker_pid=remote.get("worker_pid"), threads=remote.get("threads")
            )
            return base
        base["process"] = "inline"
        base["threads"] = int(self._tvm.get_global_func("runtime.NumThreads")())
        return base

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
            self._remote = None
        self._main = None
        self._vm = None
