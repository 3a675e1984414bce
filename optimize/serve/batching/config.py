"""The batcher's settings: each one a `lto serve` flag (docs/usage.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optimize.errors import UsageError


@dataclass
class BatcherConfig:
    """How the batcher forms batches and what it admits; `validate` refuses unusable values."""

    max_batch: int = 32
    max_wait_ms: float = 1.0
    # What batch sizes aim for (a batch may take half of it); it steers, it never rejects.
    target_latency_ms: float = 50.0
    # A deadline for requests that bring none (Triton's default queue timeout); None: no deadline.
    queue_timeout_ms: float | None = None
    # Bound on rows waiting in the queue; beyond it requests are shed.
    max_queue: int = 256
    instances: int = 1
    # Pad token inputs to power-of-two lengths (with the attention mask) so that different
    # sequence lengths batch together; only when the model has such inputs.
    seq_buckets: bool = True
    min_bucket: int = 8
    calibrate: bool = True
    calibration_runs: int = 3
    # A request the caller says is alone (the server: the only one it holds) that finds nothing
    # queued or running, and is predicted to take at most this long, runs on the event loop's
    # thread. Handing it to a model thread and back costs two wake-ups, 0.25 ms on an idle
    # 2-core VM: a third of the overhead lto serve added to a 0.7 ms CNN. 0 turns it off.
    inline_max_ms: float = 10.0

    def validate(self) -> None:
        if self.max_batch < 1:
            raise UsageError("--max-batch must be at least 1")
        if self.max_wait_ms < 0:
            raise UsageError("--max-wait-ms cannot be negative")
        if self.target_latency_ms <= 0:
            raise UsageError("--target-latency-ms must be positive")
        if self.queue_timeout_ms is not None and not (0 < self.queue_timeout_ms < math.inf):
            raise UsageError("--queue-timeout-ms must be a positive number")
        if self.max_queue < 1:
            raise UsageError("--max-queue must be at least 1")
        if self.instances < 1:
            raise UsageError("--instances must be at least 1")
        if not self.inline_max_ms >= 0:
            raise UsageError("inline_max_ms cannot be negative")

    @property
    def model_budget_ms(self) -> float:
        """The most one batch's model call should take. At saturation a request waits for the
        batch in flight, then runs in the next one: two batch times, so half the target."""
        return self.target_latency_ms / 2.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
