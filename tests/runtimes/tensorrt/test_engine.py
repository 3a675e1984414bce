"""TensorRT engines (optimize/runtimes/tensorrt/engine.py): the manifest rules that decide
whether an engine may load on this machine, and real engine builds through TensorRT-RTX, which
builds without a device (where the `tensorrt-rtx` extra is installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from optimize.data import parse_shape_ranges
from optimize.errors import InputError
from optimize.runtimes.tensorrt.engine import check_manifest
from optimize.system.gpu import GpuDevice
from tests.runtimes.tensorrt.helpers import (
    FAKE_GPU,
    manifest,
    mlp_model,
    needs_rtx_build,
    unsupported_op_model,
)

# ---------------------------------------------------------------------------------------------
# manifests


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
