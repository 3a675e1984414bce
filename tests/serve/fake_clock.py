"""A clock for batcher tests: time moves only when the test, or a fake model, says so.

The test lets time pass with `await clock.advance(seconds)`, or up to the batcher's next timer
with `await clock.run_next_timer()`; a fake model taking simulated time calls
`clock.pass_time(seconds)` from its thread. Timers fire on their event loop once
their time has come, each at its own time, so a decision made at a timer sees that time.

Two rules for tests:
- A model call that is not held at a gate is awaited before time moves on: its thread reads
  the clock when it gets to run, which may be after an advance made meanwhile.
- A deadline is still (just) met at the instant it expires, so a test that wants to see a
  request expire advances past that instant, not onto it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# Loop iterations that let the batcher react before time moves on: a submit wakes the
# dispatcher, which arms its timer; a timer wakes the dispatcher, which launches a batch.
# Twice the longest such chain (three): each iteration costs microseconds.
SETTLE_ITERATIONS = 6


async def settle() -> None:
    """Let the tasks and callbacks that are ready run, and those they make ready in turn."""
    for _ in range(SETTLE_ITERATIONS):
        await asyncio.sleep(0)


@dataclass(order=True)
class FakeTimer:
    when: float
    seq: int  # arming order breaks ties, like the event loop
    loop: asyncio.AbstractEventLoop = field(compare=False)
    callback: Callable[[], object] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.callback()


class FakeClock:
    """Implements `optimize.serve.clock.Clock`; safe to read and advance from any thread."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[FakeTimer] = []  # a heap, earliest first
        self._seq = itertools.count()
        self._lock = threading.Lock()  # model threads pass time while the loop reads it

    def now(self) -> float:
        with self._lock:
            return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeTimer:
        loop = asyncio.get_running_loop()
        timer = FakeTimer(when, next(self._seq), loop, callback)
        with self._lock:
            due = when <= self._now
            if not due:
                heapq.heappush(self._timers, timer)
        if due:  # as the event loop does with a time already past: on its next iteration
            loop.call_soon(timer.fire)
        return timer

    def _earliest(self) -> FakeTimer | None:
        """The earliest timer not cancelled (cancelled ones are dropped); call under the lock."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0] if self._timers else None

    def _pop_due(self, until: float) -> FakeTimer | None:
        """Take the earliest timer due by `until` and move time to it; call under the lock."""
        timer = self._earliest()
        if timer is None or timer.when > until:
            return None
        heapq.heappop(self._timers)
        self._now = max(self._now, timer.when)
        return timer

    async def advance(self, seconds: float) -> None:
        """Let `seconds` pass, from the event loop: what is ready runs first, at the present
        time; then each timer due on the way fires at its time, and what it wakes (the
        dispatcher) runs before time moves on."""
        until = self.now() + seconds
        await settle()
        await self._advance_to(until)

    async def run_next_timer(self) -> None:
        """Let time pass to the earliest armed timer, and fire it (and any due with it)."""
        await settle()
        with self._lock:
            timer = self._earliest()
        assert timer is not None, "no timer is armed: nothing would ever move time"
        await self._advance_to(timer.when)

    async def _advance_to(self, until: float) -> None:
        while True:
            with self._lock:
                timer = self._pop_due(until)
                if timer is None:
                    self._now = max(self._now, until)
            if timer is None:
                break
            timer.fire()  # on this loop's thread, as the loop itself would
            await settle()
        await settle()

    def pass_time(self, seconds: float) -> None:
        """Let `seconds` pass from any thread (a model call taking that long): due timers are
        handed to their loops. Calls on several threads add up, they do not overlap."""
        with self._lock:
            until = self._now + seconds
            due = []
            while (timer := self._pop_due(until)) is not None:
                due.append(timer)
            self._now = until
        for timer in due:
            timer.loop.call_soon_threadsafe(timer.fire)
