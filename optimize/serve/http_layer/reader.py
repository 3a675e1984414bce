"""Reading one connection's requests: httptools' parser, fed one message part at a time, what is
known of the message arriving (its phase, head budget, body framing and rate), and the read timeout
that the rest of a message started must arrive within.

No feed spans two messages, so each wire byte is counted against the message it belongs to and
the connection can stop parsing between any two of them. The reader decides nothing about a
request: it tells its owner (the connection) when a head, a body chunk and a whole message arrive.
"""

from __future__ import annotations

import enum
import logging
from typing import Protocol

import httptools

from optimize.serve.clock import Clock, Timer
from optimize.serve.http_layer.cycle import Exchange
from optimize.serve.http_layer.framing import ChunkedEnd, HeadBudget, body_wire_refusal
from optimize.serve.http_layer.head import HeadFields, Refusal
from optimize.serve.http_layer.limits import HttpLimits, kib

log = logging.getLogger("lto.serve")

ParseFailure = httptools.HttpParserError | httptools.HttpParserUpgrade


class Phase(enum.Enum):
    HEAD = "head"  # between messages, or a head arriving
    BODY = "body"  # a head is whole, its body arriving


class ReaderOwner(Protocol):
    """What the reader tells its connection."""

    @property
    def closing(self) -> bool: ...  # parse nothing more

    def head_arrived(self, exchange: Exchange) -> None: ...
    def body_arrived(self, exchange: Exchange, chunk: bytes) -> None: ...  # may raise Refusal
    def message_arrived(self, exchange: Exchange) -> None: ...
    def give_up(self, status: int, message: str, outcome: str) -> None: ...


class MessageReader:
    """The parser of one connection and the state of the message it is reading."""

    def __init__(self, owner: ReaderOwner, limits: HttpLimits, clock: Clock) -> None:
        self.owner = owner
        self.limits = limits
        self.clock = clock
        self.parser = httptools.HttpRequestParser(self)
        self.in_message = False  # a request has begun and not yet wholly arrived
        self.reading: Exchange | None = None  # the one whose body is arriving
        self.heads_seen = 0  # whole request heads
        self.phase = Phase.HEAD
        self.head = HeadBudget(limits.max_head_bytes)
        self.body_wire = 0  # wire bytes after the head (framing included)
        self.chunked_end: ChunkedEnd | None = None
        self.rate_mark = (0.0, 0)  # (time, body bytes) at the start of the rate window
        self.fields = HeadFields(limits.max_header_fields)
        self.timer: Timer | None = None  # the read timeout, while part of a message is here

    @property
    def between_messages(self) -> bool:
        return self.phase is Phase.HEAD and not self.in_message

    def feed(self, data: bytes, view: memoryview, pos: int, n: int) -> int:
        """Feed the parser the next part of a message in data[pos:n]: a head up to its end (or its
        budget), a body up to its end; where it stopped. Raises Refusal for a head or body framing
        over its limit, and httptools' errors (ParseFailure) for what the parser refuses."""
        in_body = self.phase is Phase.BODY
        if not in_body:
            end = self._head_end(data, pos, n)
        elif self.chunked_end is not None:
            found = self.chunked_end.scan(data, pos, n)
            end = found if found is not None else n
        else:
            ex = self.reading
            length = ex.request.content_length if ex is not None else None
            left = length - ex.received if ex is not None and length is not None else n - pos
            end = pos + max(1, min(left, n - pos))
        self.parser.feed_data(view[pos:end] if pos or end < n else data)
        if in_body and self.phase is Phase.BODY and not self.owner.closing:
            self.body_wire += end - pos
            refusal = body_wire_refusal(self.limits, self.body_wire, self.chunked_end)
            if refusal is not None:
                raise Refusal(413, refusal, "too_large")
        return end

    def _head_end(self, data: bytes, pos: int, n: int) -> int:
        """Where to feed up to while a head arrives: its end, or as far as its budget allows;
        Refusal when the budget is spent and the head has not ended (before reading more of it)."""
        end = self.head.scan(data, pos, n)
        if end is None:
            if self.head.line_done:
                status, what = 431, "request head (request line and header fields)"
            else:
                status, what = 414, "request line"
            raise Refusal(status, f"the {what} exceeds {kib(self.limits.max_head_bytes)}", "too_large")
        return end

    # ---------------------------------------------------------------- the read timeout
    def time_the_rest(self) -> None:
        """Part of a request is here (unless none is), the rest is not: it must come within the
        read timeout, counted from now unless it already runs."""
        if self.in_message and self.timer is None:
            self.timer = self.clock.call_at(self.clock.now() + self.limits.read_timeout_s, self._timed_out)

    def stop_timer(self) -> None:
        """The read timeout measures the client: it stops when the message is whole, and while
        the server itself does not read."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if not self.in_message or self.owner.closing:
            return
        what = "request body" if self.reading is not None else "request"
        message = f"the {what} did not arrive within {self.limits.read_timeout_s:g} s"
        self.owner.give_up(408, message, "read_timeout")

    def abandon(self) -> None:
        """Read no more of the message arriving (the connection gave up on it)."""
        self.reading = None
        self.in_message = False

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
        ex = Exchange(request, close_after=not self.parser.should_keep_alive())
        self.reading = ex
        self.rate_mark = (request.arrived, 0)
        self.owner.head_arrived(ex)

    def on_body(self, chunk: bytes) -> None:
        ex = self.reading
        if ex is None:
            return
        ex.received += len(chunk)  # refused too: where its body ends is counted from it
        if ex.refused:
            return  # dropped as it arrives
        if ex.received > self.limits.max_body_bytes:
            # Stops the parser: nothing more of this connection is read.
            message = f"request body exceeds the limit of {self.limits.max_body_bytes} bytes"
            raise Refusal(413, message, "too_large")
        self.owner.body_arrived(ex, chunk)

    def on_message_complete(self) -> None:
        ex = self.reading
        self.reading = None
        self.in_message = False
        self.phase = Phase.HEAD
        self.head.reset()
        self.chunked_end = None
        self.stop_timer()
        if ex is not None:
            self.fields.join_repeated()  # the trailers'
            self.owner.message_arrived(ex)


def refusal_of(failure: ParseFailure) -> Refusal | None:
    """The answer to what the parser refused; None for an upgrade (the request itself was whole)."""
    if isinstance(failure, httptools.HttpParserCallbackError):
        cause = failure.__context__ or failure
        if isinstance(cause, Refusal):
            return cause
        if isinstance(cause, httptools.HttpParserError):  # raised by a callback on bad input
            return Refusal(400, f"malformed HTTP request: {cause}", "bad_request")
        # our own callback failed: a bug, not the client's fault
        log.error("internal error while reading a request: %s", cause)
        return Refusal(500, "internal error", "error")
    if isinstance(failure, httptools.HttpParserUpgrade):
        return None
    return Refusal(400, f"malformed HTTP request: {failure}", "bad_request")
