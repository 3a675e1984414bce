"""TvmBackend (optimize/runtimes/tvm/backend.py): the artifact's files, and refusing a library
that this CPU cannot run or that lacks its sidecar.

Tests that need apache-tvm call `pytest.importorskip("tvm")` or use the `tuned` fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from optimize.errors import BackendUnavailable, UsageError
from tests.runtimes.tvm.helpers import FEEDS, mlp_model

pytestmark = pytest.mark.tvm


def test_artifact_files_and_refusal_on_a_cpu_without_the_isa(
    tuned: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import optimize.runtimes.tvm.cpu_target as cpu_target
    from optimize.runtimes.tvm.backend import TvmBackend
    from optimize.runtimes.tvm.sidecar import SIDECAR_NAME

    (cand,) = tuned["candidates"]
    sidecar = cand.model_path.parent / SIDECAR_NAME
    assert cand.extra_files == [sidecar]
    data = json.loads(sidecar.read_text())
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 32]}]
    assert data["outputs"] == [{"name": "y", "dtype": "float32", "shape": [2, 32]}]
    assert data["isa_requires"] == cand.details["isa_requires"] and data["target"]["kind"] == "llvm"
    assert data["tvm_version"] and data["tuning"]["trials_measured"] >= 1
    # A CPU that lacks one of the flags the target used: refused with the reason, no SIGILL.
    required = set(data["isa_requires"])
    dropped = "avx2" if "avx2" in required else sorted(required)[0]
    monkeypatch.setattr(cpu_target, "cpu_isa_flags", lambda: set(required) - {dropped})
    with pytest.raises(BackendUnavailable, match=f"uses instructions this CPU lacks: {dropped}"):
        TvmBackend(cand.model_path, {"process": "inline"})


def test_library_for_a_bigger_cpu_is_refused_here(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    import optimize.system.env
    from optimize.runtimes.tvm.backend import TvmBackend
    from optimize.runtimes.tvm.cpu_target import resolve_cpu_target
    from optimize.runtimes.tvm.relax_build import build, count_scheduled, fuse, import_onnx
    from optimize.runtimes.tvm.sidecar import write_sidecar

    host = resolve_cpu_target()
    if not host.triple.startswith("x86_64") or "avx512f" in optimize.system.env.cpu_isa_flags():
        pytest.skip("needs an x86 CPU without AVX-512")
    info = resolve_cpu_target("x86-64-v4")  # AVX-512: an artifact built on a bigger machine
    imported = import_onnx(mlp_model(tmp_path / "m.onnx"), FEEDS)
    fused = fuse(imported.raw, info.target)
    library = tmp_path / "out" / "model.so"
    library.parent.mkdir()
    build(fused, info.target).export_library(str(library))
    write_sidecar(library, inputs=imported.inputs, outputs=imported.outputs, target=info.spec,
                  isa_requires=list(info.isa_requires), tvm_version="test", tuning=None,
                  kernels=count_scheduled(fused).to_json())  # fmt: skip
    with pytest.raises(BackendUnavailable, match=r"compiled for x86-64-v4 .* lacks: .*avx512f"):
        TvmBackend(library, {})


def test_missing_sidecar_and_bad_settings(tuned: dict[str, Any], tmp_path: Path) -> None:
    from optimize.errors import ModelError
    from optimize.runtimes.tvm.backend import TvmBackend

    (cand,) = tuned["candidates"]
    lonely = tmp_path / "model.so"
    lonely.write_bytes(cand.model_path.read_bytes())
    with pytest.raises(ModelError, match=r"no tvm_module\.json beside it"):
        TvmBackend(lonely, {})
    with pytest.raises(UsageError, match="unknown tvm setting 'threads'"):
        TvmBackend(cand.model_path, {"threads": 2})
