"""When the batcher runs: accepting, draining, whether anything is in hand, and the dispatcher task.

The dispatcher is driven by a timer, not by arrivals: each time it wakes it asks for the next
instant anything must happen (a batch's max wait, a deadline, an expiry), arms one timer on the
batcher's clock for it, and sleeps until that timer or a kick (a request queued, a batch done,
a drain) wakes it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from optimize.serve.clock import Clock, Timer

# Launches what leaves now (as of the time given) and says when to wake next, if ever.
DispatchStep = Callable[[float], float | None]
# Told when a step raised: answers what is queued, which no later step may be able to launch.
StepFailed = Callable[[Exception], None]

log = logging.getLogger("lto.serve")


class Lifecycle:
    """The batcher's running state; `open()` and `run()` inside a running event loop."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.accepting = False
        self.draining = False
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set when nothing is queued or running
        self._timer: Timer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def dispatching(self) -> bool:
        """Whether the dispatcher task runs (from `run()` until `drain()` stops it)."""
        return self._task is not None

    def open(self) -> None:
        """Make the events the dispatcher and drain wait on (before warm-up runs any model call)."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def run(self, step: DispatchStep, failed: StepFailed) -> None:
        """Accept requests from now on, and start the dispatcher task that calls `step` (and
        `failed` when a step raises)."""
        self.accepting = True
        self._task = asyncio.get_running_loop().create_task(
            self._dispatch_loop(step, failed), name="lto-dispatcher"
        )

    def kick(self) -> None:
        """Wake the dispatcher now: it re-arms its timer for whatever is queued."""
        if self._wake is not None:
            self._wake.set()

    def busy(self) -> None:
        """A request was accepted: draining waits for it."""
        assert self._idle is not None
        self._idle.clear()

    def idle(self) -> None:
        """Nothing is queued or running any more."""
        if self._idle is not None:
            self._idle.set()

    async def drain(self) -> None:
        """Stop accepting, wait until everything accepted is answered, stop the dispatcher."""
        self.accepting = False
        self.draining = True
        self.kick()
        if self._idle is not None:
            await self._idle.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._timer is not None:
            self._timer.cancel()

    async def _dispatch_loop(self, step: DispatchStep, failed: StepFailed) -> None:
        """The timer side of dispatch: wakes for max-wait, deadline and expiry times. A step that
        raises (a bug) must not end the task: its queued requests would then wait for ever, and
        so would a drain."""
        assert self._wake is not None
        while True:
            self._wake.clear()
            try:
                wake_at = step(self.clock.now())
            except Exception as exc:
                log.exception("the batcher's dispatcher failed; answering what was queued")
                failed(exc)
                wake_at = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if wake_at is not None:
                self._timer = self.clock.call_at(wake_at, self._wake.set)
            await self._wake.wait()
