"""An exported repository served by a real tritonserver (the binary of the nvidia-pytriton wheel,
fetched once into lto's cache; skipped with the reason where it cannot be had or run).

--backend python: the artifact in lto's runtime inside Triton's python backend, batched by Triton's
dynamic batcher: ready, its config as exported, its answers equal to `lto serve`'s, requests
batched under load, a clean shutdown. Native exports: Triton parses their configuration and refuses
them only for the backend the wheel does not ship.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import tritonserver
from optimize.errors import BackendUnavailable
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model
from tests.serve.test_server import _start_serve

pytestmark = [pytest.mark.slow, pytest.mark.network]

RECIPE = """order = ["operator-fusion"]
[stages.operator-fusion]
levels = ["extended"]
[accuracy]
samples = 4
[bench]
warmup = 2
min_runs = 10
max_runs = 300
max_time_s = 0.5
"""


@pytest.fixture(scope="module")
def server_install(tmp_path_factory: pytest.TempPathFactory) -> tritonserver.Install:
    try:
        return tritonserver.install()
    except BackendUnavailable as exc:
        pytest.skip(f"no tritonserver here: {exc.one_line()}")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("artifact")
    model = make_matmul_model(work / "tiny.onnx", features=16, out=4, extra_work=8)
    (work / "r.toml").write_text(RECIPE)
    out = work / "art"
    proc = run_cli("optimize", model, "--recipe", work / "r.toml", "-o", out, "--time-budget", "none")
    assert proc.returncode == 0, proc.stderr
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _post(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_a_python_backend_export_serves_as_lto_serve_does(
    server_install: tritonserver.Install, artifact: Path, tmp_path: Path
) -> None:
    tritonclient_http = pytest.importorskip("tritonclient.http")
    repo = tmp_path / "repo"
    proc = run_cli("export", artifact, "--triton", repo, "--name", "m", "--backend", "python",
                   "--measure-batches", "1,2,4,8", "--measure-time", "0.3s", "--slo-ms", "50",
                   "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    exported = json.loads(proc.stdout)
    assert exported["config"]["backend"] == "python" and exported["config"]["dynamic_batching"]
    assert (repo / "m" / "1" / "model.py").is_file() and (
        repo / "m" / "1" / "artifact" / "manifest.json"
    ).is_file()

    try:
        server = tritonserver.start(server_install, repo, tmp_path / "triton.log", python_path=sys.path)
    except BackendUnavailable as exc:
        pytest.skip(f"tritonserver cannot run the python backend here: {exc.one_line()}")
    lto_proc, lto_url = _start_serve("--artifact", str(artifact), "--name", "m")
    try:
        # Its configuration is the one lto exported.
        config = _get(f"{server.url}/v2/models/m/config")
        assert config["backend"] == "python"
        assert config["max_batch_size"] == exported["config"]["max_batch_size"] > 1
        assert [i["name"] for i in config["input"]] == ["x"] and [o["name"] for o in config["output"]] == [
            "y"
        ]
        assert [int(d) for d in config["input"][0]["dims"]] == [16]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] > 0

        # tritonclient's answer equals lto serve's, rows of a batch of 3 included.
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        answers = []
        for url in (server.url, lto_url):
            client = tritonclient_http.InferenceServerClient(url.removeprefix("http://"))
            tensor = tritonclient_http.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            answers.append(client.infer("m", [tensor]).as_numpy("y"))
            client.close()
        np.testing.assert_allclose(answers[0], answers[1], rtol=1e-5, atol=1e-6)

        # Under load, Triton's dynamic batcher hands the model several requests per execution.
        before = _get(f"{server.url}/v2/models/m/stats")["model_stats"][0]
        load = run_cli("load", server.url, "--model", "m", "--concurrency", "8", "--duration", "2s",
                       "--warmup", "5", "--shape", "x=1x16", "--json")  # fmt: skip
        assert load.returncode == 0, load.stderr
        after = _get(f"{server.url}/v2/models/m/stats")["model_stats"][0]
        requests = int(after["inference_count"]) - int(before["inference_count"])
        executions = int(after["execution_count"]) - int(before["execution_count"])
        assert requests > 0 and executions < requests, (requests, executions)
        (run,) = json.loads(load.stdout)["load"]["runs"]
        assert run["completed_ok"] > 0 and not run["errors"], run["errors"]
    finally:
        lto_proc.terminate()
        lto_proc.wait(30)
        code = server.stop()
    # A clean shutdown: SIGTERM unloads the model (finalize closes lto's backend) and exits 0.
    assert code == 0, server.log_text()[-2000:]
    assert "successfully unloaded" in server.log_text().lower() or "unloading" in server.log_text().lower()


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_native_exports_are_refused_only_for_the_missing_backend(
    server_install: tritonserver.Install,
    make_artifact: Any,
    artifact: Path,
    tmp_path: Path,
    backend: str,
) -> None:
    source = artifact if backend == "onnxruntime" else make_artifact(backend="openvino")
    repo = tmp_path / "repo"
    proc = run_cli("export", source, "--triton", repo, "--name", "m")
    assert proc.returncode == 0, proc.stderr
    server = tritonserver.start(
        server_install, repo, tmp_path / "triton.log", extra_args=["--exit-on-error=false"], wait_ready=False
    )
    try:
        deadline = time.monotonic() + 60
        index: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                index = _post(f"{server.url}/v2/repository/index")
            except OSError:
                index = []
            if index and index[0].get("state") in ("UNAVAILABLE", "READY"):
                break
            time.sleep(0.25)
        (model,) = index
        assert model["state"] == "UNAVAILABLE", model
        # Refused for the backend the wheel does not ship: Triton parsed the configuration and looked
        # for the backend it names.
        assert f"unable to find backend library for backend '{backend}'" in model["reason"], model["reason"]
    finally:
        server.stop()
