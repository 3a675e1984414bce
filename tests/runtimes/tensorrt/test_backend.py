"""The TensorRT backend (optimize/runtimes/tensorrt/backend.py): refusing engines built for
another machine, its buffer, stream and CUDA-graph logic against a fake device, and (on a GPU,
`scripts/gpu_check.sh`) real engines run against ONNX Runtime's outputs.

Runs everywhere; the tests marked `needs_gpu` run only where a CUDA device, TensorRT and
cuda-python are present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.errors import BackendUnavailable, LtoError
from optimize.system import gpu
from tests.runtimes.tensorrt.helpers import (
    FAKE_GPU,
    HAS_TRT,
    REAL_GPU,
    SAMPLES,
    importable,
    manifest,
    mlp_model,
    needs_gpu,
    needs_rtx_build,
    reference,
    tensorrt_context,
)

# ---------------------------------------------------------------------------------------------
# refusals without a GPU


def test_tensorrt_backend_refuses_a_mismatched_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not HAS_TRT:
        pytest.importorskip("tensorrt_rtx")
    from optimize.runtimes.tensorrt.backend import TensorrtBackend
    from optimize.runtimes.tensorrt.engine import import_runtime

    trt, runtime = import_runtime("auto")
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"engine")
    m = manifest(
        runtime=runtime, runtime_version="0.0.1", gpu={"name": "NVIDIA Fake A10", "compute_capability": "8.6"}
    )
    (tmp_path / "m.engine.json").write_text(json.dumps(m))
    with pytest.raises(BackendUnavailable) as err:
        TensorrtBackend(engine)
    assert "refusing to load m.engine" in err.value.message
    assert f"built with {runtime} 0.0.1, this machine has {trt.__version__}" in err.value.message


def test_tensorrt_backend_rejects_unknown_settings(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend

    with pytest.raises(LtoError, match="unknown tensorrt setting 'graph'"):
        TensorrtBackend(tmp_path / "m.engine", {"graph": True})


@needs_rtx_build
@pytest.mark.skipif(REAL_GPU.usable, reason="checks how a GPU-less machine fails")
def test_rtx_engine_load_without_gpu_is_an_error_not_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorRT-RTX's deserialize returns None here (CUDA error 35); the backend must say so."""
    from optimize.runtimes.tensorrt.backend import TensorrtBackend
    from optimize.runtimes.tensorrt.engine import BuildSettings, build_engine

    model = mlp_model(tmp_path / "m.onnx", dynamic=False)
    build_engine(model, tmp_path / "m.engine", None, BuildSettings(runtime="tensorrt-rtx"), FAKE_GPU)
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)  # pretend, so the load reaches TensorRT
    with pytest.raises(BackendUnavailable) as err:
        TensorrtBackend(tmp_path / "m.engine")
    assert "cannot load the engine m.engine" in err.value.message
    assert "CUDA" in err.value.message or "cuda" in err.value.message


# ---------------------------------------------------------------------------------------------
# on a GPU (scripts/gpu_check.sh)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_engine_matches_onnxruntime(tmp_path: Path, precision: str) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = SAMPLES / "resnet_tiny.onnx"
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    ctx = tensorrt_context(
        tmp_path, model, feeds, precisions=[precision], shapes=["pixel_values=1x3x64x64:1x3x64x64:8x3x64x64"]
    )
    (cand,) = TensorrtBuildStage().run(ctx.best_standard, ctx)
    want = reference(model, feeds)
    for graph in (False, True):
        with TensorrtBackend(cand.model_path, {"cuda_graph": graph}) as be:
            got = be.run(feeds)
            again = be.run(feeds)
            info = be.describe()
        assert info["host_device_copies_in_timing"] is True and info["cuda_graph"] is graph
        # Tolerances scale with the logits (|max| ~36 here); fp32 engines may use TF32 on Ampere+.
        scale = float(np.abs(want["logits"]).max())
        tol = (5e-3 if precision == "fp32" else 2e-2) * scale
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=tol)
        cosine = float(np.dot(got["logits"].ravel(), want["logits"].ravel()))
        cosine /= float(np.linalg.norm(got["logits"]) * np.linalg.norm(want["logits"]))
        assert cosine > 0.999
        np.testing.assert_array_equal(got["logits"], again["logits"])
    # A batch of 4 lies in the profile; the backend rebinds its buffers.
    batch = {"pixel_values": np.repeat(feeds["pixel_values"], 4, axis=0)}
    with TensorrtBackend(cand.model_path) as be:
        out4 = be.run(batch)
    assert out4["logits"].shape == (4, 100)
    np.testing.assert_allclose(out4["logits"][3], out4["logits"][0], rtol=1e-5, atol=1e-5)


