"""The KServe v2 server's own limits against a hostile client (issue 26): bodies that are declared
and never sent hold nothing, routes that take no body refuse one on the head, JSON has a cap of
its own, and the protocol's booleans and integers are read strictly."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from optimize.serve.batcher import Batcher
from optimize.serve.server import InferenceServer, ServerConfig
from tests.serve.helpers import SleepBackend
from tests.serve.test_server import infer_json
from tests.serve.test_under_load import post_head, raw_http, serve, x


async def infer_ok(client: Any, value: float = 3.0) -> None:
    response = await client.post("/v2/models/m/infer", json=infer_json(x(value)))
    assert response.status == 200
    assert (await response.json())["outputs"][0]["data"] == [value * 2 + 1] * 4


def test_declared_bodies_never_sent_hold_nothing_and_normal_requests_get_200() -> None:
    """Found: ~20 connections declaring a Content-Length and sending nothing, 3 idle chunked
    uploads, or 256 header-only requests made every normal infer get 503 for 30 s."""

    async def body(client: Any, batcher: Batcher, server: InferenceServer) -> None:
        idle = []
        heads = [post_head(60_000_000)] * 30
        heads += [b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"] * 5
        heads += [post_head(1000)] * 300  # more than --max-inflight 256
        for head in heads:
            _, writer = await asyncio.open_connection("127.0.0.1", client.port)
            writer.write(head)
            idle.append(writer)
        await asyncio.sleep(0.2)
        try:
            for value in range(5):
                await infer_ok(client, value)
            assert client.http.body_bytes < 10_000  # only what normal requests are sending
        finally:
            for writer in idle:
                writer.transport.abort()

    serve([SleepBackend(base_ms=1)], body)


def test_routes_that_take_no_body_refuse_one_on_the_head() -> None:
    async def body(client: Any, batcher: Batcher, server: InferenceServer) -> None:
        # 40 MB declared to a GET route: answered on the head (405), nothing of it read or kept.
        answer = await raw_http(client.port, post_head(40_000_000, "/v2/health/live"), b"")
        assert answer.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in answer
        answer = await raw_http(client.port, post_head(40_000_000, "/nowhere"), b"")
        assert answer.startswith(b"HTTP/1.1 404")
        get_with_body = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
        answer = await raw_http(client.port, get_with_body, b"", closes=True)
        assert answer.startswith(b"HTTP/1.1 413") and b"takes no request body" in answer
        assert client.http.body_bytes == 0
        await infer_ok(client)

    serve([SleepBackend(base_ms=1)], body)


def test_json_has_a_cap_of_its_own_and_binary_tensors_do_not() -> None:
    async def body(client: Any, batcher: Batcher, server: InferenceServer) -> None:
        answer = await raw_http(client.port, post_head(5000), b"", closes=True)
        assert answer.startswith(b"HTTP/1.1 413")
        assert "binary tensor data extension" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        # A binary request whose JSON part is small passes, however large its tensor bytes.
        big = np.ones((1, 4), np.float32)
        header = json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
                ]
            }
        ).encode()
        response = await client.post(
            "/v2/models/m/infer",
            data=header + big.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert response.status == 200
        await infer_ok(client)

    serve([SleepBackend(base_ms=1)], body, server_config=ServerConfig(model_name="m", max_json_bytes=1000))


def test_booleans_and_integers_of_the_protocol_are_strict() -> None:
    async def body(client: Any, batcher: Batcher, server: InferenceServer) -> None:
        for params, expected in (
            ({"binary_data_output": "false"}, "binary_data_output must be true or false"),
            ({"binary_data_output": 1}, "binary_data_output must be true or false"),
        ):
            response = await client.post("/v2/models/m/infer", json=infer_json(x(), **params))
            assert response.status == 400 and expected in (await response.json())["error"]
        request = infer_json(x())
        request["outputs"] = [{"name": "y", "parameters": {"binary_data": "true"}}]
        response = await client.post("/v2/models/m/infer", json=request)
        assert (
            response.status == 400 and "binary_data must be true or false" in (await response.json())["error"]
        )
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1, 4],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": True},
                    }
                ]
            }
        ).encode()
        response = await client.post(
            "/v2/models/m/infer",
            data=header + b"\0",
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert (
            response.status == 400
            and "binary_data_size must be a non-negative integer" in (await response.json())["error"]
        )

    serve([SleepBackend(base_ms=1)], body)
