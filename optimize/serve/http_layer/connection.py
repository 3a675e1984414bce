"""One HTTP/1.1 connection as an asyncio Protocol: bytes in, parsed by httptools one message at a
time; the requests' exchanges (cycle.py) answered in the order they arrived.

Every time it reads and every timer it arms come from its server's clock (optimize/serve/clock.py),
so a test can step through a limit's timeout instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import httptools

from optimize.serve.clock import Clock, Timer
from optimize.serve.http_layer.cycle import Exchange, internal_error
from optimize.serve.http_layer.flow_control import FlowControl, Pause
from optimize.serve.http_layer.framing import ChunkedEnd, HeadBudget, body_wire_refusal
from optimize.serve.http_layer.head import HeadFields, Refusal
from optimize.serve.http_layer.limits import HttpLimits, kib
from optimize.serve.http_layer.messages import (
    HttpApplication,
    HttpRequest,
    HttpResponse,
    serialize,
    with_retry_after,
)

log = logging.getLogger("lto.serve")


@dataclass(slots=True)
class ClientUse:
    """What one client address holds: open connections and body bytes."""

    connections: int = 0
    body_bytes: int = 0


class ConnectionOwner(Protocol):
    """What a connection needs of its server (HttpServer): the application, the limits, the
    clock, and the accounting of connections and body bytes across connections."""

    app: HttpApplication
    limits: HttpLimits
    clock: Clock

    def open_connection(self, connection: HttpConnection) -> str | None: ...
    def close_connection(self, connection: HttpConnection) -> None: ...
    def charge(self, use: ClientUse, size: int) -> str | None: ...
    def declared_refusal(self, use: ClientUse, declared: int) -> str | None: ...
    def release(self, client: str, use: ClientUse, size: int) -> None: ...


class Phase(enum.Enum):
    HEAD = "head"  # between messages, or a head arriving
    BODY = "body"  # a head is whole, its body arriving


class HttpConnection(asyncio.Protocol):
    """One client connection: bytes in, parsed one message at a time, answers out in order."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.app = server.app
        self.limits = server.limits
        self.clock = server.clock
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the peer's address: per-client caps
        self.use = ClientUse()  # the server's record of that address (set on connection)
        self.exchanges: deque[Exchange] = deque()  # arrived, not yet answered, in order
        self.reading: Exchange | None = None  # the one whose body is arriving
        self.in_message = False  # a request has begun and not yet wholly arrived
        self.closing = False  # parse nothing more
        self.closed = False  # the transport is closed or closing: write nothing more
        self.lingering = False  # closing after a refusal: what arrives is dropped
        self.flow = FlowControl(self.clock.now())
        self.pending = b""  # read, not yet parsed (parsing paused between messages)
        self.accepted = 0.0
        self.heads_seen = 0  # whole request heads
        self.last_active = 0.0
        self.timer: Timer | None = None
        self.linger_timer: Timer | None = None
        # the message being parsed
        self.phase = Phase.HEAD
        self.head = HeadBudget(self.limits.max_head_bytes)
        self.body_wire = 0  # wire bytes after the head (framing included)
        self.chunked_end: ChunkedEnd | None = None
        self.rate_mark = (0.0, 0)  # (time, body bytes) at the start of the rate window
        self.fields = HeadFields(self.limits.max_header_fields)

    # ---------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
        self.accepted = self.last_active = self.clock.now()
        refusal = self.server.open_connection(self)
        if refusal is not None:
            self.app.count("overloaded")
            self.closing = True
            response = with_retry_after(self.app.error_response(503, refusal))
            transport.write(serialize(None, response, close=True))
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
        self._pause(Pause.WRITE)

    def resume_writing(self) -> None:
        self._resume(Pause.WRITE)

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.closing:
            return  # dropped: after a refusal, or after the last request before a close
        self.last_active = self.clock.now()
        if self.pending:
            data = self.pending + data
            self.pending = b""
        self._parse(data)
        if self.in_message and self.timer is None and not self.closing and not self.flow.paused:
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
            if self.phase is Phase.HEAD and not self.in_message:
                # Between messages: the place to stop when too many answers are owed, and to
                # give other connections their turn after `max_pipelined` requests in a row
                # (1,000 pipelined GETs in one read would otherwise hold the loop for all of them).
                if len(self.exchanges) >= self.limits.max_pipelined:
                    self._pause(Pause.PIPELINED)
                elif self.heads_seen - heads_before >= self.limits.max_pipelined:
                    self._pause(Pause.TURN)
                    asyncio.get_running_loop().call_soon(self._resume, Pause.TURN)
                if self.flow.paused:
                    self.pending = data[pos:]  # parsed on resume
                    return
            in_body = self.phase is Phase.BODY
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
            if in_body and self.phase is Phase.BODY and not self.closing:
                self.body_wire += end - pos
                self._check_body_wire()
            pos = end

    def _head_end(self, data: bytes, pos: int, n: int) -> int | None:
        """Where to feed up to while a head arrives: its end, or as far as its budget allows;
        None when the budget is spent (the head is refused)."""
        end = self.head.scan(data, pos, n)
        if end is None:
            # The budget is spent and the head has not ended: refuse before reading more of it.
            if self.head.line_done:
                status, what = 431, "request head (request line and header fields)"
            else:
                status, what = 414, "request line"
            self.give_up(status, f"the {what} exceeds {kib(self.limits.max_head_bytes)}", "too_large")
        return end

    def _feed_failed(self, exc: httptools.HttpParserError | httptools.HttpParserUpgrade) -> None:
        if isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__ or exc
            if isinstance(cause, Refusal):
                self.give_up(cause.status, cause.message, cause.outcome)
            elif isinstance(cause, httptools.HttpParserError):  # raised by a callback on bad input
                self.give_up(400, f"malformed HTTP request: {cause}", "bad_request")
            else:  # our own callback failed: a bug, not the client's fault
                log.error("internal error while reading a request: %s", cause)
                self.give_up(500, "internal error", "error")
        elif isinstance(exc, httptools.HttpParserUpgrade):
            # The request was read whole and is answered as if `Upgrade` were absent (which
            # HTTP allows); what follows is another protocol, so close after the answers owed.
            self.closing = True
            if self.exchanges:
                self.exchanges[-1].close_after = True
            else:
                self.close()
        else:
            self.give_up(400, f"malformed HTTP request: {exc}", "bad_request")

    def _check_body_wire(self) -> None:
        refusal = body_wire_refusal(self.limits, self.body_wire, self.chunked_end)
        if refusal is not None:
            self.give_up(413, refusal, "too_large")

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self.in_message = True
        self.fields.begin()

    def on_url(self, url: bytes) -> None:
        self.fields.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.add(name, value, "trailer" if self.phase is Phase.BODY else "header")

    def on_headers_complete(self) -> None:
        self.heads_seen += 1
        self.phase = Phase.BODY
        self.body_wire = 0
        request = self.fields.request(self.parser.get_method(), self.clock.now())
        self.chunked_end = ChunkedEnd() if request.chunked else None
        length = request.content_length
        ex = Exchange(request, close_after=not self.parser.should_keep_alive(), release=self._release)
        self.exchanges.append(ex)
        self.reading = ex
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
            refusal = internal_error(self.app, request, exc)
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
        """503 on the head when the body it declares cannot fit in what is free now."""
        reason = self.server.declared_refusal(self.use, declared)
        return (
            None
            if reason is None
            else with_retry_after(self.app.error_response(503, f"overloaded: {reason}"))
        )

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
            raise Refusal(413, message, "too_large")
        refusal = self.server.charge(self.use, size)
        if refusal is not None:
            raise Refusal(503, f"overloaded: {refusal}", "overloaded")
        ex.keep(chunk)

    def on_message_complete(self) -> None:
        ex = self.reading
        self.reading = None
        self.in_message = False
        self.phase = Phase.HEAD
        self.head.reset()
        self.chunked_end = None
        self._cancel_timer()
        if ex is None:
            return
        self.fields.join_repeated()  # the trailers'
        ex.complete = True
        if ex.refused:
            if ex not in self.exchanges:
                ex.end()  # its answer already went out
            return
        request = ex.request
        request.body = ex.take_body()
        request.body_done = self.clock.now()
        ex.run(self.app, self._answer)

    def _release(self, charged: int) -> None:
        self.server.release(self.client, self.use, charged)

    # ---------------------------------------------------------------- answers
    def _refuse(self, ex: Exchange, response: HttpResponse, close: bool) -> None:
        ex.refuse()
        response.close = response.close or close
        self._answer(ex, response)

    def _answer(self, ex: Exchange, response: HttpResponse) -> None:
        ex.response = response
        self._flush()

    def _send_continue(self, ex: Exchange) -> None:
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
                transport.write(serialize(ex.request, response, close))
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
        self.last_active = self.clock.now()
        if Pause.PIPELINED in self.flow.pauses and len(self.exchanges) <= self.limits.max_pipelined // 2:
            self._resume(Pause.PIPELINED)

    def give_up(self, status: int, message: str, outcome: str) -> None:
        """Malformed, oversized or stalled input: answer after what is already owed, then close."""
        if outcome:
            self.app.count(outcome)
        ex = self.reading
        if ex is None or ex.response is not None:
            ex = Exchange(HttpRequest("GET", "", "", {}, None, self.clock.now()))
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
                response = with_retry_after(response)
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
        self.flow.force_resume(self.transport)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.linger_timer = self.clock.call_at(self.clock.now() + self.limits.linger_s, self.abort)

    def abort(self) -> None:
        self.closing = self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- pausing
    def _pause(self, reason: Pause) -> None:
        if self.lingering or self.closed:
            return  # a lingering connection keeps reading (and dropping)
        if self.flow.pause(self.transport, reason):
            # The read timeout measures the client; while the server does not read, it stops.
            self._cancel_timer()

    def _resume(self, reason: Pause) -> None:
        if not self.flow.resume(None if self.closed else self.transport, reason):
            return
        if self.reading is not None:
            self.rate_mark = (self.clock.now(), self.reading.received)  # paused time is ours
        if self.pending:
            asyncio.get_running_loop().call_soon(self._parse_pending)
        elif self.in_message and self.timer is None:
            self._start_read_timer()

    def _parse_pending(self) -> None:
        if self.pending and not self.flow.paused and not self.closing:
            data, self.pending = self.pending, b""
            self._parse(data)
            if self.in_message and self.timer is None and not self.closing and not self.flow.paused:
                self._start_read_timer()

    # ---------------------------------------------------------------- timers
    def _start_read_timer(self) -> None:
        self.timer = self.clock.call_at(self.clock.now() + self.limits.read_timeout_s, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if not self.in_message or self.closing:
            return
        what = "request body" if self.reading is not None else "request"
        self.give_up(
            408, f"the {what} did not arrive within {self.limits.read_timeout_s:g} s", "read_timeout"
        )

    def idle_for(self, now: float) -> float:
        """How long nothing has been owed or arriving on this connection (0 when busy)."""
        if self.exchanges or self.in_message or self.pending:
            return 0.0
        return now - self.last_active