@needs_gpu
def test_gpu_engine_for_another_gpu_is_refused(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = mlp_model(tmp_path / "m.onnx")
    ctx = tensorrt_context(tmp_path, model, {"x": np.ones((1, 16), np.float32)}, precisions=["fp32"])
    (cand,) = TensorrtBuildStage().run(ctx.best_standard, ctx)
    man_path = Path(f"{cand.model_path}.json")
    m = json.loads(man_path.read_text())
    if m["runtime"] == "tensorrt":
        m["gpu"] = {"name": "Some Other GPU", "compute_capability": "1.0"}
    else:
        m["runtime_version"] = "0.0.0"
    man_path.write_text(json.dumps(m))
    with pytest.raises(BackendUnavailable, match="refusing to load"):
        TensorrtBackend(cand.model_path)


# ---------------------------------------------------------------------------------------------
# the TensorRT backend's CUDA plumbing, against a fake device made of host memory


class FakeStream:
    def __init__(self) -> None:
        self.capture: list[Any] | None = None

    def submit(self, op: Any) -> None:
        if self.capture is not None:
            self.capture.append(op)
        else:
            op()

    def __int__(self) -> int:
        return id(self)


class FakeCudart:
    """cuda-python's runtime module, played with ctypes buffers: "device" memory is host memory."""

    class cudaError_t:  # mirrors cuda-python's names
        cudaSuccess = 0
        cudaErrorMemoryAllocation = 2

    class cudaMemcpyKind:
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    class cudaStreamCaptureMode:
        cudaStreamCaptureModeThreadLocal = 1

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.live: dict[int, Any] = {}
        self.captures = 0
        self.fail_malloc = False

    def _alloc(self, n: int) -> tuple[int, int]:
        if self.fail_malloc:
            return (self.cudaError_t.cudaErrorMemoryAllocation, 0)
        buf = (self.ctypes.c_uint8 * n)()
        addr = self.ctypes.addressof(buf)
        self.live[addr] = buf
        return 0, addr

    cudaMalloc = _alloc
    cudaMallocHost = _alloc

    def cudaFree(self, ptr: int) -> tuple[int]:
        del self.live[ptr]
        return (0,)

    cudaFreeHost = cudaFree

    def cudaGetErrorString(self, err: int) -> tuple[int, bytes]:
        return 0, b"out of memory"

    def cudaStreamCreate(self) -> tuple[int, FakeStream]:
        return 0, FakeStream()

    def cudaStreamDestroy(self, stream: FakeStream) -> tuple[int]:
        return (0,)

    def cudaStreamSynchronize(self, stream: FakeStream) -> tuple[int]:
        return (0,)

    def cudaMemcpyAsync(self, dst: int, src: int, n: int, kind: int, stream: FakeStream) -> tuple[int]:
        stream.submit(lambda: self.ctypes.memmove(dst, src, n))
        return (0,)

    def cudaStreamBeginCapture(self, stream: FakeStream, mode: int) -> tuple[int]:
        stream.capture = []
        self.captures += 1
        return (0,)

    def cudaStreamEndCapture(self, stream: FakeStream) -> tuple[int, list[Any]]:
        ops, stream.capture = stream.capture, None
        return 0, ops

    def cudaGraphInstantiate(self, graph: list[Any], flags: int) -> tuple[int, list[Any]]:
        return 0, list(graph)

    def cudaGraphLaunch(self, graph_exec: list[Any], stream: FakeStream) -> tuple[int]:
        for op in graph_exec:
            stream.submit(op)
        return (0,)

    def cudaGraphExecDestroy(self, graph_exec: Any) -> tuple[int]:
        return (0,)

    cudaGraphDestroy = cudaGraphExecDestroy


class FakeTrt:
    """Just enough of the tensorrt module for an engine computing y = x @ W with x [batch, 4], W [4, 3]."""

    __version__ = "10.99.0"
    W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10

    class ILogger:
        def __init__(self) -> None:
            pass

    class TensorIOMode:
        INPUT = "input"
        OUTPUT = "output"

    @staticmethod
    def nptype(dtype: Any) -> Any:
        return np.float32

    def __init__(self, streams: dict[int, FakeStream]) -> None:
        self.streams = streams

    def Runtime(self, logger: Any) -> Any:  # mirrors tensorrt's names
        trt = self

        class _Runtime:
            def deserialize_cuda_engine(self, data: bytes) -> Any:
                return FakeEngine(trt) if data == b"good engine" else None

        return _Runtime()


class FakeEngine:
    num_io_tensors = 2

    def __init__(self, trt: FakeTrt) -> None:
        self.trt = trt

    def get_tensor_name(self, i: int) -> str:
        return ["x", "y"][i]

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 4) if name == "x" else (-1, 3)

    def get_tensor_mode(self, name: str) -> str:
        return "input" if name == "x" else "output"

    def create_execution_context(self) -> Any:
        return FakeContext(self.trt)


