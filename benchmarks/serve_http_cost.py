"""What `lto serve`'s HTTP layer costs a request on the event loop, without a socket or a model.

Requests are fed to the layer's connection object as reads arrive from a socket (one read per
request, head and body together), through a fake transport, to an application that answers at
once; the figure is the median CPU time per request over rounds. Run it on two checkouts to
compare two versions of `optimize/serve/http_layer.py` on the same machine, alternating:

    python -m benchmarks.serve_http_cost                    # ~10 s
    python -m benchmarks.serve_http_cost --requests 20000 --rounds 9
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from optimize.serve import http_layer as layer


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def write(self, data: Any) -> None:
        self.sent += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0


class _App(layer.HttpApplication):
    max_body_bytes = 64 << 20  # read by versions of the layer that take the limits from the app
    read_timeout_s = 30.0

    def admit(self, request: Any) -> Any:
        return None

    def handle(self, request: Any) -> Any:
        return layer.HttpResponse(200, b'{"ok": true}')

    def count(self, outcome: str) -> None: ...

    def error_response(self, status: int, message: str) -> Any:
        return layer.HttpResponse(status, message.encode())


def request(body_bytes: int) -> bytes:
    head = (
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: bench\r\n"
        "Accept: */*\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: 120\r\nContent-Length: {body_bytes}\r\n\r\n"
    )
    return head.encode() + b"\0" * body_bytes


async def per_request_us(data: bytes, count: int) -> float:
    server = layer.HttpServer(_App())
    connection = layer.HttpConnection(server)
    connection.connection_made(_Transport())
    start = time.process_time()
    for _ in range(count):
        connection.data_received(data)
    return (time.process_time() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{layer.__file__}")
    for size in (600, 100_000):
        data = request(size)
        runs = [asyncio.run(per_request_us(data, args.requests)) for _ in range(args.rounds)]
        print(f"  body {size:>7} B: {statistics.median(runs):6.2f} us a request "
              f"(rounds {min(runs):.2f}-{max(runs):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
