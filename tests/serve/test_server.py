"""The KServe v2 HTTP server: endpoints, JSON and binary tensors, every error answer, metrics, drain,
and a round trip with the stock tritonclient against a running `lto serve`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.backend import Backend
from optimize.runtimes.backends import open_backend
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.protocol import HEADER_LENGTH, decode_response, encode_request
from optimize.serve.server import InferenceServer, ServerConfig
from tests.cli_helpers import ROOT
from tests.conftest import make_matmul_model
from tests.serve.helpers import LocalClient, SleepBackend

LONG = 60_000.0


def with_client(
    backends: list[Backend],
    body: Callable[[Any, Batcher], Awaitable[Any]],
    config: BatcherConfig | None = None,
    max_body: int = 1 << 20,
) -> Any:
    """Run `body(client, batcher)` against an in-process server on a free port."""

    async def main() -> Any:
        batcher = Batcher(backends, config or BatcherConfig(max_wait_ms=1, target_latency_ms=LONG))
        await batcher.start()
        server = InferenceServer(batcher, ServerConfig(model_name="m", max_body_bytes=max_body))
        server.ready = True
        client = await LocalClient(server).start()
        try:
            return await body(client, batcher)
        finally:
            await client.close()
            if batcher.accepting:
                await batcher.drain()

    return asyncio.run(asyncio.wait_for(main(), timeout=120))


def infer_json(feeds: dict[str, np.ndarray], **params: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.reshape(-1).tolist()}
            for k, v in feeds.items()
        ],
        **({"parameters": params} if params else {}),
    }


@pytest.fixture
def ort_model(tmp_path: Path) -> tuple[Path, Backend]:
    path = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    return path, open_backend("onnxruntime", path, {"intra_op_num_threads": 1})


def test_health_metadata_and_ready() -> None:
    async def body(client: Any, batcher: Batcher) -> None:
        assert (await client.get("/v2/health/live")).status == 200
        assert (await client.get("/v2/health/ready")).status == 200
        meta = await (await client.get("/v2")).json()
        assert meta["name"] == "lto" and "binary_tensor_data" in meta["extensions"]
        model = await (await client.get("/v2/models/m")).json()
        assert model["inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [-1, 4], "lto_dim_names": ["batch", None]}
        ]
        assert [o["name"] for o in model["outputs"]] == ["y", "s"]
        assert (await client.get("/v2/models/m/ready")).status == 200
        assert (await client.get("/v2/models/m/versions/1/ready")).status == 200
        missing = await client.get("/v2/models/other/ready")
        assert missing.status == 404 and "other" in (await missing.json())["error"]

    with_client([SleepBackend()], body)


def test_json_and_binary_infer_match_a_direct_onnxruntime_call(ort_model: tuple[Path, Backend]) -> None:
    path, backend = ort_model
    reference = open_backend("onnxruntime", path, {"intra_op_num_threads": 1})
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    expected = reference.run({"x": x})["y"]

    async def body(client: Any, batcher: Batcher) -> None:
        resp = await client.post("/v2/models/m/infer", json={**infer_json({"x": x}), "id": "r1"})
        assert resp.status == 200, await resp.text()
        out = await resp.json()
        assert out["id"] == "r1" and out["model_name"] == "m"
        y = np.asarray(out["outputs"][0]["data"], np.float32).reshape(out["outputs"][0]["shape"])
        np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
        timing = resp.headers["Server-Timing"]
        for phase in ("decode", "queue", "batch", "model", "encode", "total"):
            assert re.search(rf"{phase};dur=[0-9.]+", timing), timing
        assert 'rows;desc="3"' in timing

        raw, head_len = encode_request({"x": x}, binary=True, binary_outputs=True)
        resp = await client.post(
            "/v2/models/m/versions/1/infer", data=raw, headers={HEADER_LENGTH: str(head_len)}
        )
        assert resp.status == 200, await resp.text()
        outputs = decode_response(await resp.read(), int(resp.headers[HEADER_LENGTH]))
        np.testing.assert_array_equal(outputs["y"], expected)

    with_client([backend], body)


BAD_REQUESTS: list[tuple[str, Any, dict[str, str], str]] = [
    ("malformed JSON", b"{not json", {}, "malformed JSON"),
    ("no inputs", {"inputs": []}, {}, "no 'inputs'"),
    ("unknown input", {"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}, {},
     "unknown input 'z'"),
    ("wrong dtype", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT64", "data": [0] * 4}]}, {},
     "'x' has datatype 'INT64', the model expects 'FP32'"),
    ("wrong rank", {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [0] * 4}]}, {},
     "'x' has shape [4], the model expects rank 2"),
    ("wrong fixed dim", {"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [0] * 5}]}, {},
     "'x' has shape [1, 5], the model expects 4 on axis 1"),
    ("wrong element count", {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0] * 5}]},
     {}, "'x' has 5 elements, shape [2, 4] needs 8"),
    ("string data", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ["1.5"] * 4}]},
     {}, "'x': data holds \"1.5\", float32 needs numbers"),
    ("null data", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, None, 4]}]},
     {}, "'x': data holds null"),
    ("boolean data", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, True, 3]}]},
     {}, "'x': data holds true"),
    ("ragged data", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2], [3]]}]},
     {}, "'x': data is not a (nested) list"),
    ("data deeper than shape", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                            "data": [[[1, 2, 3, 4]]]}]}, {}, "nested deeper than its shape"),
    ("boolean in shape", {"inputs": [{"name": "x", "shape": [True, 4], "datatype": "FP32", "data": [0] * 4}]},
     {}, "needs a 'shape' list of non-negative integers"),
    ("JSON nested 1000 deep", b'{"inputs": ' + b"[" * 1000 + b"]" * 1000 + b"}", {}, "needs a 'name'"),
    ("JSON nested 5000 deep", b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", {}, "malformed JSON"),
    ("NaN in data", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
     b'"data": [NaN, 1, 2, 3]}]}', {}, "malformed JSON"),
    ("NaN deadline", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 1]}], '
     b'"parameters": {"deadline_ms": NaN}}', {}, "malformed JSON"),
    ("infinite deadline", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
     b'"data": [0, 1, 2, 3]}], "parameters": {"deadline_ms": 1e999}}', {},
     "number is infinity"),
    ("output parameters not an object", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
     "data": [0] * 4}], "outputs": [{"name": "y", "parameters": [1]}]}, {}, "'parameters' must be an object"),
    ("unknown output", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}],
                        "outputs": [{"name": "nope"}]}, {}, "unknown output 'nope'"),
    ("binary size mismatch", "binary", {}, "'x' has 12 bytes of data"),
    ("bad header length", b'{"inputs": []}', {HEADER_LENGTH: "999"}, "the body has 14 bytes"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_400_naming_the_problem(case: tuple[str, Any, dict[str, str], str]) -> None:
    _, payload, headers, message = case
    if payload == "binary":
        head = json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 12}}
                ]
            }
        ).encode()
        payload, headers = head + b"\0" * 12, {HEADER_LENGTH: str(len(head))}

    async def body(client: Any, batcher: Batcher) -> None:
        if isinstance(payload, bytes):
            resp = await client.post("/v2/models/m/infer", data=payload, headers=headers)
        else:
            resp = await client.post("/v2/models/m/infer", json=payload)
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert message in error, error
        metrics = await (await client.get("/metrics")).text()
        assert 'lto_requests_total{outcome="bad_request"} 1.0' in metrics

    with_client([SleepBackend()], body)


def test_bad_requests_do_not_disturb_good_ones_in_the_same_batch() -> None:
    backend = SleepBackend(base_ms=1)
    good = [np.full((1, 4), float(i), np.float32) for i in range(6)]

    async def body(client: Any, batcher: Batcher) -> list[Any]:
        async def send(payload: dict[str, Any]) -> tuple[int, Any]:
            resp = await client.post("/v2/models/m/infer", json=payload)
            return resp.status, await resp.json()

        bad = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2]}]}
        tasks = [send(infer_json({"x": g})) for g in good] + [send(bad) for _ in range(3)]
        return await asyncio.gather(*tasks)

    results = with_client(
        [backend], body, BatcherConfig(max_batch=6, max_wait_ms=500, target_latency_ms=LONG)
    )
    for g, (status, out) in zip(good, results[:6], strict=True):
        assert status == 200
        np.testing.assert_array_equal(np.asarray(out["outputs"][0]["data"], np.float32), (g * 2 + 1).ravel())
    assert [status for status, _ in results[6:]] == [400, 400, 400]
    assert sum(backend.calls) == 6


def test_oversized_body_gets_413() -> None:
    big = np.zeros((300, 4), np.float32)
    raw, head_len = encode_request({"x": big})

    async def body(client: Any, batcher: Batcher) -> None:
        resp = await client.post("/v2/models/m/infer", data=raw, headers={HEADER_LENGTH: str(head_len)})
        assert resp.status == 413
        assert "exceeds the limit of 2048 bytes" in (await resp.json())["error"]

    with_client([SleepBackend()], body, max_body=2048)


# timing: whether the late request is refused on admission (503) or expires queued (504) depends on
# the model latency the batcher measured, which a test beside it on the other core stretches.
@pytest.mark.timing
def test_overload_gets_503_with_retry_after_and_a_missed_deadline_504() -> None:
    gate = threading.Event()
    backend = SleepBackend(base_ms=1, gate=gate)
    x = np.zeros((1, 4), np.float32)

    async def body(client: Any, batcher: Batcher) -> None:
        first = asyncio.ensure_future(client.post("/v2/models/m/infer", json=infer_json({"x": x})))
        while batcher.inflight_batches == 0:
            await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(client.post("/v2/models/m/infer", json=infer_json({"x": x})))
                  for _ in range(2)]  # fmt: skip
        while batcher.queued_rows < 2:
            await asyncio.sleep(0.01)
        shed = await client.post("/v2/models/m/infer", json=infer_json({"x": x}))
        assert shed.status == 503
        assert int(shed.headers["Retry-After"]) >= 1
        assert "queue full" in (await shed.json())["error"]
        gate.set()
        assert [r.status for r in await asyncio.gather(first, *queued)] == [200, 200, 200]

        gate.clear()
        blocker = asyncio.ensure_future(client.post("/v2/models/m/infer", json=infer_json({"x": x})))
        while batcher.inflight_batches == 0:
            await asyncio.sleep(0.01)
        late = await client.post(
            "/v2/models/m/infer", json=infer_json({"x": x}, timeout=20_000)
        )  # 20 ms in µs
        assert late.status == 504
        assert "deadline" in (await late.json())["error"]
        gate.set()
        assert (await blocker).status == 200

        metrics = await (await client.get("/metrics")).text()
        assert 'lto_requests_total{outcome="ok"} 4.0' in metrics
        assert 'lto_requests_total{outcome="overloaded"} 1.0' in metrics
        assert 'lto_requests_total{outcome="timeout"} 1.0' in metrics

    with_client(
        [backend], body, BatcherConfig(max_batch=8, max_wait_ms=0, target_latency_ms=LONG, max_queue=2)
    )


def test_metrics_count_requests_batches_and_latency() -> None:
    backend = SleepBackend(base_ms=1)
    x = np.zeros((1, 4), np.float32)

    async def body(client: Any, batcher: Batcher) -> str:
        await asyncio.gather(
            *(client.post("/v2/models/m/infer", json=infer_json({"x": x})) for _ in range(4))
        )
        await client.post("/v2/models/nope/infer", json=infer_json({"x": x}))
        resp = await client.get("/metrics")
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        return await resp.text()

    text = with_client([backend], body, BatcherConfig(max_batch=4, max_wait_ms=LONG, target_latency_ms=LONG))
    assert 'lto_requests_total{outcome="ok"} 4.0' in text
    assert 'lto_requests_total{outcome="not_found"} 1.0' in text
    assert "lto_request_latency_seconds_count 4.0" in text
    assert "lto_batch_size_rows_count 1.0" in text and "lto_batch_size_rows_sum 4.0" in text
    assert "lto_model_seconds_count 1.0" in text
    assert "lto_queue_depth_rows 0.0" in text


def test_drain_answers_in_flight_requests_and_refuses_new_ones() -> None:
    # The CLI's path (SIGTERM -> drain -> exit) is tested end to end below.
    backend = SleepBackend(base_ms=50)
    x = np.zeros((1, 4), np.float32)

    async def body(client: Any, batcher: Batcher) -> None:
        pending = [asyncio.ensure_future(client.post("/v2/models/m/infer", json=infer_json({"x": x})))
                   for _ in range(5)]  # fmt: skip
        while batcher.queued_rows + batcher.inflight_batches == 0:
            await asyncio.sleep(0.005)
        drain = asyncio.ensure_future(batcher.drain())
        await asyncio.sleep(0)
        refused = await client.post("/v2/models/m/infer", json=infer_json({"x": x}))
        assert refused.status == 503 and "shutting down" in (await refused.json())["error"]
        assert (await client.get("/v2/health/ready")).status == 503
        assert [r.status for r in await asyncio.gather(*pending)] == [200] * 5
        await drain

    with_client([backend], body, BatcherConfig(max_batch=2, max_wait_ms=LONG, target_latency_ms=LONG))


# ----------------------------------------------------------------------------- end to end: `lto serve`
def _start_serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimize", "serve", *args, "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if match:
            return proc, match.group(1)
    proc.kill()
    raise AssertionError(f"lto serve did not start: {proc.stdout.read()}")


def test_tritonclient_round_trip_matches_onnxruntime(tmp_path: Path) -> None:
    tritonclient_http = pytest.importorskip("tritonclient.http")
    path = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    proc, url = _start_serve(str(path), "--name", "tiny")
    try:
        client = tritonclient_http.InferenceServerClient(url.removeprefix("http://"))
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
        meta = client.get_model_metadata("tiny")
        assert meta["inputs"][0]["name"] == "x"
        x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
        reference = open_backend("onnxruntime", path).run({"x": x})["y"]
        for binary in (True, False):
            inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = tritonclient_http.InferRequestedOutput("y", binary_data=binary)
            result = client.infer("tiny", [inp], outputs=[out])
            np.testing.assert_allclose(result.as_numpy("y"), reference, rtol=1e-6, atol=1e-6)
        bad = tritonclient_http.InferInput("x", [2, 5], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 5), np.float32))
        with pytest.raises(Exception, match="expects 16 on axis 1"):
            client.infer("tiny", [bad])
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.slow
def test_sigterm_drains_the_request_in_flight_then_exits_cleanly(tmp_path: Path) -> None:
    import urllib.request

    path = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    # A request waits up to 1.5 s for company, so it is surely in flight when SIGTERM lands.
    proc, url = _start_serve(
        str(path), "--name", "tiny", "--max-wait-ms", "1500", "--target-latency-ms", "60000"
    )
    x = np.ones((1, 16), np.float32)
    body = json.dumps(infer_json({"x": x})).encode()
    answer: dict[str, Any] = {}

    def send() -> None:
        req = urllib.request.Request(f"{url}/v2/models/tiny/infer", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer["status"] = resp.status
            answer["body"] = json.loads(resp.read())

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    thread.join(timeout=60)
    out, _ = proc.communicate(timeout=60)
    assert answer.get("status") == 200
    reference = open_backend("onnxruntime", path).run({"x": x})["y"]
    np.testing.assert_allclose(np.asarray(answer["body"]["outputs"][0]["data"]), reference.ravel(), rtol=1e-6)
    assert proc.returncode == 0, out
    assert "drained: 1 requests answered" in out


class ThreadRecording(SleepBackend):
    """SleepBackend that records the thread each call ran on."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.threads: list[str] = []

    def run(self, feeds: Any) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        return super().run(feeds)


