"""MetaSchedule tuning in chunks of tasks, under a trial budget and a wall-clock budget.

MetaSchedule has no clock, and a run killed before its task scheduler joins a task saves
nothing of what it measured (docs/tvm.md#tuning-records: twice 0 records after 12 minutes). So a
time budget is honoured the other way round: the tasks are tuned a few at a time, each chunk a
complete `tune_tasks` call into the same JSON database, and a chunk is started only when the
measured cost per trial says it fits in the time left. Nothing is ever killed. The first chunk
(one task, one search round) always runs, because it is what measures the cost of a trial here:
a positive budget shorter than that is overrun by that one chunk.

The plan covers every kernel before it deepens any: first one search round per task (a kernel
without a record would run untuned, 100x slower than ORT), then the rest of each task's share
of the trial budget, heaviest tasks first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.runtimes.tvm import worker_initializer
from optimize.runtimes.tvm.relax_build import extract_tasks, task_hash


@dataclass
class TuneSettings:
    trials: int = 64  # new trials this run, all tasks together
    time_budget_s: float | None = None  # for tuning itself (the caller keeps time for the build)
    trials_per_iter: int = 8  # candidates measured per search round of one task
    # Evolutionary search population (MetaSchedule: 512). Each search round costs time in
    # proportion; measured on a loaded 2-core box: ~45 s per round at 256, ~6 s at 64.
    population_size: int = 128
    max_chunk_tasks: int = 4  # tasks per tune_tasks call: smaller = finer time control
    build_timeout_s: float = 180.0  # builds take ~35 s each on a loaded 2-core box (30 s default times out)
    run_timeout_s: float = 120.0
    builder_workers: int | None = None  # default: the target's cores
    num_threads: int | None = None  # search threads and TVM_NUM_THREADS for measurement
    rpc_tracker: str | None = None  # HOST:PORT of a TVM RPC tracker: measure on its devices
    rpc_key: str | None = None
    rpc_session_timeout_s: float = 120.0
    seed: int = 0


@dataclass
class TaskState:
    name: str
    hash: str
    weight: int
    flops: float
    trials: int = 0  # measured trials for this task, earlier runs included
    # Trials allotted to this task in completed chunks, earlier runs included. A search round
    # can measure fewer candidates than allotted (a tiny kernel has few distinct schedules), so
    # budgets are accounted in allotments: a second run with the same budget tunes nothing.
    budgeted: int = 0
    best_us: float | None = None
    extracted: Any = None  # ms ExtractedTask

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hash": self.hash,
            "weight": self.weight,
            "flops": self.flops,
            "trials": self.trials,
            "budgeted": self.budgeted,
            "best_us": self.best_us,
        }


@dataclass
class TuneProgress:
    tasks_total: int
    tasks_tuned: int  # tasks with at least one valid measured record
    trials_done: int  # measured this run
    trials_planned: int
    best_ms: float | None  # sum of weight x best latency over tasks, when every task has one
    time_left_s: float | None
    build_errors: int
    run_errors: int
    current: list[str] = field(default_factory=list)


@dataclass
class TuneSummary:
    tasks: list[TaskState]
    trials_measured: int  # this run
    trials_planned: int
    chunks: int
    wall_s: float
    stopped_by: str  # "done" | "time" | "nothing-to-tune"
    build_errors: int
    run_errors: int
    seconds_per_trial: float | None

    @property
    def untuned(self) -> list[str]:
        return [t.name for t in self.tasks if t.best_us is None]

    def estimated_ms(self) -> float | None:
        if any(t.best_us is None for t in self.tasks):
            return None
        return sum(t.weight * (t.best_us or 0.0) for t in self.tasks) / 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": [t.to_json() for t in self.tasks],
            "trials_measured": self.trials_measured,
            "trials_planned": self.trials_planned,
            "trials_total": sum(t.trials for t in self.tasks),
            "chunks": self.chunks,
            "wall_s": round(self.wall_s, 2),
            "stopped_by": self.stopped_by,
            "build_errors": self.build_errors,
            "run_errors": self.run_errors,
            "seconds_per_trial": self.seconds_per_trial,
            "estimated_ms": self.estimated_ms(),
        }


def parse_tracker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--rpc-tracker {text!r} is not HOST:PORT", "e.g. --rpc-tracker 10.0.0.5:9190")
    return host, int(port)


def task_states(fused: Any, target: Any) -> list[TaskState]:
    """The tuning tasks of a fused module, heaviest (weight x FLOPs) first."""
    from tvm.s_tir.analysis import estimate_tir_flops

    states = []
    for task in extract_tasks(fused, target):
        try:
            flops = float(estimate_tir_flops(task.dispatched[0]))
        except Exception:  # some kernels (pure data movement) have no FLOP estimate
            flops = 0.0
        states.append(
            TaskState(str(task.task_name), task_hash(task), int(task.weight), flops, extracted=task)
        )
    states.sort(key=lambda t: (-t.weight * t.flops, t.name))
    return states


def best_latencies_us(database: Any, states: list[TaskState], target: Any) -> None:
    """Fill each task's best measured latency from the database (None: no valid record)."""
    import tvm

    for state in states:
        state.best_us = None
        mod = state.extracted.dispatched[0]
        if not isinstance(mod, tvm.IRModule):
            mod = tvm.IRModule({"main": mod})
        if not database.has_workload(mod):
            continue
        workload = database.commit_workload(mod)
        for record in database.get_top_k(workload, 1):
            secs = [float(s) for s in (record.run_secs or [])]
            if secs:
                state.best_us = sum(secs) / len(secs) * 1e6


