"""The bare reference server the serve benchmarks compare lto serve with: it must give the model's
own answers over KServe v2, or the comparison measures a server that does less than lto serve."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bare_server import BareConnection, BareModel
from optimize.runtimes.backends import open_backend
from optimize.serve.http_client import HttpClient
from optimize.serve.protocol import HEADER_LENGTH, decode_response, encode_request

MLP = Path(__file__).resolve().parents[2] / "sample_models" / "mlp_small.onnx"


def _exchange(model: BareModel, requests: list[tuple[str, str, dict[str, str], bytes]]) -> list[Any]:
    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: BareConnection(model), "127.0.0.1", 0)
        client = HttpClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=10)
        try:
            return [await client.send(client.encode(*request)) for request in requests]
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(body())


def test_answers_are_the_models_own_over_binary_and_json_tensors() -> None:
    backend = open_backend("onnxruntime", MLP)
    model = BareModel(backend)
    name = backend.inputs[0].name
    features = np.random.default_rng(0).random((3, backend.inputs[0].shape[1]), dtype=np.float32)
    expected = backend.run({name: features})
    binary, head_len = encode_request({name: features}, binary=True, binary_outputs=True)
    as_json, _ = encode_request({name: features}, binary=False, binary_outputs=False)
    infer = "/v2/models/m/infer"
    octets = {HEADER_LENGTH: str(head_len), "Content-Type": "application/octet-stream"}
    answers = _exchange(
        model,
        [
            ("POST", infer, octets, binary),
            ("POST", infer, {"Content-Type": "application/json"}, as_json),
            ("GET", "/v2/models/m", {}, b""),
        ],
    )
    for answer in answers[:2]:
        assert answer.status == 200
        length = answer.headers.get(HEADER_LENGTH.lower())
        outputs = decode_response(answer.body, int(length) if length is not None else None)
        assert set(outputs) == set(expected)
        for out_name, value in expected.items():
            np.testing.assert_allclose(outputs[out_name], value, rtol=1e-6, atol=1e-6)
        # The same phases as lto serve's Server-Timing, so lto load splits both alike.
        timing = answer.headers["server-timing"]
        assert all(f"{phase};dur=" in timing for phase in ("decode", "queue", "model", "encode", "total"))
    assert answers[2].status == 200
    assert b'"inputs"' in answers[2].body


def test_a_request_the_model_cannot_take_is_a_400_and_an_unknown_path_a_404() -> None:
    backend = open_backend("onnxruntime", MLP)
    model = BareModel(backend)
    wrong, head_len = encode_request({backend.inputs[0].name: np.zeros((2,), np.float32)})
    answers = _exchange(
        model,
        [
            ("POST", "/v2/models/m/infer", {HEADER_LENGTH: str(head_len)}, wrong),
            ("GET", "/v2/models/other", {}, b""),
        ],
    )
    assert answers[0].status == 400
    assert b"rank" in answers[0].body
    assert answers[1].status == 404
