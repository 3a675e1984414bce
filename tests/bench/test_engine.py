from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from optimize.backend import Backend, TensorSpec
from optimize.bench import BenchSettings, compare, measure
from optimize.data import resolve_inputs
from optimize.errors import InputError
from optimize.runtimes.backends import open_backend
from optimize.stats import (
    BOOTSTRAP_MAX_SAMPLES,
    bootstrap_ci,
    bootstrap_ratio_ci,
    median_interval,
    median_interval_rel_width,
    quantile_ci,
    summarize,
)


class CountingBackend(Backend):
    """Runs no model: counts calls and returns its input, so the engine's logic is checked alone."""

    kind: ClassVar[str] = "counting"

    def __init__(self, work: int = 0) -> None:
        super().__init__("none")
        self.calls = 0
        self.work = work

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", "float32", ("batch", 4))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", "float32", ("batch", 4))]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        total = 0
        for i in range(self.work):  # real CPU work, proportional to `work`
            total += i
        return {"x": feeds["x"]}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind}


FEEDS = {"x": np.zeros((2, 4), dtype=np.float32)}


def test_measure_counts_every_run_and_reports_schema_fields() -> None:
    backend = CountingBackend()
    settings = BenchSettings(warmup=5, min_runs=50, max_runs=50, max_time_s=60, target_ci_rel=None)
    m = measure(backend, FEEDS, settings, label="count")
    assert backend.calls == 55  # warm-up + timed, nothing else calls the model
    data = m.to_json()
    assert data["runs"] == 50 and len(data["samples_ms"]) == 50
    assert data["batch_size"] == 2 and data["stopped_by"] == "runs"
    lat = data["latency_ms"]
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert lat["median_ci95"][0] <= lat["p50"] <= lat["median_ci95"][1]
    assert data["throughput_per_s"] == pytest.approx(2 * 1000.0 / lat["mean"])


@pytest.mark.timing
def test_adaptive_stop_ends_early_on_a_steady_workload() -> None:
    backend = CountingBackend(work=2000)
    settings = BenchSettings(warmup=5, min_runs=30, max_runs=200000, max_time_s=30, target_ci_rel=0.5)
    m = measure(backend, FEEDS, settings)
    assert m.stopped_by == "ci"
    assert median_interval_rel_width(m.samples_ms) <= 0.5
    assert len(m.samples_ms) < 200000


def test_time_budget_stops_the_run() -> None:
    settings = BenchSettings(warmup=1, min_runs=5, max_runs=10**9, max_time_s=0.2, target_ci_rel=None)
    m = measure(CountingBackend(work=100), FEEDS, settings)
    assert m.stopped_by == "time"
    assert m.wall_s < 5


def test_measure_checks_feeds_before_timing() -> None:
    backend = CountingBackend()
    with pytest.raises(InputError, match="unknown input 'y'"):
        measure(backend, {"y": FEEDS["x"]})
    assert backend.calls == 0


@pytest.mark.slow
@pytest.mark.timing
def test_compare_sees_a_backend_that_does_more_work_as_slower() -> None:
    fast, slow = CountingBackend(work=200), CountingBackend(work=20000)
    settings = BenchSettings(
        warmup=3, min_runs=30, max_runs=3000, max_time_s=3, target_ci_rel=0.05, chunk_s=0.02
    )
    result = compare(fast, slow, FEEDS, settings=settings, labels=("fast", "slow"))
    assert result.ratio > 1.5
    assert result.b_slower and not result.b_faster
    assert result.chunks >= 4
    # interleaved: both sides got runs in every chunk
    assert fast.calls > 30 and slow.calls > 30


