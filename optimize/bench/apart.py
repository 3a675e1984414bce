"""Side-by-side comparisons with every side in its own worker process (one runtime per process,
as a user deploys it).

Why not in one process: two runtimes' thread pools in one process take the cores from each
other. After a block of runs ONNX Runtime's workers keep spinning and OpenVINO's TBB workers
keep polling for a while; the other side's next runs then share two cores with them. How much
depends on the pair and drifts within a run, so no fixed pause removes it (docs/measurement.md
has the figures). Here each side runs in its own long-lived worker; the parent runs no model,
sends one worker a block of runs at a time, and before each block waits until every other worker
has stopped using the CPU, read from the kernel's per-thread run time. The waits and the CPU the
idle workers still used are reported with the figures, so a reader can see the sides were apart.

Blocks alternate in rounds, forward then reversed (A B, B A, A B ...; with three sides A B C,
C B A, ...), so that for every pair the first side of a round alternates like the in-process
comparison's chunks, and the ratio's interval comes from the same AB/BA block-pair bootstrap.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from optimize.backend import Backend
from optimize.bench.engine import BenchSettings, Comparison, Measurement, _batch_of, _time_runs, compare_here
from optimize.runtimes.worker import SubprocessBackend
from optimize.stats import (
    BLOCK_STATISTICS,
    PERCENTILES,
    PairedRatio,
    block_figures,
    full_chunks,
    interleaved_ratio_ci,
    paired_ratio,
)
from optimize.system.env import CpuLoadMonitor

# A worker counts as idle once its threads used less than this share of one core over a poll
# window (ORT's spin-wait uses a whole core; a parked thread pool uses none).
_IDLE_SHARE = 0.05
# A comparison runs at least this many rounds before any stop (a 95% interval needs pairs).
MIN_ROUNDS = 4
_POLL_S = 0.005

# Feeds staged in a worker, keyed by the backend they were staged for (worker side only).
_STAGED: dict[int, dict[str, np.ndarray]] = {}


def worker_of(backend: Backend) -> SubprocessBackend | None:
    """The worker process hosting `backend` (itself, or a TVM library's host), or None."""
    if isinstance(backend, SubprocessBackend):
        return backend
    host = getattr(backend, "host", None)
    return host if isinstance(host, SubprocessBackend) else None


# -- run inside the worker (through SubprocessBackend.call_in_child) ----------------------------


def stage_feeds(backend: Backend, feeds: Mapping[str, np.ndarray], warmup: int) -> float:
    """Keep the feeds in the worker, warm up, and return the fastest of 3 runs in ms."""
    backend.check_feeds(feeds)
    staged = _STAGED[id(backend)] = dict(feeds)
    for _ in range(warmup):
        backend.run(staged)
    probe: list[float] = []
    _time_runs(backend.run, staged, 3, probe)
    return max(min(probe), 1e-6)


def time_block(backend: Backend, runs: int) -> tuple[list[float], float | None]:
    """`runs` timed runs on the staged feeds; with the share of the CPU other processes used."""
    monitor = CpuLoadMonitor()
    monitor.start()
    samples: list[float] = []
    _time_runs(backend.run, _STAGED[id(backend)], runs, samples)
    return samples, monitor.foreign_fraction()


# -- the parent ------------------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds all threads of `pid` have run, at nanosecond resolution (Linux schedstat;
    /proc/<pid>/stat counts in 10 ms ticks, too coarse to see a spin of a few ms)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between listing and reading
    return total * 1e-9


@dataclass
class _Settle:
    """Waiting for the other workers to go idle before one block."""

    waited_s: float
    cpu_s: float  # CPU the other workers used meanwhile
    idle: bool  # they went idle within settle_max_s
    after: int = -1  # the side whose block ran just before (whose threads may still be busy)


def wait_until_idle(pids: Sequence[int], max_s: float) -> _Settle | None:
    """Poll until the processes `pids` together use under _IDLE_SHARE of a core over a window,
    or max_s passes. None when their CPU time cannot be read (not Linux)."""
    start = time.monotonic()
    first = _cpu_of(pids)
    if first is None:
        return None
    previous = first
    while True:
        time.sleep(_POLL_S)
        now_cpu = _cpu_of(pids)
        if now_cpu is None:
            return None
        waited = time.monotonic() - start
        if now_cpu - previous < _IDLE_SHARE * _POLL_S:
            return _Settle(waited, now_cpu - first, True)
        if waited >= max_s:
            return _Settle(waited, now_cpu - first, False)
        previous = now_cpu


def _cpu_of(pids: Sequence[int]) -> float | None:
    values = [process_cpu_s(pid) for pid in pids]
    return None if any(v is None for v in values) else float(sum(v for v in values if v is not None))


