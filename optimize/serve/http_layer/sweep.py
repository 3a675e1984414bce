"""The limits no timer of a connection's own watches, checked for every connection every fraction
of a second (`HttpLimits.sweep_interval_s`): a timer per request would cost too much.

- the send timeout: bytes owed to the client that do not move (flow_control.py);
- the first request: a new connection must send a whole head within `first_request_timeout_s`;
- keep-alive: a connection idle past `keepalive_s` is closed;
- the body rate: a body arriving slower than `min_body_rate` over `rate_window_s` gets 408.
"""

from __future__ import annotations

import logging

from optimize.serve.http_layer.connection import HttpConnection
from optimize.serve.http_layer.reader import Phase

log = logging.getLogger("lto.serve")


def sweep(connection: HttpConnection, now: float) -> None:
    """Check `connection` against the limits in time, as of `now`."""
    limits = connection.limits
    transport = connection.transport
    if transport is None:
        return
    owed = transport.get_write_buffer_size()
    if connection.flow.send_stalled(now, owed, limits.send_timeout_s):
        connection.app.count("send_timeout")
        log.info("aborted a connection from %s: %d bytes owed did not move in %g s",
                 connection.client, owed, limits.send_timeout_s)  # fmt: skip
        connection.abort()
        return
    if connection.closing:
        return
    reader = connection.reader
    if reader.heads_seen == 0 and now - connection.accepted > limits.first_request_timeout_s:
        if reader.in_message:
            message = f"no whole request within {limits.first_request_timeout_s:g} s of connecting"
            connection.give_up(408, message, "read_timeout")
        else:
            connection.close()  # never sent a byte: nothing to answer
        return
    if connection.idle_for(now) > limits.keepalive_s:
        connection.close()
        return
    ex = reader.reading
    if ex is not None and not ex.refused and not connection.flow.paused and reader.phase is Phase.BODY:
        start, received = reader.rate_mark
        if now - start >= limits.rate_window_s:
            rate = (ex.received - received) / (now - start)
            if rate < limits.min_body_rate:
                connection.give_up(
                    408,
                    f"the request body arrived at {rate:.0f} B/s, under the minimum of "
                    f"{limits.min_body_rate:g} B/s",
                    "read_timeout",
                )
                return
            reader.rate_mark = (now, ex.received)