class FakeContext:
    def __init__(self, trt: FakeTrt) -> None:
        self.trt = trt
        self.batch = -1
        self.addr: dict[str, int] = {}

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if not 1 <= shape[0] <= 8:
            return False
        self.batch = shape[0]
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self.batch, 4) if name == "x" else (self.batch, 3)

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addr[name] = address
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        import ctypes

        batch, xa, ya = self.batch, self.addr["x"], self.addr["y"]

        def compute() -> None:
            x = np.frombuffer((ctypes.c_float * (batch * 4)).from_address(xa), np.float32).reshape(batch, 4)
            y = np.frombuffer((ctypes.c_float * (batch * 3)).from_address(ya), np.float32).reshape(batch, 3)
            y[:] = x @ self.trt.W

        self.trt.streams[stream_handle].submit(compute)
        return True


@pytest.fixture
def fake_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, FakeCudart]:
    import optimize.runtimes.tensorrt.backend as trt_backend

    cudart = FakeCudart()
    streams: dict[int, FakeStream] = {}
    real_create = cudart.cudaStreamCreate

    def create() -> tuple[int, FakeStream]:
        err, stream = real_create()
        streams[int(stream)] = stream
        return err, stream

    cudart.cudaStreamCreate = create  # type: ignore[method-assign]
    fake_trt = FakeTrt(streams)
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)
    monkeypatch.setattr(trt_backend, "import_runtime", lambda runtime="auto": (fake_trt, "tensorrt"))
    monkeypatch.setattr(trt_backend._Cuda, "__init__", lambda self: setattr(self, "rt", cudart))
    engine = tmp_path / "fake.engine"
    engine.write_bytes(b"good engine")
    return engine, cudart


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_tensorrt_backend_moves_data_through_device_buffers(
    fake_device: tuple[Path, FakeCudart], cuda_graph: bool
) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend

    engine, cudart = fake_device
    rng = np.random.default_rng(0)
    be = TensorrtBackend(engine, {"cuda_graph": cuda_graph})
    assert [s.to_json() for s in be.inputs] == [{"name": "x", "dtype": "float32", "shape": [None, 4]}]
    info = be.describe()
    assert info["host_device_copies_in_timing"] is True and info["cuda_graph"] is cuda_graph
    assert info["engine"]["manifest"] is False
    for batch in (1, 1, 3, 3, 1):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        out = be.run({"x": x})
        # New values each run: a graph that replayed stale inputs, or skipped a copy, would fail here.
        np.testing.assert_allclose(out["y"], x @ FakeTrt.W, rtol=1e-6)
    first = out["y"]
    be.run({"x": np.zeros((1, 4), np.float32)})
    assert first.any(), "results must be copies, not views of the reused pinned buffer"
    # One capture per change of shape (1 -> 3 -> 1), none without graphs.
    assert cudart.captures == (3 if cuda_graph else 0)
    be.close()
    be.close()
    assert cudart.live == {}, "every device and pinned allocation is freed on close"