@dataclass
class ApartRun:
    """Every side's blocks from one comparison in worker processes."""

    labels: list[str]
    kinds: list[str]
    batches: list[int]
    block_runs: list[int]
    samples: list[list[float]]
    rounds: int
    wall_s: float
    stopped_by: str
    warmup: int
    metric: str
    foreign: list[list[float]] = field(default_factory=list)  # per side, per block
    settles: list[_Settle] = field(default_factory=list)
    busy_during_s: list[float] = field(default_factory=list)  # idle workers' CPU during a block
    parent_cpu_during_s: float = 0.0  # this process's CPU time while blocks ran (it runs no model)
    processes: int = 1  # sets of worker processes pooled into this run (see extend)
    round_sets: list[int] = field(default_factory=list)  # the process set of every round

    def measurement(self, i: int) -> Measurement:
        load = [f for f in self.foreign[i] if f is not None]
        return Measurement(
            self.labels[i], self.kinds[i], self.batches[i], self.samples[i], self.warmup, self.wall_s,
            self.stopped_by, float(np.mean(load)) if load else None,
            extra={"interleaved": True, "process": "own worker"},
        )  # fmt: skip

    def blocks(self, i: int) -> np.ndarray:
        return full_chunks(self.samples[i], self.block_runs[i])

    def paired(self, i: int, j: int) -> PairedRatio | None:
        """metric(j) / metric(i) as the median of per-round block ratios, with modes
        (optimize.stats.paired_ratio); None for a tail percentile, which no block holds."""
        if self.metric not in BLOCK_STATISTICS:
            return None
        a, b = self.blocks(i), self.blocks(j)
        usable = min(a.shape[0], b.shape[0])
        if usable == 0:
            return None
        sets = (self.round_sets + [self.processes - 1] * usable)[:usable]
        return paired_ratio(
            block_figures(a[:usable], self.metric), block_figures(b[:usable], self.metric), sets
        )

    def ratio(self, i: int, j: int, n: int = 2000) -> tuple[float, float, float]:
        """metric(j) / metric(i) with its 95% CI: the paired figure for p50, mean and min; for a
        tail percentile the pooled ratio with an AB/BA bootstrap over block pairs."""
        paired = self.paired(i, j)
        if paired is not None:
            lo, hi = paired.ci95
            return paired.ratio, lo, hi
        a, b = self.blocks(i), self.blocks(j)
        usable = min(a.shape[0], b.shape[0])
        return interleaved_ratio_ci(a[:usable], b[:usable], metric=self.metric, n=n)

    def isolation(self) -> dict[str, Any]:
        """How apart the sides were: the waits before blocks and the CPU idle workers used."""
        if not self.settles:
            return {
                "method": "own worker per side",
                "process_sets": self.processes,
                "idle_wait": "not measured (no /proc on this system)",
                "parent_cpu_during_blocks_ms": self.parent_cpu_during_s * 1e3,
            }
        waits = [s.waited_s * 1e3 for s in self.settles]
        # CPU each side's worker still used after its own block, before the next side began:
        # the cross-talk that the next side's runs would have shared the cores with in one process.
        spill = {
            self.labels[i]: [s.cpu_s * 1e3 for s in self.settles if s.after == i]
            for i in range(len(self.labels))
        }
        return {
            "method": "own worker per side",
            "process_sets": self.processes,
            "settle_wait_ms": {"median": float(np.median(waits)), "max": float(np.max(waits))},
            "cpu_after_own_block_ms": {
                label: {"median": float(np.median(v)), "max": float(np.max(v))}
                for label, v in spill.items()
                if v
            },
            "blocks_not_idle_after_wait": sum(1 for s in self.settles if not s.idle),
            "idle_workers_cpu_during_blocks_ms": float(np.sum(self.busy_during_s) * 1e3),
            "parent_cpu_during_blocks_ms": self.parent_cpu_during_s * 1e3,
        }

    def extend(self, other: ApartRun) -> None:
        """Pool another run of the same sides with the same block sizes (fresh processes, say)."""
        if other.block_runs != self.block_runs or len(other.samples) != len(self.samples):
            raise ValueError("only runs of the same sides with the same block sizes pool")
        for mine, theirs in zip(self.samples, other.samples, strict=True):
            mine += theirs
        for mine_f, theirs_f in zip(self.foreign, other.foreign, strict=True):
            mine_f += theirs_f
        mine_sets = (self.round_sets + [0] * self.rounds)[: self.rounds]
        theirs = (other.round_sets + [0] * other.rounds)[: other.rounds]
        self.round_sets = mine_sets + [self.processes + k for k in theirs]
        self.settles += other.settles
        self.busy_during_s += other.busy_during_s
        self.parent_cpu_during_s += other.parent_cpu_during_s
        self.rounds += other.rounds
        self.wall_s += other.wall_s
        self.processes += other.processes

    def comparison(self, i: int, j: int) -> Comparison:
        """Side j against side i, as a Comparison (ratio = metric(j) / metric(i)): its figure, its
        interval and both sides' latency all from the same block pairs."""
        paired = self.paired(i, j)
        if paired is not None:
            fig = paired.figure
            ratio, (lo, hi) = fig.ratio, paired.ci95
            a_ms, b_ms = fig.a_ms, fig.b_ms
            sets = f" from {self.processes} sets of processes" if self.processes > 1 else ""
            method = (
                f"median of {fig.pairs} per-pair {self.metric} ratios{sets}, each side in its own "
                "process; order-statistic 95% interval"
            )
        else:
            ratio, lo, hi = self.ratio(i, j)
            a_ms = float(np.percentile(self.samples[i], PERCENTILES[self.metric]))
            b_ms = float(np.percentile(self.samples[j], PERCENTILES[self.metric]))
            method = f"AB/BA bootstrap over {self.rounds} block pairs, each side in its own process"
        return Comparison(
            self.measurement(i), self.measurement(j), self.metric, ratio, (lo, hi), self.rounds,
            (self.block_runs[i], self.block_runs[j]), method, isolation=self.isolation(),
            a_ms=a_ms, b_ms=b_ms, paired=paired,
        )  # fmt: skip