def plan(states: list[TaskState], settings: TuneSettings) -> list[tuple[TaskState, int]]:
    """(task, trials to add) in the order they will be tuned: coverage first, then depth.

    Each task's share is `trials / tasks`; trials it was already allotted (from the cache) count
    toward it, so a second run with the same budget plans nothing and a bigger budget
    continues where the last run stopped.
    """
    n = len(states)
    if n == 0 or settings.trials <= 0:
        return []
    per_task = max(1, settings.trials // n)
    per_iter = max(1, min(settings.trials_per_iter, per_task))
    first: list[tuple[TaskState, int]] = []
    second: list[tuple[TaskState, int]] = []
    budget = settings.trials
    # Round one: a task without a valid record gets one search round, heaviest first.
    for state in states:
        if state.best_us is None and budget > 0:
            add = min(per_iter, budget)
            first.append((state, add))
            budget -= add
    # Round two: top every task up to its share of the budget.
    planned = {id(s): a for s, a in first}
    for state in states:
        have = state.budgeted + planned.get(id(state), 0)
        add = min(per_task - have, budget)
        if add > 0:
            second.append((state, add))
            budget -= add
    return first + second


def index_safe_alloc(rpc: bool) -> Callable[..., Any]:
    """An `f_alloc_argument` for MetaSchedule's runners that fills integer tensors with zeros.

    The default fills every argument with random bits. For a gather (`take`, an embedding
    lookup) those are indices far out of bounds: the measurement segfaults ("LocalRunner:
    Subprocess terminated"), the kernel never gets a record, and a BERT-like model could never
    be shipped (measured on sample_models/bert_tiny.onnx: take1, take2, take5). Zero is a valid
    index, mask and condition; floats stay random.
    Built as a closure so cloudpickle ships it to the runner workers by value.
    """

    def fill_with(random_fill: Any) -> Callable[[Any], None]:
        def fill(arg: Any) -> None:
            dtype = str(arg.dtype)
            if dtype.startswith(("int", "uint")) or dtype == "bool":
                import numpy

                arg.copyfrom(numpy.zeros([int(d) for d in arg.shape], dtype=dtype))
            else:
                random_fill(arg)

        return fill

    def alloc_local(device: Any, args_info: Any, alloc_repeat: int) -> Any:
        import tvm
        from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

        random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
        return alloc_argument_common(fill_with(random_fill), device, args_info, alloc_repeat)

    def alloc_rpc(session: Any, device: Any, args_info: Any, alloc_repeat: int) -> Any:
        from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

        random_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
        return alloc_argument_common(fill_with(random_fill), device, args_info, alloc_repeat)

    return alloc_rpc if rpc else alloc_local


class Tuner:
    """Owns the builder, runner and cost model for one run, reused across chunks."""

    def __init__(self, target: Any, work_dir: Path, settings: TuneSettings) -> None:
        from tvm.s_tir import meta_schedule as ms

        self.ms = ms
        self.target = target
        self.work_dir = Path(work_dir)
        self.settings = settings
        cores = int(target.attrs.get("num-cores", 0) or 0) or 1
        self.threads = settings.num_threads or cores
        self.builder = ms.builder.LocalBuilder(
            max_workers=settings.builder_workers or cores,
            timeout_sec=settings.build_timeout_s,
            initializer=worker_initializer(),
        )
        evaluator = ms.runner.EvaluatorConfig(
            number=3, repeat=1, min_repeat_ms=50, enable_cpu_cache_flush=False
        )
        if settings.rpc_tracker:
            if not settings.rpc_key:
                raise UsageError("--rpc-tracker needs --rpc-key", "the key the RPC servers registered with")
            host, port = parse_tracker(settings.rpc_tracker)
            self.runner: Any = ms.runner.RPCRunner(
                rpc_config=ms.runner.RPCConfig(
                    tracker_host=host,
                    tracker_port=port,
                    tracker_key=settings.rpc_key,
                    session_timeout_sec=int(settings.rpc_session_timeout_s),
                ),
                evaluator_config=evaluator,
                f_alloc_argument=index_safe_alloc(rpc=True),
            )
        else:
            self.runner = ms.runner.LocalRunner(
                timeout_sec=settings.run_timeout_s,
                evaluator_config=evaluator,
                f_alloc_argument=index_safe_alloc(rpc=False),
            )
        self.cost_model = ms.cost_model.XGBModel(num_tuning_cores=self.threads)
        self.database = ms.database.JSONDatabase(work_dir=str(self.work_dir))
        self.build_errors = 0
        self.run_errors = 0
        self.trials_measured = 0

    def close(self) -> None:
        """End the runner's worker processes now: its pool is otherwise shut down only when
        garbage-collected, and the workers (200 MB each) outlive the tuning run."""
        pool = getattr(self.runner, "pool", None)
        if pool is not None:
            pool.shutdown(wait=True)

    def _callback(self, chunk: list[TaskState], on_batch: Callable[[TaskState, list[float]], None]) -> Any:
        from tvm.ir.utils import derived_object

        tuner = self

        @derived_object
        class _Progress(self.ms.measure_callback.PyMeasureCallback):  # type: ignore[misc, name-defined]
            def apply(
                self, task_scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any
            ) -> None:
                good: list[float] = []
                for build, run in zip(builds, runs, strict=False):
                    if build.error_msg:
                        tuner.build_errors += 1
                    elif run.error_msg:
                        tuner.run_errors += 1
                    elif run.run_secs:
                        secs = [float(s) for s in run.run_secs]
                        good.append(sum(secs) / len(secs) * 1e6)
                tuner.trials_measured += len(candidates)
                state = chunk[task_id]
                state.trials += len(candidates)
                on_batch(state, good)

        return _Progress()

    def tune_chunk(
        self, chunk: list[tuple[TaskState, int]], on_batch: Callable[[TaskState, list[float]], None]
    ) -> None:
        ms = self.ms
        states = [s for s, _ in chunk]
        # MetaSchedule logs every task's table to stdout (its console handler takes the logger's
        # level when the loggers are created, once per chunk), which would tear the progress
        # display; the files under work_dir/logs keep everything.
        ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
        ms_logger.setLevel(logging.CRITICAL)
        # MetaSchedule re-creates its loggers by handler *name* and crashes on an unnamed handler
        # ("'NoneType' object has no attribute 'format'"), e.g. a log-capture handler a host
        # application (pytest) attached. Those belong on the root logger, not on this one.
        for handler in list(ms_logger.handlers):
            if handler.get_name() is None:
                ms_logger.removeHandler(handler)
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [s.extracted for s in states],
            work_dir=str(self.work_dir),
            strategy=ms.search_strategy.EvolutionarySearch(population_size=self.settings.population_size),
            num_threads=self.threads,
            seed=self.settings.seed,
        )
        if len(contexts) != len(states):  # a task already scheduled is dropped by MetaSchedule
            keep = {c.task_name for c in contexts}
            states = [s for s in states if s.name in keep]
            chunk = [(s, a) for s, a in chunk if s.name in keep]
            if not contexts:
                return
        per_task = max(a for _, a in chunk)
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(self.work_dir),
            max_trials_global=sum(a for _, a in chunk),
            max_trials_per_task=per_task,
            num_trials_per_iter=max(1, min(self.settings.trials_per_iter, min(a for _, a in chunk))),
            builder=self.builder,
            runner=self.runner,
            database=self.database,
            cost_model=self.cost_model,
            measure_callbacks=[
                *ms.measure_callback.MeasureCallback.create("default"),
                self._callback(states, on_batch),
            ],
            task_scheduler="gradient",
        )