def test_tensorrt_backend_errors_are_clear(fake_device: tuple[Path, FakeCudart]) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend

    engine, cudart = fake_device
    with TensorrtBackend(engine) as be:
        with pytest.raises(
            LtoError, match=r"input 'x' shape \[9, 4\] is outside the engine's optimization profile"
        ):
            be.run({"x": np.zeros((9, 4), np.float32)})
        cudart.fail_malloc = True
        with pytest.raises(BackendUnavailable, match=r"CUDA cudaMalloc failed: .*out of memory"):
            be.run({"x": np.zeros((2, 4), np.float32)})
    engine.write_bytes(b"bad engine")
    with pytest.raises(
        BackendUnavailable, match=r"cannot load the engine fake\.engine: TensorRT gave no reason"
    ):
        TensorrtBackend(engine)


def test_tensorrt_backend_finds_the_manifest_of_a_renamed_engine(
    fake_device: tuple[Path, FakeCudart],
) -> None:
    """An artifact stores model_fp16.engine as model.engine: the manifest must still be found and checked."""
    import hashlib

    from optimize.runtimes.tensorrt.backend import TensorrtBackend

    engine, _ = fake_device
    renamed = engine.with_name("model.engine")
    engine.rename(renamed)
    m = manifest(
        runtime_version="10.98.0",
        gpu={"name": "NVIDIA Fake A10", "compute_capability": "8.6"},
        engine_sha256=hashlib.sha256(b"good engine").hexdigest(),
    )
    (renamed.parent / "model_fp16.engine.json").write_text(json.dumps(m))
    with pytest.raises(
        BackendUnavailable, match=r"built with tensorrt 10\.98\.0, this machine has 10\.99\.0"
    ):
        TensorrtBackend(renamed)
    m["runtime_version"] = FakeTrt.__version__
    (renamed.parent / "model_fp16.engine.json").write_text(json.dumps(m))
    with TensorrtBackend(renamed) as be:
        assert be.describe()["engine"]["manifest"] is True


def test_engine_validity_diagnostics_are_named() -> None:
    import enum

    from optimize.runtimes.tensorrt.backend import _validity_reason

    class Diagnostics(enum.IntEnum):
        VERSION_MISMATCH = 1
        UNSUPPORTED_CC = 2
        OLD_CUDA_DRIVER = 4

    class Runtime:
        def __init__(self, diagnostics: int) -> None:
            self.diagnostics = diagnostics

        def get_engine_validity(self, data: bytes) -> tuple[str, int]:
            return "INVALID", self.diagnostics

    trt = type("trt", (), {"EngineInvalidityDiagnostics": Diagnostics})
    assert _validity_reason(trt, Runtime(1 | 4), b"x") == "TensorRT says: version_mismatch, old_cuda_driver"
    assert _validity_reason(trt, Runtime(0), b"x") is None
    assert _validity_reason(trt, object(), b"x") is None


@pytest.mark.skipif(not importable("cuda.bindings"), reason="needs cuda-python")
@pytest.mark.skipif(REAL_GPU.usable, reason="checks how CUDA calls fail on a GPU-less machine")
def test_real_cuda_python_errors_become_backend_unavailable() -> None:
    from optimize.runtimes.tensorrt.backend import _Cuda

    with pytest.raises(BackendUnavailable, match="CUDA cudaMalloc failed"):
        _Cuda().malloc(16)
