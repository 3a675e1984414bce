"""`lto serve`'s HTTP layer against a hostile client, each attack through a real socket (issue 26):
the answer a trusted server gives (431, 414, 413, 408, 503 or 400), nothing read or held beyond
the limits, and a normal client answered 200 while the attack goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import pytest

from optimize.serve import polling
from tests.serve.fake_clock import FakeClock
from tests.serve.test_http import GET_FAST, EchoApp, advancing, exchange, post, run

Answer = tuple[int, dict[str, str], bytes]


async def read_answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), timeout)
    return int(lines[0].split()[1]), headers, body


async def attack(port: int, data: bytes, *, keep_sending: bytes = b"", timeout: float = 5.0) -> Answer:
    """Send `data` (then `keep_sending` in a loop, as a client that ignores the answer does) and
    read one answer; then check that the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            for start in range(0, len(data), 65536):
                writer.write(data[start : start + 65536])
                await writer.drain()
            while keep_sending:
                writer.write(keep_sending)
                await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        answer = await read_answer(reader, timeout)
        sender.cancel()
        assert await asyncio.wait_for(reader.read(), timeout) == b"", "the server should close"
        return answer
    finally:
        sender.cancel()
        writer.transport.abort()


async def normal_ok(port: int) -> None:
    """A well-behaved client, during an attack."""
    [(status, _, body)] = await exchange(port, GET_FAST, 1)
    assert (status, body) == (200, b'{"fast": true}')


def head_of(size: int, path: str = "/headers") -> bytes:
    """A GET head of exactly `size` wire bytes (padded with one header field)."""
    start = f"GET {path} HTTP/1.1\r\nHost: t\r\nX-Pad: ".encode()
    pad = size - len(start) - 4
    assert pad >= 0
    return start + b"p" * pad + b"\r\n\r\n"


# ----------------------------------------------------------------------------- the head
def test_the_head_budget_counts_wire_bytes_per_message_to_the_byte() -> None:
    app = EchoApp(max_head_bytes=2048)

    async def body(port: int) -> None:
        # A head of exactly the budget, pipelined behind a body, is fine: each message counts its own.
        answers = await exchange(port, post("/slow?ms=0", b"b" * 5000) + head_of(2048), 2)
        assert [s for s, _, _ in answers] == [200, 200]
        status, headers, payload = await attack(port, head_of(2049))
        assert status == 431 and headers["connection"] == "close"
        assert "exceeds 2 KiB" in json.loads(payload)["error"]

    run(app, body)
    assert app.counts == {"too_large": 1}


def test_an_8_mb_header_line_gets_431_without_being_read_whole() -> None:
    app = EchoApp(linger_s=1.0)

    async def body(port: int) -> None:
        flood = b"GET /fast HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (8 << 20)
        task = asyncio.ensure_future(attack(port, flood))
        await normal_ok(port)
        status, _, payload = await task
        assert status == 431 and "request head" in json.loads(payload)["error"]

    run(app, body)


def test_an_unfinished_16_mb_request_line_gets_414() -> None:
    app = EchoApp(linger_s=1.0)

    async def body(port: int) -> None:
        status, _, payload = await attack(port, b"GET /" + b"a" * (16 << 20))
        assert status == 414 and "request line exceeds 64 KiB" in json.loads(payload)["error"]
        await normal_ok(port)

    run(app, body)


def test_more_header_fields_than_the_limit_get_431() -> None:
    app = EchoApp(max_header_fields=100)

    async def body(port: int) -> None:
        def request(fields: int) -> bytes:
            lines = "".join(f"X-F{i}: v\r\n" for i in range(fields - 1))
            return f"GET /fast HTTP/1.1\r\nHost: t\r\n{lines}\r\n".encode()

        [(status, _, _)] = await exchange(port, request(100), 1)
        assert status == 200
        status, _, payload = await attack(port, request(101) + request(20_000)[30:])
        assert status == 431 and json.loads(payload)["error"] == "more than 100 header fields"

    run(app, body)


