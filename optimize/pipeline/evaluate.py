"""Check and time candidates: the one owner of every backend and worker process a run opens.

Accuracy checks run the models in this process. Every timing runs each side in a worker process
of its own, one runtime per process as a user deploys it (optimize.bench.apart): the baseline's
worker lives for the whole run, the best's until a better one replaces it, and each candidate
gets its own. A candidate's comparison times it, the best so far and the baseline side by side,
so its speedup over the baseline is measured, not chained through ratios.

What is opened here is closed here, on every path, through context managers: `Evaluator` is one
itself (the run's long-lived workers), and each evaluation holds its own `ExitStack`, from which
a kept candidate's worker is handed to the best so far.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimize.accuracy import AccuracyResult, MetricError, accuracy_json, check, is_lossy, numerics
from optimize.backend import Backend
from optimize.bench import BenchSettings, Comparison, Measurement, measure_where_it_runs
from optimize.bench.apart import MIN_ROUNDS, PROCESS_SETS, ApartRun, compare_apart, compare_in_process_sets
from optimize.errors import first_line, full_text
from optimize.model.runtime_model import BASELINE_BACKEND, RuntimeModel
from optimize.pipeline import judge
from optimize.pipeline.baseline import Baseline
from optimize.pipeline.record import Decision, RunRecord, StageRecord
from optimize.runtimes.backends import open_backend, open_in_worker
from optimize.runtimes.registry import runtime_of_backend
from optimize.stage import Status

Candidate = RuntimeModel
MeasureFn = Callable[..., Measurement]  # optimize.bench.measure_where_it_runs's signature
CompareFn = Callable[..., ApartRun]  # optimize.bench.apart.compare_apart's signature
WorkerFn = Callable[[Candidate], Backend]  # a candidate loaded in a worker process of its own

# ONNX Runtime settings that leave the graph and its kernels as they are (threads, spinning,
# memory reuse): a candidate with only these can be numerically exact.
SESSION_ONLY_SETTINGS = {
    "intra_op_num_threads",
    "inter_op_num_threads",
    "execution_mode",
    "allow_spinning",
    "enable_mem_pattern",
    "enable_cpu_mem_arena",
    "graph_optimization_level",
}


def open_candidate(candidate: Candidate) -> Backend:
    """The candidate loaded in this process (for accuracy checks)."""
    return open_backend(candidate.backend, candidate.model_path, candidate.runtime_config)


def open_candidate_worker(candidate: Candidate) -> Backend:
    """The candidate in a worker process of its own (for timing)."""
    return open_in_worker(candidate.backend, candidate.model_path, candidate.runtime_config)


# Writing an artifact: copying its files (and hashing them) at about this rate, plus a fixed cost
# (the report, its plots, the process's exit).
_WRITE_BYTES_PER_S = 100e6
_WRITE_FIXED_S = 1.0
MIN_COMPARISON_S = 1.0  # a comparison times at least this long, whatever budget is left
_SETTLE_S = 0.02  # a typical wait for the other worker to go idle before a block


def artifact_write_s(*paths: Path | str) -> float:
    """About how long writing an artifact of these files takes."""
    size = 0
    for path in paths:
        with contextlib.suppress(OSError):
            size += Path(path).stat().st_size
            data = Path(str(path) + ".data")
            if data.exists():
                size += data.stat().st_size
    return _WRITE_FIXED_S + size / _WRITE_BYTES_PER_S


def _owned(stack: ExitStack, worker: Backend) -> Backend:
    """`worker`, closed when `stack` closes."""
    stack.callback(worker.close)
    return worker


class BestSoFar:
    """The best candidate so far and everything measured of it, in one place: its worker, the row
    it was kept on (its figures side by side with the best before it and the baseline) and its
    measurement alone in its worker, which every target decision reads. Set by begin() (the
    baseline), changed only through adopt()."""

    def __init__(self, baseline: Candidate) -> None:
        self.candidate = baseline
        # Its worker process (None while the best is the baseline: the baseline's own worker).
        self.worker: Backend | None = None
        self.row: StageRecord | None = None  # the row it was kept on (the baseline's at first)
        self.alone: Measurement | None = None  # measured alone, once it became the best
        self.accuracy = AccuracyResult(True, "", {})
        self.kept_chain: list[dict[str, Any]] = []
        self.standard = baseline  # the best standard-op candidate (for TVM / TensorRT / OpenVINO)
        # The best candidate of each runtime: a stage starts from its own runtime's best (an ONNX
        # Runtime stage cannot start from an OpenVINO IR), whichever runtime leads.
        self.by_runtime: dict[str, Candidate] = {runtime_of_backend(baseline.backend).name: baseline}

    @property
    def speedup(self) -> float:
        """Its speedup over the baseline, measured side by side when it was kept (the baseline: 1)."""
        if self.row is None or self.row.speedup is None:
            return 1.0
        return self.row.speedup

    def alone_ms(self, metric: str) -> float:
        """Its latency at `metric`, measured alone: what the target decisions read."""
        if self.alone is None:
            raise RuntimeError("the best so far has not been measured alone yet (begin() comes first)")
        return float(self.alone.latency[metric])

    def begin(self, row: StageRecord, alone: Measurement) -> None:
        """The baseline's row and its measurement alone, before any stage runs."""
        self.row, self.alone = row, alone

    def adopt(
        self,
        cand: Candidate,
        worker: Backend,
        *,
        row: StageRecord,
        accuracy: AccuracyResult,
        alone: Measurement,
    ) -> None:
        """`cand`, kept on `row`, becomes the best with its worker and its measurement alone."""
        self.close()
        self.candidate, self.worker, self.row, self.accuracy, self.alone = cand, worker, row, accuracy, alone
        self.kept_chain.append({"stage": cand.label, **cand.details})
        if cand.standard_ops:
            self.standard = cand
        self.by_runtime[runtime_of_backend(cand.backend).name] = cand

    def of_runtime(self, runtime: str | None) -> Candidate:
        """Where a stage of `runtime` starts: that runtime's best so far, else the best overall."""
        return self.by_runtime.get(runtime or "", self.candidate)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


