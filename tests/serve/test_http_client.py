"""`lto load`'s HTTP client against small servers that answer in each way HTTP/1.1 allows."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from optimize.errors import UsageError
from optimize.serve.http_client import HttpAnswer, HttpClient, HttpClientError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


def _run(
    handler: Handler, client_calls: Callable[[HttpClient], Awaitable[object]], timeout_s: float = 5
) -> object:
    async def main() -> object:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}", timeout_s=timeout_s)
        try:
            return await client_calls(client)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def test_keep_alive_answers_reuse_one_connection_and_keep_their_headers() -> None:
    connections: list[int] = []
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                request = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            seen.append(request)
            body = request.rsplit(b"\r\n\r\n", 1)[1][::-1]
            writer.write(
                b"HTTP/1.1 200 OK\r\nServer-Timing: model;dur=1.5\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            await writer.drain()
        writer.close()

    async def calls(client: HttpClient) -> list[HttpAnswer]:
        request = client.encode(
            "POST", "/v2/models/m/infer", {"Content-Type": "application/octet-stream"}, b"abc"
        )
        return [await client.send(request) for _ in range(3)]

    answers = _run(handler, calls)
    assert isinstance(answers, list)
    assert [a.status for a in answers] == [200] * 3 and all(a.body == b"cba" for a in answers)
    assert answers[0].headers["server-timing"] == "model;dur=1.5"
    assert len(connections) == 1  # one connection carried all three
    assert seen[0].startswith(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 3\r\n" in seen[0] and seen[0].endswith(b"\r\n\r\nabc")


def test_chunked_answers_and_a_closing_server_are_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nRetry-After: 1\r\n\r\n")
        writer.write(b"4\r\nbusy\r\n6\r\n, wait\r\n0\r\n\r\n")
        await writer.drain()
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def calls(client: HttpClient) -> tuple[HttpAnswer, HttpAnswer, int]:
        request = client.encode("GET", "/v2/health/ready", {})
        first = await client.send(request)
        second = await client.send(request)
        await asyncio.sleep(0.05)
        return first, second, len(client._open)

    first, second, still_open = _run(handler, calls)  # type: ignore[misc]
    assert (first.status, first.body, first.headers["retry-after"]) == (503, b"busy, wait", "1")
    assert (second.status, second.body) == (200, b"ok")
    assert still_open == 0  # `Connection: close` is honoured: the next request opens a new one


def test_failures_are_one_exception_each_never_a_hang() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")  # then closes
        await writer.drain()
        writer.close()

    async def garbles(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def send_one(client: HttpClient) -> HttpAnswer:
        return await client.send(client.encode("GET", "/", {}))

    with pytest.raises(HttpClientError, match="closed the connection"):
        _run(hangs_up, send_one)
    with pytest.raises(HttpClientError, match="malformed answer"):
        _run(garbles, send_one)
    with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
        _run(never_answers, send_one, timeout_s=0.2)

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def refused() -> HttpAnswer:
        return await HttpClient(f"http://127.0.0.1:{port}").send(b"GET / HTTP/1.1\r\n\r\n")

    with pytest.raises(HttpClientError, match="cannot connect"):
        asyncio.run(refused())
    with pytest.raises(UsageError, match="not an http://HOST:PORT URL"):
        HttpClient("https://example.com")
