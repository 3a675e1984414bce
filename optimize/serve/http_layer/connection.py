"""One HTTP/1.1 connection as an asyncio Protocol: bytes in, read into requests one message at a
time (reader.py); the requests' exchanges (cycle.py) answered in the order they arrived.

Every time it reads and every timer it arms come from its server's clock (optimize/serve/clock.py),
so a test can step through a limit's timeout instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

import httptools

from optimize.serve.clock import Clock, Timer
from optimize.serve.http_layer.cycle import AnswerQueue, Exchange, head_refusal
from optimize.serve.http_layer.flow_control import FlowControl, Pause
from optimize.serve.http_layer.head import Refusal
from optimize.serve.http_layer.limits import HttpLimits
from optimize.serve.http_layer.messages import (
    HttpApplication,
    HttpResponse,
    serialize,
    with_retry_after,
)
from optimize.serve.http_layer.reader import MessageReader, refusal_of

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


class HttpConnection(asyncio.Protocol):
    """One client connection: bytes in, parsed one message at a time, answers out in order."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.app = server.app
        self.limits = server.limits
        self.clock = server.clock
        self.reader = MessageReader(self, self.limits, self.clock)
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the peer's address: per-client caps
        self.use = ClientUse()  # the server's record of that address (set on connection)
        self.answers = AnswerQueue()  # exchanges arrived, not yet answered, in order
        self.closing = False  # parse nothing more
        self.closed = False  # the transport is closed or closing: write nothing more
        self.lingering = False  # closing after a refusal: what arrives is dropped
        self.flow = FlowControl(self.clock.now())
        self.pending = b""  # read, not yet parsed (parsing paused between messages)
        self.accepted = 0.0
        self.last_active = 0.0
        self.linger_timer: Timer | None = None

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
        self.reader.stop_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        ex = self.reader.reading
        if ex is not None and not ex.ended and ex.response is None:
            self.app.count("disconnected")  # hung up mid-body: a count, not a traceback
        self.answers.abandon(ex)
        self.reader.reading = None
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
        self._time_the_rest()

    # ---------------------------------------------------------------- feeding the reader
    def _parse(self, data: bytes) -> None:
        """Feed `data` to the reader one message part at a time, stopping between two messages
        when too many answers are owed or other connections should have their turn."""
        pos, n = 0, len(data)
        view = memoryview(data)
        reader = self.reader
        heads_before = reader.heads_seen
        while pos < n and not self.closing:
            if reader.between_messages:
                # The place to stop when too many answers are owed, and to give other connections
                # their turn after `max_pipelined` requests in a row (1,000 pipelined GETs in one
                # read would otherwise hold the loop for all of them).
                if len(self.answers) >= self.limits.max_pipelined:
                    self._pause(Pause.PIPELINED)
                elif reader.heads_seen - heads_before >= self.limits.max_pipelined:
                    self._pause(Pause.TURN)
                    asyncio.get_running_loop().call_soon(self._resume, Pause.TURN)
                if self.flow.paused:
                    self.pending = data[pos:]  # parsed on resume
                    return
            try:
                pos = reader.feed(data, view, pos, n)
            except Refusal as refusal:  # a head or body framing over its limit
                self.give_up(refusal.status, refusal.message, refusal.outcome)
                return
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as failure:
                self._parse_failed(refusal_of(failure))
                return

    def _parse_failed(self, refusal: Refusal | None) -> None:
        if refusal is not None:
            self.give_up(refusal.status, refusal.message, refusal.outcome)
            return
        # An upgrade: the request was read whole and is answered as if `Upgrade` were absent
        # (which HTTP allows); what follows is another protocol, so close after the answers owed.
        self.closing = True
        last = self.answers.last()
        if last is not None:
            last.close_after = True
        else:
            self.close()

    def _time_the_rest(self) -> None:
        if not self.closing and not self.flow.paused:
            self.reader.time_the_rest()

    # ---------------------------------------------------------------- what the reader tells
    def head_arrived(self, ex: Exchange) -> None:
        ex.release = self._release
        self.answers.add(ex)
        refusal = head_refusal(self.app, self.limits, ex.request, self._declared_refusal)
        if refusal is not None:
            # The connection stays open (unless the refusal closes it) and the body is dropped as
            # it arrives: cheaper than a new connection for every retry, and an
            # `Expect: 100-continue` client sends none.
            self._refuse(ex, refusal)
        elif ex.request.headers.get("expect", "").lower() == "100-continue" and ex.request.has_body:
            ex.continue_owed = True
            if self.answers.first() is ex:
                ex.send_continue(self._open_transport())

    def _declared_refusal(self, declared: int) -> str | None:
        return self.server.declared_refusal(self.use, declared)

    def body_arrived(self, ex: Exchange, chunk: bytes) -> None:
        refusal = self.server.charge(self.use, len(chunk))
        if refusal is not None:
            raise Refusal(503, f"overloaded: {refusal}", "overloaded")
        ex.keep(chunk)

    def message_arrived(self, ex: Exchange) -> None:
        ex.arrived(self.clock.now())
        if not ex.refused:
            ex.run(self.app, self._answer)
        elif ex not in self.answers:
            ex.end()  # its answer already went out

    def _release(self, charged: int) -> None:
        self.server.release(self.client, self.use, charged)

    # ---------------------------------------------------------------- answers
    def _refuse(self, ex: Exchange, response: HttpResponse, close: bool = False) -> None:
        ex.refuse()
        response.close = response.close or close
        self._answer(ex, response)

    def _answer(self, ex: Exchange, response: HttpResponse) -> None:
        ex.response = response
        self._flush()

    def _open_transport(self) -> asyncio.Transport | None:
        """The transport, while answers may still be written to it."""
        return None if self.closed else self.transport

    def _flush(self) -> None:
        closing = self.answers.flush(self._open_transport())
        if closing is not None:
            # After a refusal the client may still be sending: linger, so it reads the answer.
            if closing.refused:
                self._linger()
            else:
                self.close()
            return
        self.last_active = self.clock.now()
        if Pause.PIPELINED in self.flow.pauses and len(self.answers) <= self.limits.max_pipelined // 2:
            self._resume(Pause.PIPELINED)

    def give_up(self, status: int, message: str, outcome: str) -> None:
        """Malformed, oversized or stalled input: answer after what is already owed, then close."""
        if outcome:
            self.app.count(outcome)
        ex = self.answers.error_exchange(self.reader.reading, self.clock.now())
        self.reader.abandon()
        self.closing = True
        self.reader.stop_timer()
        ex.complete = True
        if ex.response is None:
            response = self.app.error_response(status, message)
            if status == 503:
                response = with_retry_after(response)
            self._refuse(ex, response, close=True)

    def close(self) -> None:
        self.closing = self.closed = True
        self.reader.stop_timer()
        if self.transport is not None:
            self.transport.close()  # sends what is buffered first

    def _linger(self) -> None:
        """Close after a refusal without resetting the answer away: shut the write side once it
        is sent, then read and drop until the client closes or `linger_s` passes."""
        if self.lingering or self.transport is None:
            return
        self.lingering = self.closing = True
        self.pending = b""
        self.reader.stop_timer()
        self.flow.force_resume(self.transport)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.linger_timer = self.clock.call_at(self.clock.now() + self.limits.linger_s, self.abort)

    def abort(self) -> None:
        self.closing = self.closed = True
        self.reader.stop_timer()
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- pausing
    def _pause(self, reason: Pause) -> None:
        if self.lingering or self.closed:
            return  # a lingering connection keeps reading (and dropping)
        if self.flow.pause(self.transport, reason):
            # The read timeout measures the client; while the server does not read, it stops.
            self.reader.stop_timer()

    def _resume(self, reason: Pause) -> None:
        if not self.flow.resume(None if self.closed else self.transport, reason):
            return
        reading = self.reader.reading
        if reading is not None:
            self.reader.rate_mark = (self.clock.now(), reading.received)  # paused time is ours
        if self.pending:
            asyncio.get_running_loop().call_soon(self._parse_pending)
        else:
            self.reader.time_the_rest()

    def _parse_pending(self) -> None:
        if self.pending and not self.flow.paused and not self.closing:
            data, self.pending = self.pending, b""
            self._parse(data)
            self._time_the_rest()

    def idle_for(self, now: float) -> float:
        """How long nothing has been owed or arriving on this connection (0 when busy)."""
        if self.answers or self.reader.in_message or self.pending:
            return 0.0
        return now - self.last_active
