"""The GPU path: device detection, shape ranges, manifests, engine builds, and the GPU backends.

Runs everywhere. Without a GPU it checks detection, the skip path, shape-range parsing, the
manifest rules and (where the `tensorrt-rtx` extra is installed) real engine builds through
TensorRT-RTX, which builds without a device. Tests marked `needs_gpu` run only where a CUDA
device, TensorRT and cuda-python are present: `scripts/gpu_check.sh` runs them on such a machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimize import gpu
from optimize.errors import BackendUnavailable, InputError, LtoError
from optimize.gpu import GpuDevice, GpuStatus, detect_gpu
from optimize.runtimes.tensorrt.engine import (
    MANIFEST_FORMAT,
    ShapeRange,
    check_manifest,
    parse_shape_range,
    parse_shape_ranges,
    profile_for_inputs,
)
from optimize.stage import AccuracyResult, Candidate, StageContext
from tests.cli_helpers import ROOT

SAMPLES = ROOT / "sample_models"

REAL_GPU = gpu.detect_gpu()


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


HAS_RTX = _importable("tensorrt_rtx")
HAS_TRT = _importable("tensorrt")
HAS_CUDA_PY = _importable("cuda")
needs_gpu = pytest.mark.skipif(
    not (REAL_GPU.usable and (HAS_TRT or HAS_RTX) and HAS_CUDA_PY),
    reason=f"needs an NVIDIA GPU, TensorRT and cuda-python ({REAL_GPU.reason or 'GPU present'})",
)
# On a GPU machine with full TensorRT, TensorRT-RTX must not be loaded beside it (one flavour per process).
needs_rtx_build = pytest.mark.skipif(
    not HAS_RTX or (REAL_GPU.usable and HAS_TRT),
    reason="needs tensorrt-rtx-cu12 (pip install 'lto[tensorrt-rtx]'), and no full TensorRT on a GPU box",
)

FAKE_GPU = GpuStatus(
    usable=True,
    kernel_driver_version="550.54.15",
    cuda_driver_version="12.4",
    devices=(GpuDevice(0, "NVIDIA Fake A10", (8, 6), 24 << 30),),
)


# ---------------------------------------------------------------------------------------------
# models


def mlp_model(path: Path, features: int = 16, out: int = 8, dynamic: bool = True) -> Path:
    rng = np.random.default_rng(0)
    batch: Any = "batch" if dynamic else 1
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["mm"], name="/fc/MatMul"),
            helper.make_node("Add", ["mm", "B"], ["pre"], name="/fc/Add"),
            helper.make_node("Relu", ["pre"], ["y"], name="/act/Relu"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])],
        [
            numpy_helper.from_array(rng.standard_normal((features, out)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal((out,)).astype(np.float32), "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def unsupported_op_model(path: Path) -> Path:
    """Relu followed by an op no TensorRT implements (a custom-domain op)."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="/ok/Relu"),
            helper.make_node("FancyThing", ["r"], ["y"], name="/bad/FancyThing", domain="com.example"),
        ],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def qdq_model(path: Path) -> Path:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul(W) -> y: the quantization stage's Q/DQ form."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="/q"),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="/dq"),
            helper.make_node("MatMul", ["xd", "W"], ["y"], name="/mm"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [
            numpy_helper.from_array(np.array(0.05, dtype=np.float32), "s"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "z"),
            numpy_helper.from_array(w, "W"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def make_ctx(tmp_path: Path, model: Path, feeds: dict[str, np.ndarray], **options: Any) -> StageContext:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    source = Candidate(label="baseline", model_path=model)
    logs: list[str] = []
    ctx = StageContext(
        workdir=workdir,
        original_model=model,
        feeds=feeds,
        options={"cache_dir": str(tmp_path / "cache"), **options},
        best_standard=source,
        best_latency_ms=None,
        target_ms=None,
        deadline=None,
        check_accuracy=lambda c: AccuracyResult(True, "", {}),
        log=logs.append,
    )
    ctx.logs = logs  # type: ignore[attr-defined]
    return ctx


# ---------------------------------------------------------------------------------------------
# device detection


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
        "import sys; from optimize.gpu import detect_gpu; detect_gpu(); "
        "import optimize.runtimes.tensorrt.build_stage, optimize.runtimes.tensorrt.backend; "
        "import optimize.runtimes.onnxruntime.gpu_backend; "
        "bad = [m for m in ('tensorrt', 'tensorrt_rtx', 'onnxruntime', 'cuda') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


# ---------------------------------------------------------------------------------------------
# shape ranges


def test_parse_range_and_fixed_shapes() -> None:
    ranges = parse_shape_ranges(["input_ids=1x128:8x128:32x128", "mask=1x128"])
    assert ranges["input_ids"] == ShapeRange((1, 128), (8, 128), (32, 128))
    assert ranges["mask"].fixed and ranges["mask"].opt == (1, 128)
    assert parse_shape_ranges({"x": "1x16:4x16:8x16"})["x"].max == (8, 16)


@pytest.mark.parametrize(
    ("arg", "names"),
    [
        ("input_ids", "input_ids"),
        ("x=1x128:8x128", "2 shapes"),
        ("x=1xa:2x2:3x3", "'1xa'"),
        ("x=1x128:8x64:32x128", "axis 1"),
        ("x=8x128:1x128:32x128", "axis 0"),
        ("x=1x128:8x128x2:32x128", "different ranks"),
        ("x=0x128", "zero dimension"),
        ("=1x2", "bad --shape"),
    ],
)
def test_parse_range_errors_name_the_bad_part(arg: str, names: str) -> None:
    with pytest.raises(InputError) as err:
        parse_shape_range(arg)
    assert names in err.value.message


def test_opt_shapes_pin_the_benchmark_inputs() -> None:
    from optimize.inputs import resolve_inputs
    from optimize.runtimes.tensorrt.engine import opt_shapes

    model = SAMPLES / "bert_tiny.onnx"
    if not model.is_file():
        pytest.skip("sample models not built")
    ranges = parse_shape_ranges(
        ["input_ids=1x16:2x32:4x64", "attention_mask=1x16:2x32:4x64", "token_type_ids=2x32"]
    )
    _, feeds = resolve_inputs(model, opt_shapes(ranges))
    assert {name: a.shape for name, a in feeds.items()} == dict.fromkeys(feeds, (2, 32))


def test_parse_ranges_rejects_a_repeated_input() -> None:
    with pytest.raises(InputError, match="twice"):
        parse_shape_ranges(["x=1x2", "x=1x3"])


def test_profile_uses_ranges_and_pins_the_rest() -> None:
    inputs = [("ids", ("batch", "seq")), ("mask", ("batch", "seq")), ("pix", (1, 3))]
    profile = profile_for_inputs(
        inputs, parse_shape_ranges(["ids=1x8:2x8:4x8"]), {"ids": (2, 8), "mask": (2, 8), "pix": (1, 3)}
    )
    assert profile["ids"] == ShapeRange((1, 8), (2, 8), (4, 8))
    assert profile["mask"].fixed and profile["mask"].min == (2, 8)
    assert profile["pix"].fixed


def test_profile_takes_ranges_for_named_dims() -> None:
    inputs = [("ids", ("batch", "seq")), ("mask", ("batch", "seq")), ("pix", (1, 3))]
    ranges = parse_shape_ranges(["seq=16:128:512", "batch=1:4:8"])
    profile = profile_for_inputs(inputs, ranges, {"ids": (4, 128), "mask": (4, 128), "pix": (1, 3)})
    assert profile["ids"] == profile["mask"] == ShapeRange((1, 16), (4, 128), (8, 512))
    # A named dim without a range keeps the benchmark's size.
    profile = profile_for_inputs(
        inputs, parse_shape_ranges(["seq=16:128:512"]), {"ids": (2, 128), "mask": (2, 128)}
    )
    assert profile["ids"] == ShapeRange((2, 16), (2, 128), (2, 512))
    with pytest.raises(InputError, match="names a dim, so it takes one number"):
        profile_for_inputs(inputs, parse_shape_ranges(["batch=1", "seq=1x16:1x128:1x512"]), {})


@pytest.mark.parametrize(
    ("shapes", "pinned", "message"),
    [
        (["nope=1x2"], {"ids": (1, 8)}, "neither a model input nor a named dynamic dim"),
        (["ids=1x8:2x8:4x8"], {"ids": (8, 8)}, "outside the --shape range"),
        (["ids=1x8x1:2x8x1:4x8x1"], {"ids": (1, 8)}, "rank 3"),
        ([], {}, "no shape for input 'ids': dim 'batch' on axis 0 has no range"),
    ],
)
def test_profile_errors(shapes: list[str], pinned: dict[str, tuple[int, ...]], message: str) -> None:
    with pytest.raises(InputError, match=message):
        profile_for_inputs([("ids", ("batch", 8))], parse_shape_ranges(shapes), pinned)


def test_profile_refuses_to_range_a_fixed_dim() -> None:
    with pytest.raises(InputError, match="axis 1 is fixed at 8"):
        profile_for_inputs([("ids", ("batch", 8))], parse_shape_ranges(["ids=1x4:1x8:1x16"]), {})


# ---------------------------------------------------------------------------------------------
# manifests


def manifest(**over: Any) -> dict[str, Any]:
    base = {
        "format": MANIFEST_FORMAT,
        "manifest_version": 1,
        "runtime": "tensorrt",
        "runtime_version": "11.4.0.106",
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
        "hardware_compatibility_level": "none",
    }
    return {**base, **over}


H200 = GpuDevice(0, "NVIDIA H200", (9, 0))
H100 = GpuDevice(0, "NVIDIA H100 80GB HBM3", (9, 0))
A10 = GpuDevice(0, "NVIDIA A10", (8, 6))
T4 = GpuDevice(0, "Tesla T4", (7, 5))


def test_manifest_accepts_the_machine_it_was_built_on() -> None:
    assert check_manifest(manifest(), "tensorrt", "11.4.0.106", H200) is None


@pytest.mark.parametrize(
    ("m", "runtime", "version", "device", "reason"),
    [
        (
            manifest(),
            "tensorrt",
            "10.13.0.35",
            H200,
            "built with tensorrt 11.4.0.106, this machine has 10.13.0.35",
        ),
        (
            manifest(),
            "tensorrt-rtx",
            "11.4.0.106",
            H200,
            "built with tensorrt, this process runs tensorrt-rtx",
        ),
        (
            manifest(),
            "tensorrt",
            "11.4.0.106",
            A10,
            "compute capability 9.0 (NVIDIA H200), this NVIDIA A10 is 8.6",
        ),
        (manifest(), "tensorrt", "11.4.0.106", H100, "built on NVIDIA H200, this GPU is NVIDIA H100"),
        (manifest(), "tensorrt", "11.4.0.106", None, "no CUDA device"),
        (manifest(format="other"), "tensorrt", "11.4.0.106", H200, "not an lto engine manifest"),
        (manifest(manifest_version=99), "tensorrt", "11.4.0.106", H200, "newer than this lto"),
        (
            manifest(hardware_compatibility_level="ampere_plus"),
            "tensorrt",
            "11.4.0.106",
            T4,
            "needs an Ampere or newer GPU",
        ),
    ],
)
def test_manifest_mismatches_are_refused_with_the_reason(
    m: dict[str, Any], runtime: str, version: str, device: GpuDevice | None, reason: str
) -> None:
    got = check_manifest(m, runtime, version, device)
    assert got is not None and reason in got


def test_manifest_compatibility_levels_relax_the_gpu_model_check() -> None:
    same_cc = manifest(hardware_compatibility_level="same_compute_capability")
    assert check_manifest(same_cc, "tensorrt", "11.4.0.106", H100) is None
    assert "compute capability" in (check_manifest(same_cc, "tensorrt", "11.4.0.106", A10) or "")
    ampere = manifest(hardware_compatibility_level="ampere_plus")
    assert check_manifest(ampere, "tensorrt", "11.4.0.106", A10) is None


def test_manifest_detects_a_changed_engine_file() -> None:
    import hashlib

    m = manifest(engine_sha256=hashlib.sha256(b"engine").hexdigest())
    assert check_manifest(m, "tensorrt", "11.4.0.106", H200, b"engine") is None
    assert "changed" in (check_manifest(m, "tensorrt", "11.4.0.106", H200, b"other") or "")


def test_rtx_manifest_without_build_gpu_checks_target_capabilities() -> None:
    m = manifest(
        runtime="tensorrt-rtx", runtime_version="1.7.1.116", gpu=None, compute_capabilities=["8.6", "8.9"]
    )
    assert check_manifest(m, "tensorrt-rtx", "1.7.1.116", A10) is None
    assert "8.6, 8.9" in (check_manifest(m, "tensorrt-rtx", "1.7.1.116", H200) or "")
    # Without explicit targets: TensorRT-RTX's portable default, which has no Hopper.
    portable = manifest(
        runtime="tensorrt-rtx", runtime_version="1.7.1.116", gpu=None, compute_capabilities=[]
    )
    assert check_manifest(portable, "tensorrt-rtx", "1.7.1.116", A10) is None
    assert "this NVIDIA H200 is 9.0" in (check_manifest(portable, "tensorrt-rtx", "1.7.1.116", H200) or "")


@pytest.mark.skipif(not HAS_RTX or HAS_TRT, reason="needs TensorRT-RTX as the only TensorRT")
def test_stage_skips_a_gpu_tensorrt_rtx_cannot_target(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    hopper = GpuStatus(True, devices=(GpuDevice(0, "NVIDIA H200", (9, 0)),))
    ctx = make_ctx(tmp_path, mlp_model(tmp_path / "m.onnx"), {"x": np.zeros((1, 16), np.float32)})
    reason = TensorrtBuildStage(gpu_probe=lambda: hopper).skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "cannot target NVIDIA H200 (compute capability 9.0)" in reason


# ---------------------------------------------------------------------------------------------
# skip path and backends without a GPU


NO_GPU = GpuStatus(False, "no NVIDIA driver library (libcuda.so.1: not found)")


def test_stage_is_skipped_with_the_reason_without_a_gpu(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = mlp_model(tmp_path / "m.onnx")
    ctx = make_ctx(tmp_path, model, {"x": np.zeros((1, 16), np.float32)})
    reason = TensorrtBuildStage(gpu_probe=lambda: NO_GPU).skip_reason(ctx.best_standard, ctx)
    assert reason == "no usable NVIDIA GPU: no NVIDIA driver library (libcuda.so.1: not found)"


def test_stage_is_skipped_for_a_non_standard_graph(tmp_path: Path) -> None:
    if not HAS_TRT:
        pytest.importorskip("tensorrt_rtx")
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = mlp_model(tmp_path / "m.onnx")
    ctx = make_ctx(tmp_path, model, {"x": np.zeros((1, 16), np.float32)})
    ctx.best_standard = Candidate("fused", model, standard_ops=False)
    reason = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).skip_reason(ctx.best_standard, ctx)
    assert reason is not None and "standard-op ONNX graph" in reason and "'fused'" in reason


@pytest.mark.parametrize("kind", ["tensorrt", "onnxruntime-cuda", "onnxruntime-trt"])
def test_gpu_backends_refuse_to_open_without_a_gpu(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimize.runtimes import open_backend

    monkeypatch.setattr(gpu, "gpu_status", lambda: NO_GPU)
    model = mlp_model(tmp_path / "m.onnx")
    path = model if kind != "tensorrt" else tmp_path / "m.engine"
    if kind == "tensorrt":
        path.write_bytes(b"not really an engine")
    with pytest.raises(BackendUnavailable) as err:
        open_backend(kind, path, {})
    assert "needs an NVIDIA GPU" in err.value.message and "libcuda.so.1" in err.value.message


def test_ort_cuda_backend_refuses_a_cpu_only_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort

    from optimize.runtimes import open_backend

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)
    with pytest.raises(BackendUnavailable) as err:
        open_backend("onnxruntime-cuda", mlp_model(tmp_path / "m.onnx"), {})
    assert "has no CUDAExecutionProvider" in err.value.message
    assert "onnxruntime-gpu" in (err.value.hint or "")


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


# ---------------------------------------------------------------------------------------------
# real engine builds through TensorRT-RTX (no GPU needed)


@needs_rtx_build
def test_build_engine_with_profile_and_timing_cache(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.engine import BuildSettings, build_engine, manifest_path

    model = mlp_model(tmp_path / "m.onnx")
    cache = tmp_path / "cache" / "timing.cache"
    profile = parse_shape_ranges(["x=1x16:4x16:8x16"])
    settings = BuildSettings(runtime="tensorrt-rtx", timing_cache=cache, builder_optimization_level=2,
                             workspace_bytes=64 << 20)  # fmt: skip
    first = build_engine(
        model, tmp_path / "a.engine", profile, settings, FAKE_GPU, log_path=tmp_path / "a.log"
    )
    assert first.engine_path.stat().st_size == first.manifest["engine_bytes"] > 1000
    written = json.loads(manifest_path(first.engine_path).read_text())
    assert written == json.loads(json.dumps(first.manifest))
    assert written["runtime"] == "tensorrt-rtx" and written["strongly_typed"] is True
    assert written["profiles"] == [{"x": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}]
    assert written["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 16]}]
    assert written["outputs"][0]["name"] == "y"
    assert written["builder_optimization_level"] == 2
    assert written["build_machine_gpu"]["name"] == "NVIDIA Fake A10"
    # The cache file is written by the first build and read back by the second.
    assert cache.is_file() and written["timing_cache"]["written_bytes"] == cache.stat().st_size > 0
    assert written["timing_cache"]["loaded_bytes"] == 0
    second = build_engine(model, tmp_path / "b.engine", profile, settings, FAKE_GPU)
    assert second.manifest["timing_cache"]["loaded_bytes"] == cache.stat().st_size
    assert "discarded" not in second.manifest["timing_cache"]


@needs_rtx_build
def test_build_survives_a_corrupt_timing_cache(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.engine import BuildSettings, build_engine

    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"garbage" * 10)
    model = mlp_model(tmp_path / "m.onnx", dynamic=False)
    result = build_engine(
        model, tmp_path / "m.engine", None, BuildSettings(runtime="tensorrt-rtx", timing_cache=cache), None
    )
    assert result.engine_path.is_file()
    # TensorRT-RTX accepts any bytes (its cache is a no-op); full TensorRT refuses them and we start afresh.
    # Either way the build succeeds and the file is replaced by a cache TensorRT wrote.
    assert cache.read_bytes() != b"garbage" * 10
    assert result.manifest["timing_cache"]["written_bytes"] == cache.stat().st_size


@needs_rtx_build
def test_parser_failure_names_the_unsupported_node(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.engine import BuildSettings, EngineBuildError, build_engine

    model = unsupported_op_model(tmp_path / "bad.onnx")
    log = tmp_path / "bad.log"
    with pytest.raises(EngineBuildError) as err:
        build_engine(
            model, tmp_path / "bad.engine", None, BuildSettings(runtime="tensorrt-rtx"), None, log_path=log
        )
    assert "'/bad/FancyThing'" in err.value.message and "FancyThing" in err.value.message
    assert str(log) in (err.value.hint or "") and log.read_text().strip()
    assert not (tmp_path / "bad.engine").exists()


@needs_rtx_build
def test_dynamic_input_without_range_is_an_input_error(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.engine import BuildSettings, build_engine

    with pytest.raises(InputError, match="input 'x' has dynamic dims"):
        build_engine(
            mlp_model(tmp_path / "m.onnx"),
            tmp_path / "m.engine",
            None,
            BuildSettings(runtime="tensorrt-rtx"),
            None,
        )


@needs_rtx_build
def test_stage_builds_fp32_and_fp16_engines(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = SAMPLES / "mlp_small.onnx"
    if not model.is_file():
        model = mlp_model(tmp_path / "m.onnx", features=256, out=10)
    feeds = (
        {"features": np.zeros((1, 256), np.float32)}
        if "mlp_small" in model.name
        else {"x": np.zeros((1, 256), np.float32)}
    )
    name = next(iter(feeds))
    ctx = make_ctx(tmp_path, model, feeds, runtime="tensorrt-rtx", shapes=[f"{name}=1x256:4x256:16x256"])
    stage = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU)
    assert stage.skip_reason(ctx.best_standard, ctx) is None
    out = stage.run(ctx.best_standard, ctx)
    assert [c.label for c in out] == ["tensorrt:fp32", "tensorrt:fp16"]
    for cand in out:
        assert cand.backend == "tensorrt" and cand.model_path.is_file() and not cand.standard_ops
        assert cand.details["gpu"] == "NVIDIA Fake A10" and cand.details["compute_capability"] == "8.6"
        assert cand.details["runtime"] == "tensorrt-rtx" and cand.details["runtime_version"]
        assert cand.details["hardware_compatibility_level"] == "none"
        assert json.loads(cand.extra_files[0].read_text())["compute_capabilities"] == ["8.6"]
        assert cand.details["profile"][name] == {"min": [1, 256], "opt": [4, 256], "max": [16, 256]}
        assert cand.extra_files[0].is_file()
    # The fp16 graph really is float16 inside and float32 at its edges.
    fp16 = onnx.load(str(ctx.workdir / "model_fp16.onnx"))
    assert fp16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert fp16.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(init.data_type == TensorProto.FLOAT16 for init in fp16.graph.initializer)
    # Both builds shared one timing cache in the cache dir.
    caches = list((tmp_path / "cache" / "tensorrt").glob("timing-tensorrt-rtx-*-nvidia-fake-a10-sm8-6.cache"))
    assert len(caches) == 1


@needs_rtx_build
def test_stage_builds_qdq_graphs_as_int8(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = qdq_model(tmp_path / "q.onnx")
    ctx = make_ctx(tmp_path, model, {"x": np.zeros((2, 16), np.float32)}, runtime="tensorrt-rtx")
    out = TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).run(ctx.best_standard, ctx)
    assert [c.label for c in out] == ["tensorrt:int8"] and out[0].precision == "int8"
    assert out[0].details["profile"]["x"] == {"min": [2, 16], "opt": [2, 16], "max": [2, 16]}


@needs_rtx_build
def test_stage_build_failure_surfaces_the_node(tmp_path: Path) -> None:
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage
    from optimize.runtimes.tensorrt.engine import EngineBuildError

    model = unsupported_op_model(tmp_path / "bad.onnx")
    ctx = make_ctx(
        tmp_path, model, {"x": np.zeros((1, 4), np.float32)}, runtime="tensorrt-rtx", precisions=["fp32"]
    )
    with pytest.raises(EngineBuildError, match="/bad/FancyThing"):
        TensorrtBuildStage(gpu_probe=lambda: FAKE_GPU).run(ctx.best_standard, ctx)
    assert (ctx.workdir / "tensorrt_fp32.log").is_file()


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


def _reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from optimize.runtimes import open_backend

    with open_backend("onnxruntime", model, {}) as ref:
        return ref.run(feeds)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_engine_matches_onnxruntime(tmp_path: Path, precision: str) -> None:
    from optimize.runtimes.tensorrt.backend import TensorrtBackend
    from optimize.runtimes.tensorrt.build_stage import TensorrtBuildStage

    model = SAMPLES / "resnet_tiny.onnx"
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    ctx = make_ctx(
        tmp_path, model, feeds, precisions=[precision], shapes=["pixel_values=1x3x64x64:1x3x64x64:8x3x64x64"]
    )
    (cand,) = TensorrtBuildStage().run(ctx.best_standard, ctx)
    want = _reference(model, feeds)
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
    ctx = make_ctx(tmp_path, model, {"x": np.ones((1, 16), np.float32)}, precisions=["fp32"])
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


@needs_gpu
def test_gpu_ort_cuda_matches_cpu_and_stays_on_gpu(tmp_path: Path) -> None:
    import onnxruntime as ort

    from optimize.runtimes import open_backend

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    model = SAMPLES / "mlp_small.onnx"
    feeds = {"features": np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)}
    with open_backend("onnxruntime-cuda", model, {"allow_cpu_nodes": True}) as be:
        got = be.run(feeds)
        assert be.describe()["providers"][0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(got["logits"], _reference(model, feeds)["logits"], rtol=1e-3, atol=1e-3)


@needs_gpu
def test_gpu_ort_cuda_with_devices_hidden_fails_closed(tmp_path: Path) -> None:
    """With CUDA_VISIBLE_DEVICES empty, onnxruntime-gpu would fall back to the CPU; lto must refuse."""
    code = (
        "from optimize.runtimes import open_backend\n"
        "from optimize.errors import BackendUnavailable\n"
        "try:\n"
        f"    open_backend('onnxruntime-cuda', {str(SAMPLES / 'mlp_small.onnx')!r}, {{}})\n"
        "    print('OPENED')\n"
        "except BackendUnavailable as exc:\n"
        "    print('REFUSED', exc.one_line())\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.stdout.startswith("REFUSED"), out.stdout + out.stderr


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_ort_gpu_backends_fail_closed_when_the_provider_lies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-gpu lists CUDA where it cannot run it (notes §7): the session must not run on the CPU."""
    import onnxruntime as ort

    from optimize.runtimes import open_backend

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime really has the CUDA provider")
    real = ort.get_available_providers
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real()])
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)
    model = mlp_model(tmp_path / "m.onnx")
    with pytest.raises(BackendUnavailable, match="on the CPU, and CPU fallback is off"):
        open_backend("onnxruntime-cuda", model, {})
    with pytest.raises(
        BackendUnavailable, match=r"did not load CUDAExecutionProvider \(session providers: CPU"
    ):
        open_backend("onnxruntime-cuda", model, {"allow_cpu_nodes": True})


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
    import optimize.runtimes.tensorrt.engine as support

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
    monkeypatch.setattr(support, "import_runtime", lambda runtime="auto": (fake_trt, "tensorrt"))
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


@pytest.mark.skipif(not _importable("cuda.bindings"), reason="needs cuda-python")
@pytest.mark.skipif(REAL_GPU.usable, reason="checks how CUDA calls fail on a GPU-less machine")
def test_real_cuda_python_errors_become_backend_unavailable() -> None:
    from optimize.runtimes.tensorrt.backend import _Cuda

    with pytest.raises(BackendUnavailable, match="CUDA cudaMalloc failed"):
        _Cuda().malloc(16)