class SpinningNeighbour(CountingBackend):
    """Sleeps `ms` a run, twice as long while the `other` backend's pool 'spins' (within
    `spin_s` of its last run): two runtimes' thread pools fighting over the cores."""

    def __init__(self, ms: float, spin_s: float = 0.0, other: SpinningNeighbour | None = None) -> None:
        super().__init__()
        self.ms, self.spin_s, self.other = ms, spin_s, other
        self.last_end = -1e9

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import time

        slowed = self.other is not None and time.monotonic() - self.other.last_end < self.other.spin_s
        time.sleep(self.ms * (2 if slowed else 1) / 1e3)
        self.last_end = time.monotonic()
        return {"x": feeds["x"]}


@pytest.mark.slow
@pytest.mark.timing
def test_compare_pauses_between_sides_so_one_pool_cannot_slow_the_other() -> None:
    # A's pool "spins" 15 ms after each run and doubles B's run time meanwhile; alone, both take
    # 2 ms. Without the pause B reads 1.4x slower (the chunks right after A's); with it, as fast.
    settings = BenchSettings(
        warmup=0, min_runs=20, max_runs=400, max_time_s=2, target_ci_rel=None, chunk_s=0.02
    )
    for settle_s, low, high in ((0.0, 1.25, 2.4), (0.03, 0.85, 1.15)):
        spinner = SpinningNeighbour(2.0, spin_s=0.015)
        victim = SpinningNeighbour(2.0, other=spinner)
        settings.settle_s = settle_s
        result = compare(spinner, victim, FEEDS, settings=settings, labels=("a", "b"))
        assert low < result.ratio < high, (settle_s, result.ratio)


def test_summarize_and_ratio_ci_on_known_distributions() -> None:
    rng = np.random.default_rng(0)
    base = rng.lognormal(0.0, 0.05, 2000)
    stats = summarize(base)
    assert stats["p50"] == pytest.approx(np.median(base))
    assert stats["cv"] == pytest.approx(np.std(base, ddof=1) / np.mean(base))
    ratio, lo, hi = bootstrap_ratio_ci(base, base * 1.3)
    assert ratio == pytest.approx(1.3) and lo <= 1.3 <= hi and lo > 1.2
    ratio, lo, hi = bootstrap_ratio_ci(base, rng.lognormal(0.0, 0.05, 2000))
    assert lo < 1.0 < hi


def test_many_runs_get_an_order_statistic_interval_that_agrees_with_the_bootstrap() -> None:
    """A fast model under --min-time gives 100,000+ runs: their interval must not cost a bootstrap
    over every run (it took 20 s and 1.8 GB), and must say what the bootstrap says."""
    rng = np.random.default_rng(1)
    many = rng.lognormal(0.0, 0.3, 4 * BOOTSTRAP_MAX_SAMPLES)
    for q in (50.0, 99.0):
        lo, hi = quantile_ci(many, q)
        b_lo, b_hi = bootstrap_ci(many, stat=lambda x, axis=None, q=q: np.percentile(x, q, axis=axis), n=300)
        assert lo < np.percentile(many, q) < hi
        assert lo == pytest.approx(b_lo, rel=0.01) and hi == pytest.approx(b_hi, rel=0.01)
    assert summarize(many)["median_ci95"] == list(quantile_ci(many, 50.0))
    # Few runs keep the bootstrap for a tail; the median's interval is median_interval's at any size.
    few = many[:100]
    p99 = lambda x, axis=None: np.percentile(x, 99.0, axis=axis)  # noqa: E731
    assert quantile_ci(few, 99.0) == bootstrap_ci(few, stat=p99)
    assert quantile_ci(few, 50.0) == median_interval(few)[1:]


def test_measure_on_onnxruntime_model(tiny_model: Path) -> None:
    _, feeds = resolve_inputs(tiny_model, {}, batch=3)
    with open_backend("onnxruntime", tiny_model, {"intra_op_num_threads": 1}) as backend:
        m = measure(backend, feeds, BenchSettings(warmup=2, min_runs=10, max_runs=10, target_ci_rel=None))
        assert backend.describe()["config"]["intra_op_num_threads"] == 1
    assert m.batch_size == 3 and len(m.samples_ms) == 10 and all(s > 0 for s in m.samples_ms)
