"""What the batcher has done, for the server's metrics and `describe()`: counts, and a hook told
about every batch."""

from __future__ import annotations

from collections.abc import Callable

from optimize.serve.batching.outcomes import BatchStats


class BatcherMetrics:
    """Batches run and requests answered; `on_batch`, when set, hears about every batch."""

    def __init__(self, on_batch: Callable[[BatchStats], None] | None = None) -> None:
        self.on_batch = on_batch
        self.batches_run = 0
        self.requests_answered = 0

    def answered(self) -> None:
        """A request got its outputs or its error."""
        self.requests_answered += 1

    def batch_ran(self, stats: BatchStats) -> None:
        """A batch returned, answered or failed."""
        self.batches_run += 1
        if self.on_batch is not None:
            self.on_batch(stats)
