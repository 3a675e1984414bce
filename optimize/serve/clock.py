"""The time source of the batcher: where it reads the time and how it arms its timers.

Every time the batcher compares (arrivals, deadlines, batch leave times, model call
timestamps, calibration runs) comes from one `Clock`, so a test can pass one whose time
moves only when the test says so, and check decisions about milliseconds without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """A callback armed for a later time; `asyncio.TimerHandle` is one."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Seconds on a monotonic scale, and timers on that scale.

    `now` may be called from any thread (the model threads stamp their calls with it);
    `call_at` only from the event loop, whose thread runs `callback` once `when` has come.
    """

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer: ...


class MonotonicClock:
    """The real clock: `time.monotonic()`, and timers on the running event loop."""

    # The C function itself, so a reading on the request path costs no Python frame.
    now = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        # A delay, not the loop's own time: that holds whatever clock the loop reads.
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), callback)
