"""Request framing of `lto serve`'s HTTP layer against h11 as a reference parser (issue 26).

Generated request streams (well-formed ones, and ones carrying the usual smuggling vectors:
Content-Length with Transfer-Encoding, duplicate or signed lengths, bad chunk sizes, bare LF),
split at arbitrary points into reads, go to both parsers. The layer may refuse more than h11
does (llhttp is stricter: it refuses Content-Length with Transfer-Encoding, which h11 lets TE
win), but every request it hands the application must be one h11 read at the same place, with
the same method, target and body; a well-formed stream must be read whole; and no feed of the
parser may span two messages."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimize.serve.http_layer import (
    HttpApplication,
    HttpConnection,
    HttpLimits,
    HttpRequest,
    HttpResponse,
    HttpServer,
)
from optimize.serve.http_layer.reader import MessageReader

Seen = tuple[bytes, bytes, bytes]  # method, target, body
REFUSED = b"<refused on the head>"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("192.0.2.1", 1234) if name == "peername" else default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0


class _Recorder(HttpApplication):
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def admit(self, request: HttpRequest) -> HttpResponse | None:
        # Paths under /r are refused on the head (503, keep-alive): their bodies are dropped as
        # they arrive, and the next request must still be found where it starts.
        if request.path.startswith("/r"):
            self.seen.append((request.method.encode(), self._target(request).encode(), REFUSED))
            return HttpResponse(503)
        return None

    @staticmethod
    def _target(request: HttpRequest) -> str:
        return request.path + (f"?{request.query}" if request.query else "")

    def handle(self, request: HttpRequest) -> HttpResponse:
        self.seen.append((request.method.encode(), self._target(request).encode(), request.body))
        return HttpResponse(200)

    def count(self, outcome: str) -> None: ...

    def error_response(self, status: int, message: str) -> HttpResponse:
        return HttpResponse(status, message.encode())


class _OneMessagePerFeed(MessageReader):
    """Checks the layer's framing invariant: no feed of the parser spans two messages (so each
    wire byte is counted against its own message and parsing can stop between any two)."""

    def __init__(self, connection: HttpConnection) -> None:
        super().__init__(connection, connection.limits, connection.clock)
        self.events: list[str] = []
        parser = self.parser
        reader = self

        class Parser:
            def feed_data(self, data: Any) -> None:
                reader.events = []
                try:
                    parser.feed_data(data)
                finally:
                    assert reader.events in ([], ["begin"], ["complete"], ["begin", "complete"]), (
                        bytes(data),
                        reader.events,
                    )

            def __getattr__(self, name: str) -> Any:
                return getattr(parser, name)

        self.parser = Parser()  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        self.events.append("begin")
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self.events.append("complete")
        super().on_message_complete()


def lto_reads(reads: list[bytes]) -> tuple[list[Seen], bytes]:
    async def main() -> tuple[list[Seen], bytes]:
        app = _Recorder()
        server = HttpServer(app, HttpLimits())
        connection = HttpConnection(server)
        connection.reader = _OneMessagePerFeed(connection)
        transport = _Transport()
        connection.connection_made(transport)
        for data in reads:
            connection.data_received(data)
            await asyncio.sleep(0)
        connection.connection_lost(None)
        return app.seen, bytes(transport.out)

    return asyncio.run(main())


def h11_reads(reads: list[bytes]) -> tuple[list[Seen], bool]:
    """What h11 reads whole, and whether it found an error."""
    conn = h11.Connection(h11.SERVER)
    seen: list[Seen] = []
    method = target = b""
    body = bytearray()
    for data in reads:
        conn.receive_data(data)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return seen, True
            if event in (h11.NEED_DATA, h11.PAUSED):
                break
            if isinstance(event, h11.Request):
                method, target, body = event.method, event.target, bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                seen.append((method, target, REFUSED if target.startswith(b"/r") else bytes(body)))
                conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is not h11.IDLE:
                    conn.start_next_cycle()
    return seen, False


TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,;=/.", max_size=20).map(str.strip)
PATH = st.tuples(
    st.sampled_from(["/", "/r"]), st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/-._", max_size=16)
).map("".join)


@st.composite
def well_formed(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    target = draw(PATH) + draw(st.sampled_from(["", "?a=1", "?q=x&r=2"]))
    fields = [("Host", "t")] + [
        (f"X-{name}", value) for name, value in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=4))
    ]
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["none", "length", "chunked"]) if body else st.just("none"))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    if framing == "none":
        return (head + "\r\n").encode()
    if framing == "length":
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=3, unique=True)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
    out = (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
    for piece in pieces:
        extension = draw(st.sampled_from(["", ";x=1", ";name"]))
        out += f"{len(piece):x}{extension}\r\n".encode() + piece + b"\r\n"
    trailer = draw(st.sampled_from(["", "X-Trailer: 1\r\n"]))
    return out + f"0\r\n{trailer}\r\n".encode()


SMUGGLING = [
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /s HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3 3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\ng\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\nHost: t\n\n",
    b"GET / HTTP/1.1\r\nHost : t\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n",
    b"GET / HTTP/1.1\r\nHo\x00st: t\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc\r\n",
]


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True) if stream[a:b]]


def check(stream: bytes, cuts: list[int], *, well_formed_stream: bool) -> None:
    reads = split(stream, cuts)
    ours, answers = lto_reads(reads)
    reference, reference_error = h11_reads(reads)
    # Never a request h11 did not read at that place, nor one read differently.
    assert ours == reference[: len(ours)], (stream, ours, reference)
    if well_formed_stream:
        assert not reference_error and ours == reference, (stream, ours, reference)
        refused = sum(1 for _, _, body in ours if body == REFUSED)
        assert answers.count(b"HTTP/1.1 200") == len(ours) - refused and b"HTTP/1.1 4" not in answers
        assert answers.count(b"HTTP/1.1 503") == refused
    elif len(ours) < len(reference) or reference_error:
        # Refused: with a 4xx after the answers owed, never silently.
        assert b"HTTP/1.1 4" in answers, (stream, answers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(well_formed(), min_size=1, max_size=3), st.lists(st.integers(0, 10_000), max_size=6))
@pytest.mark.slow
def test_well_formed_streams_are_read_as_h11_reads_them_however_they_are_split(
    requests: list[bytes], cuts: list[int]
) -> None:
    check(b"".join(requests), cuts, well_formed_stream=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(well_formed(), max_size=2),
    st.sampled_from(SMUGGLING),
    st.lists(well_formed(), max_size=1),
    st.lists(st.integers(0, 10_000), max_size=6),
)
def test_smuggling_vectors_never_yield_a_request_h11_would_not_read(
    before: list[bytes], bad: bytes, after: list[bytes], cuts: list[int]
) -> None:
    check(b"".join([*before, bad, *after]), cuts, well_formed_stream=False)