def test_repeated_fields_are_joined_in_order() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        lines = "".join(f"X-R: v{i}\r\n" for i in range(90))
        [(status, _, payload)] = await exchange(
            port, f"GET /headers HTTP/1.1\r\nHost: t\r\n{lines}\r\n".encode(), 1
        )
        assert status == 200
        assert json.loads(payload)["headers"]["x-r"] == ", ".join(f"v{i}" for i in range(90))

    run(app, body)


# ----------------------------------------------------------------------------- bodies
def test_chunk_extensions_and_framing_count_against_the_limits() -> None:
    app = EchoApp(max_body_bytes=64 << 10, max_head_bytes=2048)

    async def body(port: int) -> None:
        chunked = b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        ok = chunked + b"3;ext=1\r\nabc\r\n0\r\n\r\n"
        [(status, _, payload)] = await exchange(port, ok, 1)
        assert (status, payload) == (200, b"abc")
        extension = b"3;" + b"e" * (70 << 10)
        flood = chunked + extension
        status, _, payload = await attack(port, flood)
        assert status == 413 and "chunk extensions exceed 16 KiB" in json.loads(payload)["error"]
        # Framing alone (many tiny chunks) still counts against one head's budget beyond the body.
        tiny = chunked + b"1\r\na\r\n" * 12000  # 72 KB of wire for 12 KB of payload
        status, _, payload = await attack(port, tiny)
        assert status == 413 and "framing and trailers" in json.loads(payload)["error"]

    run(app, body)


def test_chunk_extensions_spread_over_many_chunks_are_capped_like_nodes() -> None:
    """4 MB of extensions in 1 KiB pieces stayed under the old per-message budget (body limit +
    head budget) and were read whole; Node stops at 16 KiB (CVE-2024-22019)."""
    app = EchoApp()  # the defaults: 64 MiB bodies, 64 KiB heads, 16 KiB of chunk extensions

    async def body(port: int) -> None:
        chunked = b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        piece = b"3;" + b"x" * 1024 + b"\r\nabc\r\n"
        status, _, payload = await attack(port, chunked + piece * 4096)
        assert status == 413 and "chunk extensions exceed 16 KiB" in json.loads(payload)["error"]
        ok = chunked + (b"3;" + b"x" * 100 + b"\r\nabc\r\n") * 100 + b"0\r\n\r\n"
        [(status, _, payload)] = await exchange(port, ok, 1)
        assert status == 200 and payload == b"abc" * 100  # 10 KiB of extensions: within the cap

    run(app, body)


def test_trailers_are_kept_apart_from_the_header_fields_and_bounded() -> None:
    app = EchoApp(max_header_fields=10)

    async def body(port: int) -> None:
        chunked = (
            b"POST /headers HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nab\r\n0\r\nInference-Header-Content-Length: 5\r\nX-T: 1\r\n\r\n"
        )
        # The request after the trailers is read as its own: the chunked body ended where it should.
        (status, _, payload), (after, _, _) = await exchange(port, chunked + GET_FAST, 2)
        assert status == after == 200
        fields = json.loads(payload)
        assert "inference-header-content-length" not in fields["headers"]
        assert fields["trailers"] == {"inference-header-content-length": "5", "x-t": "1"}
        many = b"".join(b"X-T%d: 1\r\n" % i for i in range(11))
        status, _, payload = await attack(
            port,
            b"POST /headers HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + many + b"\r\n",
        )
        assert status == 431 and json.loads(payload)["error"] == "more than 10 trailer fields"

    run(app, body)


def test_a_body_dribbled_under_the_minimum_rate_gets_408() -> None:
    app = EchoApp(min_body_rate=1000, rate_window_s=0.3, read_timeout_s=30)
    clock = FakeClock()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            start = clock.now()
            answer = asyncio.ensure_future(read_answer(reader))
            while not answer.done() and clock.now() - start < 5:
                writer.write(b"x" * 10)  # 100 B/s of the server's time
                await clock.advance(0.1)
                await asyncio.sleep(0.005)
            status, _, payload = await answer
            assert status == 408 and "under the minimum of 1000 B/s" in json.loads(payload)["error"]
            assert clock.now() - start < 2.0
            await normal_ok(port)
        finally:
            writer.transport.abort()

    run(app, body, clock)
    assert app.counts == {"read_timeout": 1} and app.held == 0