class Evaluator:
    """Checks candidates against the baseline's reference outputs and times them against the
    best so far and the baseline. Measuring and worker start-up are injectable for tests."""

    def __init__(
        self,
        record: RunRecord,
        baseline: Baseline,
        settings: BenchSettings,
        *,
        measure_fn: MeasureFn | None = None,
        compare_fn: CompareFn | None = None,
        open_worker_fn: WorkerFn | None = None,
    ) -> None:
        self.record = record
        self.baseline = baseline
        self.settings = settings
        self.metric = record.metric
        self.measure_fn = measure_fn or measure_where_it_runs
        self.compare_fn = compare_fn or compare_apart
        self._open_worker = open_worker_fn or open_candidate_worker
        # Seconds of the --time-budget left for the search (None: no budget); the pipeline sets it.
        self.time_left: Callable[[], float | None] = lambda: None
        self.evaluated_s: list[float] = []  # how long each evaluate() took
        # Seconds each candidate's worker took to start (the model loaded and compiled), by label:
        # what the final comparison's fresh processes will cost (end_cost_s).
        self.open_s: dict[str, float] = {}
        self.original = Candidate(
            label="baseline", model_path=baseline.model_path, backend=BASELINE_BACKEND, runtime_config={}
        )
        self.best = BestSoFar(self.original)
        self._stack = ExitStack()
        self.base_worker: Backend | None = None
        self.baseline_ms = 0.0  # the baseline's p50 alone: how long warm-up runs take

    def open_worker(self, candidate: Candidate) -> Backend:
        """`candidate` in a worker process of its own; how long that took is kept."""
        start = time.monotonic()
        worker = self._open_worker(candidate)
        self.open_s[candidate.label] = time.monotonic() - start
        return worker

    def end_cost_s(self, best: Candidate | None = None) -> float:
        """What the end of a run will take with `best` (by default the best so far) as the
        artifact: the final comparison (its timing, at least the rounds and runs each set needs,
        its PROCESS_SETS fresh pairs of workers and their warm-up) and the artifact's write.
        Estimated from this run's own worker starts and the baseline's latency."""
        best = self.best.candidate if best is None else best
        if best is self.original or best.label == self.original.label:
            return artifact_write_s(self.original.model_path)
        run_s = self.baseline_ms / 1000.0
        starts = self.open_s.get(self.original.label, 0.0) + self.open_s.get(best.label, 0.0)
        warmup_s = self.settings.warmup * 2.0 * run_s
        # compare_apart's least per set: 4 rounds of a block per side, and min_runs shared out
        round_s = 2.0 * (max(self.settings.block_s, run_s) + _SETTLE_S)
        least_s = PROCESS_SETS * max(
            MIN_ROUNDS * round_s, 2.0 * math.ceil(self.settings.min_runs / PROCESS_SETS) * run_s
        )
        return (
            max(self.settings.max_time_s, least_s)
            + PROCESS_SETS * (starts + warmup_s)
            + artifact_write_s(best.model_path, *best.extra_files)
        )

    # -- the run's long-lived workers ----------------------------------------------------------

    def __enter__(self) -> Evaluator:
        self._stack.callback(self.best.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def start_baseline(self) -> Measurement:
        """The baseline's worker, kept for the whole run, and its first measurement."""
        self.record.status("baseline: starting its worker process")
        self.base_worker = _owned(self._stack, self.open_worker(self.original))
        measured = self.measure_alone(self.original, self.base_worker, what="baseline: measuring")
        self.baseline_ms = float(measured.latency["p50"])
        return measured

    def measure_alone(self, candidate: Candidate, worker: Backend, what: str | None = None) -> Measurement:
        """One side alone in its process: the figure every target decision reads."""
        return self.measure_fn(
            worker, self.baseline.feeds, self.settings, candidate.label,
            progress=self._bench_progress(what or f"{candidate.label}: alone"),
        )  # fmt: skip

    def adopt(self, cand: Candidate, worker: Backend, row: StageRecord, accuracy: AccuracyResult) -> None:
        """`cand`, kept on `row`, becomes the best so far with `worker` (now owned here), measured
        alone in it for the target decisions."""
        self.best.close()  # the previous best's worker: never timed again
        self.record.became_best(cand.label)
        self.record.status(f"{cand.label}: measuring alone, for the target")
        try:
            alone = self.measure_alone(cand, worker)
        except BaseException:
            worker.close()
            raise
        self.best.adopt(cand, worker, row=row, accuracy=accuracy, alone=alone)
        self.record.results.append({**alone.to_json(), "label": f"{cand.label} (alone, for the target)"})

    def _bench_progress(self, what: str) -> Callable[[int, float], None]:
        return lambda runs, elapsed: self.record.status(f"{what}: {runs} runs, {elapsed:.1f} s")

    # -- accuracy --------------------------------------------------------------------------------

    def check_backend(self, backend: Backend, candidate: Candidate) -> AccuracyResult:
        """The candidate's outputs against the reference's, weighed by what the rows can tell."""
        base = self.baseline
        expected = {(s.name, s.dtype) for s in base.inputs}
        got = {(s.name, s.dtype) for s in backend.inputs}
        if got != expected:
            missing = sorted(n for n, _ in expected - got)
            extra = sorted(n for n, _ in got - expected)
            what = "; ".join(
                x
                for x in (
                    f"lost {', '.join(missing)}" if missing else "",
                    f"added {', '.join(extra)}" if extra else "",
                )
                if x
            )
            return AccuracyResult(False, f"the candidate changed the model's inputs ({what})", {})
        result = check(
            base.reference,
            base.outputs_of(backend),
            self.record.recipe.accuracy,
            choices=base.choices,
            user_metric=base.user_metric,
            inputs=base.samples,
            labels=base.labels,
            fp32=not is_lossy(candidate.precision),
        )
        return judge.weigh_evidence(result, candidate.precision, base.evidence)

    def check_accuracy(self, candidate: Candidate) -> AccuracyResult:
        """The service stages get through ctx.check_accuracy (quantization back-off)."""
        with open_candidate(candidate) as backend:
            return self.check_backend(backend, candidate)

    def reference_accuracy(self) -> AccuracyResult:
        """The original against itself: what the report says when the original ships."""
        base = self.baseline
        return check(
            base.reference, base.reference, self.record.recipe.accuracy, choices=base.choices,
            user_metric=base.user_metric, inputs=base.samples, labels=base.labels,
        )  # fmt: skip

    def numerics_of(self, cand: Candidate, accuracy: AccuracyResult) -> str:
        """exact only for the original graph under session settings alone, seen bit for bit equal."""
        same_graph = (
            cand.backend == BASELINE_BACKEND
            and Path(cand.model_path).resolve() == Path(self.record.request.model_path).resolve()
            and set(cand.runtime_config) <= SESSION_ONLY_SETTINGS
            and cand.runtime_config.get("graph_optimization_level", "all") == "all"
        )
        identical = bool(accuracy.per_output) and all(
            float(f.get("max_abs", 1.0)) == 0.0 for f in accuracy.per_output.values()
        )
        return numerics(cand.precision, same_graph, identical)

    # -- one candidate ---------------------------------------------------------------------------

    def evaluate(self, stage: str, cand: Candidate) -> tuple[StageRecord, Backend | None, AccuracyResult]:
        """Check `cand`, then time it against the best so far and the baseline, twice when it
        wins. Returns its record, its worker when it is kept (the caller then owns it), and its
        accuracy. How long it took is kept (evaluation_s)."""
        start = time.monotonic()
        try:
            return self._evaluate(stage, cand)
        finally:
            self.evaluated_s.append(time.monotonic() - start)

    def evaluation_s(self) -> float:
        """About how long checking and timing one candidate takes here: the median of this run's
        evaluations so far, else an estimate from the baseline (a comparison's timing, a worker's
        start, the accuracy rows run twice)."""
        if self.evaluated_s:
            return float(statistics.median(self.evaluated_s))
        run_s = self.baseline_ms / 1000.0
        check_s = 2.0 * len(self.baseline.samples) * run_s
        return self.settings.max_time_s + 2.0 * self.open_s.get(self.original.label, 0.0) + check_s

    def _search_settings(self) -> BenchSettings:
        """The recipe's bench settings, a comparison's timing capped by the --time-budget left."""
        left = self.time_left()
        if left is None or left >= self.settings.max_time_s:
            return self.settings
        return replace(self.settings, max_time_s=max(MIN_COMPARISON_S, left))

    def _evaluate(self, stage: str, cand: Candidate) -> tuple[StageRecord, Backend | None, AccuracyResult]:
        record = StageRecord(
            stage=stage,
            label=cand.label,
            status=Status.FAILED,
            details=dict(cand.details),
            backend=cand.backend,
            runtime_config=dict(cand.runtime_config),
            precision=cand.precision,
        )
        no_accuracy = AccuracyResult(False, "", {})
        accuracy = self._check(record, cand)
        if accuracy is None:
            return record, None, no_accuracy
        record.accuracy = accuracy_json(accuracy)
        record.numerics = self.numerics_of(cand, accuracy)
        if not accuracy.ok and not judge.timed_though_inaccurate(cand):
            record.take(judge.inaccurate(accuracy))
            return record, None, accuracy
        best = self.best.candidate
        with ExitStack() as owned:
            self.record.status(f"{cand.label}: benchmarking against {best.label}")
            try:
                worker, versus_best, versus_baseline = self._side_by_side(owned, cand, fresh=False)
            except Exception as exc:
                record.reason = f"benchmarking failed: {first_line(exc)}"
                return record, None, accuracy
            decision = self._judge(record, "comparison", versus_best, versus_baseline, best.label)
            if not accuracy.ok:
                record.take(judge.inaccurate(accuracy, timed=decision))
                return record, None, accuracy
            if accuracy.unverified:
                # Measured so the report can say what verifying it would gain; never adopted, so
                # no confirmation run is spent on it.
                record.take(judge.hold_unverified(decision, accuracy))
                return record, None, accuracy
            record.take(decision)
            if decision.status != Status.KEPT:
                return record, None, accuracy
            # Two processes of the same model can differ by a few percent for their whole life
            # (memory placement), and that bias is invisible to one comparison's CI. A win must
            # therefore repeat on fresh processes, the baseline's included, before it is kept.
            first = versus_best
            owned.close()  # the first candidate worker: the confirmation starts fresh ones
            self.record.status(f"{cand.label}: confirming on fresh processes")
            try:
                worker, versus_best, versus_baseline = self._side_by_side(owned, cand, fresh=True)
            except Exception as exc:
                record.status, record.reason = (
                    Status.FAILED,
                    f"confirmation benchmark failed: {first_line(exc)}",
                )
                return record, None, accuracy
            decision = self._judge(record, "confirmation", versus_best, versus_baseline, best.label)
            record.take(judge.confirm(first, decision))
            if decision.status != Status.KEPT:
                return record, None, accuracy
            owned.pop_all()  # the kept candidate's worker goes to the caller
            return record, worker, accuracy

    def _check(self, record: StageRecord, cand: Candidate) -> AccuracyResult | None:
        """The candidate's accuracy, or None with the record's reason when it does not load or run."""
        self.record.status(f"{cand.label}: loading the candidate")
        try:
            backend = open_candidate(cand)
        except Exception as exc:
            record.reason = f"the candidate does not load: {first_line(exc)}"
            record.details["error_text"] = full_text(exc)
            return None
        # Timing runs in worker processes, never beside this one: it is closed before any.
        with backend:
            self.record.status(f"{cand.label}: checking accuracy on {len(self.baseline.samples)} samples")
            try:
                return self.check_backend(backend, cand)
            except MetricError:  # the user's --metric broke: a usage error
                raise
            except Exception as exc:
                record.reason = f"the candidate does not run: {first_line(exc)}"
                record.details["error_text"] = full_text(exc)
                return None

    def _side_by_side(
        self, owned: ExitStack, cand: Candidate, fresh: bool
    ) -> tuple[Backend, Comparison, Comparison]:
        """Time the candidate, the best so far and the baseline, each in its own worker, side by
        side. `fresh`: in new processes, the baseline's and the best's too, closed when this
        returns. The candidate's worker goes on `owned`. Returns it, the candidate's comparison
        with the best and with the baseline (the same one while the best is the baseline)."""
        best = self.best
        with ExitStack() as temporary:

            def worker_for(candidate: Candidate, kept: Backend | None) -> Backend:
                if kept is not None and not fresh:
                    return kept
                return _owned(temporary, self.open_worker(candidate))

            sides = [worker_for(self.original, self.base_worker)]
            labels = ["baseline"]
            if best.worker is not None:
                sides.append(worker_for(best.candidate, best.worker))
                labels.append(best.candidate.label)
            sides.append(_owned(owned, self.open_worker(cand)))
            labels.append(cand.label)
            cand_i = len(sides) - 1
            run = self.compare_fn(
                sides, [self.baseline.feeds] * len(sides), self._search_settings(), labels, self.metric,
                self._bench_progress(f"{cand.label} vs {best.candidate.label}"),
                give_up=self._cannot_win(cand_i - 1, cand_i),
            )  # fmt: skip
        versus_baseline = run.comparison(0, cand_i)
        versus_best = run.comparison(cand_i - 1, cand_i) if cand_i == 2 else versus_baseline
        return sides[-1], versus_best, versus_baseline

    def _cannot_win(self, best_i: int, cand_i: int) -> Callable[[ApartRun], bool]:
        """Stop timing a candidate once even the fast end of its ratio's interval to the best is
        short of the recipe's minimum gain: more runs would only say by how much it lost."""
        needed = 1.0 - self.record.recipe.min_improvement

        def cannot_win(run: ApartRun) -> bool:
            _, lo, _ = run.ratio(best_i, cand_i, n=300)
            return bool(lo > needed)

        return cannot_win

    def _judge(
        self,
        record: StageRecord,
        key: str,
        versus_best: Comparison,
        versus_baseline: Comparison,
        best_label: str,
    ) -> Decision:
        """Record the comparisons under details[key] (and key_with_baseline); the judge's decision
        on them."""
        record.details[key] = versus_best.to_json()
        if versus_baseline is not versus_best:
            record.details[f"{key}_with_baseline"] = versus_baseline.to_json()
        return judge.judge_candidate(
            versus_best,
            versus_baseline,
            label=record.label,
            metric=self.metric,
            best_label=best_label,
            min_improvement=self.record.recipe.min_improvement,
            confirmation=key == "confirmation",
        )

    # -- the end ---------------------------------------------------------------------------------

    def measure_artifact(self, best: Candidate, max_time_s: float | None = None) -> Comparison:
        """The artifact against the baseline once more, after the search chose it, in
        PROCESS_SETS fresh pairs of worker processes, pooled (`max_time_s`: their timing, shared;
        the recipe's by default). The comparisons that chose it are the luckiest of several noisy
        ones (the winner's curse: on the corpus its confirmed figure read 16-18% above the alone
        figure on 3 of 7 models), and one pair of processes is one draw of this machine's
        process-to-process and phase-to-phase speed. `lto bench --compare` measures the same way."""
        settings = self.settings if max_time_s is None else replace(self.settings, max_time_s=max_time_s)
        labels = ["baseline", best.label]
        run = compare_in_process_sets(
            [lambda: self.open_worker(self.original), lambda: self.open_worker(best)],
            [self.baseline.feeds] * 2, settings, labels, self.metric, PROCESS_SETS,
            status=lambda text: self.record.status(f"final: {text}"),
            progress=self._bench_progress(f"final: {best.label} vs baseline"),
            compare_fn=self.compare_fn,
        )  # fmt: skip
        return run.comparison(0, 1)


__all__ = [
    "SESSION_ONLY_SETTINGS",
    "BestSoFar",
    "CompareFn",
    "Evaluator",
    "MeasureFn",
    "WorkerFn",
    "open_candidate",
    "open_candidate_worker",
]
