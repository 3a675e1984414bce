"""The benchmarking engine: warm-up, timed runs with an adaptive stop, interleaved A/B comparison.

Every latency in every report comes from here, so that `bench`, `optimize`, `gate` and
`serve` numbers are produced the same way. Timing wraps only `backend.run`; the loop does
nothing else between runs except appending one integer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimize.backend import Backend
from optimize.runtimes.worker import SubprocessBackend
from optimize.stats import (
    PairedRatio,
    bootstrap_ratio_ci,
    full_chunks,
    interleaved_ratio_ci,
    median_interval_rel_width,
    summarize,
    tail_flags,
)
from optimize.system.env import CpuLoadMonitor

# A measurement is called unstable above these.
UNSTABLE_CV = 0.25
UNSTABLE_FOREIGN_LOAD = 0.10


@dataclass
class BenchSettings:
    """When a measurement stops. `max_runs` and `max_time_s` are maxima: the run ends at the
    first of them or earlier, once the median's CI is narrow enough (`target_ci_rel`), but never
    before both `min_runs` runs and `min_time_s` seconds (minima win over maxima)."""

    warmup: int = 10
    min_runs: int = 20
    max_runs: int = 5000
    max_time_s: float = 10.0
    min_time_s: float = 0.0
    # Stop once the 95% CI of the median is within this relative width (None: never stop early).
    target_ci_rel: float | None = 0.02
    # Interleaved comparisons alternate chunks of about this many seconds per side. Short
    # chunks give many chunk pairs, which is what the ratio's interval is computed over.
    chunk_s: float = 0.05
    # Idle seconds before a chunk when the other side ran last. A thread pool keeps spinning for
    # some 10-20 ms after its work (ONNX Runtime's by default) and takes the cores from the
    # other side's next runs. Measured on the MiniLM, 2 cores, against each side alone:
    # without the pause ORT int8 read 3.51x over ORT fp32 (alone 1.77x) and OpenVINO bf16
    # 2.44x (alone 2.85x); with 20 ms, 1.79x and 2.88x.
    settle_s: float = 0.02
    # Comparisons with each side in its own worker process (optimize.bench.apart): blocks of
    # about block_s per side, each started once the other workers' threads have gone idle, or
    # after settle_max_s at most (the wait and what the idle side still used are reported).
    block_s: float = 0.2
    settle_max_s: float = 0.5

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Measurement:
    label: str
    backend: str
    batch_size: int
    samples_ms: list[float]
    warmup_runs: int
    wall_s: float
    stopped_by: str  # "ci" | "runs" | "time" | "given up" (a comparison that could no longer change)
    foreign_cpu_fraction: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def latency(self) -> dict[str, Any]:
        return summarize(self.samples_ms)

    def stability(self) -> dict[str, Any]:
        reasons: list[str] = []
        lat = self.latency
        if lat["cv"] > UNSTABLE_CV:
            reasons.append(f"high variation (CV {lat['cv']:.0%} > {UNSTABLE_CV:.0%})")
        if self.foreign_cpu_fraction is not None and self.foreign_cpu_fraction > UNSTABLE_FOREIGN_LOAD:
            reasons.append(f"other processes used {self.foreign_cpu_fraction:.0%} of the CPU during the run")
        if len(self.samples_ms) < 20:
            reasons.append(f"only {len(self.samples_ms)} runs")
        return {"stable": not reasons, "reasons": reasons, "foreign_cpu_fraction": self.foreign_cpu_fraction}

    def to_json(self) -> dict[str, Any]:
        lat = self.latency
        return {
            "label": self.label,
            "backend": self.backend,
            "batch_size": self.batch_size,
            "latency_ms": lat,
            "throughput_per_s": self.batch_size * 1000.0 / lat["mean"] if lat["mean"] > 0 else 0.0,
            "runs": len(self.samples_ms),
            "warmup_runs": self.warmup_runs,
            "wall_s": self.wall_s,
            "stopped_by": self.stopped_by,
            "stability": self.stability(),
            # Tails that these runs cannot estimate, with the runs each would need.
            "too_few_runs_for": tail_flags(len(self.samples_ms)),
            **({"extra": self.extra} if self.extra else {}),
            "samples_ms": [round(s, 6) for s in self.samples_ms],
        }


def _time_runs(run: Callable[[Any], Any], feeds: Any, count: int, out: list[float]) -> None:
    # Locals and a bare call: the loop adds well under a microsecond per run.
    perf = time.perf_counter_ns
    append = out.append
    for _ in range(count):
        start = perf()
        run(feeds)
        append((perf() - start) * 1e-6)


def measure(
    backend: Backend,
    feeds: Mapping[str, np.ndarray],
    settings: BenchSettings | None = None,
    label: str = "model",
    batch_size: int | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> Measurement:
    """Warm up, then time `backend.run(feeds)` until the adaptive stop, run count or time budget."""
    settings = settings or BenchSettings()
    backend.check_feeds(feeds)
    feeds = dict(feeds)
    run = backend.run  # the timed call, bound once
    for _ in range(settings.warmup):
        run(feeds)
    monitor = CpuLoadMonitor()
    monitor.start()
    samples: list[float] = []
    start = time.monotonic()
    next_check = settings.min_runs
    stopped_by = "runs"
    minima_met = False
    # The minima win over the run count: --min-time 30s runs 30 s even past --runs.
    while len(samples) < settings.max_runs or not minima_met:
        # Time in small blocks so the stop checks happen between blocks, never inside one.
        block = max(1, next_check - len(samples))
        if len(samples) < settings.max_runs:
            block = min(block, settings.max_runs - len(samples))
        _time_runs(run, feeds, block, samples)
        elapsed = time.monotonic() - start
        if progress is not None:
            progress(len(samples), elapsed)
        minima_met = len(samples) >= settings.min_runs and elapsed >= settings.min_time_s
        if elapsed >= settings.max_time_s and minima_met:
            stopped_by = "time"
            break
        if len(samples) >= next_check:
            if (
                settings.target_ci_rel is not None
                and minima_met
                and median_interval_rel_width(samples) <= settings.target_ci_rel
            ):
                stopped_by = "ci"
                break
            # Check again after ~25% more runs, or ~0.25 s, whichever comes first.
            per_run = elapsed / len(samples)
            step = max(1, min(int(len(samples) * 0.25), int(0.25 / per_run) if per_run > 0 else 1000))
            next_check = len(samples) + step
    wall = time.monotonic() - start
    first = next(iter(feeds.values()), None)
    batch = (
        batch_size
        if batch_size is not None
        else (int(first.shape[0]) if first is not None and first.ndim else 1)
    )
    return Measurement(
        label=label,
        backend=backend.kind,
        batch_size=batch,
        samples_ms=samples,
        warmup_runs=settings.warmup,
        wall_s=wall,
        stopped_by=stopped_by,
        foreign_cpu_fraction=monitor.foreign_fraction(),
    )


@dataclass
class Comparison:
    a: Measurement
    b: Measurement
    metric: str
    ratio: float  # metric(b) / metric(a): below 1 means B is faster
    ratio_ci95: tuple[float, float]
    chunks: int
    chunk_runs: tuple[int, int] = (0, 0)  # runs per chunk of A and of B
    ci_method: str = ""
    # Each side in its own worker (optimize.bench.apart): how apart they were. None: one process.
    isolation: dict[str, Any] | None = None
    # Each side's `metric` in ms in the same block pairs the ratio comes from (b_ms / a_ms is the
    # ratio: optimize.stats.RatioFigure). None: the pooled runs' own percentiles.
    a_ms: float | None = None
    b_ms: float | None = None
    # The paired estimate with its modes (optimize.stats.PairedRatio), where one was taken.
    paired: PairedRatio | None = None

    @property
    def side_ms(self) -> tuple[float, float]:
        """(A, B) latency at `metric` in this measurement, in ms."""
        if self.a_ms is not None and self.b_ms is not None:
            return self.a_ms, self.b_ms
        return float(self.a.latency[self.metric]), float(self.b.latency[self.metric])

    @property
    def b_faster(self) -> bool:
        """B is faster with 95% confidence."""
        return self.ratio_ci95[1] < 1.0

    @property
    def b_slower(self) -> bool:
        return self.ratio_ci95[0] > 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": [self.a.label, self.b.label],
            "metric": self.metric,
            "ratio": self.ratio,
            "ratio_ci95": list(self.ratio_ci95),
            "speedup": 1.0 / self.ratio if self.ratio > 0 else None,
            "chunks": self.chunks,
            # Chunk i holds runs [i*chunk_runs, (i+1)*chunk_runs) of each side; A ran first in
            # even chunks, B in odd ones. The gate relies on this layout.
            "chunk_runs": list(self.chunk_runs),
            "first_in_even_chunks": "A",
            "ci_method": self.ci_method,
            "stopped_by": self.b.stopped_by,
            "process": "own worker per side" if self.isolation is not None else "one process",
            "latency_ms": dict(zip(("A", "B"), self.side_ms, strict=True)),
            **({"paired": self.paired.to_json()} if self.paired is not None else {}),
            **({"isolation": self.isolation} if self.isolation is not None else {}),
        }


def compare_here(
    a: Backend,
    b: Backend,
    feeds_a: Mapping[str, np.ndarray],
    feeds_b: Mapping[str, np.ndarray] | None = None,
    settings: BenchSettings | None = None,
    labels: tuple[str, str] = ("A", "B"),
    metric: str = "p50",
    progress: Callable[[int, float], None] | None = None,
) -> Comparison:
    """Run A and B in this process, interleaved in short chunks (A B B A A B ...) so drift hits
    both alike. Stops when the ratio's CI is within `target_ci_rel`, or at the run/time budget.
    optimize.bench.apart.compare chooses this or a comparison of two worker processes."""
    settings = settings or BenchSettings()
    feeds_b = feeds_a if feeds_b is None else feeds_b
    a.check_feeds(feeds_a)
    b.check_feeds(feeds_b)
    fa, fb = dict(feeds_a), dict(feeds_b)
    per_run: list[float] = []
    for run, feeds in ((a.run, fa), (b.run, fb)):
        for _ in range(settings.warmup):
            run(feeds)
        probe: list[float] = []
        _time_runs(run, feeds, 3, probe)
        per_run.append(max(min(probe) / 1000.0, 1e-6))
    # Chunks of about chunk_s each, but at least 8 chunks per side within max_runs, so that
    # drift is averaged over many alternations even for very fast models.
    cap = max(1, settings.max_runs // 8)
    chunk_a = max(1, min(cap, int(settings.chunk_s / per_run[0])))
    chunk_b = max(1, min(cap, int(settings.chunk_s / per_run[1])))
    monitor = CpuLoadMonitor()
    samples_a: list[float] = []
    samples_b: list[float] = []
    start = time.monotonic()
    chunks = 0
    next_check = 8
    stopped_by = "runs"
    foreign: list[float] = []
    last: list[float] | None = None
    while len(samples_a) < settings.max_runs or len(samples_b) < settings.max_runs:
        order = ((a.run, fa, samples_a, chunk_a), (b.run, fb, samples_b, chunk_b))
        if chunks % 2:
            order = order[::-1]
        monitor.start()
        for run, feeds, out, size in order:
            if settings.settle_s and last is not None and out is not last:
                time.sleep(settings.settle_s)
            _time_runs(run, feeds, min(size, settings.max_runs - len(out)), out)
            last = out
        chunks += 1
        frac = monitor.foreign_fraction()
        if frac is not None:
            foreign.append(frac)
        elapsed = time.monotonic() - start
        if progress is not None:
            progress(len(samples_a) + len(samples_b), elapsed)
        enough = min(len(samples_a), len(samples_b)) >= settings.min_runs and chunks >= 4
        if enough and settings.target_ci_rel is not None and chunks >= next_check:
            # Stop on the ratio's own chunk-level interval (a cheap bootstrap), checked after
            # ~25% more chunks each time: within ±target_ci_rel of the ratio, the answer is known.
            next_check = int(chunks * 1.25) + 1
            if (
                _ratio_ci_rel_halfwidth(samples_a, samples_b, chunk_a, chunk_b, metric)
                <= settings.target_ci_rel
            ):
                stopped_by = "ci"
                break
        if elapsed >= settings.max_time_s and enough:
            stopped_by = "time"
            break
    wall = time.monotonic() - start
    load = float(np.mean(foreign)) if foreign else None
    ma = _measurement(a, labels[0], samples_a, settings, wall, stopped_by, load, fa)
    mb = _measurement(b, labels[1], samples_b, settings, wall, stopped_by, load, fb)
    blocks_a, blocks_b = full_chunks(samples_a, chunk_a), full_chunks(samples_b, chunk_b)
    usable = min(blocks_a.shape[0], blocks_b.shape[0])
    if usable >= 4:
        ratio, lo, hi = interleaved_ratio_ci(blocks_a[:usable], blocks_b[:usable], metric=metric)
        method = f"AB/BA bootstrap over {usable} chunk pairs"
    else:  # too few chunks for a chunk-level interval: runs, with the caveat said
        ratio, lo, hi = bootstrap_ratio_ci(samples_a, samples_b, metric=metric)
        method = f"bootstrap over runs (only {usable} chunk pairs)"
    return Comparison(ma, mb, metric, ratio, (lo, hi), chunks, (chunk_a, chunk_b), method)


def _measurement(
    backend: Backend,
    label: str,
    samples: list[float],
    settings: BenchSettings,
    wall: float,
    stopped_by: str,
    load: float | None,
    feeds: Mapping[str, np.ndarray],
) -> Measurement:
    return Measurement(
        label, backend.kind, _batch_of(feeds), samples, settings.warmup, wall, stopped_by, load,
        extra={"interleaved": True},
    )  # fmt: skip


def _batch_of(feeds: Mapping[str, np.ndarray]) -> int:
    first = next(iter(feeds.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


def _ratio_ci_rel_halfwidth(
    samples_a: list[float], samples_b: list[float], chunk_a: int, chunk_b: int, metric: str
) -> float:
    blocks_a, blocks_b = full_chunks(samples_a, chunk_a), full_chunks(samples_b, chunk_b)
    usable = min(blocks_a.shape[0], blocks_b.shape[0])
    if usable < 8:
        return math.inf
    ratio, lo, hi = interleaved_ratio_ci(blocks_a[:usable], blocks_b[:usable], metric=metric, n=300)
    return (hi - lo) / 2.0 / ratio


def measure_where_it_runs(
    backend: Backend,
    feeds: Mapping[str, np.ndarray],
    settings: BenchSettings | None = None,
    label: str = "model",
    batch_size: int | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> Measurement:
    """`measure`, run inside the process that hosts the model (a worker of its own, a TVM
    library isolated in a child), so that the inter-process round trip is not in the figure.
    `progress` is called only when the model runs here (a worker cannot call back mid-run)."""

    host = backend if isinstance(backend, SubprocessBackend) else getattr(backend, "host", None)
    if isinstance(host, SubprocessBackend):
        return host.call_in_child(  # type: ignore[no-any-return]
            "optimize.bench.engine:measure", dict(feeds), settings, label, batch_size
        )
    return measure(backend, feeds, settings, label=label, batch_size=batch_size, progress=progress)
