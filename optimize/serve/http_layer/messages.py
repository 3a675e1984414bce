"""What the HTTP layer and its application exchange: requests, responses, and the application's
interface; and a response's bytes on the wire."""

from __future__ import annotations

import abc
import email.utils
import http
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


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
    arrived: float  # the server's clock (time.monotonic() by default) when the head was complete
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


def with_retry_after(response: HttpResponse) -> HttpResponse:
    """`response` telling the client to retry in a second (503s the layer gives itself)."""
    response.headers = {**(response.headers or {}), "Retry-After": "1"}
    return response


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


def serialize(request: HttpRequest | None, response: HttpResponse, close: bool) -> bytes:
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
