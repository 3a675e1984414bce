"""A request head as the parser reports it: its target and fields, counted against the limits,
made into an `HttpRequest` once whole; trailer fields after a chunked body the same way."""

from __future__ import annotations

from urllib.parse import unquote

import httptools

from optimize.serve.http_layer.messages import HttpRequest


class Refusal(Exception):
    """Raised inside a parser callback: stop parsing and answer this, then close."""

    def __init__(self, status: int, message: str, outcome: str) -> None:
        super().__init__(message)
        self.status, self.message, self.outcome = status, message, outcome


class HeadFields:
    """The request target and the fields of one message: its head's, then its trailers."""

    __slots__ = ("count", "headers", "into", "max_fields", "repeated", "url")

    def __init__(self, max_fields: int) -> None:
        self.max_fields = max_fields
        self.begin()

    def begin(self) -> None:
        """A new message begins."""
        self.url = b""
        self.headers: dict[str, str] = {}
        self.into = self.headers  # where a field goes: the head's fields, then the trailers
        self.repeated: dict[str, list[str]] = {}
        self.count = 0

    def add(self, name: bytes, value: bytes, what: str) -> None:
        """One field (`what`: "header" or "trailer"); Refusal 431 beyond `max_fields` of them."""
        self.count += 1
        if self.count > self.max_fields:
            raise Refusal(431, f"more than {self.max_fields} {what} fields", "too_large")
        key = name.decode("latin-1").lower()
        fields = self.into
        if key in fields:
            # Joined once, when the head is whole: appending to a string each time is quadratic.
            self.repeated.setdefault(key, [fields[key]]).append(value.decode("latin-1"))
        else:
            fields[key] = value.decode("latin-1")

    def join_repeated(self) -> None:
        """Repeated fields become one, their values joined with ", " in order."""
        if self.repeated:
            for key, values in self.repeated.items():
                self.into[key] = ", ".join(values)
            self.repeated = {}

    def request(self, method: bytes, arrived: float) -> HttpRequest:
        """The whole head as a request; its trailers, if any, go to `request.trailers` from now on.
        Raises httptools.HttpParserError on a target or Content-Length it cannot read."""
        self.join_repeated()
        self.count = 0  # trailers count afresh
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            raise httptools.HttpParserError(f"invalid request target {self.url[:80]!r}") from None
        length_text = self.headers.get("content-length")
        try:
            length = int(length_text) if length_text is not None else None
        except ValueError:  # e.g. two Content-Length headers the parser let through
            raise httptools.HttpParserError(f"invalid Content-Length {length_text!r}") from None
        # Chunked when it is the last coding (RFC 9112 6.1); llhttp refuses a request otherwise.
        coding = self.headers.get("transfer-encoding")
        chunked = coding is not None and coding.lower().rsplit(",", 1)[-1].strip() == "chunked"
        # Absolute form (`GET http://host HTTP/1.1`) may carry no path: it is "/" then.
        path = url.path.decode("latin-1") if url.path else ("*" if self.url == b"*" else "/")
        request = HttpRequest(
            method=method.decode("latin-1"),
            path=unquote(path),
            query=(url.query or b"").decode("latin-1"),
            headers=self.headers,
            content_length=length,
            arrived=arrived,
            chunked=chunked,
        )
        self.into = request.trailers
        return request
