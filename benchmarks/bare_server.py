"""A bare KServe v2 server: the reference for what any server costs on this machine.

    python -m benchmarks.bare_server ART [--port 0]

It serves one artifact at `/v2/models/m/infer` with binary tensors, and nothing a real server needs:
no batching, no queue, no limits, no deadlines, no metrics, no flow control. Each request is
decoded and run on the event loop's thread the moment its last byte is read, and answered before
the next is read, so requests that arrive during a run wait unread in their sockets: the floor's
one worker, taking one request at a time, behind an HTTP parser (httptools) and lto's own codec
(`optimize/serve/protocol.py`). Its Server-Timing header carries the same phases as lto serve's,
so `lto load` splits its latency the same way.

`benchmarks/serve_floor.py --bare` drives it beside `lto serve` at the same loads: the gap between
it and the floor is what a co-located client and an HTTP path cost on these cores; the gap between
`lto serve` and it is what lto serve's own request path adds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import httptools

from optimize.artifact import load_artifact
from optimize.backend import Backend
from optimize.errors import InputError
from optimize.runtimes.backends import open_backend
from optimize.serve.protocol import HEADER_LENGTH, decode_request, encode_response, v2_datatype, v2_shape

MODEL = "m"
HEADER_LENGTH_NAME = HEADER_LENGTH.lower().encode()


class BareModel:
    """A runtime, each input shape compiled for on first sight (as lto serve does before its first
    request; here the client's warm-up requests pay it)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.shapes: set[tuple[tuple[int, ...], ...]] = set()
        described = {
            side: [
                {"name": t.name, "datatype": v2_datatype(t.dtype), "shape": v2_shape(t.shape)} for t in specs
            ]
            for side, specs in (("inputs", backend.inputs), ("outputs", backend.outputs))
        }
        self.metadata = json.dumps({"name": MODEL, **described}).encode()

    @classmethod
    def from_artifact(cls, artifact: str) -> BareModel:
        found = load_artifact(artifact)
        return cls(open_backend(found.backend, found.model_path, found.runtime_config))

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        shapes = tuple(tuple(v.shape) for v in feeds.values())
        if shapes not in self.shapes:
            self.backend.prepare(feeds)
            self.shapes.add(shapes)
        return self.backend.run(feeds)


def _answer(status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> bytes:
    reason = b"OK" if status == 200 else b"Error"
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status, reason, content_type, len(body))  # fmt: skip
    return head + extra + b"\r\n" + body


class BareConnection(asyncio.Protocol):
    """One keep-alive connection: parse, run, answer, all inside `data_received`."""

    def __init__(self, model: BareModel) -> None:
        self.model = model
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.header_length: int | None = None
        self.url = b""
        self.started = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(_answer(400, b"malformed request", b"text/plain"))
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.started = time.monotonic()
        self.body = []
        self.header_length = None

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == HEADER_LENGTH_NAME:
            self.header_length = int(value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.parser.get_method() == b"GET":
            found = self.url.rstrip(b"/") == b"/v2/models/" + MODEL.encode()
            self.transport.write(
                _answer(200, self.model.metadata, b"application/json") if found
                else _answer(404, b"not found", b"text/plain")
            )  # fmt: skip
            return
        t_read = time.monotonic()
        try:
            request = decode_request(b"".join(self.body), self.header_length, self.model.backend.inputs)
        except InputError as exc:
            self.transport.write(_answer(400, exc.one_line().encode(), b"text/plain"))
            return
        t_decoded = time.monotonic()
        outputs = self.model.run(request.feeds)
        t_ran = time.monotonic()
        payload, head_len = encode_response(MODEL, "1", request, outputs, self.model.backend.outputs)
        t_done = time.monotonic()
        timing = (
            f"Server-Timing: read;dur={(t_read - self.started) * 1e3:.3f}, "
            f"decode;dur={(t_decoded - t_read) * 1e3:.3f}, queue;dur=0, batch;dur=0, "
            f"model;dur={(t_ran - t_decoded) * 1e3:.3f}, encode;dur={(t_done - t_ran) * 1e3:.3f}, "
            f"total;dur={(t_done - self.started) * 1e3:.3f}\r\n"
        ).encode()
        if head_len is None:
            self.transport.write(_answer(200, payload, b"application/json", timing))
        else:
            extra = timing + f"{HEADER_LENGTH}: {head_len}\r\n".encode()
            self.transport.write(_answer(200, payload, b"application/octet-stream", extra))


async def serve(artifact: str, port: int) -> None:
    model = BareModel.from_artifact(artifact)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: BareConnection(model), "127.0.0.1", port)
    bound = server.sockets[0].getsockname()[1]
    print(f"serving {MODEL} (bare) at http://127.0.0.1:{bound}", flush=True)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("artifact")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):  # stopped by a signal: nothing to report
        asyncio.run(serve(args.artifact, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
