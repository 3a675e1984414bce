"""A small HTTP/1.1 server on asyncio's Protocol and httptools' parser (llhttp, as uvicorn uses).

`lto serve` answers requests that take about a millisecond, so the HTTP layer's own cost is
most of its overhead: a framework's request and response objects, middleware, router and stream
reader cost about 0.1 ms a request over a plain Protocol on our machines. This layer does what
the server needs and no more:

- the application sees a request twice: `admit` when its head arrives (so it can refuse before
  the body is read), and `handle` once its body is whole;
- responses go out in the order requests arrived (pipelining), refusals as soon as their turn
  comes while the body is still arriving and then dropped;
- `Expect: 100-continue` is answered when the request's turn comes, HEAD is GET without a body,
  and malformed HTTP gets 400.

What one client may cost is bounded (`HttpLimits`, docs/serving-limits.md has each limit's
reference in nginx, h11, Node and Kestrel and the attack it stops):

- the parser is fed one message at a time, in slices, so every wire byte is counted against the
  message it belongs to: a head (request line and fields) over its budget gets 414 or 431 before
  more of it is read; a body over its limit 413; chunk framing, extensions and trailers count too;
- body bytes in flight are charged as they arrive (server-wide and per client address), never
  reserved from a declared length, and a body arriving slower than the minimum rate gets 408;
- a client that stops reading its answers stops being read (and parsed) once `max_pipelined`
  answers are owed, and a connection whose owed bytes do not move for `send_timeout_s` is
  aborted; connections are capped (503), and one that sends no whole request head within
  `first_request_timeout_s` of accept, or idles past `keepalive_s`, is closed;
- an answer that closes the connection before the client finished sending (413, 408, 400, 431)
  closes it lingering: the write side is shut and what still arrives is read and dropped for a
  while, so the client reads its answer instead of a reset.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import email.utils
import enum
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

KIB = 1024
MIB = 1024 * 1024
# The head's end, CRLF CRLF: llhttp (strict, as used here) rejects bare LF line ends.
_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection or client may cost the server; each is a `lto serve` flag."""

    # Request line and header fields, in wire bytes: over it, 431 (414 while the request line
    # itself is unfinished). nginx: 1 KiB + 4 x 8 KiB; Node: 16 KiB; h11: 16 KiB.
    max_head_bytes: int = 64 * KIB
    # Header fields in a head, and trailer fields after a chunked body: 431. Node and Go: 100-2000.
    max_header_fields: int = 100
    # Chunk extensions (";name=value" after a chunk's size) over a whole body: 413. Node caps them
    # at 16 KiB (CVE-2024-22019: unbounded extensions let a client spend the server's CPU).
    max_chunk_ext_bytes: int = 16 * KIB
    # A request body's payload: 413 (declared, at the head; or as it arrives).
    max_body_bytes: int = 64 * MIB
    # A request must be whole this long after its first byte arrived: 408.
    read_timeout_s: float = 30.0
    # A body arriving slower than this (bytes/s, measured over `rate_window_s`): 408. Kestrel's
    # MinRequestBodyDataRate is 240 B/s with a 5 s grace.
    min_body_rate: float = 1 * KIB
    rate_window_s: float = 5.0
    # Body bytes held in the server (arrived, exchange not yet ended): over them, 503.
    max_inflight_body_bytes: int = 256 * MIB
    max_client_body_bytes: int = 128 * MIB  # ... and per client address
    # Bytes owed to a client that do not move for this long: the connection is aborted.
    # nginx send_timeout: 60 s.
    send_timeout_s: float = 30.0
    max_connections: int = 1024  # open connections; above it: 503 and close
    max_client_connections: int = 512  # ... per client address (a proxy counts as one client)
    # A new connection must send a whole request head this soon (nginx client_header_timeout 60 s).
    first_request_timeout_s: float = 10.0
    keepalive_s: float = 75.0  # an idle keep-alive connection is closed (nginx, aiohttp: 75 s)
    # Answers owed on one connection beyond which it is not read (or parsed) until it catches up.
    max_pipelined: int = 32
    # A refusing close reads and drops what still arrives for up to this long (nginx: 30 s,
    # with 5 s between reads).
    linger_s: float = 5.0

    def check(self) -> None:
        """Refuse values that would make the server unusable (the CLI's flags reach here)."""
        if self.max_head_bytes < 1 * KIB:
            raise ValueError("the head budget must be at least 1 KiB (a browser's head is ~0.5-2 KiB)")
        if self.max_client_body_bytes > self.max_inflight_body_bytes:
            raise ValueError("a client's body budget cannot exceed the server's")
        if self.max_client_connections > self.max_connections:
            raise ValueError("a client's connection cap cannot exceed the server's")


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
    headers: dict[str, str]  # lower-cased names; repeated fields joined with ", "
    content_length: int | None  # None: chunked (or no body)
    arrived: float  # time.monotonic() when the head was complete
    body_done: float = 0.0  # ... and when the body was
    body: bytes | bytearray = b""
    # Trailer fields of a chunked body, apart from `headers` (they arrive after admission).
    trailers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    # Set by the application to release what it took; called exactly once when the exchange
    # ends, whether answered, refused, timed out or abandoned.
    on_end: Callable[[], None] | None = None
    context: Any = None  # the application's, e.g. the route it found on the head

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


