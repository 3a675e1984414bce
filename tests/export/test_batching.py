"""The rule that turns a measured batch-latency profile and an SLO into Triton's dynamic batching."""

from __future__ import annotations

import pytest

from optimize.errors import UsageError
from optimize.export.batching import BatchPoint, BatchProfile, plan_batching


def profile(latency_ms: dict[int, list[float]]) -> BatchProfile:
    return BatchProfile(tuple(BatchPoint(b, tuple(s)) for b, s in latency_ms.items()), "test")


def test_the_slo_percentile_is_read_from_the_samples() -> None:
    # Batch 4: median 1 ms but a slow tail (p99 about 9.6 ms); within a 6 ms SLO only at p50.
    tail = [1.0] * 95 + [10.0] * 5
    measured = profile({1: [0.5] * 100, 4: tail})
    assert plan_batching(measured, 6, 50).max_batch_size == 4
    assert plan_batching(measured, 6, 99).max_batch_size == 1


def test_no_room_to_batch_and_an_slo_that_cannot_be_met_are_warnings() -> None:
    measured = profile({1: [1.0], 2: [1.5]})
    tight = plan_batching(measured, 1.5, 99)
    assert tight.max_batch_size == 1 and tight.max_queue_delay_us is None
    assert "no room to batch" in tight.warnings[0]
    impossible = plan_batching(measured, 0.5, 99)
    assert impossible.max_batch_size == 1 and "cannot be met" in impossible.warnings[0]


def test_the_batch_is_the_best_rate_not_the_largest_that_fits() -> None:
    # 8 rows cost as much per row as 1: batching buys nothing, so Triton gets no dynamic batching.
    flat = plan_batching(profile({1: [1.0], 8: [8.0]}), 100, 99)
    assert flat.max_batch_size == 1 and flat.max_queue_delay_us is None and flat.preferred_batch_size == []
    # 4 rows in 1.2 ms beat 16 in 6 ms, though 16 fits the SLO too.
    curved = plan_batching(profile({1: [1.0], 4: [1.2], 16: [6.0]}), 100, 99)
    assert curved.max_batch_size == 4 and curved.preferred_batch_size == [4]
    assert curved.max_queue_delay_us == 1200  # capped at one batch's latency


def test_the_model_files_own_limit_caps_the_batch() -> None:
    measured = profile({1: [1.0], 8: [2.0], 32: [3.0]})
    assert plan_batching(measured, 100, 99, batch_limit=8).max_batch_size == 8
    with pytest.raises(UsageError, match="at most 0"):
        plan_batching(measured, 100, 99, batch_limit=0)


def test_a_bench_report_without_samples_is_refused() -> None:
    with pytest.raises(UsageError, match="no latency samples"):
        BatchProfile.from_bench_report({"results": [{"batch_size": 1, "samples_ms": []}]}, "b.json")