def tune(
    states: list[TaskState],
    target: Any,
    work_dir: Path,
    settings: TuneSettings,
    *,
    on_progress: Callable[[TuneProgress], None] | None = None,
    on_chunk: Callable[[TuneSummary], None] | None = None,
) -> TuneSummary:
    """Tune `states` (their `trials`/`best_us` already read from the cache) into work_dir's database."""
    started = time.monotonic()
    work = plan(states, settings)
    planned = sum(a for _, a in work)
    summary = TuneSummary(states, 0, planned, 0, 0.0, "nothing-to-tune" if not work else "done", 0, 0, None)
    if work and settings.time_budget_s is not None and settings.time_budget_s <= 0:
        summary.stopped_by = "time"  # nothing left of the budget: apply what the database holds
        return summary
    if not work:
        return summary
    tuner = Tuner(target, work_dir, settings)
    try:
        return _tune_chunks(tuner, states, work, planned, summary, started, on_progress, on_chunk)
    finally:
        tuner.close()


def _tune_chunks(
    tuner: Tuner,
    states: list[TaskState],
    work: list[tuple[TaskState, int]],
    planned: int,
    summary: TuneSummary,
    started: float,
    on_progress: Callable[[TuneProgress], None] | None,
    on_chunk: Callable[[TuneSummary], None] | None,
) -> TuneSummary:
    settings, target = tuner.settings, tuner.target
    deadline = started + settings.time_budget_s if settings.time_budget_s else None
    current: list[str] = []

    def progress() -> TuneProgress:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return TuneProgress(
            tasks_total=len(states),
            tasks_tuned=sum(1 for s in states if s.best_us is not None),
            trials_done=tuner.trials_measured,
            trials_planned=planned,
            best_ms=summary.estimated_ms(),
            time_left_s=left,
            build_errors=tuner.build_errors,
            run_errors=tuner.run_errors,
            current=list(current),
        )

    def on_batch(state: TaskState, good_us: list[float]) -> None:
        if good_us:
            best = min(good_us)
            state.best_us = best if state.best_us is None else min(state.best_us, best)
        if on_progress:
            on_progress(progress())

    # Time spent inside tune_tasks over trials measured: the cost of a trial here, per-chunk
    # setup (task contexts, XGBoost training) included, so the estimate errs on the safe side.
    tuning_s = 0.0
    while work:
        spt = tuning_s / tuner.trials_measured if tuner.trials_measured else None
        chunk: list[tuple[TaskState, int]] = []
        if spt is None:
            # The first chunk is one task, one search round, and always runs (a positive budget
            # smaller than that is overrun by it): it measures what a trial costs here.
            chunk = [work[0]]
        else:
            left = math.inf if deadline is None else deadline - time.monotonic()
            cost = 0.0
            names: set[str] = set()
            for item in work:
                state, add = item
                if len(chunk) >= settings.max_chunk_tasks or state.name in names:
                    break  # a task appears once per chunk (round two may repeat round-one tasks)
                if cost + add * spt > left:
                    break
                chunk.append(item)
                names.add(state.name)
                cost += add * spt
            if not chunk:
                summary.stopped_by = "time"
                break
        work = work[len(chunk) :]
        current[:] = [s.name for s, _ in chunk]
        if on_progress:
            on_progress(progress())
        t0 = time.monotonic()
        tuner.tune_chunk(chunk, on_batch)
        elapsed = time.monotonic() - t0
        tuning_s += elapsed
        for state, add in chunk:
            state.budgeted += add
        summary.chunks += 1
        best_latencies_us(tuner.database, states, target)
        summary.trials_measured = tuner.trials_measured
        summary.build_errors, summary.run_errors = tuner.build_errors, tuner.run_errors
        summary.wall_s = time.monotonic() - started
        summary.seconds_per_trial = tuning_s / tuner.trials_measured if tuner.trials_measured else None
        current.clear()
        if on_chunk:
            on_chunk(summary)
        if on_progress:
            on_progress(progress())
    summary.wall_s = time.monotonic() - started
    return summary
