"""The HTTP/1.1 layer under `lto serve` (optimize/serve/http_layer.py), through a real socket: order of
answers, refusals before the body, limits, timeouts, malformed input and hang-ups."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from optimize.serve.clock import Clock
from optimize.serve.http_layer import HttpApplication, HttpLimits, HttpRequest, HttpResponse, HttpServer
from tests.serve.fake_clock import FakeClock


class EchoApp(HttpApplication):
    """GET /fast answers at once; POST /slow?ms=N answers its body after N ms; POST /gated answers
    its body once the test opens `gate`; POST /refuse is refused on its headers; every admitted
    POST reserves one slot until its exchange ends."""

    def __init__(self, **limits: Any) -> None:
        self.limits = HttpLimits(**{"max_body_bytes": 1 << 20, "read_timeout_s": 5.0,
                                    "max_client_body_bytes": 1 << 20, "max_inflight_body_bytes": 1 << 20,
                                    **limits})  # fmt: skip
        self.held = 0
        self.handled: list[HttpRequest] = []
        self.server: HttpServer | None = None  # set by `run`
        self.counts: dict[str, int] = {}
        self.cancelled = 0
        self.gate = asyncio.Event()  # holds /gated requests until the test sets it

    def admit(self, request: HttpRequest) -> HttpResponse | None:
        if request.path == "/refuse":
            return HttpResponse(503, b'{"error": "busy"}', headers={"Retry-After": "1"})
        if request.method == "POST":
            self.held += 1

            def release() -> None:
                self.held -= 1

            request.on_end = release
        return None

    def handle(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        self.handled.append(request)
        if request.path == "/fast":
            return HttpResponse(200, b'{"fast": true}')
        if request.path == "/big":
            return HttpResponse(200, b"x" * 65536, "application/octet-stream")
        if request.path == "/headers":
            fields = {"headers": request.headers, "trailers": request.trailers}
            return HttpResponse(200, json.dumps(fields).encode())
        if request.path == "/slow":
            return self._slow(request)
        if request.path == "/gated":
            return self._gated(request)
        if request.path == "/catch":
            return self._catch()
        if request.path == "/raise":
            return self._raise()
        return HttpResponse(404, b'{"error": "not found"}')

    async def _catch(self) -> HttpResponse:
        """Waits on a future that fails, then on a bare yield, and answers what it caught."""
        failing = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, failing.set_exception, ValueError("from the future"))
        try:
            await failing
        except ValueError as exc:
            await asyncio.sleep(0)
            return HttpResponse(200, str(exc).encode())
        return HttpResponse(200, b"not raised")

    async def _raise(self) -> HttpResponse:
        await asyncio.sleep(0.01)
        raise RuntimeError("handler bug")

    async def _slow(self, request: HttpRequest) -> HttpResponse:
        try:
            await asyncio.sleep(float(request.query.split("=")[1]) / 1e3)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return HttpResponse(200, request.body, "application/octet-stream")

    async def _gated(self, request: HttpRequest) -> HttpResponse:
        await self.gate.wait()
        return HttpResponse(200, request.body, "application/octet-stream")

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def error_response(self, status: int, message: str) -> HttpResponse:
        return HttpResponse(status, json.dumps({"error": message}).encode())


def run(app: EchoApp, body: Callable[[int], Awaitable[Any]], clock: Clock | None = None) -> Any:
    async def main() -> Any:
        server = HttpServer(app, app.limits, clock)
        app.server = server
        port = await server.start("127.0.0.1", 0)
        try:
            return await body(port)
        finally:
            await server.stop(timeout_s=5)

    return asyncio.run(asyncio.wait_for(main(), timeout=60))


async def exchange(
    port: int, data: bytes, answers: int, *, hang_up: bool = False
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `data`, read `answers` responses (status, headers, body), then check for EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if hang_up:
        writer.transport.abort()
        return []
    out = []
    try:
        for _ in range(answers):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            status = int(lines[0].split()[1])
            length = int(headers["content-length"])
            payload = await reader.readexactly(length) if not data.startswith(b"HEAD") else b""
            out.append((status, headers, payload))
    finally:
        writer.transport.abort()
    return out


async def advancing(clock: FakeClock, awaitable: Awaitable[Any], step_s: float) -> Any:
    """Await `awaitable` (real socket I/O) while fake time passes in steps of `step_s`: a limit in
    time is reached by stepping the server's clock, not by waiting for it."""
    task = asyncio.ensure_future(awaitable)
    while not task.done():
        await clock.advance(step_s)
        await asyncio.sleep(0.005)  # the I/O the step caused
    return task.result()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


