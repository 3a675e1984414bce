"""ONNX Runtime's GPU backends (optimize/runtimes/onnxruntime/gpu_backend.py): onnxruntime-cuda and
onnxruntime-trt must run on the GPU or refuse, never fall back to the CPU silently.

Runs everywhere; the tests marked `needs_gpu` run only on a GPU machine (`scripts/gpu_check.sh`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optimize.errors import BackendUnavailable
from optimize.system import gpu
from tests.cli_helpers import ROOT
from tests.runtimes.tensorrt.helpers import FAKE_GPU, SAMPLES, mlp_model, needs_gpu, reference


def test_ort_cuda_backend_refuses_a_cpu_only_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort

    from optimize.runtimes.backends import open_backend

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    monkeypatch.setattr(gpu, "gpu_status", lambda: FAKE_GPU)
    with pytest.raises(BackendUnavailable) as err:
        open_backend("onnxruntime-cuda", mlp_model(tmp_path / "m.onnx"), {})
    assert "has no CUDAExecutionProvider" in err.value.message
    assert "onnxruntime-gpu" in (err.value.hint or "")


@needs_gpu
def test_gpu_ort_cuda_matches_cpu_and_stays_on_gpu(tmp_path: Path) -> None:
    import onnxruntime as ort

    from optimize.runtimes.backends import open_backend

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    model = SAMPLES / "mlp_small.onnx"
    feeds = {"features": np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)}
    with open_backend("onnxruntime-cuda", model, {"allow_cpu_nodes": True}) as be:
        got = be.run(feeds)
        assert be.describe()["providers"][0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(got["logits"], reference(model, feeds)["logits"], rtol=1e-3, atol=1e-3)


@needs_gpu
def test_gpu_ort_cuda_with_devices_hidden_fails_closed(tmp_path: Path) -> None:
    """With CUDA_VISIBLE_DEVICES empty, onnxruntime-gpu would fall back to the CPU; lto must refuse."""
    code = (
        "from optimize.runtimes.backends import open_backend\n"
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
    """onnxruntime-gpu lists CUDA where it cannot run it (docs/onnxruntime.md#gpu-providers): the
    session must not run on the CPU."""
    import onnxruntime as ort

    from optimize.runtimes.backends import open_backend

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