def test_a_refusing_close_lingers_so_a_client_still_sending_reads_its_413() -> None:
    app = EchoApp(max_body_bytes=100 << 10, linger_s=2.0)

    async def body(port: int) -> None:
        head = b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nContent-Length: 50000000\r\n\r\n"
        # It keeps sending its 50 MB after the answer: without a lingering close, closing with its
        # data unread resets the connection and the client may never see the 413.
        status, _, payload = await attack(port, head, keep_sending=b"y" * 65536)
        assert status == 413 and "50000000 bytes exceeds the limit" in json.loads(payload)["error"]

    run(app, body)


# ----------------------------------------------------------------------------- a client that does not read
def test_a_client_that_stops_reading_is_not_parsed_further_and_is_dropped_at_the_send_timeout() -> None:
    app = EchoApp(send_timeout_s=0.5, max_pipelined=4)
    clock = FakeClock()

    async def body(port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.connect(("127.0.0.1", port))
        _, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n" * 1000)  # ~30 KB asking for 64 MB
            await writer.drain()
            server = app.server
            assert server is not None
            while not server.connections:
                await asyncio.sleep(0.01)
            most_owed, start = 0, clock.now()
            while server.connections and clock.now() - start < 10:
                for connection in list(server.connections):
                    if connection.transport is not None:
                        most_owed = max(most_owed, connection.transport.get_write_buffer_size())
                await normal_ok(port)
                await clock.advance(0.05)  # of the server's time: its sweep checks the send timeout
                await asyncio.sleep(0.005)  # the I/O the step caused
            gone_after = clock.now() - start
            assert not server.connections, "the stuck connection was never dropped"
            assert gone_after < 0.5 + 2.0
            # Parsing stopped with the answers owed: not 1,000 answers of 64 KiB queued.
            assert len([r for r in app.handled if r.path == "/big"]) < 100
            assert most_owed <= 4 * 65536 + 65536
        finally:
            writer.transport.abort()

    run(app, body, clock)
    assert app.counts.get("send_timeout") == 1


def test_one_connection_pipelining_many_requests_takes_turns_with_the_others() -> None:
    app = EchoApp(max_pipelined=32)

    async def body(port: int) -> None:
        _, pipeliner = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            pipeliner.write(GET_FAST * 2000)  # answered at once: never 32 owed, so no pause
            writer.write(b"GET /headers HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_answer(reader))[0] == 200
            order = [r.path for r in app.handled]
            # Served after at most a few turns of 32, not after the 2,000.
            assert order.index("/headers") < 200, order.index("/headers")
        finally:
            pipeliner.transport.abort()
            writer.transport.abort()

    run(app, body)


def test_the_read_timeout_stops_while_the_server_itself_does_not_read() -> None:
    app = EchoApp(read_timeout_s=0.3, max_pipelined=1)
    clock = FakeClock()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # The second request waits unread behind the first, held at the gate for ten read
            # timeouts of the server's time; its body comes in the middle of them.
            writer.write(
                post("/gated", b"first") + b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n"
            )
            for step in range(30):
                if step == 15:
                    writer.write(b"xyz")
                await clock.advance(0.1)
                await asyncio.sleep(0.005)  # the I/O the step caused
            assert [r.path for r in app.handled] == ["/gated"]  # the second is not read yet
            app.gate.set()
            assert (await read_answer(reader))[::2] == (200, b"first")
            assert (await read_answer(reader))[::2] == (200, b"xyz")
        finally:
            writer.transport.abort()

    run(app, body, clock)
    assert "read_timeout" not in app.counts


def test_100_continue_waits_for_the_answers_before_it() -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                post("/slow?ms=300", b"first")
                + b"POST /slow?ms=0 HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
            )
            assert (await read_answer(reader))[::2] == (200, b"first")
            assert (
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
            )
            writer.write(b"data")
            assert (await read_answer(reader))[::2] == (200, b"data")
        finally:
            writer.transport.abort()

    run(app, body)


# ----------------------------------------------------------------------------- connections
def test_connections_over_the_cap_get_503_and_are_closed() -> None:
    app = EchoApp(max_connections=3, max_client_connections=3)

    async def body(port: int) -> None:
        held = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(GET_FAST)
            assert (await read_answer(reader))[0] == 200  # open and counted
            held.append(writer)
        status, headers, payload = await attack(port, GET_FAST)
        assert status == 503 and headers["connection"] == "close" and "retry-after" in headers
        assert "3 connections open (limit 3)" in json.loads(payload)["error"]
        held.pop().transport.abort()
        await asyncio.sleep(0.05)
        await normal_ok(port)  # room again
        for writer in held:
            writer.transport.abort()

    run(app, body)


def test_one_client_cannot_take_every_connection() -> None:
    app = EchoApp(max_connections=10, max_client_connections=2)

    async def body(port: int) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.05)
        [(status, _, payload)] = await exchange(port, GET_FAST, 1)
        assert status == 503 and "this client has 2 connections open" in json.loads(payload)["error"]
        for _, w in held:
            w.transport.abort()

    run(app, body)


