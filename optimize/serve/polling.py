"""Busy polling for the server's event loop (`lto serve --busy-poll-us`): latency for CPU.

An idle loop sleeps in epoll_wait; on a VM, the halted vCPU then takes a wake-up (an exit to the
hypervisor) when the next request arrives, and the model's first run after the pause is slower.
Measured on a 2-core Firecracker VM: the wake-up adds ~0.05 ms to a request, the pause ~0.04 ms to
a 0.8 ms CNN run. Polling for a short while before sleeping catches a client that sends its next
request soon after the last answer, as ONNX Runtime's spinning thread pool does for its own work.

It polls only while that pays: every idle period tells whether the next event came within the
window (whether the loop polled or slept), and a running hit rate below one half stops the
polling until events come quickly again. A client that answers within the window gets the
polling; one that sends every 10 ms costs no CPU (measured: 0.4 ms of CPU a request without this).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Awaitable, Callable
from typing import Any

# Busy polling relies on epoll's level-triggered poll with timeout 0 and is measured only on
# Linux; elsewhere `lto serve` runs on asyncio's default selector and --busy-poll-us is ignored.
HAVE_EPOLL = hasattr(selectors, "EpollSelector")
_Base: type[selectors.BaseSelector] = getattr(selectors, "EpollSelector", selectors.DefaultSelector)


class PollingSelector(_Base):  # type: ignore[valid-type,misc]
    """Polls (epoll with timeout 0) for up to `poll_s` before sleeping, while `may_poll()`.

    `may_poll` must say no while model threads run: the polling thread holds the GIL between
    polls, and a thread waiting for it could wait a whole switch interval (5 ms).
    """

    # Weight of the latest idle period in the hit rate: about the last five count.
    LEARNING_RATE = 0.2

    def __init__(self, poll_s: float) -> None:
        super().__init__()
        self.poll_s = poll_s
        self.may_poll: Callable[[], bool] = lambda: False
        self.hit_rate = 1.0  # share of recent idle periods that an event ended within the window

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0 or self.poll_s <= 0 or not self.may_poll():
            return super().select(timeout)
        window = self.poll_s if timeout is None else min(self.poll_s, timeout)
        start = time.monotonic()
        if self.hit_rate >= 0.5:
            end = start + window
            while True:
                ready = super().select(0)
                if ready or time.monotonic() >= end:
                    break
            if ready:
                self._learn(hit=True)
                return ready
            ready = super().select(None if timeout is None else max(0.0, timeout - window))
        else:
            ready = super().select(timeout)
        # Slept: would a poll have caught it? (The wake-up adds to the wait; that errs to "no".)
        self._learn(hit=bool(ready) and time.monotonic() - start <= window)
        return ready

    def _learn(self, hit: bool) -> None:
        self.hit_rate += self.LEARNING_RATE * (float(hit) - self.hit_rate)


def run(main: Callable[[PollingSelector | None], Awaitable[Any]], busy_poll_us: float) -> Any:
    """asyncio.run(main(selector)) on the server's loop: asyncio's default, or one whose selector
    polls first when `busy_poll_us` > 0 (main receives that selector, or None)."""
    if busy_poll_us <= 0 or not HAVE_EPOLL:
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