GET_FAST = b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n"


def test_pipelined_requests_are_answered_in_order_even_when_the_first_is_slow() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        answers = await exchange(
            port, post("/slow?ms=200", b"first") + GET_FAST + post("/slow?ms=1", b"third"), 3
        )
        assert [(s, b) for s, _, b in answers] == [(200, b"first"), (200, b'{"fast": true}'), (200, b"third")]

    run(app, body)
    assert app.held == 0


def test_a_handler_that_waits_sees_its_futures_errors_and_its_own_become_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        answers = await exchange(port, post("/catch", b"") + post("/raise", b"") + GET_FAST, 3)
        assert [(s, b) for s, _, b in answers][:2] == [
            (200, b"from the future"),
            (500, b'{"error": "internal error"}'),
        ]
        assert answers[2][0] == 200

    run(app, body)
    assert app.held == 0
    assert any("handler bug" in r.getMessage() for r in caplog.records)


def test_a_refusal_is_sent_before_the_body_and_the_connection_stays_usable() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # Only the head and half the body: the 503 must come now, not after the rest.
            writer.write(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
            await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
            writer.write(b"67890" + GET_FAST)  # the rest of the refused body, then a new request
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 200")
        finally:
            writer.transport.abort()

    run(app, body)


def test_head_expect_continue_and_chunked_bodies() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        [(status, headers, _)] = await exchange(port, b"HEAD /fast HTTP/1.1\r\nHost: t\r\n\r\n", 1)
        assert status == 200 and headers["content-length"] == "14"

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
            )
            assert (
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
            )
            writer.write(b"data")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(4) == b"data"
        finally:
            writer.transport.abort()

        chunked = (
            b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        [(status, _, payload)] = await exchange(port, chunked, 1)
        assert (status, payload) == (200, b"abcde")

    run(app, body)
    assert app.held == 0


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /slow?ms=0 HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"POST /slow?ms=0 HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ],
)
def test_malformed_http_gets_a_json_400_and_the_connection_is_closed(data: bytes) -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(data)
            answer = await asyncio.wait_for(reader.read(), 2)  # read to EOF: the server closes
        finally:
            writer.transport.abort()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head
        assert json.loads(payload)["error"].startswith("malformed HTTP request")

    run(app, body)
    assert app.counts == {"bad_request": 1}


def test_an_upgrade_is_answered_as_plain_http_then_closed() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"GET /fast HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            )
            answer = await asyncio.wait_for(reader.read(), 2)
        finally:
            writer.transport.abort()
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1

    run(app, body)


def test_limits_a_stalled_request_and_a_hang_up_each_end_the_exchange_once() -> None:
    app = EchoApp(max_body_bytes=100, read_timeout_s=0.3)
    clock = FakeClock()

    async def body(port: int) -> None:
        [(status, headers, _)] = await exchange(port, post("/slow?ms=0", b"x" * 101), 1)
        assert status == 413 and headers["connection"] == "close"
        chunked = (
            b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n" + b"x" * 101
        )
        [(status, _, _)] = await exchange(port, chunked, 1)
        assert status == 413
        stalled = exchange(port, b"POST /slow?ms=0 HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc", 1)
        [(status, _, payload)] = await advancing(clock, stalled, 0.1)
        assert status == 408 and b"did not arrive within 0.3 s" in payload
        [(status, _, _)] = await advancing(clock, exchange(port, b"GET /fast HTTP/1.1\r\nHost:", 1), 0.1)
        assert status == 408
        await exchange(port, b"POST /slow?ms=0 HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc", 0, hang_up=True)
        await exchange(port, post("/slow?ms=5000", b"abc"), 0, hang_up=True)  # hang up mid-handler
        for _ in range(100):
            if app.cancelled and app.counts.get("disconnected"):
                break
            await asyncio.sleep(0.02)

    run(app, body, clock)
    assert app.counts == {"too_large": 2, "read_timeout": 2, "disconnected": 1}
    assert app.cancelled == 1 and app.held == 0


def test_an_idle_keep_alive_connection_is_closed() -> None:
    app = EchoApp(keepalive_s=0.2)
    clock = FakeClock()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(GET_FAST)
            await asyncio.wait_for(reader.readuntil(b'{"fast": true}'), 2)
            await clock.advance(0.1)
            assert app.server is not None and app.server.connections  # idle, within keep-alive
            assert await advancing(clock, reader.read(), 0.05) == b""  # closed by the server
        finally:
            writer.transport.abort()

    run(app, body, clock)
