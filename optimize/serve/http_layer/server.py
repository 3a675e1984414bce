"""The listening server: its connections, and what all of them together may hold.

Connections and body bytes are counted per server and per client address, against `HttpLimits`;
a sweep every fraction of a second (on the server's clock) checks the limits that no timer of a
connection's own watches.
"""

from __future__ import annotations

import asyncio
import contextlib

from optimize.serve.clock import Clock, MonotonicClock, Timer
from optimize.serve.http_layer.connection import ClientUse, HttpConnection
from optimize.serve.http_layer.limits import HttpLimits
from optimize.serve.http_layer.messages import HttpApplication
from optimize.serve.http_layer.sweep import sweep


class HttpServer:
    """Listens on host:port and runs every connection with `app`, within `limits`."""

    def __init__(
        self, app: HttpApplication, limits: HttpLimits | None = None, clock: Clock | None = None
    ) -> None:
        self.app = app
        self.limits = limits or HttpLimits()
        self.limits.check()
        # Every limit in time is measured on this clock and fires on its timers.
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.connections: set[HttpConnection] = set()
        self.clients: dict[str, ClientUse] = {}  # by address
        self.body_bytes = 0  # body bytes held, all clients
        self._server: asyncio.base_events.Server | None = None
        self._sweep_timer: Timer | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; the port bound (the real one when 0 was asked for)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: HttpConnection(self), host, port, reuse_address=True)
        self._arm_sweep()
        return int(self._server.sockets[0].getsockname()[1])

    # ---------------------------------------------------------------- accounting
    def open_connection(self, connection: HttpConnection) -> str | None:
        """Count a new connection; the reason it is refused, if it is."""
        use = self.clients.get(connection.client)
        if use is None:
            use = self.clients[connection.client] = ClientUse()
        connection.use = use
        if len(self.connections) >= self.limits.max_connections:
            reason = (
                f"overloaded: {len(self.connections)} connections open (limit {self.limits.max_connections})"
            )
        elif use.connections >= self.limits.max_client_connections:
            reason = (
                f"overloaded: this client has {use.connections} connections open "
                f"(limit {self.limits.max_client_connections} per client)"
            )
        else:
            self.connections.add(connection)
            use.connections += 1
            return None
        self._forget(connection.client, use)
        return reason

    def close_connection(self, connection: HttpConnection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            connection.use.connections -= 1
            self._forget(connection.client, connection.use)

    def _forget(self, client: str, use: ClientUse) -> None:
        if use.connections == 0 and use.body_bytes == 0 and self.clients.get(client) is use:
            del self.clients[client]

    def charge(self, use: ClientUse, size: int) -> str | None:
        """Charge arrived body bytes; the reason they cannot be, if over a budget."""
        if self.body_bytes + size > self.limits.max_inflight_body_bytes:
            return f"{self.body_bytes} body bytes in flight (limit {self.limits.max_inflight_body_bytes})"
        if use.body_bytes + size > self.limits.max_client_body_bytes:
            return (
                f"this client has {use.body_bytes} body bytes in flight "
                f"(limit {self.limits.max_client_body_bytes} per client)"
            )
        use.body_bytes += size
        self.body_bytes += size
        return None

    def declared_refusal(self, use: ClientUse, declared: int) -> str | None:
        """Why a body of `declared` bytes cannot fit in what is free now, if it cannot. Only
        bytes that arrived count as used: a declared length that is never sent holds nothing."""
        limits = self.limits
        if declared and self.body_bytes + declared > limits.max_inflight_body_bytes:
            return f"{self.body_bytes} body bytes in flight (limit {limits.max_inflight_body_bytes})"
        if declared and use.body_bytes + declared > limits.max_client_body_bytes:
            return (
                f"this client has {use.body_bytes} body bytes "
                f"in flight (limit {limits.max_client_body_bytes} per client)"
            )
        return None

    def release(self, client: str, use: ClientUse, size: int) -> None:
        self.body_bytes -= size
        use.body_bytes -= size
        if use.body_bytes == 0 and use.connections == 0:
            self._forget(client, use)

    # ---------------------------------------------------------------- timers
    def _arm_sweep(self) -> None:
        # One sweep a fraction of a second instead of a timer per request or connection.
        self._sweep_timer = self.clock.call_at(self.clock.now() + self.limits.sweep_interval_s, self._sweep)

    def _sweep(self) -> None:
        now = self.clock.now()
        for connection in list(self.connections):
            sweep(connection, now)
        self._arm_sweep()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening, let handlers in flight answer (up to `timeout_s`), then close."""
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._server is not None:
            self._server.close()
        tasks = [ex.task for c in self.connections for ex in c.answers if ex.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