def test_a_connection_without_a_whole_request_soon_after_accept_is_closed() -> None:
    app = EchoApp(first_request_timeout_s=0.3, read_timeout_s=30)
    clock = FakeClock()

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = clock.now()
        assert await advancing(clock, reader.read(), 0.1) == b""  # silent: closed, nothing to answer
        assert clock.now() - start < 1.5
        writer.transport.abort()
        status, _, payload = await advancing(clock, attack(port, b"GET /fast HTTP/1.1\r\nHost: t\r\n"), 0.1)
        assert status == 408 and "of connecting" in json.loads(payload)["error"]

    run(app, body, clock)


def test_the_real_clock_fires_the_limits_in_time() -> None:
    """The tests above step a fake clock through each timeout; here the real timers fire (briefly):
    a silent connection, an idle keep-alive one and a stalled body, all at once."""
    app = EchoApp(first_request_timeout_s=0.2, keepalive_s=0.2, read_timeout_s=0.2)

    async def body(port: int) -> None:
        silent, silent_writer = await asyncio.open_connection("127.0.0.1", port)
        idle, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            idle_writer.write(GET_FAST)
            await asyncio.wait_for(idle.readuntil(b'{"fast": true}'), 2)
            stalled = exchange(port, b"POST /slow?ms=0 HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc", 1)
            closed_silent, closed_idle, [(status, _, payload)] = await asyncio.gather(
                asyncio.wait_for(silent.read(), 3), asyncio.wait_for(idle.read(), 3), stalled
            )
            assert closed_silent == closed_idle == b""
            assert status == 408 and b"did not arrive within 0.2 s" in payload
        finally:
            silent_writer.transport.abort()
            idle_writer.transport.abort()

    run(app, body)
    assert app.counts == {"read_timeout": 1}


# ----------------------------------------------------------------------------- odd but legal
def test_absolute_form_and_asterisk_targets_are_answered_not_500(caplog: pytest.LogCaptureFixture) -> None:
    app = EchoApp()

    async def body(port: int) -> None:
        answers = await exchange(
            port,
            b"GET http://t HTTP/1.1\r\nHost: t\r\n\r\nGET http://t/fast HTTP/1.1\r\nHost: t\r\n\r\n"
            b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
            3,
        )
        assert [s for s, _, _ in answers] == [404, 200, 404]

    run(app, body)
    assert "error" not in app.counts and not [r for r in caplog.records if r.levelname == "ERROR"]


def test_the_polling_selector_is_used_only_where_epoll_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def main(selector: Any) -> int:
        seen.append(selector)
        return 7

    monkeypatch.setattr(polling, "HAVE_EPOLL", False)
    assert polling.run(main, busy_poll_us=300) == 7 and seen == [None]
