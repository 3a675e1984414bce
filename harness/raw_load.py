"""A load generator that costs the machine little: raw keep-alive HTTP/1.1 connections, each
request's bytes built once, responses read only as far as the status line and Content-Length.

On a 2-core machine the load generator shares the cores with the server it measures. The aiohttp
client of `lto load` needs most of a core to offer 3,000 binary requests/s of 110 KB, so an
overload run measured the contest for cores more than the server (last measured: the server got
1.12 cores). This one needs a small fraction of that (its CPU time is reported with each run).

Open loop: Poisson arrivals at a fixed rate; an arrival with no free connection (all
`max_connections` busy) waits in the client and its wait counts in its latency, as a user's would.
Closed loop: `concurrency` connections, each sending its next request when the last is answered.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from optimize.serve.protocol import HEADER_LENGTH, encode_request


@dataclass
class RawLoadResult:
    issued: int = 0
    answered: int = 0
    by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    ok_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    issue_s: float = 0.0  # how long arrivals were issued (the drain of the backlog comes after)
    cpu_s: float = 0.0  # this process's CPU time during the run
    max_backlog: int = 0  # arrivals that waited in the client for a connection, at most

    def to_json(self) -> dict[str, Any]:
        ok = np.asarray(self.ok_ms) if self.ok_ms else None
        return {
            "issued": self.issued,
            "answered": self.answered,
            "by_status": dict(self.by_status),
            "ok_per_s": len(self.ok_ms) / self.wall_s if self.wall_s else None,
            "offered_per_s": self.issued / self.issue_s if self.issue_s else None,
            "ok_p50_ms": float(np.percentile(ok, 50)) if ok is not None else None,
            "ok_p99_ms": float(np.percentile(ok, 99)) if ok is not None else None,
            "wall_s": self.wall_s,
            "client_cpu_cores": self.cpu_s / self.wall_s if self.wall_s else None,
            "max_backlog": self.max_backlog,
        }


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, load: RawLoad) -> None:
        self.load = load
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.sent_at: float | None = None  # the scheduled time of the request in flight
        self.timed_out = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, scheduled: float) -> None:
        assert self.transport is not None
        self.sent_at = scheduled
        self.transport.write(self.load.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.sent_at is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buffer[:end]).lower().split(b"\r\n")
            length = 0
            closes = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    closes = value.strip() == b"close"
            if len(self.buffer) < end + 4 + length:
                return
            status = lines[0][9:12].decode()
            del self.buffer[: end + 4 + length]
            scheduled, self.sent_at = self.sent_at, None
            self.load.answered(self, status, scheduled, closes)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.sent_at is not None:
            scheduled, self.sent_at = self.sent_at, None
            self.load.answered(self, "client_timeout" if self.timed_out else "closed", scheduled, True)
        self.load.lost(self)


def http_request(
    url: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[str, int, bytes]:
    """Host, port and the bytes of one HTTP/1.1 request to them (a POST when it has a body)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    method = "POST" if body else "GET"
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return host, port, ("\r\n".join(head) + "\r\n\r\n").encode() + body