def compare_apart(
    backends: Sequence[Backend],
    feeds: Sequence[Mapping[str, np.ndarray]],
    settings: BenchSettings | None = None,
    labels: Sequence[str] | None = None,
    metric: str = "p50",
    progress: Callable[[int, float], None] | None = None,
    focus: Sequence[tuple[int, int]] | None = None,
    block_runs: Sequence[int] | None = None,
    give_up: Callable[[ApartRun], bool] | None = None,
) -> ApartRun:
    """Time every side in its own worker, in alternating blocks, each after the others went idle.

    Stops once every pair in `focus` (default: the last side against each other) has a ratio CI
    within ±target_ci_rel, once `give_up(run)` says the answer is known well enough (a candidate
    whose interval can no longer beat the best, say), or at the run/time budget, each after at
    least 4 rounds and min_runs runs. `block_runs` fixes the runs per block (to pool with an
    earlier run, see ApartRun.extend).
    """
    settings = settings or BenchSettings()
    workers = [worker_of(b) for b in backends]
    if any(w is None for w in workers):
        raise ValueError("compare_apart needs backends hosted in worker processes")
    hosts = [w for w in workers if w is not None]
    n = len(hosts)
    if n < 2 or len(feeds) != n:
        raise ValueError("compare_apart needs at least two sides and one feed dict per side")
    labels = list(labels) if labels is not None else [chr(ord("A") + i) for i in range(n)]
    focus = list(focus) if focus is not None else [(i, n - 1) for i in range(n - 1)]
    per_run_ms = [
        float(w.call_in_child("optimize.bench.apart:stage_feeds", dict(f), settings.warmup))
        for w, f in zip(hosts, feeds, strict=True)
    ]
    cap = max(1, settings.max_runs // 8)
    if block_runs is None:
        block_runs = [max(1, min(cap, int(settings.block_s * 1000.0 / ms))) for ms in per_run_ms]
    block_runs = list(block_runs)
    run = ApartRun(
        labels, [w.hosted_kind for w in hosts], [_batch_of(f) for f in feeds], block_runs,
        [[] for _ in hosts], 0, 0.0, "runs", settings.warmup, metric, [[] for _ in hosts],
    )  # fmt: skip
    run.round_sets = []
    start = time.monotonic()
    next_check = 8
    previous = -1
    while any(len(s) < settings.max_runs for s in run.samples):
        order = range(n) if run.rounds % 2 == 0 else range(n - 1, -1, -1)
        for i in order:
            others = [w.pid for k, w in enumerate(hosts) if k != i]
            settle = wait_until_idle(others, settings.settle_max_s)
            if settle is None:
                time.sleep(settings.settle_s)  # no per-thread CPU times here: a fixed pause
            else:
                settle.after = previous
                run.settles.append(settle)
            before = _cpu_of(others)
            count = min(block_runs[i], max(1, settings.max_runs - len(run.samples[i])))
            parent_cpu = time.process_time()
            samples, foreign = hosts[i].call_in_child("optimize.bench.apart:time_block", count)
            run.parent_cpu_during_s += time.process_time() - parent_cpu
            after = _cpu_of(others)
            if before is not None and after is not None:
                run.busy_during_s.append(after - before)
            run.samples[i] += samples
            run.foreign[i].append(foreign)
            previous = i
        run.rounds += 1
        run.round_sets.append(0)
        elapsed = time.monotonic() - start
        if progress is not None:
            progress(sum(len(s) for s in run.samples), elapsed)
        enough = min(len(s) for s in run.samples) >= settings.min_runs and run.rounds >= MIN_ROUNDS
        if enough and give_up is not None and give_up(run):
            run.stopped_by = "given up"
            break
        if enough and settings.target_ci_rel is not None and run.rounds >= next_check:
            next_check = int(run.rounds * 1.25) + 1
            if all(_halfwidth(run, i, j) <= settings.target_ci_rel for i, j in focus):
                run.stopped_by = "ci"
                break
        if enough and elapsed >= settings.max_time_s:
            run.stopped_by = "time"
            break
    run.wall_s = time.monotonic() - start
    return run


# Fresh sets of worker processes a headline comparison pools (lto optimize's artifact, lto bench
# --compare): one pair of processes is one draw of the machine's process-to-process speed, and
# ONNX Runtime's default pool runs at two speeds in some processes and not in others.
PROCESS_SETS = 3


def compare_in_process_sets(
    open_sides: Sequence[Callable[[], Backend]],
    feeds: Sequence[Mapping[str, np.ndarray]],
    settings: BenchSettings,
    labels: Sequence[str],
    metric: str = "p50",
    sets: int = PROCESS_SETS,
    status: Callable[[str], None] | None = None,
    progress: Callable[[int, float], None] | None = None,
    compare_fn: Callable[..., ApartRun] | None = None,
    first: Sequence[Backend] | None = None,
) -> ApartRun:
    """The sides compared in `sets` fresh sets of worker processes, one after the other, their
    blocks pooled into one run (settings.max_time_s is shared among the sets). `open_sides[i]()`
    opens side i in a worker of its own; `first`: already open workers for the first set (the
    caller keeps them). The paired figure then carries each set's rounds, and its modes say
    which sets they came from."""
    compare_fn = compare_fn or compare_apart
    sets = max(1, sets)
    # The timing and the minimum of runs are shared: the sets together time as one comparison would.
    share = replace(
        settings,
        max_time_s=max(1.0, settings.max_time_s / sets),
        min_runs=max(1, math.ceil(settings.min_runs / sets)),
    )
    pooled: ApartRun | None = None
    for index in range(sets):
        if status is not None:
            status(f"{' vs '.join(labels)}: process set {index + 1}/{sets}")
        with ExitStack() as workers:
            if index == 0 and first is not None:
                sides = list(first)
            else:
                sides = []
                for open_side in open_sides:
                    worker = open_side()
                    workers.callback(worker.close)
                    sides.append(worker)
            run = compare_fn(
                sides, list(feeds), share, list(labels), metric, progress,
                block_runs=pooled.block_runs if pooled else None,
            )  # fmt: skip
        if pooled is None:
            pooled = run
        else:
            pooled.extend(run)
    assert pooled is not None
    return pooled


def _halfwidth(run: ApartRun, i: int, j: int) -> float:
    if run.rounds < 8:
        return math.inf
    ratio, lo, hi = run.ratio(i, j, n=300)
    return (hi - lo) / 2.0 / ratio


def compare(
    a: Backend,
    b: Backend,
    feeds_a: Mapping[str, np.ndarray],
    feeds_b: Mapping[str, np.ndarray] | None = None,
    settings: BenchSettings | None = None,
    labels: tuple[str, str] = ("A", "B"),
    metric: str = "p50",
    progress: Callable[[int, float], None] | None = None,
) -> Comparison:
    """A against B. When both sides are hosted in worker processes, each runs in its own and the
    parent runs nothing: the figure a user running one of them per process sees. Otherwise both
    run in this process, interleaved (engine.compare_here)."""
    settings = settings or BenchSettings()
    feeds_b = feeds_a if feeds_b is None else feeds_b
    if worker_of(a) is not None and worker_of(b) is not None:
        apart = compare_apart([a, b], [feeds_a, feeds_b], settings, labels, metric, progress)
        return apart.comparison(0, 1)
    return compare_here(a, b, feeds_a, feeds_b, settings, labels, metric, progress)


__all__ = [
    "MIN_ROUNDS",
    "PROCESS_SETS",
    "ApartRun",
    "compare",
    "compare_apart",
    "compare_in_process_sets",
    "process_cpu_s",
    "wait_until_idle",
    "worker_of",
]
