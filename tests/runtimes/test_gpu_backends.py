"""Every GPU backend, opened through the runtime registry, refuses to open without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimize.errors import BackendUnavailable
from optimize.system import gpu
from tests.runtimes.tensorrt.helpers import NO_GPU, mlp_model


@pytest.mark.parametrize("kind", ["tensorrt", "onnxruntime-cuda", "onnxruntime-trt"])
def test_gpu_backends_refuse_to_open_without_a_gpu(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimize.runtimes.backends import open_backend

    monkeypatch.setattr(gpu, "gpu_status", lambda: NO_GPU)
    model = mlp_model(tmp_path / "m.onnx")
    path = model if kind != "tensorrt" else tmp_path / "m.engine"
    if kind == "tensorrt":
        path.write_bytes(b"not really an engine")
    with pytest.raises(BackendUnavailable) as err:
        open_backend(kind, path, {})
    assert "needs an NVIDIA GPU" in err.value.message and "libcuda.so.1" in err.value.message
