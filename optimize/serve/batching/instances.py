"""The model instances: one backend and one thread each, and what runs on that thread.

The batcher's event loop decides; an instance's thread runs the batch it is handed (assemble,
run, split) and stamps it with the batcher's clock. `Instances` keeps which instances are free,
when each busy one is predicted to be done, and which also hold their next batch (standby).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from optimize.backend import Backend
from optimize.runtimes.warmup import batch_shapes, rows_of, warm_shapes
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.batching.estimators import LatencyModel
from optimize.serve.batching.signature import BatchPart, ModelSignature, assemble, split
from optimize.serve.clock import Clock

Feeds = dict[str, np.ndarray]
# Each request's outputs (or the error it alone got), and when assembly started, the model call
# started and ended; and the batch's work.
BatchRun = tuple[list[Feeds | BaseException], float, float, float, float]


class Instances:
    """The instances of one model, their threads, and what each is busy with."""

    def __init__(self, backends: Sequence[Backend], signature: ModelSignature, clock: Clock) -> None:
        self.backends = list(backends)
        self.signature = signature
        self.clock = clock
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lto-model-{i}")
            for i in range(len(self.backends))
        ]
        self.free: list[int] = list(range(len(self.backends)))
        # Instance -> when its running batch is predicted to end; and the instances that also
        # hold their next batch (one at most), with when that one should end.
        self.busy_until: dict[int, float] = {}
        self.standby: dict[int, float] = {}
        self.inflight = 0  # batches launched and not yet finished

    def __len__(self) -> int:
        return len(self.backends)

    def next_free(self) -> tuple[int, float] | None:
        """The busy instance without a standby batch that is predicted to be free first, and when."""
        ready = [i for i in self.busy_until if i not in self.standby]
        if not ready:
            return None
        instance = min(ready, key=self.busy_until.__getitem__)
        return instance, self.busy_until[instance]

    def busy_ms(self, now: float) -> float:
        """What the running and standby batches of all instances have left, predicted, in ms."""
        return 1e3 * sum(max(0.0, self.standby.get(i, end) - now) for i, end in self.busy_until.items())

    def occupy(self, instance: int, end: float, standby: bool) -> None:
        """`instance` runs a batch predicted to end at `end`: now, or (standby) after its current one."""
        if standby:
            self.standby[instance] = end
        else:
            self.busy_until[instance] = end

    def release(self, instance: int) -> None:
        """A batch of `instance` ended: its standby batch (already running) becomes its current
        one, or the instance is free."""
        self.inflight -= 1
        if instance in self.standby:
            self.busy_until[instance] = self.standby.pop(instance)
        else:
            self.busy_until.pop(instance, None)
            self.free.append(instance)

    def start(
        self, instance: int, batch: Sequence[BatchPart], work_of: Callable[[Mapping[str, np.ndarray]], float]
    ) -> asyncio.Future[BatchRun]:
        """Run `batch` on the instance's thread (behind the batch it runs, if any)."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executors[instance], self.execute, instance, batch, work_of)

    def execute(
        self, instance: int, batch: Sequence[BatchPart], work_of: Callable[[Mapping[str, np.ndarray]], float]
    ) -> BatchRun:
        """Run the batch; when it fails, run its requests one by one, so that only the request
        that fails gets the error."""
        try:
            parts, t_asm, t_run, t_end, work = self._execute_batch(instance, batch, work_of)
            return list(parts), t_asm, t_run, t_end, work
        except Exception as exc:
            if len(batch) == 1:
                now = self.clock.now()
                return [exc], now, now, now, 0.0
        outs: list[Feeds | BaseException] = []
        t_asm = self.clock.now()
        for req in batch:
            try:
                outs.append(self._execute_batch(instance, [req], work_of)[0][0])
            except Exception as exc:
                outs.append(exc)
        t_end = self.clock.now()
        return outs, t_asm, t_asm, t_end, 0.0

    def _execute_batch(
        self, instance: int, batch: Sequence[BatchPart], work_of: Callable[[Mapping[str, np.ndarray]], float]
    ) -> tuple[list[Feeds], float, float, float, float]:
        """Assemble, run, split."""
        t_asm = self.clock.now()
        feeds = assemble(self.signature, batch)
        work = work_of(feeds)
        t_run = self.clock.now()
        outputs = self.backends[instance].run(feeds)
        t_end = self.clock.now()
        return split(self.signature, batch, outputs), t_asm, t_run, t_end, work

    async def warm_up(
        self,
        row: Mapping[str, np.ndarray],
        latency: LatencyModel,
        work_of: Callable[[Mapping[str, np.ndarray]], float],
        *,
        max_rows: int,
        config: BatcherConfig,
    ) -> None:
        """Run every batch shape of `row` once on every instance, then, when `config` says so,
        calibrate `latency`: calibration then times the prepared runs that requests will get."""
        await self.warm(row, max_rows)
        if config.calibrate:
            await self.calibrate(
                row,
                latency,
                work_of,
                max_rows=max_rows,
                budget_ms=config.model_budget_ms,
                runs=config.calibration_runs,
            )

    async def warm(self, row: Mapping[str, np.ndarray], max_rows: int) -> None:
        """Every instance prepares and runs every batch it can form of such rows once, so that no
        request pays a first run's set-up (OpenVINO compiles each new input shape on first
        sight: 17-36 ms for a 1.6 ms CNN, docs/serving.md)."""
        loop = asyncio.get_running_loop()
        sizes = batch_shapes(rows_of(row), max_rows)
        await asyncio.gather(
            *(
                loop.run_in_executor(self.executors[i], warm_shapes, backend, dict(row), sizes)
                for i, backend in enumerate(self.backends)
            )
        )

    async def calibrate(
        self,
        row: Mapping[str, np.ndarray],
        latency: LatencyModel,
        work_of: Callable[[Mapping[str, np.ndarray]], float],
        *,
        max_rows: int,
        budget_ms: float,
        runs: int,
    ) -> None:
        """Seed `latency` on the first instance: batch sizes 1, 2, 4 ... of `row`, `runs` timed
        runs each, until a batch is predicted over `budget_ms` or `max_rows` is reached."""
        run = functools.partial(self._calibrate, dict(row), latency, work_of, max_rows, budget_ms, runs)
        await asyncio.get_running_loop().run_in_executor(self.executors[0], run)

    def _calibrate(
        self,
        row: Feeds,
        latency: LatencyModel,
        work_of: Callable[[Mapping[str, np.ndarray]], float],
        max_rows: int,
        budget_ms: float,
        runs: int,
    ) -> None:
        backend = self.backends[0]
        size = 1
        while size <= max_rows:
            feeds = {k: np.concatenate([v] * size, axis=0) if size > 1 else v for k, v in row.items()}
            backend.run(feeds)  # warm-up for this shape
            work = work_of(feeds)
            for _ in range(runs):
                t0 = self.clock.now()
                backend.run(feeds)
                latency.observe(work, (self.clock.now() - t0) * 1e3)
            if latency.predict(work) > budget_ms or size == max_rows:
                break
            size = min(size * 2, max_rows)

    def shutdown(self) -> None:
        for executor in self.executors:
            executor.shutdown(wait=True)
