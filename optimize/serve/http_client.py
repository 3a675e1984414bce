"""`lto load`'s HTTP/1.1 client: pre-encoded requests over a pool of keep-alive connections.

The load generator shares the machine with the server it measures, so what it costs per request
is taken from the model's cores. Measured on a 2-vCPU VM (2026-12-06, the MiniLM encoder served at
100 requests a second, two rounds each): `lto load` cost 0.57-0.77 ms of CPU a request on aiohttp's
session and 0.42-0.44 ms on this, of which MLPerf LoadGen's own scheduling is about 0.2 ms
(docs/serving.md, "Under load"). Here a request is bytes encoded once and written to an idle
connection; the answer is framed by httptools (llhttp, the parser the server uses), so
Content-Length, chunked bodies and keep-alive follow HTTP/1.1 as a C parser reads them.

Open loop: a request never waits for a connection; with none idle, a new one is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

from optimize.errors import UsageError


class HttpClientError(Exception):
    """The connection failed or closed before a whole answer came (refused, reset, malformed)."""


@dataclass
class HttpAnswer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names; the last of repeats
    body: bytes = b""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, pool: HttpClient) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[HttpAnswer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._name = b""
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpClientError(f"malformed answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost fails whatever waits

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        self._fail(HttpClientError("the server closed the connection" + (f": {exc}" if exc else "")))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._headers = {}
        self._body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer = HttpAnswer(self.parser.get_status_code(), self._headers, b"".join(self._body))
        waiter, self.waiter = self.waiter, None
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.release(self)
        else:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # ours
    def send(self, data: bytes, waiter: asyncio.Future[HttpAnswer]) -> None:
        assert self.transport is not None
        self.waiter = waiter
        self.transport.write(data)

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Requests to one `http://host:port`, each on an idle connection or a new one."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise UsageError(f"{base_url!r} is not an http://HOST:PORT URL", "lto load speaks plain HTTP/1.1")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    def encode(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        """A whole request, to send as many times as wanted."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def send(self, request: bytes) -> HttpAnswer:
        """Send an encoded request; its answer, or HttpClientError, or TimeoutError after timeout_s."""
        loop = asyncio.get_running_loop()
        connection = self._idle.pop() if self._idle else await self._connect(loop)
        waiter: asyncio.Future[HttpAnswer] = loop.create_future()
        timer = loop.call_later(self.timeout_s, self._expire, connection, waiter)
        try:
            connection.send(request, waiter)
            return await waiter
        finally:
            timer.cancel()

    def _expire(self, connection: _Connection, waiter: asyncio.Future[HttpAnswer]) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError(f"no answer within {self.timeout_s:g} s"))
            connection.close()  # a late answer must not be read as the next request's

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self), self.host, self.port), self.timeout_s
            )
        except OSError as exc:
            raise HttpClientError(f"cannot connect to {self.authority}: {exc.strerror or exc}") from None
        self._open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        if connection in self._open:
            self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)

    async def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