def test_a_lone_short_request_runs_on_the_loop_and_batched_work_on_the_model_thread() -> None:
    backend = ThreadRecording(base_ms=1)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)

    async def body(client: Any, batcher: Batcher) -> None:
        for _ in range(3):  # one at a time: each is the only request in the server
            resp = await client.post("/v2/models/m/infer", json=infer_json({"x": x}))
            assert resp.status == 200
            assert (await resp.json())["outputs"][0]["data"] == (x * 2 + 1).ravel().tolist()
        # Called directly (not known to be alone), as under load: the model thread, batched.
        results = await asyncio.gather(*(batcher.submit({"x": x + i}) for i in range(4)))
        for i, r in enumerate(results):
            np.testing.assert_array_equal(r.outputs["y"], (x + i) * 2 + 1)

    # A generous inline_max_ms: a loaded test machine can stretch a 1 ms sleep past 10 ms.
    config = BatcherConfig(max_batch=8, max_wait_ms=5, target_latency_ms=LONG, inline_max_ms=1000)
    with_client([backend], body, config)
    main = threading.main_thread().name
    # The first runs on the model thread: nothing has measured the model yet.
    assert backend.threads[0].startswith("lto-model") and backend.threads[1:3] == [main, main]
    assert all(t.startswith("lto-model") for t in backend.threads[3:]) and len(backend.threads) >= 4

    off = ThreadRecording(base_ms=1)
    with_client(
        [off], body, BatcherConfig(max_batch=8, max_wait_ms=5, target_latency_ms=LONG, inline_max_ms=0)
    )
    assert all(t.startswith("lto-model") for t in off.threads)
