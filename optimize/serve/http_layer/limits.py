"""What one connection or client may cost the server: every limit of the HTTP layer, in one object.

docs/serving-limits.md has each limit's reference in nginx, h11, Node and Kestrel and the attack it stops.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection or client may cost the server; each is a `lto serve` flag."""

    # Request line and header fields, in wire bytes: over it, 431 (414 while the request line
    # itself is unfinished). nginx: 1 KiB + 4 x 8 KiB; Node: 16 KiB; h11: 16 KiB.
    max_head_bytes: int = 64 * KIB
    # Header fields in a head, and trailer fields after a chunked body: 431. Node and Go: 100-2000.
    max_header_fields: int = 100
    # Chunk extensions (";name=value" after a chunk's size) over a whole body: 413. Node caps them
    # at 16 KiB (CVE-2024-22019: unbounded extensions let a client spend the server's CPU).
    max_chunk_ext_bytes: int = 16 * KIB
    # A request body's payload: 413 (declared, at the head; or as it arrives).
    max_body_bytes: int = 64 * MIB
    # A request must be whole this long after its first byte arrived: 408.
    read_timeout_s: float = 30.0
    # A body arriving slower than this (bytes/s, measured over `rate_window_s`): 408. Kestrel's
    # MinRequestBodyDataRate is 240 B/s with a 5 s grace.
    min_body_rate: float = 1 * KIB
    rate_window_s: float = 5.0
    # Body bytes held in the server (arrived, exchange not yet ended): over them, 503.
    max_inflight_body_bytes: int = 256 * MIB
    max_client_body_bytes: int = 128 * MIB  # ... and per client address
    # Bytes owed to a client that do not move for this long: the connection is aborted.
    # nginx send_timeout: 60 s.
    send_timeout_s: float = 30.0
    max_connections: int = 1024  # open connections; above it: 503 and close
    max_client_connections: int = 512  # ... per client address (a proxy counts as one client)
    # A new connection must send a whole request head this soon (nginx client_header_timeout 60 s).
    first_request_timeout_s: float = 10.0
    keepalive_s: float = 75.0  # an idle keep-alive connection is closed (nginx, aiohttp: 75 s)
    # Answers owed on one connection beyond which it is not read (or parsed) until it catches up.
    max_pipelined: int = 32
    # A refusing close reads and drops what still arrives for up to this long (nginx: 30 s,
    # with 5 s between reads).
    linger_s: float = 5.0

    @property
    def sweep_interval_s(self) -> float:
        """How often the server checks the limits no timer of its own watches (send timeout, first
        request, keep-alive, body rate): a quarter of the shortest, within [0.01 s, 0.5 s]."""
        shortest = min(
            self.send_timeout_s, self.first_request_timeout_s, self.keepalive_s, self.rate_window_s
        )
        return max(0.01, min(0.5, shortest / 4))

    def check(self) -> None:
        """Refuse values that would make the server unusable (the CLI's flags reach here)."""
        if self.max_head_bytes < 1 * KIB:
            raise ValueError("the head budget must be at least 1 KiB (a browser's head is ~0.5-2 KiB)")
        if self.max_client_body_bytes > self.max_inflight_body_bytes:
            raise ValueError("a client's body budget cannot exceed the server's")
        if self.max_client_connections > self.max_connections:
            raise ValueError("a client's connection cap cannot exceed the server's")


def kib(n: int) -> str:
    """A byte count as the limits' messages give it: KiB below a MiB, MiB from there."""
    return f"{n / KIB:g} KiB" if n < MIB else f"{n / MIB:g} MiB"
