"""The floor a server is held to: the same model in the load's own process, no HTTP, no batching
policy, one worker that runs whatever has arrived.

Requests go into one FIFO queue; a single worker thread takes the oldest and every other one
waiting, up to `max_batch` rows, runs them as one batch, and answers them. Nothing waits on purpose
and nothing is reordered, so under Poisson arrivals its latency percentiles are what this model on
this machine gives at that rate: the physical reference `lto load` prints beside a server's
figures (`--floor`). The model's batch-1 throughput alone (one request at a time, back to back)
is measured the same way, so a rate can be given as a share of what the model can do.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from optimize.backend import Backend
from optimize.runtimes.warmup import batch_shapes, warm_shapes
from optimize.serve.loadgen import Endpoint, Outcome

FLOOR_MAX_BATCH = 8  # rows one run may take when the model's batch axis is free


def batch_axis_free(backend: Backend) -> bool:
    """Whether every input's first axis is dynamic, so that waiting requests can run as one batch."""
    return all(spec.shape and not isinstance(spec.shape[0], int) for spec in backend.inputs)


class FloorEndpoint(Endpoint):
    """The model in-process behind one FIFO worker with greedy batching (the module's docstring)."""

    remainder = "event_loop"

    def __init__(
        self, backend: Backend, feeds: Sequence[Mapping[str, np.ndarray]], max_batch: int = FLOOR_MAX_BATCH
    ) -> None:
        self.backend = backend
        self.row_feeds = [dict(f) for f in feeds]
        self.rows = len(self.row_feeds)
        self.max_batch = max_batch if batch_axis_free(backend) else 1
        self.name = f"in-process, one worker, greedy batches of up to {self.max_batch}"
        self._queue: queue.SimpleQueue[
            tuple[dict[str, np.ndarray], asyncio.Future[Outcome], float] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> None:
        """Run every batch the worker may form once (a runtime's first run of a shape is set-up, not
        the floor), then start the worker."""
        self._loop = asyncio.get_running_loop()
        row = self.row_feeds[0]
        per = next((int(v.shape[0]) for v in row.values() if v.ndim), 1)
        with contextlib.suppress(Exception):  # a model that fails here fails its requests, answered
            await self._loop.run_in_executor(
                None, warm_shapes, self.backend, row, batch_shapes(per, per * self.max_batch)
            )
        self._thread = threading.Thread(target=self._work, name="lto-floor", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    async def infer(self, row: int | None = None) -> Outcome:
        assert self._loop is not None, "open() first"
        future: asyncio.Future[Outcome] = self._loop.create_future()
        self._queue.put((self.row_feeds[self._take(row)], future, time.perf_counter()))
        return await future

    def _work(self) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # answer these, then stop
                    break
                batch.append(item)
            started = time.perf_counter()
            try:
                if len(batch) == 1:
                    outputs = [self.backend.run(batch[0][0])]
                else:
                    feeds = {k: np.concatenate([b[0][k] for b in batch]) for k in batch[0][0]}
                    joined = self.backend.run(feeds)
                    outputs = [{k: v[i : i + 1] for k, v in joined.items()} for i in range(len(batch))]
                kind = "ok"
            except Exception:  # a runtime failure answers the requests, as a server would
                outputs, kind = [{} for _ in batch], "error"
            model_ms = (time.perf_counter() - started) * 1e3
            for (_, future, arrived), _out in zip(batch, outputs, strict=True):
                queue_ms = (started - arrived) * 1e3
                phases = {"queue": queue_ms, "model": model_ms, "total": queue_ms + model_ms}
                outcome = Outcome(kind, phases if kind == "ok" else None, len(batch))
                loop.call_soon_threadsafe(_settle, future, outcome)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "transport": "in-process", "rows": self.rows, "max_batch": self.max_batch}


def _settle(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def throughput_alone(
    backend: Backend, feeds: Sequence[Mapping[str, np.ndarray]], seconds: float = 2.0
) -> float:
    """Requests per second the model answers one at a time, back to back, in this thread: the
    model's own batch-1 capacity, which a served rate is a share of."""
    rows = [dict(f) for f in feeds]
    for row in rows[:3]:
        backend.run(row)  # warm-up
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done < 20:
        backend.run(rows[done % len(rows)])
        done += 1
    return done / elapsed
