"""A small HTTP/1.1 server on asyncio's Protocol and httptools' parser (llhttp, as uvicorn uses).

`lto serve` answers requests that take about a millisecond, so the HTTP layer's own cost is
most of its overhead: a framework's request and response objects, middleware, router and stream
reader cost about 0.1 ms a request over a plain Protocol on our machines. This layer does what
the server needs and no more:

- the application sees a request twice: `admit` when its headers arrive (so it can refuse
  before the body is read, and reserve room for it), and `handle` once its body is whole;
- responses go out in the order requests arrived (pipelining), refusals as soon as their
  turn comes while the body is still arriving and then dropped;
- a body larger than the limit is answered 413, a request not whole within the read timeout 408,
  and both close the connection; a client that hangs up cancels its request's handler;
- `Expect: 100-continue` is answered, HEAD is GET without a body, and malformed HTTP gets 400.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import email.utils
import http
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httptools

log = logging.getLogger("lto.serve")

# A connection that pipelines more unanswered requests than this stops being read until it
# catches up: what a client queues in the server stays bounded.
MAX_PIPELINED = 32
# A keep-alive connection idle this long is closed (aiohttp's and nginx's default is 75 s).
KEEPALIVE_S = 75.0


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] | None = None
    close: bool = False  # close the connection once this is sent


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str  # percent-decoded, without the query
    query: str
    headers: dict[str, str]  # lower-cased names
    content_length: int | None  # None: chunked
    arrived: float  # time.monotonic() when the headers were complete
    body_done: float = 0.0  # ... and when the body was
    body: bytes = b""
    # Set by `admit` to release what it reserved; called exactly once when the exchange ends,
    # whether answered, refused, timed out or abandoned.
    on_end: Callable[[], None] | None = None
    context: Any = None  # the application's, e.g. the route it found on the headers


class HttpApplication(abc.ABC):
    """What `HttpServer` calls; `handle` may return a response or an awaitable of one."""

    max_body_bytes: int
    read_timeout_s: float

    @abc.abstractmethod
    def admit(self, request: HttpRequest) -> HttpResponse | None:
        """On the headers, before the body is read: a response refuses the request."""

    @abc.abstractmethod
    def handle(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        """On the whole request. Must not raise; a coroutine is run as a task of its own."""

    @abc.abstractmethod
    def count(self, outcome: str) -> None:
        """A request ended in the HTTP layer: too_large, read_timeout, disconnected, bad_request."""

    @abc.abstractmethod
    def error_response(self, status: int, message: str) -> HttpResponse:
        """The body of an answer this layer gives itself (413, 408, 400)."""


@dataclass(slots=True, eq=False)
class _Exchange:
    request: HttpRequest
    response: HttpResponse | None = None
    task: asyncio.Task[Any] | None = None
    body: list[bytes] = field(default_factory=list)
    received: int = 0
    complete: bool = False  # the whole request has arrived
    refused: bool = False  # answered before its body arrived: the body is dropped
    close_after: bool = False  # HTTP/1.0 or `Connection: close`
    ended: bool = False

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            if self.request.on_end is not None:
                self.request.on_end()


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _serialize(request: HttpRequest, response: HttpResponse, close: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {response.status} {_reason(response.status)}",
        f"Date: {_http_date()}",
        "Server: lto",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    if response.headers:
        lines += [f"{k}: {v}" for k, v in response.headers.items()]
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if request.method == "HEAD" else head + response.body


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.exchanges: deque[_Exchange] = deque()  # arrived, not yet answered, in order
        self.reading: _Exchange | None = None  # the one whose body is arriving
        self.in_message = False  # a request has begun and not yet wholly arrived
        self.closing = False  # read nothing more
        self.closed = False  # the transport is closed or closing: write nothing more
        self.paused = False  # reading paused: too many answers owed
        self.write_paused = False  # reading paused: the client does not read its answers
        self.last_active = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self._url = b""
        self._headers: dict[str, str] = {}

    # ---------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        self.last_active = time.monotonic()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = self.closed = True
        self._cancel_timer()
        ex = self.reading
        if ex is not None and not ex.ended and ex.response is None:
            self.app.count("disconnected")  # hung up mid-body: a count, not a traceback
        for ex in [*self.exchanges, *([self.reading] if self.reading is not None else [])]:
            if ex.task is not None and not ex.task.done():
                ex.task.cancel()  # nobody to answer: a queued request leaves the batcher's queue
            ex.end()
        self.exchanges.clear()
        self.reading = None

    def pause_writing(self) -> None:
        # Answers pile up unread: stop reading requests until the client catches up.
        self.write_paused = True
        if self.transport is not None and not self.paused:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.paused and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ or exc
            if isinstance(cause, httptools.HttpParserError):  # raised by a callback on bad input
                self._give_up(400, f"malformed HTTP request: {cause}", "bad_request")
            else:  # our own callback failed: a bug, not the client's fault
                log.error("internal error while reading a request: %s", cause)
                self._give_up(500, "internal error", "error")
        except httptools.HttpParserUpgrade:
            # The request was read whole and is answered as if `Upgrade` were absent (which
            # HTTP allows); what follows is another protocol, so close after the answers owed.
            self.closing = True
            if self.exchanges:
                self.exchanges[-1].close_after = True
            else:
                self.close()
        except httptools.HttpParserError as exc:
            self._give_up(400, f"malformed HTTP request: {exc}", "bad_request")
        if self.in_message and self.timer is None and not self.closing:
            # Part of a request is here, the rest is not: it must come within the read timeout.
            self.timer = asyncio.get_running_loop().call_later(self.app.read_timeout_s, self._timed_out)

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self.in_message = True
        self._url = b""
        self._headers = {}

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self._headers.get(key)
        self._headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        url = httptools.parse_url(self._url)
        length_text = self._headers.get("content-length")
        try:
            length = int(length_text) if length_text is not None else None
        except ValueError:  # e.g. two Content-Length headers the parser let through
            raise httptools.HttpParserError(f"invalid Content-Length {length_text!r}") from None
        request = HttpRequest(
            method=self.parser.get_method().decode("latin-1"),
            path=unquote(url.path.decode("latin-1")),
            query=(url.query or b"").decode("latin-1"),
            headers=self._headers,
            content_length=length,
            arrived=time.monotonic(),
        )
        ex = _Exchange(request, close_after=not self.parser.should_keep_alive())
        self.exchanges.append(ex)
        self.reading = ex
        limit = self.app.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            self.app.count("too_large")
            message = f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
            self._refuse(ex, self.app.error_response(413, message), close=True)
            return
        try:
            refusal = self.app.admit(request)
        except Exception as exc:
            refusal = self._internal_error(request, exc)
        if refusal is not None:
            # The connection stays open and the body is dropped as it arrives: cheaper than a
            # new connection for every retry, and an `Expect: 100-continue` client sends none.
            self._refuse(ex, refusal, close=refusal.close)
        elif request.headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(self.exchanges) > MAX_PIPELINED and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def on_body(self, chunk: bytes) -> None:
        ex = self.reading
        if ex is None or ex.refused:
            return
        ex.received += len(chunk)
        if ex.received > self.app.max_body_bytes:
            self.app.count("too_large")
            message = f"request body exceeds the limit of {self.app.max_body_bytes} bytes"
            self._refuse(ex, self.app.error_response(413, message), close=True)
            return
        ex.body.append(chunk)

    def on_message_complete(self) -> None:
        ex = self.reading
        self.reading = None
        self.in_message = False
        self._cancel_timer()
        if ex is None:
            return
        ex.complete = True
        if ex.refused:
            if ex not in self.exchanges:
                ex.end()  # its answer already went out
            return
        request = ex.request
        request.body = ex.body[0] if len(ex.body) == 1 else b"".join(ex.body)
        request.body_done = time.monotonic()
        ex.body = []
        try:
            result = self.app.handle(request)
        except Exception as exc:
            result = self._internal_error(request, exc)
        if isinstance(result, HttpResponse):
            self._answer(ex, result)
        else:
            ex.task = asyncio.ensure_future(self._await(ex, result))
            if inspect.iscoroutine(result):
                # A task cancelled before its first step never awaits `result`: close it then.
                ex.task.add_done_callback(lambda _task, coro=result: coro.close())

    # ---------------------------------------------------------------- answers
    async def _await(self, ex: _Exchange, result: Awaitable[HttpResponse]) -> None:
        try:
            response = await result
        except Exception as exc:
            response = self._internal_error(ex.request, exc)
        self._answer(ex, response)

    def _internal_error(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        """The application raised, which its contract forbids: a logged, counted JSON 500."""
        log.error("internal error on %s %s: %s", request.method, request.path, exc)
        self.app.count("error")
        return self.app.error_response(500, "internal error")

    def _refuse(self, ex: _Exchange, response: HttpResponse, close: bool) -> None:
        ex.refused = True
        ex.body = []
        response.close = response.close or close
        self._answer(ex, response)

    def _answer(self, ex: _Exchange, response: HttpResponse) -> None:
        ex.response = response
        self._flush()

    def _flush(self) -> None:
        transport = self.transport
        while self.exchanges and self.exchanges[0].response is not None:
            ex = self.exchanges.popleft()
            response = ex.response
            assert response is not None
            close = response.close or ex.close_after
            if transport is not None and not self.closed:
                transport.write(_serialize(ex.request, response, close))
            if ex.complete or close:
                ex.end()  # else: refused while its body arrives; it ends when the body is done
            if close:
                self.close()
                return
        self.last_active = time.monotonic()
        if self.paused and len(self.exchanges) <= MAX_PIPELINED // 2 and transport is not None:
            self.paused = False
            if not self.write_paused:
                transport.resume_reading()

    def _give_up(self, status: int, message: str, outcome: str) -> None:
        """Malformed or stalled input: answer after what is already owed, then close."""
        self.app.count(outcome)
        ex = self.reading
        if ex is None or ex.response is not None:
            ex = _Exchange(HttpRequest("GET", "", "", {}, None, time.monotonic()))
            self.exchanges.append(ex)
        if self.reading is not None and self.reading is not ex:
            self.reading.end()
        self.reading = None
        self.in_message = False
        ex.complete = True
        self._refuse(ex, self.app.error_response(status, message), close=True)
        self.closing = True

    def close(self) -> None:
        self.closing = self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()  # sends what is buffered first

    def idle_for(self, now: float) -> float:
        """How long nothing has been owed or arriving on this connection (0 when busy)."""
        if self.exchanges or self.in_message:
            return 0.0
        return now - self.last_active

    # ---------------------------------------------------------------- read timeout
    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if not self.in_message or self.closing:
            return
        what = "request body" if self.reading is not None else "request"
        self._give_up(408, f"the {what} did not arrive within {self.app.read_timeout_s:g} s", "read_timeout")


class HttpServer:
    """Listens on host:port and runs every connection with `app`."""

    def __init__(self, app: HttpApplication) -> None:
        self.app = app
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; the port bound (the real one when 0 was asked for)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
        self._sweeper = asyncio.ensure_future(self._close_idle_connections())
        return int(self._server.sockets[0].getsockname()[1])

    async def _close_idle_connections(self) -> None:
        # One sweep every few seconds instead of a timer per request.
        while True:
            await asyncio.sleep(min(5.0, KEEPALIVE_S / 4))
            now = time.monotonic()
            for connection in list(self.connections):
                if connection.idle_for(now) > KEEPALIVE_S:
                    connection.close()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening, let handlers in flight answer (up to `timeout_s`), then close."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        tasks = [ex.task for c in self.connections for ex in c.exchanges if ex.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