def binary_infer_request(feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a KServe v2 infer request for `feeds`, binary tensors both ways."""

    body, head_len = encode_request(feeds, binary=True, binary_outputs=True)
    return body, {HEADER_LENGTH: str(head_len), "Content-Type": "application/octet-stream"}


class RawLoad:
    def __init__(
        self,
        url: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        max_connections: int = 1024,
        timeout_s: float = 30.0,
    ) -> None:
        self.timeout_s = timeout_s  # a request unanswered this long after its arrival is given up
        self._conns: set[_Connection] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self.host, self.port, self.request = http_request(url, path, body, headers)
        self.max_connections = max_connections
        self._idle: list[_Connection] = []
        self._opening = 0
        self._open = 0
        self._backlog: collections.deque[float] = collections.deque()
        self._result = RawLoadResult()
        self._outstanding = 0
        self._done: asyncio.Event | None = None
        self._issuing = False
        self._closed_loop = False

    # ------------------------------------------------------------------------ connections
    def _dispatch(self, scheduled: float) -> None:
        if self._idle:
            self._idle.pop().send(scheduled)
            return
        self._backlog.append(scheduled)
        self._result.max_backlog = max(self._result.max_backlog, len(self._backlog))
        if self._open + self._opening < self.max_connections:
            self._spawn_connect()

    def _spawn_connect(self) -> None:
        self._opening += 1
        task = asyncio.ensure_future(self._connect())
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError:
            self._opening -= 1
            if self._backlog:  # count the arrival that wanted this connection as failed
                self.answered(None, "connect_error", self._backlog.popleft(), True)
            return
        self._opening -= 1
        self._open += 1
        self._conns.add(conn)
        self._release(conn)

    def _release(self, conn: _Connection) -> None:
        if self._backlog:
            conn.send(self._backlog.popleft())
        elif self._closed_loop and self._issuing:
            self._issue_now()
            self._release(conn)
        else:
            self._idle.append(conn)

    def answered(self, conn: _Connection | None, status: str, scheduled: float, closes: bool) -> None:
        loop = asyncio.get_running_loop()
        result = self._result
        result.answered += 1
        result.by_status[status] += 1
        if status == "200":
            result.ok_ms.append((loop.time() - scheduled) * 1e3)
        self._outstanding -= 1
        if conn is not None and not closes:
            self._release(conn)
        elif conn is not None and conn.transport is not None:
            conn.transport.close()
        if self._outstanding == 0 and not self._issuing and self._done is not None:
            self._done.set()

    def lost(self, conn: _Connection) -> None:
        self._open -= 1
        self._conns.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        if self._backlog and self._open + self._opening < self.max_connections:
            self._spawn_connect()  # arrivals still wait: replace the connection

    def _issue_now(self) -> None:
        loop = asyncio.get_running_loop()
        self._result.issued += 1
        self._outstanding += 1
        now = loop.time()
        if self._closed_loop:
            self._backlog.append(now)
        else:
            self._dispatch(now)

    # ----------------------------------------------------------------------------- runs
    async def open_loop(self, qps: float, seconds: float, seed: int = 0) -> RawLoadResult:
        """Poisson arrivals at `qps` for `seconds`, then wait for every answer."""
        loop = asyncio.get_running_loop()
        rng = np.random.default_rng(seed)
        gaps = iter(rng.exponential(1.0 / qps, size=int(qps * seconds * 2) + 100))
        self._begin(closed=False)
        start = loop.time()
        stop_at = start + seconds

        def arrive(at: float) -> None:
            if at >= stop_at:
                self._stop_issuing(loop.time() - start)
                return
            self._result.issued += 1
            self._outstanding += 1
            self._dispatch(at)
            nxt = at + float(next(gaps))
            loop.call_at(nxt, arrive, nxt)

        loop.call_at(start, arrive, start)
        return await self._finish(start)

    async def closed_loop(self, concurrency: int, seconds: float) -> RawLoadResult:
        """`concurrency` requests always in flight for `seconds`."""
        loop = asyncio.get_running_loop()
        self._begin(closed=True)
        self.max_connections = concurrency
        start = loop.time()
        for _ in range(concurrency):
            self._issue_now()
            self._spawn_connect()
        loop.call_later(seconds, lambda: self._stop_issuing(loop.time() - start))
        return await self._finish(start)

    def _begin(self, closed: bool) -> None:
        self._result = RawLoadResult()
        self._done = asyncio.Event()
        self._issuing = True
        self._closed_loop = closed
        self._cpu0 = time.process_time()
        asyncio.get_running_loop().call_later(0.5, self._sweep)

    def _sweep(self) -> None:
        """Give up requests older than timeout_s: those still waiting for a connection, and
        those in flight (their connection is closed, as a client with a timeout would)."""
        loop = asyncio.get_running_loop()
        oldest = loop.time() - self.timeout_s
        while self._backlog and self._backlog[0] < oldest:
            self.answered(None, "client_timeout", self._backlog.popleft(), True)
        for conn in list(self._conns):
            if conn.sent_at is not None and conn.sent_at < oldest and conn.transport is not None:
                conn.timed_out = True
                conn.transport.abort()
        if self._done is not None and not self._done.is_set():
            loop.call_later(0.5, self._sweep)

    def _stop_issuing(self, issue_s: float) -> None:
        self._issuing = False
        self._result.issue_s = issue_s
        if self._outstanding == 0 and self._done is not None:
            self._done.set()

    async def _finish(self, start: float) -> RawLoadResult:
        assert self._done is not None
        await self._done.wait()
        result = self._result
        result.wall_s = asyncio.get_running_loop().time() - start
        result.cpu_s = time.process_time() - self._cpu0
        return result

    def close(self) -> None:
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()


def infer_load(
    url: str, model: str, feeds: dict[str, np.ndarray], max_connections: int = 1024, timeout_s: float = 30.0
) -> RawLoad:
    """Binary KServe v2 infer requests for `feeds` to `url`."""
    body, headers = binary_infer_request(feeds)
    return RawLoad(url, f"/v2/models/{model}/infer", body, headers, max_connections, timeout_s)
