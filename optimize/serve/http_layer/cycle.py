"""One request's cycle on a connection: from its head to the end of its exchange.

An `Exchange` holds the request as it arrives (its body charged to the server's budgets as it
comes), the application's task and answer, and ends exactly once, whether answered, refused,
timed out or abandoned: then what it was charged is given back and `request.on_end` is called.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from optimize.serve.http_layer.messages import HttpApplication, HttpRequest, HttpResponse

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
