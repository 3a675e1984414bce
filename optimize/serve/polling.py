"""Busy polling for the server's event loop (`lto serve --busy-poll-us`): latency for CPU.

An idle loop sleeps in epoll_wait; on a VM, the halted vCPU then takes a wake-up (an exit to the
hypervisor) when the next request arrives, and the model's first run after the pause is slower.
Measured on a 2-core Firecracker VM: the wake-up adds ~0.05 ms to a request, the pause ~0.04 ms to
a 0.8 ms CNN run. Polling for a short while before sleeping catches a client that sends its next
request soon after the last answer, as ONNX Runtime's spinning thread pool does for its own work.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Awaitable, Callable
from typing import Any


class PollingSelector(selectors.EpollSelector):
    """Polls (epoll with timeout 0) for up to `poll_s` before sleeping, while `may_poll()`.

    `may_poll` must say no while model threads run: the polling thread holds the GIL between
    polls, and a thread waiting for it could wait a whole switch interval (5 ms).
    """

    def __init__(self, poll_s: float) -> None:
        super().__init__()
        self.poll_s = poll_s
        self.may_poll: Callable[[], bool] = lambda: False

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0 or self.poll_s <= 0 or not self.may_poll():
            return super().select(timeout)
        window = self.poll_s if timeout is None else min(self.poll_s, timeout)
        end = time.monotonic() + window
        while True:
            ready = super().select(0)
            if ready or time.monotonic() >= end:
                break
        if ready:
            return ready
        return super().select(None if timeout is None else max(0.0, timeout - window))


def run(main: Callable[[PollingSelector | None], Awaitable[Any]], busy_poll_us: float) -> Any:
    """asyncio.run(main(selector)) on the server's loop: asyncio's default, or one whose selector
    polls first when `busy_poll_us` > 0 (main receives that selector, or None)."""
    if busy_poll_us <= 0:
        return asyncio.run(main(None))
    selector = PollingSelector(busy_poll_us / 1e6)
    loop = asyncio.SelectorEventLoop(selector)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main(selector))
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
