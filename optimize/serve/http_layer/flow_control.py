"""Flow control of one connection: when to stop reading it, and whether what it owes moves.

Reading pauses for any of several reasons at once (too many answers owed, the transport's write
buffer full, a turn given to other connections) and resumes when the last of them goes. A
client that does not read its answers is found by the send timeout: the bytes owed to it not
moving for `send_timeout_s`.
"""

from __future__ import annotations

import asyncio
import enum


class Pause(enum.Enum):
    PIPELINED = "pipelined"  # `max_pipelined` answers are owed: parse nothing more until it catches up
    WRITE = "write"  # the transport's write buffer is over its high mark
    TURN = "turn"  # `max_pipelined` requests parsed in a row: other connections' turn


class FlowControl:
    """Why reading is paused, and when the bytes owed to the client last moved."""

    __slots__ = ("pauses", "send_mark")

    def __init__(self, now: float) -> None:
        self.pauses: set[Pause] = set()
        self.send_mark = (now, 0)  # (time, bytes owed) when the bytes owed last moved

    @property
    def paused(self) -> bool:
        return bool(self.pauses)

    def pause(self, transport: asyncio.Transport | None, reason: Pause) -> bool:
        """Pause reading for `reason`; whether reading stopped just now."""
        was = bool(self.pauses)
        self.pauses.add(reason)
        if was or transport is None:
            return False
        transport.pause_reading()
        return True

    def resume(self, transport: asyncio.Transport | None, reason: Pause) -> bool:
        """Drop `reason`; whether reading resumed just now (it was the last reason, and there is a
        `transport`: None when the connection is closed)."""
        if reason not in self.pauses:
            return False
        self.pauses.discard(reason)
        if self.pauses or transport is None:
            return False
        transport.resume_reading()
        return True

    def force_resume(self, transport: asyncio.Transport) -> None:
        """Read whatever the reasons (a lingering close reads and drops until the client is done)."""
        self.pauses.clear()
        try:
            transport.resume_reading()
        except Exception:  # a transport closing or never paused: nothing to resume
            return

    def send_stalled(self, now: float, owed: int, timeout_s: float) -> bool:
        """Whether `owed` bytes have not moved for longer than `timeout_s`, as of `now`."""
        mark_time, mark_size = self.send_mark
        if owed == 0 or owed < mark_size:
            self.send_mark = (now, owed)
            return False
        if now - mark_time > timeout_s:
            return True
        self.send_mark = (mark_time, owed)
        return False
