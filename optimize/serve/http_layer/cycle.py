"""One request's cycle on a connection: from its head to the end of its exchange.

An `Exchange` holds the request as it arrives (its body charged to the server's budgets as it
comes), the application's task and answer, and ends exactly once, whether answered, refused,
timed out or abandoned: then what it was charged is given back and `request.on_end` is called.
`head_refusal` is what a head alone can be refused for; `AnswerQueue` keeps a connection's
exchanges in the order their requests arrived and writes their answers in that order.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from optimize.serve.http_layer.limits import HttpLimits
from optimize.serve.http_layer.messages import (
    HttpApplication,
    HttpRequest,
    HttpResponse,
    serialize,
    with_retry_after,
)

log = logging.getLogger("lto.serve")


@dataclass(slots=True, eq=False)
class Exchange:
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

    def keep(self, chunk: bytes) -> None:
        """Keep a body chunk (already charged)."""
        self.charged += len(chunk)
        if self.grown is not None:
            self.grown += chunk
        elif self.body:
            # A body of several chunks grows in one buffer (realloc, no copy of what is there)
            # instead of a list joined at the end: a 50 MB body then peaks at 50 MB, not 100.
            self.grown = bytearray(self.body[0])
            self.grown += chunk
            self.body = []
        else:
            self.body.append(chunk)

    def arrived(self, now: float) -> None:
        """The whole request is here: unless refused, its body goes to the request."""
        self.complete = True
        if not self.refused:
            self.request.body = self.take_body()
            self.request.body_done = now

    def take_body(self) -> bytes | bytearray:
        """The whole body, handed to the request; the exchange keeps no reference to it."""
        body = self.grown if self.grown is not None else (self.body[0] if self.body else b"")
        self.body, self.grown = [], None
        return body

    def run(self, app: HttpApplication, answer: Callable[[Exchange, HttpResponse], None]) -> None:
        """Hand the whole request to `app`; `answer` gets its response, now or when its task ends."""
        try:
            result = app.handle(self.request)
        except Exception as exc:
            result = internal_error(app, self.request, exc)
        if isinstance(result, HttpResponse):
            answer(self, result)
            return
        self.task = asyncio.ensure_future(self._await(app, result, answer))
        if inspect.iscoroutine(result):
            # A task cancelled before its first step never awaits `result`: close it then.
            self.task.add_done_callback(lambda _task, coro=result: coro.close())

    async def _await(
        self,
        app: HttpApplication,
        result: Awaitable[HttpResponse],
        answer: Callable[[Exchange, HttpResponse], None],
    ) -> None:
        try:
            response = await result
        except Exception as exc:
            response = internal_error(app, self.request, exc)
        answer(self, response)

    def send_continue(self, transport: asyncio.Transport | None) -> None:
        """Tell an `Expect: 100-continue` client to send its body now, unless it has already sent
        it (or `transport` is None: the connection is closed)."""
        self.continue_owed = False
        if transport is not None and not self.complete:
            transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def refuse(self) -> None:
        """Answered before its body arrived: drop what arrived, give back what it was charged."""
        self.refused = True
        self.body, self.grown = [], None
        self.continue_owed = False
        self._give_back()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self._give_back()
            if self.request.on_end is not None:
                self.request.on_end()

    def _give_back(self) -> None:
        if self.release is not None and self.charged:
            self.release(self.charged)
            self.charged = 0


def internal_error(app: HttpApplication, request: HttpRequest, exc: Exception) -> HttpResponse:
    """The application raised, which its contract forbids: a logged, counted JSON 500."""
    log.error("internal error on %s %s: %s", request.method, request.path, exc)
    app.count("error")
    return app.error_response(500, "internal error")


def head_refusal(
    app: HttpApplication,
    limits: HttpLimits,
    request: HttpRequest,
    declared_refusal: Callable[[int], str | None],
) -> HttpResponse | None:
    """The answer to a request refused on its head alone, if it is: a declared body over the limit
    (413, closing the connection), the application's own refusal, or 503 when the declared body
    cannot fit in what the server's budgets have free now (`declared_refusal` says why)."""
    limit = limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        app.count("too_large")
        message = f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        response = app.error_response(413, message)
        response.close = True
        return response
    try:
        refusal = app.admit(request)
    except Exception as exc:
        refusal = internal_error(app, request, exc)
    length = request.content_length
    if refusal is None and length and (reason := declared_refusal(length)):
        refusal = with_retry_after(app.error_response(503, f"overloaded: {reason}"))
        app.count("overloaded")
    return refusal


class AnswerQueue:
    """The exchanges a connection owes answers to, in the order their requests arrived: an answer
    goes out only once every answer before it has (HTTP/1.1 pipelining)."""

    __slots__ = ("exchanges",)

    def __init__(self) -> None:
        self.exchanges: deque[Exchange] = deque()

    def __len__(self) -> int:
        return len(self.exchanges)

    def __iter__(self) -> Iterator[Exchange]:
        return iter(self.exchanges)

    def add(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)

    def first(self) -> Exchange | None:
        return self.exchanges[0] if self.exchanges else None

    def last(self) -> Exchange | None:
        return self.exchanges[-1] if self.exchanges else None

    def flush(self, transport: asyncio.Transport | None) -> Exchange | None:
        """Write the answers now due, in order (`transport` None: the connection is closed, write
        nothing); the exchange whose answer closes the connection, if one does: nothing after it
        goes out. Then the next exchange, if it waits for `100 Continue`, gets it."""
        while self.exchanges and self.exchanges[0].response is not None:
            ex = self.exchanges.popleft()
            response = ex.response
            assert response is not None
            close = response.close or ex.close_after
            if transport is not None:
                transport.write(serialize(ex.request, response, close))
            if ex.complete or close:
                ex.end()  # else: refused while its body arrives; it ends when the body is done
            if close:
                return ex
        if self.exchanges and self.exchanges[0].continue_owed:
            self.exchanges[0].send_continue(transport)  # its turn: now it may send its body
        return None

    def error_exchange(self, reading: Exchange | None, now: float) -> Exchange:
        """The exchange that carries the answer to a connection's last error: `reading` (the one
        whose body was arriving) unless it has its answer already; then it ends, and a new one is
        queued after the others."""
        if reading is not None and reading.response is None:
            return reading
        ex = Exchange(HttpRequest("GET", "", "", {}, None, now))
        self.add(ex)
        if reading is not None:
            reading.end()
        return ex

    def abandon(self, reading: Exchange | None) -> None:
        """The connection is gone, with these exchanges and `reading` (the one whose body was
        arriving, if any): nobody to answer, so their handlers' tasks are cancelled (a queued
        request leaves the batcher's queue) and every exchange ends."""
        for ex in [*self.exchanges, *([reading] if reading is not None else [])]:
            if ex.task is not None and not ex.task.done():
                ex.task.cancel()
            ex.end()
        self.exchanges.clear()
