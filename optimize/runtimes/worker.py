"""Any backend, hosted in a child process of its own.

Why: thread pools busy-spin against each other when they share a process. Measured alternately in
one process (2 cores, 2026), a tuned TVM module ran 14x slower than alone beside ONNX Runtime, and
ONNX Runtime's pool keeps spinning for some 40 ms of CPU after each burst of work, slowing
whatever runs next (docs/measurement.md). So TVM runs in its own process, and every comparison
lto times runs each side in a worker of its own.

How it is timed, honestly: `run()` copies the feeds into a shared-memory file, sends a small
message over a socket pair, and copies the outputs back out of a second shared file, so a
timing taken in the parent (what `optimize.bench.compare` does when it interleaves a hosted
backend with an in-process one) includes that round trip and the copies: it errs against the
hosted backend, never for it. `benchmarks/tvm_tuning.py` prints that overhead next to the
model latencies. Where an absolute latency without IPC is wanted, the bench engine runs its
own `measure` inside the child through `call_in_child` (`optimize.bench.measure_where_it_runs`),
and a comparison of two hosted backends times blocks of runs inside each child, one at a time
(`optimize.bench.apart`): the backend never times itself.

Starting the worker, carrying its errors and ending it are optimize.system.child's, as for every child
process of lto's; what is here is the request loop and the shared-memory tensor protocol. The
per-call path sends and receives on the connection directly, with nothing in between.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.errors import LtoError
from optimize.runtimes.spec import resolve
from optimize.system.child import ERROR, RESULT, Child, ErrorRecord, ParentLink, start_child

_START_TIMEOUT_S = 300.0  # loading a large library under load can take a while
_CLOSE_WAIT_S = 10.0  # for the worker to close its backend and exit before it is ended
_ALIGN = 64
# Tensors travel through files in RAM (/dev/shm where there is one): a memcpy each way instead
# of pickling every array through the socket (which cost ~0.2 ms per call on small models).
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

Layout = list[tuple[str, str, tuple[int, ...], int]]  # (name, dtype str, shape, byte offset)


def _layout(arrays: Mapping[str, np.ndarray]) -> tuple[Layout, int]:
    layout: Layout = []
    offset = 0
    for name, array in arrays.items():
        layout.append((name, array.dtype.str, tuple(int(d) for d in array.shape), offset))
        offset += -(-max(int(array.nbytes), 1) // _ALIGN) * _ALIGN
    return layout, offset


class _SharedFile:
    """A file in RAM mapped into this process; the parent creates it, the child maps it by path."""

    def __init__(self, path: str, size: int | None = None) -> None:
        import mmap

        self.path = path
        self.unlinked = False
        with open(path, "r+b") as fh:
            if size is not None:
                fh.truncate(size)
            self.size = os.fstat(fh.fileno()).st_size
            self.map = mmap.mmap(fh.fileno(), self.size)

    @classmethod
    def create(cls, size: int) -> _SharedFile:
        fd, path = tempfile.mkstemp(prefix="lto-worker-", suffix=".shm", dir=_SHM_DIR)
        os.close(fd)
        return cls(path, size)

    def views(self, layout: Layout) -> dict[str, np.ndarray]:
        return {
            name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=self.map, offset=offset)
            for name, dtype, shape, offset in layout
        }

    def write(self, arrays: Mapping[str, np.ndarray], layout: Layout) -> None:
        for (_, _, _, offset), array in zip(layout, arrays.values(), strict=True):
            view = np.ndarray(array.shape, dtype=array.dtype, buffer=self.map, offset=offset)
            np.copyto(view, array, casting="no")

    def unlink(self) -> None:
        """Remove the name; both processes keep their mappings. Done once the child has mapped
        the file, so nothing is left in /dev/shm even if a process dies."""
        if not self.unlinked:
            self.unlinked = True
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def close(self, unlink: bool = False) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.map.close()
        if unlink:
            self.unlink()


def _serve(link: ParentLink, backend_class: str, model_path: str, config: dict[str, Any]) -> None:
    """The child: open the backend (its class named "module:Class"), say what it is, then serve
    run/measure requests. Each answer is a RESULT or an ERROR message (optimize.system.child's
    vocabulary), sent straight over the connection: this loop is the per-call path."""
    conn = link.connection
    backend = resolve(backend_class)(model_path, config)  # what it raises reaches the parent as itself
    conn.send(
        (
            RESULT,
            {
                "inputs": [s.to_json() for s in backend.inputs],
                "outputs": [s.to_json() for s in backend.outputs],
                "describe": backend.describe(),
            },
        )
    )
    shared: dict[str, _SharedFile] = {}  # "in" / "out": the parent's files, mapped here by path

    def mapped(role: str, path: str) -> _SharedFile:
        current = shared.get(role)
        if current is None or current.path != path:
            if current is not None:
                current.close()
            shared[role] = current = _SharedFile(path)
        return current

    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the parent went away
            op = message[0]
            if op == "close":
                break
            try:
                if op == "run_shm":
                    _, in_path, in_layout, out_path = message
                    views = mapped("in", in_path).views(in_layout)
                    start = time.perf_counter_ns()
                    outputs = backend.run(views)
                    run_ns = time.perf_counter_ns() - start  # the parent subtracts it: IPC cost
                    out_layout, needed = _layout(outputs)
                    out = mapped("out", out_path)
                    if needed <= out.size:
                        out.write(outputs, out_layout)
                        result: Any = ("shm", run_ns, out_layout)
                    else:  # too small this once: send them inline and say what size is needed
                        result = ("inline", run_ns, outputs, needed)
                elif op == "run":
                    result = backend.run(message[1])
                elif op == "call":
                    # fn(backend, *args) where the backend lives: the bench engine uses it to
                    # time a hosted model without the pipe round trip in the figure.
                    module_name, _, fn_name = message[1].partition(":")
                    import importlib

                    result = getattr(importlib.import_module(module_name), fn_name)(backend, *message[2:])
                else:
                    raise LtoError(f"unknown worker request {op!r}")
            except Exception as exc:
                conn.send((ERROR, ErrorRecord.of(exc)))
                continue
            conn.send((RESULT, result))
    finally:
        for file in shared.values():
            file.close()
        backend.close()


def _specs(entries: list[dict[str, Any]]) -> list[TensorSpec]:
    return [TensorSpec(str(e["name"]), str(e["dtype"]), tuple(e["shape"])) for e in entries]


class SubprocessBackend(Backend):
    """Hosts a backend in a child process of its own and forwards every call to it: backend
    `hosted_kind`, whose class `hosted_class` ("module:Class") the child imports and opens."""

    kind: ClassVar[str] = "subprocess"

    def __init__(
        self,
        model_path: str | Path,
        config: Mapping[str, Any] | None = None,
        *,
        hosted_kind: str,
        hosted_class: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(model_path, config)
        self.hosted_kind = hosted_kind
        self._conn: Connection | None = None
        self._in: _SharedFile | None = None
        self._out: _SharedFile | None = None
        # One request in flight at a time (a server may call run() from several threads).
        self._lock = threading.Lock()
        # What the last run() cost on top of the model itself (copies, messages, wake-ups), from
        # the child's own timing of backend.run: a paired figure, unlike two separate timings.
        self.last_overhead_ms: float | None = None
        # A request was cut short (an interrupt while waiting for its answer): the worker is
        # still busy with it and will not read "close" soon, so close() ends it at once.
        self._abandoned = False
        # A fresh interpreter (optimize.system.child), its output kept out of the parent's: TVM prints
        # harmless "Scope Loaded" noise, and stderr is kept for the error when the worker dies.
        self._child: Child | None = start_child(
            _serve,
            hosted_class,
            str(self.model_path),
            dict(self.config),
            what=f"the {hosted_kind} worker process",
            capture_output=True,
            env=env,
            stderr_noise=("Scope Loaded",),
        )
        self._proc = self._child.process
        self.pid = self._child.pid
        try:
            reply = self._child.receive(_START_TIMEOUT_S)
            if reply is None:
                raise LtoError(
                    f"the {hosted_kind} worker process did not start within {_START_TIMEOUT_S:.0f} s"
                )
            status, payload = reply
            if status != RESULT:
                raise self._child.rebuild(payload)
        except BaseException:  # a failed start, or an interrupt: the worker goes too, at once
            self._abandoned = True
            self.close()
            raise
        # The per-call path uses the connection directly (see _call).
        self._conn = self._child.connection
        self._inputs = _specs(payload["inputs"])
        self._outputs = _specs(payload["outputs"])
        self._describe = payload["describe"]

    def _receive(self) -> tuple[str, Any]:
        assert self._conn is not None
        try:
            return self._conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            raise self._died() from None
        except BaseException:
            self._abandoned = True
            raise

    def _call(self, *message: Any) -> Any:
        if self._conn is None:
            raise LtoError(f"the {self.hosted_kind} backend is closed")
        try:
            self._conn.send(message)
        except OSError:  # the child is gone (broken pipe / connection reset)
            raise self._died() from None
        except BaseException:  # a message cut in two: the channel is no use any more
            self._abandoned = True
            raise
        status, payload = self._receive()
        if status != RESULT:
            raise self._rebuild(payload)
        return payload

    # The error paths of _call: _conn is set only while _child is.
    def _died(self) -> LtoError:
        assert self._child is not None
        return self._child.died()

    def _rebuild(self, record: ErrorRecord) -> BaseException:
        assert self._child is not None
        return self._child.rebuild(record)

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            return self._run_shared(feeds)

    def _run_shared(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        layout, needed = _layout(feeds)
        if self._in is None or needed > self._in.size:
            self._replace("_in", max(needed, 2 * (self._in.size if self._in else 0), 1 << 16))
        if self._out is None:
            self._replace("_out", 1 << 20)
        assert self._in is not None and self._out is not None
        start = time.perf_counter_ns()
        self._in.write(feeds, layout)
        kind, run_ns, *rest = self._call("run_shm", self._in.path, layout, self._out.path)
        self._in.unlink()
        self._out.unlink()
        if kind == "shm":
            result = {name: view.copy() for name, view in self._out.views(rest[0]).items()}
            self.last_overhead_ms = (time.perf_counter_ns() - start - run_ns) / 1e6
            return result
        outputs, out_needed = rest
        self._replace("_out", max(out_needed, 2 * self._out.size))
        return outputs  # type: ignore[no-any-return]

    def _replace(self, attr: str, size: int) -> None:
        old: _SharedFile | None = getattr(self, attr)
        setattr(self, attr, _SharedFile.create(size))
        if old is not None:
            old.close(unlink=True)

    def call_in_child(self, function: str, *args: Any) -> Any:
        """`function(hosted backend, *args)` run inside the child ("module:function")."""
        with self._lock:
            return self._call("call", function, *args)

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "process": "isolated", "worker_pid": self.pid}

    def close(self) -> None:
        self._conn = None
        child, self._child = getattr(self, "_child", None), None
        if child is not None:
            if not self._abandoned:  # idle: it closes its backend and exits by itself
                with contextlib.suppress(OSError, ValueError):
                    child.connection.send(("close",))
                child.wait(_CLOSE_WAIT_S)
            child.close()
        for attr in ("_in", "_out"):
            file = getattr(self, attr, None)
            if file is not None:
                file.close(unlink=True)
                setattr(self, attr, None)


__all__ = ["SubprocessBackend"]