class HttpApplication(abc.ABC):
    """What `HttpServer` calls; `handle` may return a response or an awaitable of one."""

    @abc.abstractmethod
    def admit(self, request: HttpRequest) -> HttpResponse | None:
        """On the head, before the body is read: a response refuses the request."""

    @abc.abstractmethod
    def handle(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        """On the whole request. Must not raise; a coroutine is run as a task of its own."""

    @abc.abstractmethod
    def count(self, outcome: str) -> None:
        """A request ended in the HTTP layer: too_large, read_timeout, disconnected, bad_request,
        overloaded, send_timeout."""

    @abc.abstractmethod
    def error_response(self, status: int, message: str) -> HttpResponse:
        """The body of an answer this layer gives itself (4xx, 503)."""


@dataclass(slots=True)
class _ClientUse:
    """What one client address holds: open connections and body bytes."""

    connections: int = 0
    body_bytes: int = 0


class _Refusal(Exception):
    """Raised inside a parser callback: stop parsing and answer this, then close."""

    def __init__(self, status: int, message: str, outcome: str) -> None:
        super().__init__(message)
        self.status, self.message, self.outcome = status, message, outcome


class _Phase(enum.Enum):
    HEAD = "head"  # between messages, or a head arriving
    BODY = "body"  # a head is whole, its body arriving


@dataclass(slots=True, eq=False)
class _Exchange:
    request: HttpRequest
    response: HttpResponse | None = None
    task: asyncio.Task[Any] | None = None
    body: list[bytes] = field(default_factory=list)  # its first chunk ...
    grown: bytearray | None = None  # ... and, from the second, all of it: grown in place
    received: int = 0  # body payload bytes
    charged: int = 0  # of those, charged to the server's and the client's budgets
    complete: bool = False  # the whole request has arrived
    refused: bool = False  # answered before its body arrived: the body is dropped
    close_after: bool = False  # HTTP/1.0 or `Connection: close`
    continue_owed: bool = False  # `Expect: 100-continue`, sent when its turn comes
    ended: bool = False
    release: Callable[[int], None] | None = None  # gives back what was charged

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            if self.release is not None and self.charged:
                self.release(self.charged)
                self.charged = 0
            if self.request.on_end is not None:
                self.request.on_end()


class _ChunkedEnd:
    """Where a chunked body ends on the wire, so that the parser is fed one message at a time
    and what follows it is counted as the next message's head. llhttp validates the framing;
    this only finds its end, and on input it cannot read it says "not yet" (llhttp then fails
    the request on the same bytes). It also counts the body's chunk-extension bytes."""

    __slots__ = ("ext_done", "left", "line", "size_line", "state")

    # A size line's own bytes: up to 16 hex digits and its CRLF. The rest is extensions.
    _SIZE_LINE_OWN = 18

    def __init__(self) -> None:
        self.state = "size"  # size line, data, CRLF after data, trailer lines
        self.left = 0
        self.line = b""  # the start of a size line split across slices (its hex digits)
        self.size_line = 0  # bytes of the current size line so far, however it was split
        self.ext_done = 0  # extension bytes of the size lines already ended

    @property
    def extension_bytes(self) -> int:
        """Chunk-extension bytes so far (";name=value" after each chunk's size)."""
        return self.ext_done + max(0, self.size_line - self._SIZE_LINE_OWN)

    def scan(self, data: bytes, pos: int, end: int) -> int | None:
        """The position in `data` just past the body's last byte, or None if not in [pos, end)."""
        while pos < end:
            if self.state == "data":
                take = min(self.left, end - pos)
                pos += take
                self.left -= take
                if self.left == 0:
                    self.state = "data-end"
                continue
            lf = data.find(b"\n", pos, end)
            if self.state == "size":
                self.size_line += (end if lf < 0 else lf + 1) - pos
            if lf < 0:
                if self.state == "size":
                    self.line = (self.line + data[pos:end])[:32]  # its hex digits
                elif self.state == "trailer":
                    self.line = (self.line + data[pos:end])[:2]  # enough to tell "\r" from a field
                return None
            line = self.line + data[pos:lf]
            self.line = b""
            pos = lf + 1
            if self.state == "data-end":
                self.state = "size"
            elif self.state == "size":
                self.ext_done = self.extension_bytes
                self.size_line = 0
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self.state = "lost"
                    return None
                self.state, self.left = ("trailer", 0) if size == 0 else ("data", size)
            elif self.state == "trailer":
                if line in (b"", b"\r"):
                    return pos
            else:  # lost: llhttp will reject these bytes
                return None
        return None


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


def _serialize(request: HttpRequest | None, response: HttpResponse, close: bool) -> bytes:
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
    return head if request is not None and request.method == "HEAD" else head + response.body


def _kib(n: int) -> str:
    return f"{n / KIB:g} KiB" if n < MIB else f"{n / MIB:g} MiB"


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the peer's address: per-client caps
        self.use = _ClientUse()  # the server's record of that address (set on connection)
        self.exchanges: deque[_Exchange] = deque()  # arrived, not yet answered, in order
        self.reading: _Exchange | None = None  # the one whose body is arriving
        self.in_message = False  # a request has begun and not yet wholly arrived
        self.closing = False  # parse nothing more
        self.closed = False  # the transport is closed or closing: write nothing more
        self.lingering = False  # closing after a refusal: what arrives is dropped
        self.pauses: set[str] = set()  # why reading is paused: "pipelined", "write", "turn"
        self.pending = b""  # read, not yet parsed (parsing paused between messages)
        self.accepted = 0.0
        self.heads_seen = 0  # whole request heads
        self.last_active = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        # the message being parsed
        self.phase = _Phase.HEAD
        self.head_bytes = 0  # wire bytes of the head so far (and empty lines before it)
        self.head_tail = b""  # the head's last 3 bytes, for a CRLF CRLF split across reads
        self.line_done = False  # the request line has ended
        self.body_wire = 0  # wire bytes after the head (framing included)
        self.chunked_end: _ChunkedEnd | None = None
        self.rate_mark = (0.0, 0)  # (time, body bytes) at the start of the rate window
        self._url = b""
        self._headers: dict[str, str] = {}
        self._repeated: dict[str, list[str]] = {}
        self._fields_to: dict[str, str] = self._headers  # where on_header puts a field
        self._fields = 0
        # the send timeout: when the bytes owed last moved
        self.send_mark = (0.0, 0)

    # ---------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
        self.accepted = self.last_active = time.monotonic()
        refusal = self.server.open_connection(self)
        if refusal is not None:
            self.app.count("overloaded")
            self.closing = True
            response = self.app.error_response(503, refusal)
            response.headers = {**(response.headers or {}), "Retry-After": "1"}
            transport.write(_serialize(None, response, close=True))
            self._linger()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.close_connection(self)
        self.closing = self.closed = True
        self._cancel_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        ex = self.reading
        if ex is not None and not ex.ended and ex.response is None:
            self.app.count("disconnected")  # hung up mid-body: a count, not a traceback
        for ex in [*self.exchanges, *([self.reading] if self.reading is not None else [])]:
            if ex.task is not None and not ex.task.done():
                ex.task.cancel()  # nobody to answer: a queued request leaves the batcher's queue
            ex.end()
        self.exchanges.clear()
        self.reading = None
        self.pending = b""

    def eof_received(self) -> bool | None:
        if self.lingering:
            return False  # the client is done sending: close now
        return None

    def pause_writing(self) -> None:
        # Answers pile up unread: stop reading requests until the client catches up.
        self._pause("write")

    def resume_writing(self) -> None:
        self._resume("write")

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.closing:
            return  # dropped: after a refusal, or after the last request before a close
        self.last_active = time.monotonic()
        if self.pending:
            data = self.pending + data
            self.pending = b""
        self._parse(data)
        if self.in_message and self.timer is None and not self.closing and not self.pauses:
            # Part of a request is here, the rest is not: it must come within the read timeout.
            self._start_read_timer()

    # ---------------------------------------------------------------- feeding the parser
    def _parse(self, data: bytes) -> None:
        """Feed `data` to the parser one message part at a time: a head up to its end (or its
        budget), a body up to its end. No feed spans two messages, so each byte is counted
        against the message it belongs to and parsing can stop between any two of them."""
        pos, n = 0, len(data)
        view = memoryview(data)
        heads_before = self.heads_seen
        while pos < n and not self.closing:
            if self.phase is _Phase.HEAD and not self.in_message:
                # Between messages: the place to stop when too many answers are owed, and to
                # give other connections their turn after `max_pipelined` requests in a row
                # (1,000 pipelined GETs in one read would otherwise hold the loop for all of them).
                if len(self.exchanges) >= self.limits.max_pipelined:
                    self._pause("pipelined")
                elif self.heads_seen - heads_before >= self.limits.max_pipelined:
                    self._pause("turn")
                    asyncio.get_running_loop().call_soon(self._resume, "turn")
                if self.pauses:
                    self.pending = data[pos:]  # parsed on resume
                    return
            in_body = self.phase is _Phase.BODY
            if not in_body:
                end = self._head_end(data, pos, n)
                if end is None:
                    return  # refused: the head is over its budget
            elif self.chunked_end is not None:
                found = self.chunked_end.scan(data, pos, n)
                end = found if found is not None else n
            else:
                ex = self.reading
                length = ex.request.content_length if ex is not None else None
                left = length - ex.received if ex is not None and length is not None else n - pos
                end = pos + max(1, min(left, n - pos))
            try:
                self.parser.feed_data(view[pos:end] if pos or end < n else data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self._feed_failed(exc)
            if in_body and self.phase is _Phase.BODY and not self.closing:
                self.body_wire += end - pos
                self._check_body_wire()
            pos = end

    def _head_end(self, data: bytes, pos: int, n: int) -> int | None:
        """Where to feed up to while a head arrives: its end, or as far as its budget allows."""
        budget = self.limits.max_head_bytes - self.head_bytes
        stop = min(n, pos + budget)
        if not self.head_tail:  # the usual case: a whole head in one read
            i = data.find(_HEAD_END, pos, stop)
            if i >= 0:
                self.head_bytes += i + 4 - pos
                return i + 4
        found = -1
        if self.head_tail:
            joined = self.head_tail + data[pos : pos + 3]
            i = joined.find(_HEAD_END)
            if i >= 0:
                found = pos + i + 4 - len(self.head_tail)
        if found < 0:
            i = data.find(_HEAD_END, pos, stop)
            found = i + 4 if i >= 0 else -1
        end = found if found >= 0 else stop
        if not self.line_done:
            self.line_done = data.find(b"\n", pos, end) >= 0
        self.head_bytes += end - pos
        if found < 0 and end - pos >= budget:
            # The budget is spent and the head has not ended: refuse before reading more of it.
            if self.line_done:
                status, what = 431, "request head (request line and header fields)"
            else:
                status, what = 414, "request line"
            self._give_up(status, f"the {what} exceeds {_kib(self.limits.max_head_bytes)}", "too_large")
            return None
        tail = (self.head_tail + data[max(pos, end - 3) : end])[-3:]
        self.head_tail = tail
        return end

    def _feed_failed(self, exc: httptools.HttpParserError | httptools.HttpParserUpgrade) -> None:
        if isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__ or exc
            if isinstance(cause, _Refusal):
                self._give_up(cause.status, cause.message, cause.outcome)
            elif isinstance(cause, httptools.HttpParserError):  # raised by a callback on bad input
                self._give_up(400, f"malformed HTTP request: {cause}", "bad_request")
            else:  # our own callback failed: a bug, not the client's fault
                log.error("internal error while reading a request: %s", cause)
                self._give_up(500, "internal error", "error")
        elif isinstance(exc, httptools.HttpParserUpgrade):
            # The request was read whole and is answered as if `Upgrade` were absent (which
            # HTTP allows); what follows is another protocol, so close after the answers owed.
            self.closing = True
            if self.exchanges:
                self.exchanges[-1].close_after = True
            else:
                self.close()
        else:
            self._give_up(400, f"malformed HTTP request: {exc}", "bad_request")

    def _check_body_wire(self) -> None:
        # Every wire byte of a message counts: a chunked body's framing, extensions and
        # trailers may add at most one head's budget to its payload's limit, its extensions
        # no more than max_chunk_ext_bytes of that.
        ext = self.chunked_end.extension_bytes if self.chunked_end is not None else 0
        if ext > self.limits.max_chunk_ext_bytes:
            self._give_up(
                413,
                f"the chunked body's chunk extensions exceed {_kib(self.limits.max_chunk_ext_bytes)}",
                "too_large",
            )
            return
        allowed = self.limits.max_body_bytes + self.limits.max_head_bytes
        if self.body_wire > allowed:
            self._give_up(
                413,
                f"the chunked body's framing and trailers exceed {_kib(self.limits.max_head_bytes)}",
                "too_large",
            )

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self.in_message = True
        self._url = b""
        self._headers = self._fields_to = {}
        self._repeated = {}
        self._fields = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > self.limits.max_header_fields:
            what = "trailer" if self.phase is _Phase.BODY else "header"
            raise _Refusal(431, f"more than {self.limits.max_header_fields} {what} fields", "too_large")
        key = name.decode("latin-1").lower()
        fields = self._fields_to  # the head's fields, then the trailers
        if key in fields:
            # Joined once, when the head is whole: appending to a string each time is quadratic.
            self._repeated.setdefault(key, [fields[key]]).append(value.decode("latin-1"))
        else:
            fields[key] = value.decode("latin-1")

    def _join_repeated(self, fields: dict[str, str]) -> None:
        if self._repeated:
            for key, values in self._repeated.items():
                fields[key] = ", ".join(values)
            self._repeated = {}

    def on_headers_complete(self) -> None:
        self._join_repeated(self._headers)
        self.heads_seen += 1
        self.phase = _Phase.BODY
        self.body_wire = 0
        self._fields = 0  # trailers count afresh
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:
            raise httptools.HttpParserError(f"invalid request target {self._url[:80]!r}") from None
        length_text = self._headers.get("content-length")
        try:
            length = int(length_text) if length_text is not None else None
        except ValueError:  # e.g. two Content-Length headers the parser let through
            raise httptools.HttpParserError(f"invalid Content-Length {length_text!r}") from None
        # Chunked when it is the last coding (RFC 9112 6.1); llhttp refuses a request otherwise.
        coding = self._headers.get("transfer-encoding")
        chunked = coding is not None and coding.lower().rsplit(",", 1)[-1].strip() == "chunked"
        self.chunked_end = _ChunkedEnd() if chunked else None
        # Absolute form (`GET http://host HTTP/1.1`) may carry no path: it is "/" then.
        path = url.path.decode("latin-1") if url.path else ("*" if self._url == b"*" else "/")
        request = HttpRequest(
            method=self.parser.get_method().decode("latin-1"),
            path=unquote(path),
            query=(url.query or b"").decode("latin-1"),
            headers=self._headers,
            content_length=length,
            arrived=time.monotonic(),
            chunked=chunked,
        )
        ex = _Exchange(request, close_after=not self.parser.should_keep_alive(), release=self._release)
        self.exchanges.append(ex)
        self.reading = ex
        self._fields_to = request.trailers
        self.rate_mark = (request.arrived, 0)
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            self.app.count("too_large")
            message = f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
            self._refuse(ex, self.app.error_response(413, message), close=True)
            return
        try:
            refusal = self.app.admit(request)
        except Exception as exc:
            refusal = self._internal_error(request, exc)
        if refusal is None and length and (refusal := self._budget_refusal(length)):
            self.app.count("overloaded")
        if refusal is not None:
            # The connection stays open and the body is dropped as it arrives: cheaper than a
            # new connection for every retry, and an `Expect: 100-continue` client sends none.
            self._refuse(ex, refusal, close=refusal.close)
        elif request.headers.get("expect", "").lower() == "100-continue" and request.has_body:
            ex.continue_owed = True
            if self.exchanges[0] is ex:
                self._send_continue(ex)

    def _budget_refusal(self, declared: int) -> HttpResponse | None:
        """503 on the head when the body it declares cannot fit in what is free now. Only bytes
        that arrived count as used: a declared length that is never sent holds nothing."""
        server, limits = self.server, self.limits
        if declared and server.body_bytes + declared > limits.max_inflight_body_bytes:
            message = (
                f"overloaded: {server.body_bytes} body bytes in flight "
                f"(limit {limits.max_inflight_body_bytes})"
            )
        elif declared and self.use.body_bytes + declared > limits.max_client_body_bytes:
            message = (
                f"overloaded: this client has {self.use.body_bytes} body bytes "
                f"in flight (limit {limits.max_client_body_bytes} per client)"
            )
        else:
            return None
        response = self.app.error_response(503, message)
        response.headers = {**(response.headers or {}), "Retry-After": "1"}
        return response

    def on_body(self, chunk: bytes) -> None:
        ex = self.reading
        if ex is None:
            return
        size = len(chunk)
        ex.received += size  # refused too: where its body ends is counted from it
        if ex.refused:
            return  # dropped as it arrives
        if ex.received > self.limits.max_body_bytes:
            # Stops the parser: nothing more of this connection is read.
            message = f"request body exceeds the limit of {self.limits.max_body_bytes} bytes"
            raise _Refusal(413, message, "too_large")
        refusal = self.server.charge(self.use, size)
        if refusal is not None:
            raise _Refusal(503, f"overloaded: {refusal}", "overloaded")
        ex.charged += size
        if ex.grown is not None:
            ex.grown += chunk
        elif ex.body:
            # A body of several chunks grows in one buffer (realloc, no copy of what is there)
            # instead of a list joined at the end: a 50 MB body then peaks at 50 MB, not 100.
            ex.grown = bytearray(ex.body[0])
            ex.grown += chunk
            ex.body = []
        else:
            ex.body.append(chunk)

    def on_message_complete(self) -> None:
        ex = self.reading
        self.reading = None
        self.in_message = False
        self.phase = _Phase.HEAD
        self.head_bytes = 0
        self.head_tail = b""
        self.line_done = False
        self.chunked_end = None
        self._cancel_timer()
        if ex is None:
            return
        self._join_repeated(ex.request.trailers)
        ex.complete = True
        if ex.refused:
            if ex not in self.exchanges:
                ex.end()  # its answer already went out
            return
        request = ex.request
        request.body = ex.grown if ex.grown is not None else (ex.body[0] if ex.body else b"")
        ex.grown = None
        request.body_done = time.monotonic()
        ex.body, ex.grown = [], None
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

    def _release(self, charged: int) -> None:
        self.server.release(self.client, self.use, charged)

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
        ex.body, ex.grown = [], None
        ex.continue_owed = False
        if ex.release is not None and ex.charged:
            ex.release(ex.charged)
            ex.charged = 0
        response.close = response.close or close
        self._answer(ex, response)

    def _answer(self, ex: _Exchange, response: HttpResponse) -> None:
        ex.response = response
        self._flush()

    def _send_continue(self, ex: _Exchange) -> None:
        ex.continue_owed = False
        if self.transport is not None and not self.closed and not ex.complete:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

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
                # After a refusal the client may still be sending: linger, so it reads the answer.
                if ex.refused:
                    self._linger()
                else:
                    self.close()
                return
        if self.exchanges and self.exchanges[0].continue_owed:
            self._send_continue(self.exchanges[0])  # its turn: now it may send its body
        self.last_active = time.monotonic()
        if "pipelined" in self.pauses and len(self.exchanges) <= self.limits.max_pipelined // 2:
            self._resume("pipelined")

    def _give_up(self, status: int, message: str, outcome: str) -> None:
        """Malformed, oversized or stalled input: answer after what is already owed, then close."""
        if outcome:
            self.app.count(outcome)
        ex = self.reading
        if ex is None or ex.response is not None:
            ex = _Exchange(HttpRequest("GET", "", "", {}, None, time.monotonic()))
            self.exchanges.append(ex)
        if self.reading is not None and self.reading is not ex:
            self.reading.end()
        self.reading = None
        self.in_message = False
        self.closing = True
        self._cancel_timer()
        ex.complete = True
        if ex.response is None:
            response = self.app.error_response(status, message)
            if status == 503:
                response.headers = {**(response.headers or {}), "Retry-After": "1"}
            self._refuse(ex, response, close=True)

    def close(self) -> None:
        self.closing = self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()  # sends what is buffered first

    def _linger(self) -> None:
        """Close after a refusal without resetting the answer away: shut the write side once it
        is sent, then read and drop until the client closes or `linger_s` passes."""
        if self.lingering or self.transport is None:
            return
        self.lingering = self.closing = True
        self.pending = b""
        self._cancel_timer()
        self.pauses.clear()
        with contextlib.suppress(Exception):
            self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.linger_timer = asyncio.get_running_loop().call_later(self.limits.linger_s, self.abort)

    def abort(self) -> None:
        self.closing = self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- pausing
    def _pause(self, reason: str) -> None:
        if self.lingering or self.closed:
            return  # a lingering connection keeps reading (and dropping)
        was = bool(self.pauses)
        self.pauses.add(reason)
        if not was and self.transport is not None:
            self.transport.pause_reading()
            # The read timeout measures the client; while the server does not read, it stops.
            self._cancel_timer()

    def _resume(self, reason: str) -> None:
        if reason not in self.pauses:
            return
        self.pauses.discard(reason)
        if self.pauses or self.closed or self.transport is None:
            return
        self.transport.resume_reading()
        if self.reading is not None:
            self.rate_mark = (time.monotonic(), self.reading.received)  # paused time is ours
        if self.pending:
            asyncio.get_running_loop().call_soon(self._parse_pending)
        elif self.in_message and self.timer is None:
            self._start_read_timer()

    def _parse_pending(self) -> None:
        if self.pending and not self.pauses and not self.closing:
            data, self.pending = self.pending, b""
            self._parse(data)
            if self.in_message and self.timer is None and not self.closing and not self.pauses:
                self._start_read_timer()

    # ---------------------------------------------------------------- timers
    def _start_read_timer(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.limits.read_timeout_s, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if not self.in_message or self.closing:
            return
        what = "request body" if self.reading is not None else "request"
        self._give_up(
            408, f"the {what} did not arrive within {self.limits.read_timeout_s:g} s", "read_timeout"
        )

    def idle_for(self, now: float) -> float:
        """How long nothing has been owed or arriving on this connection (0 when busy)."""
        if self.exchanges or self.in_message or self.pending:
            return 0.0
        return now - self.last_active

    def sweep(self, now: float) -> None:
        """The checks a timer per request would cost too much for, every fraction of a second."""
        limits = self.limits
        transport = self.transport
        if transport is None:
            return
        owed = transport.get_write_buffer_size()
        mark_time, mark_size = self.send_mark
        if owed == 0 or owed < mark_size:
            self.send_mark = (now, owed)
        elif now - mark_time > limits.send_timeout_s:
            self.app.count("send_timeout")
            log.info("aborted a connection from %s: %d bytes owed did not move in %g s",
                     self.client, owed, limits.send_timeout_s)  # fmt: skip
            self.abort()
            return
        else:
            self.send_mark = (mark_time, owed)
        if self.closing:
            return
        if self.heads_seen == 0 and now - self.accepted > limits.first_request_timeout_s:
            if self.in_message:
                self._give_up(408, f"no whole request within {limits.first_request_timeout_s:g} s "
                              "of connecting", "read_timeout")  # fmt: skip
            else:
                self.close()  # never sent a byte: nothing to answer
            return
        if self.idle_for(now) > limits.keepalive_s:
            self.close()
            return
        ex = self.reading
        if ex is not None and not ex.refused and not self.pauses and self.phase is _Phase.BODY:
            start, received = self.rate_mark
            if now - start >= limits.rate_window_s:
                rate = (ex.received - received) / (now - start)
                if rate < limits.min_body_rate:
                    self._give_up(
                        408,
                        f"the request body arrived at {rate:.0f} B/s, under the minimum of "
                        f"{limits.min_body_rate:g} B/s",
                        "read_timeout",
                    )
                    return
                self.rate_mark = (now, ex.received)


class HttpServer:
    """Listens on host:port and runs every connection with `app`, within `limits`."""

    def __init__(self, app: HttpApplication, limits: HttpLimits | None = None) -> None:
        self.app = app
        self.limits = limits or HttpLimits()
        self.limits.check()
        self.connections: set[_Connection] = set()
        self.clients: dict[str, _ClientUse] = {}  # by address
        self.body_bytes = 0  # body bytes held, all clients
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; the port bound (the real one when 0 was asked for)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
        self._sweeper = asyncio.ensure_future(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])

    # ---------------------------------------------------------------- accounting
    def open_connection(self, connection: _Connection) -> str | None:
        """Count a new connection; the reason it is refused, if it is."""
        use = self.clients.get(connection.client)
        if use is None:
            use = self.clients[connection.client] = _ClientUse()
        connection.use = use
        if len(self.connections) >= self.limits.max_connections:
            reason = (
                f"overloaded: {len(self.connections)} connections open (limit {self.limits.max_connections})"
            )
        elif use.connections >= self.limits.max_client_connections:
            reason = (
                f"overloaded: this client has {use.connections} connections open "
                f"(limit {self.limits.max_client_connections} per client)"
            )
        else:
            self.connections.add(connection)
            use.connections += 1
            return None
        self._forget(connection.client, use)
        return reason

    def close_connection(self, connection: _Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            connection.use.connections -= 1
            self._forget(connection.client, connection.use)

    def _forget(self, client: str, use: _ClientUse) -> None:
        if use.connections == 0 and use.body_bytes == 0 and self.clients.get(client) is use:
            del self.clients[client]

    def charge(self, use: _ClientUse, size: int) -> str | None:
        """Charge arrived body bytes; the reason they cannot be, if over a budget."""
        if self.body_bytes + size > self.limits.max_inflight_body_bytes:
            return f"{self.body_bytes} body bytes in flight (limit {self.limits.max_inflight_body_bytes})"
        if use.body_bytes + size > self.limits.max_client_body_bytes:
            return (
                f"this client has {use.body_bytes} body bytes in flight "
                f"(limit {self.limits.max_client_body_bytes} per client)"
            )
        use.body_bytes += size
        self.body_bytes += size
        return None

    def release(self, client: str, use: _ClientUse, size: int) -> None:
        self.body_bytes -= size
        use.body_bytes -= size
        if use.body_bytes == 0 and use.connections == 0:
            self._forget(client, use)

    # ---------------------------------------------------------------- timers
    async def _sweep(self) -> None:
        # One sweep a fraction of a second instead of a timer per request or connection.
        limits = self.limits
        interval = max(0.01, min(0.5, limits.send_timeout_s / 4, limits.first_request_timeout_s / 4,
                                 limits.keepalive_s / 4, limits.rate_window_s / 4))  # fmt: skip
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.sweep(now)

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
