"""The bounded queue: waiting requests by batch key, in arrival order, and their deadlines.

Requests that can share a model call share a key (`signature.batch_key`) and wait in that key's
deque; a heap orders those with a deadline by it, so expiry looks at one request, not all.
A request leaves the queue by being marked (`queued = False`); its entries are dropped lazily,
since removing from the middle of a deque is O(n) and overload expires many at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimize.serve.batching.outcomes import InferResult


@dataclass(eq=False)
class Pending:
    """One request from submission to answer."""

    feeds: dict[str, np.ndarray]
    rows: int
    seq_len: int | None
    bucket: int | None
    key: tuple[Any, ...]
    work: float
    deadline: float  # hard: math.inf unless the client or --queue-timeout-ms set one
    target: float  # soft: when the batch should leave to keep to --target-latency-ms
    enqueued: float
    future: asyncio.Future[InferResult]
    seq: int = 0
    queued: bool = True
    alone: bool = False  # the caller holds no other request (see BatcherConfig.inline_max_ms)


class RequestQueue:
    """Requests waiting for a batch; `rows` is what `--max-queue` bounds."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Any, ...], deque[Pending]] = {}
        self._key_rows: dict[tuple[Any, ...], int] = {}
        self._deadlines: list[tuple[float, int, Pending]] = []
        self._counter = itertools.count()
        self.rows = 0
        self.work = 0.0

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def add(self, req: Pending) -> None:
        req.seq = next(self._counter)
        self.by_key.setdefault(req.key, deque()).append(req)
        self._key_rows[req.key] = self._key_rows.get(req.key, 0) + req.rows
        if req.deadline < float("inf"):
            heapq.heappush(self._deadlines, (req.deadline, req.seq, req))
        self.rows += req.rows
        self.work += req.work

    def remove(self, req: Pending) -> None:
        """Take a request out of the queue (a no-op when it is no longer queued). Its deque entry
        is left behind and skipped, but never at a deque's head: the head is always live."""
        if not req.queued:
            return
        req.queued = False
        self.rows -= req.rows
        self.work = max(0.0, self.work - req.work) if self.rows else 0.0
        left = self._key_rows[req.key] - req.rows
        if left:
            self._key_rows[req.key] = left
            queue = self.by_key[req.key]
            while queue and not queue[0].queued:
                queue.popleft()
        else:
            del self._key_rows[req.key]
            del self.by_key[req.key]

    def take_all(self) -> list[Pending]:
        """Take every queued request out, in arrival order."""
        taken = sorted((r for q in self.by_key.values() for r in q if r.queued), key=lambda r: r.seq)
        for req in taken:
            self.remove(req)
        return taken

    def expired(self, now: float, needs_ms: Callable[[Pending], float]) -> Iterator[tuple[Pending, float]]:
        """Take out and yield (request, predicted ms) for each request that can no longer meet its
        deadline even run alone at `now`, earliest deadline first."""
        while self._deadlines:
            deadline, _, req = self._deadlines[0]
            if not req.queued:
                heapq.heappop(self._deadlines)
                continue
            needs = needs_ms(req)
            if now + needs / 1e3 <= deadline:
                return
            heapq.heappop(self._deadlines)
            self.remove(req)
            yield req, needs

    def next_expiry(self, needs_ms: Callable[[Pending], float]) -> float | None:
        """When the queued request with the earliest deadline must start to meet it, if any."""
        while self._deadlines and not self._deadlines[0][2].queued:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return None
        req = self._deadlines[0][2]
        return req.deadline - needs_ms(req) / 1e3
