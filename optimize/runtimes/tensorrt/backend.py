"""A TensorRT engine on one CUDA device: deserialize, bind device buffers, run on a stream.

`run()` does what the user's application pays for: host -> device copies of the inputs, the
engine, device -> host copies of the outputs, then a stream synchronise. So every latency lto
reports for this backend includes the PCIe transfers (`describe()` says so). The host side goes
through page-locked staging buffers, as a careful application would do.

With `cuda_graph: true` the whole sequence (copies included) is captured once per input shape
and replayed, which removes most per-run launch overhead at batch 1.

Before TensorRT sees the file, the engine's manifest (written by `tensorrt-build`) is checked
against this machine: TensorRT version, GPU model, compute capability. A mismatch is refused
with the reason; TensorRT's own failure (deserialize returning None) is turned into an error
carrying TensorRT's log, never passed on silently.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.backend import Backend, TensorSpec
from optimize.errors import BackendUnavailable, ModelError, UsageError
from optimize.files import sha256_bytes
from optimize.runtimes.tensorrt.engine import check_manifest, import_runtime, make_logger, manifest_path
from optimize.system import gpu

DEFAULT_CONFIG: dict[str, Any] = {
    "cuda_graph": False,
    # Which TensorRT to load an engine without a manifest into; with one, the manifest decides.
    "runtime": "auto",
}

_CUDA_HINT = "install cuda-python (part of the GPU extra: pip install 'lto-onnx[gpu]')"


class _Cuda:
    """The handful of CUDA runtime calls the backend needs, via cuda-python, with errors as exceptions."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:
            try:
                from cuda import cudart  # type: ignore[no-redef]  # older cuda-python
            except ImportError as exc:
                raise BackendUnavailable(
                    f"the TensorRT backend needs cuda-python: {exc}", _CUDA_HINT
                ) from exc
        self.rt = cudart

    def call(self, what: str, result: Any) -> Any:
        err = result[0]
        if err != self.rt.cudaError_t.cudaSuccess:
            _, text = self.rt.cudaGetErrorString(err)
            detail = text.decode() if isinstance(text, bytes) else str(text)
            raise BackendUnavailable(f"CUDA {what} failed: {getattr(err, 'name', err)}: {detail}")
        rest = result[1:]
        return rest[0] if len(rest) == 1 else rest

    def malloc(self, nbytes: int) -> int:
        return int(self.call("cudaMalloc", self.rt.cudaMalloc(max(nbytes, 1))))

    def malloc_host(self, nbytes: int) -> int:
        return int(self.call("cudaMallocHost", self.rt.cudaMallocHost(max(nbytes, 1))))

    def h2d(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.call("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream))

    def d2h(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.call("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream))


class _Buffer:
    """A device allocation and its page-locked host twin, grown on demand, never shrunk."""

    def __init__(self, cuda: _Cuda) -> None:
        self.cuda = cuda
        self.capacity = 0
        self.device = 0
        self.host = 0

    def ensure(self, nbytes: int) -> bool:
        """Make room for `nbytes`; True when the addresses changed (bindings must be reset)."""
        if nbytes <= self.capacity:
            return False
        self.free()
        self.device = self.cuda.malloc(nbytes)
        self.host = self.cuda.malloc_host(nbytes)
        self.capacity = max(nbytes, 1)
        return True

    def host_array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(self.host)
        return np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)

    def free(self) -> None:
        if self.device:
            self.cuda.rt.cudaFree(self.device)
        if self.host:
            self.cuda.rt.cudaFreeHost(self.host)
        self.device = self.host = self.capacity = 0


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"engine manifest {path} is unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelError(f"engine manifest {path} is not a JSON object")
    return data


def read_manifest(engine_path: Path, engine_bytes: bytes) -> dict[str, Any] | None:
    """The engine's manifest: `<engine>.json`, or a `*.engine.json` beside it naming this engine's sha256.

    The second form finds the manifest after the engine was renamed (an artifact stores the
    stage's `model_fp16.engine` as `model.engine` next to `model_fp16.engine.json`).
    """

    path = manifest_path(engine_path)
    if path.is_file():
        return _load_json(path)
    digest = sha256_bytes(engine_bytes)
    for other in sorted(engine_path.parent.glob("*.engine.json")):
        data = _load_json(other)
        if data.get("engine_sha256") == digest:
            return data
    return None


def _validity_reason(trt: Any, runtime: Any, engine_bytes: bytes) -> str | None:
    """TensorRT's own diagnosis of an engine it will not load, where the version offers one."""
    if not hasattr(runtime, "get_engine_validity"):
        return None
    try:
        _validity, diagnostics = runtime.get_engine_validity(engine_bytes)
    except Exception:  # older bindings take other argument types; the log still explains
        return None
    flags = getattr(trt, "EngineInvalidityDiagnostics", None)
    if flags is None or not diagnostics:
        return None
    # The members are bit values (VERSION_MISMATCH = 1, UNSUPPORTED_CC = 2, ...).
    names = [name.lower() for name, member in flags.__members__.items() if int(diagnostics) & int(member)]
    return "TensorRT says: " + ", ".join(names) if names else None


class TensorrtBackend(Backend):
    """A serialized TensorRT engine (with its lto manifest) on the first visible CUDA device."""

    kind: ClassVar[str] = "tensorrt"

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(model_path, config)
        self.config = self.config_with_defaults(DEFAULT_CONFIG)
        self._closed = True

        if not self.model_path.is_file():
            raise ModelError(f"engine file {self.model_path} does not exist")
        engine_bytes = self.model_path.read_bytes()
        self.manifest = read_manifest(self.model_path, engine_bytes)
        status = gpu.require_gpu("the TensorRT backend")
        self.gpu = status.device
        wanted = str(self.manifest["runtime"]) if self.manifest else str(self.config["runtime"])
        self.trt, self.runtime_name = import_runtime(wanted)
        trt = self.trt
        if self.manifest is not None:
            reason = check_manifest(
                self.manifest, self.runtime_name, str(trt.__version__), self.gpu, engine_bytes
            )
            if reason:
                raise BackendUnavailable(f"refusing to load {self.model_path.name}: {reason}")
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(engine_bytes) if self._runtime is not None else None
        if engine is None:
            # TensorRT logs the cause and returns None; say what it said.
            why = _validity_reason(trt, self._runtime, engine_bytes) if self._runtime is not None else None
            errors = self._logger.errors()
            detail = (
                "; ".join(filter(None, [why, errors[-1] if errors else None])) or "TensorRT gave no reason"
            )
            raise BackendUnavailable(
                f"TensorRT {trt.__version__} cannot load the engine {self.model_path.name}: {detail}",
                "rebuild the engine on this machine (lto optimize ... --stages tensorrt-build)",
            )
        self._engine = engine
        self._context = engine.create_execution_context()
        if self._context is None:
            errors = self._logger.errors()
            raise BackendUnavailable(
                "TensorRT could not create an execution context: "
                + (errors[-1] if errors else "no reason logged")
            )
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            shape = tuple(int(d) if d >= 0 else None for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, dtype.name, shape)
            (
                self._inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else self._outputs
            ).append(spec)

        self._cuda = _Cuda()
        self._stream = self._cuda.call("cudaStreamCreate", self._cuda.rt.cudaStreamCreate())
        self._buffers = {spec.name: _Buffer(self._cuda) for spec in self._inputs + self._outputs}
        self._shape_key: tuple[tuple[int, ...], ...] | None = None
        self._host_in: dict[str, np.ndarray] = {}
        self._host_out: dict[str, np.ndarray] = {}
        self._nbytes: dict[str, int] = {}
        self._graph_exec: Any = None
        self._graph: Any = None
        self._closed = False

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    # -- shapes and bindings ------------------------------------------------------------------

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> None:
        ctx = self._context
        for spec in self._inputs:
            shape = tuple(feeds[spec.name].shape)
            if not ctx.set_input_shape(spec.name, shape):
                errors = self._logger.errors()
                raise UsageError(
                    f"input {spec.name!r} shape {list(shape)} is outside the engine's optimization profile",
                    errors[-1] if errors else "rebuild with a --shape range that covers it",
                )
        for spec in self._inputs + self._outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(spec.name))
            if any(d < 0 for d in shape):
                raise BackendUnavailable(
                    f"output {spec.name!r} has a data-dependent shape {list(shape)}; "
                    "lto's TensorRT backend needs shapes known from the inputs"
                )
            dtype = np.dtype(spec.dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            buf = self._buffers[spec.name]
            buf.ensure(nbytes)
            if not ctx.set_tensor_address(spec.name, buf.device):
                raise BackendUnavailable(f"TensorRT refused the device address for {spec.name!r}")
            self._nbytes[spec.name] = nbytes
            target = self._host_in if spec in self._inputs else self._host_out
            target[spec.name] = buf.host_array(dtype, shape)
        self._shape_key = tuple(tuple(feeds[s.name].shape) for s in self._inputs)
        self._drop_graph()

    def _enqueue(self) -> None:
        """Copies in, the engine, copies out: all on the stream, nothing waited for."""
        cuda, stream = self._cuda, self._stream
        for spec in self._inputs:
            buf = self._buffers[spec.name]
            cuda.h2d(buf.device, buf.host, self._nbytes[spec.name], stream)
        if not self._context.execute_async_v3(int(stream)):
            errors = self._logger.errors()
            raise BackendUnavailable(
                f"TensorRT execution failed: {errors[-1] if errors else 'no reason logged'}"
            )
        for spec in self._outputs:
            buf = self._buffers[spec.name]
            cuda.d2h(buf.host, buf.device, self._nbytes[spec.name], stream)

    def _capture(self) -> None:
        cuda, rt, stream = self._cuda, self._cuda.rt, self._stream
        # One plain run first: TensorRT finishes deferred set-up on the first enqueue,
        # which must not be captured.
        self._enqueue()
        cuda.call("cudaStreamSynchronize", rt.cudaStreamSynchronize(stream))
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda.call("cudaStreamBeginCapture", rt.cudaStreamBeginCapture(stream, mode))
        try:
            self._enqueue()
        finally:
            graph = cuda.call("cudaStreamEndCapture", rt.cudaStreamEndCapture(stream))
        self._graph = graph
        self._graph_exec = cuda.call("cudaGraphInstantiate", rt.cudaGraphInstantiate(graph, 0))

    def _drop_graph(self) -> None:
        if self._graph_exec is not None:
            self._cuda.rt.cudaGraphExecDestroy(self._graph_exec)
            self._graph_exec = None
        if self._graph is not None:
            self._cuda.rt.cudaGraphDestroy(self._graph)
            self._graph = None

    # -- the hot path -------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        key = tuple(tuple(feeds[s.name].shape) for s in self._inputs)
        if key != self._shape_key:
            self._prepare(feeds)
        for name, host in self._host_in.items():
            np.copyto(host, feeds[name], casting="no")
        cuda, rt = self._cuda, self._cuda.rt
        if self.config["cuda_graph"]:
            if self._graph_exec is None:
                self._capture()
            cuda.call("cudaGraphLaunch", rt.cudaGraphLaunch(self._graph_exec, self._stream))
        else:
            self._enqueue()
        cuda.call("cudaStreamSynchronize", rt.cudaStreamSynchronize(self._stream))
        # Copies: the pinned buffers are overwritten by the next run.
        return {name: host.copy() for name, host in self._host_out.items()}

    def describe(self) -> dict[str, Any]:
        gpu = self.gpu
        return {
            "backend": self.kind,
            "runtime": self.runtime_name,
            "runtime_version": str(self.trt.__version__),
            "device": f"cuda:{gpu.index} {gpu.name} (sm {gpu.sm})" if gpu else "cuda",
            "gpu": gpu.to_json() if gpu else None,
            "host_device_copies_in_timing": True,
            "pinned_host_buffers": True,
            "cuda_graph": bool(self.config["cuda_graph"]),
            "engine": {
                "precision": (self.manifest or {}).get("precision"),
                "built_with": (self.manifest or {}).get("runtime_version"),
                "built_on": ((self.manifest or {}).get("gpu") or {}).get("name"),
                "hardware_compatibility_level": (self.manifest or {}).get("hardware_compatibility_level"),
                "profiles": (self.manifest or {}).get("profiles"),
                "manifest": self.manifest is not None,
            },
            "config": dict(self.config),
        }

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._drop_graph()
        for buf in self._buffers.values():
            buf.free()
        self._cuda.rt.cudaStreamDestroy(self._stream)
        # Release in dependency order: context before engine before runtime.
        self._context = None
        self._engine = None
        self._runtime = None
