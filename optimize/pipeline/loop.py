"""The run of `lto optimize`: baseline, stages in recipe order, every candidate checked and
measured against the best so far and the baseline, then the artifact.

Roles, each in its own file: `baseline` prepares what every candidate is judged against;
`evaluate` loads, checks and times (through the bench engine only) and owns every process it
starts; `judge` decides; the loop runs the stages and writes what happens into the run's
`record`, from which `summary` builds the report. A stage only proposes candidates (STYLE.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from optimize import interrupts
from optimize.accuracy import MetricError, accuracy_json
from optimize.artifact import write_artifact
from optimize.bench import BenchSettings, Comparison, Measurement, peaks
from optimize.env import cpu_isa_flags, machine_fingerprint
from optimize.errors import first_line, full_text
from optimize.evidence import numerics
from optimize.inspection import model_flops
from optimize.onnx_file import file_has_external_data
from optimize.pipeline import judge, order
from optimize.pipeline.baseline import Baseline, prepare_baseline, prepare_inputs
from optimize.pipeline.evaluate import CompareFn, Evaluator, MeasureFn, WorkerFn, open_candidate
from optimize.pipeline.isolation import run_in_child
from optimize.pipeline.record import Progress, RunRecord, StageRecord, Status
from optimize.pipeline.request import (
    OptimizeRequest,
    apply_overrides,
    choose_recipe,
    default_out_dir,
    partial_report_path,
)
from optimize.pipeline.summary import (
    FinalFigures,
    PipelineResult,
    final_line,
    optimize_report,
    write_partial_report,
)
from optimize.recipes import Recipe, StageSpec
from optimize.render.markdown import render_markdown
from optimize.report import write_report
from optimize.runtimes.registry import BASELINE_BACKEND, BASELINE_RUNTIME, stage_runtime
from optimize.runtimes.stages import load_stage
from optimize.stage import Candidate, Stage, StageContext, StageSkipped
from optimize.stats import percentile_ci

StageFactory = Callable[[str], Stage]
# The final comparison times for at least this long, even when the --time-budget is spent: a
# headline needs its own measurement (a few rounds in each set of processes).
FINAL_MIN_TIME_S = 3.0


def _named(stage: str, text: str) -> str:
    """A stage's line, led by its name once ("openvino-convert: openvino-convert:bf16: ..." read
    twice when the line already names one of the stage's candidates)."""
    return text if text.startswith(f"{stage}:") else f"{stage}: {text}"


# Exception types that, raised by lto's own code, are its bugs (Olive re-raises the same kinds).
PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, AssertionError, UnboundLocalError)
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _own_programming_error(exc: BaseException) -> bool:
    """A programming error whose innermost frame is in lto's own package (not in a library a stage
    calls, where the same types mean the library refused the model)."""
    if not isinstance(exc, PROGRAMMING_ERRORS):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(_PACKAGE_DIR)


def _missing_folders(path: Path) -> list[Path]:
    """The folders of `path` that do not exist yet, deepest first (mkdir would create them)."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    return missing


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


class Pipeline:
    """One run of `lto optimize`. Measuring and stage loading are injectable for tests."""

    def __init__(
        self,
        request: OptimizeRequest,
        recipe: Recipe,
        *,
        model_kind: str = "default",
        stage_factory: StageFactory | None = None,
        measure_fn: MeasureFn | None = None,
        compare_fn: CompareFn | None = None,
        open_worker_fn: WorkerFn | None = None,
        progress: Progress | None = None,
        recipe_notes: Sequence[str] = (),
    ) -> None:
        self.request = request
        self.recipe = recipe
        self.stage_factory = stage_factory or load_stage
        self.measure_fn = measure_fn
        self.compare_fn = compare_fn
        self.open_worker_fn = open_worker_fn
        self.settings = BenchSettings(**recipe.bench)
        self.metric = request.target_percentile
        out_dir = Path(request.out_dir) if request.out_dir else default_out_dir(request.model_path)
        self.record = RunRecord(
            started=request.started if request.started is not None else time.monotonic(),
            request=request,
            recipe=recipe,
            model_kind=model_kind,
            out_dir=out_dir,
            bench_settings=self.settings.to_json(),
            progress=progress or Progress(),
            warnings=list(recipe_notes),
        )
        self._deadline = self.record.started + request.time_budget_s if request.time_budget_s else None
        self._loaded: dict[str, Stage | StageSkipped] = {}
        self._evaluator: Evaluator | None = None
        self.record.deadline = self._deadline
        # The order the stages run in, by expected gain per second (pipeline/order.py).
        # The machine's class in the prior, from its measured arithmetic rates (once per machine).
        self.peaks = peaks.machine_peaks(
            announce=lambda: self.record.status("measuring this machine's fp32, int8 and bf16 rates (once)")
        )
        self.cpu = peaks.machine_class(cpu_isa_flags(), self.peaks)
        self.fingerprint = machine_fingerprint()
        self.history = order.history_path()
        past = order.read_history(self.history, self.fingerprint)
        self.plan = order.plan(recipe.stages, model_kind, self.cpu, request.search_order, history=past)
        self._remaining: list[tuple[StageSpec, order.Odds]] = []  # the stages still to run, in order
        self.record.search = {
            "order": request.search_order,
            "cpu_class": self.cpu,
            "machine_rates_gops": self.peaks.to_json() if self.peaks else None,
            "stages": [odds.to_json() for _, odds in self.plan],
            "history": str(self.history) if self.history else None,
        }

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> PipelineResult:
        self.request.validate()
        model_path = Path(self.request.model_path)
        work_parent = self.record.out_dir.parent
        created = _missing_folders(work_parent)
        work_parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f".lto-work-{model_path.stem}-", dir=work_parent)).absolute()
        try:
            return self._run(model_path, workdir)
        except BaseException as exc:
            write_partial_report(self.record, exc)
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            for folder in created:  # a run that wrote nothing leaves no empty folders behind
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _run(self, model_path: Path, workdir: Path) -> PipelineResult:
        record = self.record
        record.external_data = file_has_external_data(model_path)
        prepared = prepare_inputs(record, model_path, workdir)
        # Absolute: stages run inside their scratch directory (see _stage_items).
        original = Candidate(label="baseline", model_path=model_path.absolute(), runtime_config={})
        record.status(f"baseline: loading the original model on {BASELINE_RUNTIME.title} defaults")
        t0 = time.monotonic()
        with open_candidate(original) as backend:
            baseline = prepare_baseline(record, original.model_path, prepared, backend)
        evaluator = Evaluator(
            record, baseline, self.settings, measure_fn=self.measure_fn, compare_fn=self.compare_fn,
            open_worker_fn=self.open_worker_fn,
        )  # fmt: skip
        self._evaluator = evaluator
        evaluator.time_left = self._time_left
        record.log(order.plan_line(self.plan, self.record.model_kind, self.cpu))
        with evaluator:
            base_meas = evaluator.start_baseline()
            record.results.append({**base_meas.to_json(), "label": "baseline (alone, at the start)"})
            record.became_best("baseline")
            record.add(
                StageRecord(
                    stage="baseline",
                    label="baseline",
                    status=Status.BASELINE,
                    reason=f"original model, {BASELINE_RUNTIME.title} default settings; measured alone at "
                    "the start, for the search's target decisions (every speedup is measured side by side)",
                    latency_ms=self._latency(base_meas),
                    speedup=1.0,
                    baseline_ms=self._latency(base_meas)[self.metric],
                    metric=self.metric,
                    accuracy={"ok": True, "reason": "reference", "per_output": {}, "worst": {}},
                    backend=BASELINE_BACKEND,
                    runtime_config={},
                    precision="fp32",
                    elapsed_s=time.monotonic() - t0,
                )
            )
            # The search's target decisions (skipping a stage, stopping a search, --stop-at-target)
            # read the best candidate measured alone, as the user's process runs it; the final
            # verdict reads the artifact's figure in its final comparison (what the table shows).
            self.best_alone = base_meas
            self._stages(evaluator, baseline, workdir)
        return self._finish(evaluator, baseline, base_meas)

    def _stages(self, evaluator: Evaluator, baseline: Baseline, workdir: Path) -> None:
        """Every stage of the recipe in order, then the runoff among close runners-up."""
        record, best = self.record, evaluator.best
        runners_up: list[tuple[StageSpec, Candidate, StageRecord]] = []
        stop_reason = ""
        if self.request.stop_at_target and self._target_met(self.best_alone, confident=True):
            stop_reason = "the baseline already meets the target (--stop-at-target)"
        self._remaining = list(self.plan)
        while self._remaining:
            if self.request.search_order == "gain":  # the best changed: so may the order
                self._remaining = order.rank(self._remaining, best.speedup)
            (spec, odds), self._remaining = self._remaining[0], self._remaining[1:]
            t_stage = time.monotonic()
            reason = self._pre_skip_reason(spec, stop_reason, odds) or self._not_worth_reason(
                spec, odds, best.speedup
            )
            if reason:
                # Which candidate a target-based skip was decided on (the final comparison may revert it).
                basis = {"decided_on": best.candidate.label}
                record.add(StageRecord(spec.name, spec.name, Status.SKIPPED, reason, details=basis))
                continue
            opened = self._open_stage(spec, evaluator, baseline, workdir)
            if isinstance(opened, StageRecord):
                opened.elapsed_s = time.monotonic() - t_stage
                record.add(opened)
                continue
            stage, ctx = opened
            items = self._stage_items(spec, stage, best.of_runtime(stage_runtime(spec.name)), ctx)
            produced = 0
            try:
                for item in items:
                    if isinstance(item, StageRecord):  # a failure, or a search point not tried
                        item.elapsed_s = time.monotonic() - t_stage
                        record.add(item)
                        continue
                    cand, produced = item, produced + 1
                    why = self._unmeasured_reason(ctx, produced)
                    if why:
                        record.add(
                            StageRecord(spec.name, cand.label, Status.SKIPPED, why, details=cand.details)
                        )
                        break
                    row = self._evaluate_and_adopt(evaluator, spec, cand, t_stage)
                    ctx.outcomes[cand.label] = row.outcome()
                    if row.status == Status.KEPT:
                        ctx.best_latency_ms = self._best_ms()
                    elif row.outcome() == "slower":
                        runners_up.append((spec, cand, row))
                    if judge.search_done(spec, self.request.target_ms, self._best_ms()):
                        record.log(
                            f"{spec.name}: the best {self.metric} ({self._best_ms():.3f} ms, measured "
                            f"alone) meets the {self.request.target_ms:g} ms target; the stage stops here"
                        )
                        break
            finally:
                items.close()  # a generator stage stops here, its cleanup runs
                record.stage_seconds[spec.name] = time.monotonic() - t_stage
            if produced == 0 and not any(r.stage == spec.name for r in record.records):
                record.add(
                    StageRecord(spec.name, spec.name, Status.SKIPPED, "the stage produced no candidate")
                )
            if self.request.stop_at_target and not stop_reason and self._target_met(self.best_alone, True):
                stop_reason = f"target met with 95% confidence after {spec.name} (--stop-at-target)"
        if not stop_reason:
            self._runoff(evaluator, runners_up)

    def _unmeasured_reason(self, ctx: StageContext, produced: int) -> str:
        """Why the stage's next candidate is left unmeasured ("" when it is measured)."""
        left = self._time_left()
        if left is not None and left <= 0:
            return "the --time-budget was used up before it could be measured"
        short = self._too_little_time()
        if short:
            return short
        share_deadline = ctx.deadline if self._deadline is not None else None
        if judge.share_used_up(share_deadline, time.monotonic(), produced - 1):
            return "the stage's share of the --time-budget was used up before it could be measured"
        return ""

    def _evaluate_and_adopt(
        self, evaluator: Evaluator, spec: StageSpec, cand: Candidate, t_stage: float
    ) -> StageRecord:
        """Check and time `cand` against the best so far; a kept one becomes the best."""
        row, worker, accuracy = evaluator.evaluate(spec.name, cand)
        interrupts.ensure_signal_stack()  # the candidate ran here to be checked (interrupts.py)
        row.elapsed_s = time.monotonic() - t_stage
        self.record.add(row)
        if worker is not None and row.speedup is not None:  # kept: the worker is now the best's
            evaluator.best.adopt(cand, worker, row.speedup, accuracy)
            self.record.became_best(cand.label)
            self.record.status(f"{cand.label}: measuring alone, for the target")
            self.best_alone = evaluator.measure_alone(cand, worker)
            self.record.results.append(
                {**self.best_alone.to_json(), "label": f"{cand.label} (alone, for the target)"}
            )
        elif worker is not None:
            worker.close()
        return row

    def _runoff(
        self, evaluator: Evaluator, runners_up: list[tuple[StageSpec, Candidate, StageRecord]]
    ) -> None:
        """Accurate candidates that lost to an earlier best but whose estimated speedup comes close
        to the final best's meet it directly: stages run greedily, so a candidate rejected against
        one best was never measured against a later one (e.g. an OpenVINO fp variant measured
        against ORT int8, then OpenVINO int8 kept)."""
        best = evaluator.best
        # Only those measured against another best than the final one: the others already met it.
        unmet = [
            (cand, row.speedup)
            for _, cand, row in runners_up
            if (row.versus or {}).get("label") != best.candidate.label
        ]
        close = judge.runoff_candidates(unmet, best.candidate, best.speedup)
        by_label = {cand.label: spec for spec, cand, _ in runners_up}
        for cand in close:
            left = self._time_left()
            if (left is not None and left <= 0) or self._too_little_time():
                break
            self.record.log(f"runoff: {cand.label} against {best.candidate.label}, side by side")
            self._evaluate_and_adopt(evaluator, by_label[cand.label], cand, time.monotonic())

    # -- helpers --------------------------------------------------------------------------------

    def _latency(self, measurement: Measurement, figure: float | None = None) -> dict[str, float]:
        """p50 and p99 of a measurement's runs; at the target percentile `figure` when given (a
        comparison's figure for the side, from the block pairs its ratio comes from)."""
        lat = measurement.latency
        value = lat[self.metric] if figure is None else figure
        return {"p50": lat["p50"], "p99": lat["p99"], self.metric: value}

    def _side_interval(self, comparison: Comparison, side: str) -> tuple[float, float]:
        """The 95% interval of side "a" (the baseline) or "b" (the artifact)'s figure in the final
        comparison, from the same pairs as the figure."""
        paired = comparison.paired
        if paired is not None:
            return paired.figure.a_ci95 if side == "a" else paired.figure.b_ci95
        _, lo, hi = percentile_ci((comparison.a if side == "a" else comparison.b).samples_ms, self.metric)
        return lo, hi

    def _target_met(self, measurement: Measurement, confident: bool) -> bool:
        return judge.target_met(measurement.samples_ms, self.metric, self.request.target_ms, confident)

    def _time_left(self) -> float | None:
        """Seconds of the --time-budget left for the search: what the end of the run (the final
        comparison in fresh processes and writing the artifact) will take is kept back."""
        if self._deadline is None:
            return None
        reserve = self._evaluator.end_cost_s(self._evaluator.best.candidate) if self._evaluator else 0.0
        return self._deadline - time.monotonic() - reserve

    def _too_little_time(self, stage_cost_s: float = 0.0) -> str:
        """Why what is left of the --time-budget cannot fit one more candidate ("" when it can):
        checking and timing one takes about evaluation_s here, and a measurement once begun runs
        its least rounds whatever the budget. A stage about to start needs `stage_cost_s` too
        (what it took in earlier runs: a quantizer's calibration cannot be cut short)."""
        left = self._time_left()
        if left is None or self._evaluator is None:
            return ""
        evaluation = self._evaluator.evaluation_s()
        if left >= max(evaluation, stage_cost_s):
            return ""
        if stage_cost_s > evaluation:
            return (
                f"the --time-budget left for the search ({max(left, 0.0):.0f} s) is less than this "
                f"stage took in earlier runs (about {stage_cost_s:.0f} s)"
            )
        return (
            f"the --time-budget left for the search ({max(left, 0.0):.0f} s) is less than checking "
            f"and timing a candidate takes here (about {evaluation:.0f} s)"
        )

    def _final_time_s(self) -> float | None:
        """The final comparison's timing budget: the recipe's, or what is left of the --time-budget
        once its processes' start and the artifact's write are counted, whichever is less."""
        if self._deadline is None or self._evaluator is None:
            return None
        best = self._evaluator.best.candidate
        overhead = self._evaluator.end_cost_s(best) - self.settings.max_time_s
        left = self._deadline - time.monotonic() - overhead
        return float(min(self.settings.max_time_s, max(left, FINAL_MIN_TIME_S)))

    def _best_ms(self) -> float:
        return float(self._latency(self.best_alone)[self.metric])

    def _pre_skip_reason(self, spec: StageSpec, stop_reason: str, odds: order.Odds | None = None) -> str:
        reason = judge.pre_skip_reason(
            spec,
            self.request,
            self.recipe,
            stop_reason=stop_reason,
            best_latency_ms=self._best_ms(),
            time_left_s=self._time_left(),
        )
        if reason or not spec.enabled:
            return reason
        # A stage with no record has a placeholder cost, not a measured one.
        return self._too_little_time(odds.cost_s if odds is not None and odds.tried > 0 else 0.0)

    def _load_stage(self, name: str) -> Stage | StageSkipped:
        """The stage registered as `name`, loaded once (or why it cannot load)."""
        if name not in self._loaded:
            try:
                self._loaded[name] = self.stage_factory(name)
            except StageSkipped as exc:
                self._loaded[name] = exc
        return self._loaded[name]

    @staticmethod
    def _stage_weight(spec: StageSpec) -> float:
        return float(spec.budget_s) if spec.budget_s else judge.DEFAULT_STAGE_WEIGHT_S

    def _runnable_after(self, spec: StageSpec) -> list[StageSpec]:
        """The stages after `spec` that are on and can load: those a --time-budget is shared with
        (a runtime that is not installed reserves nothing)."""
        later = [s for s, _ in self._remaining if s.name != spec.name]
        return [s for s in later if s.enabled and not isinstance(self._load_stage(s.name), StageSkipped)]

    def _not_worth_reason(self, spec: StageSpec, odds: order.Odds, best: float) -> str:
        """Under the default time budget and the gain order, a stage not worth its time."""
        if not (self.request.default_budget and self.request.search_order == "gain" and spec.enabled):
            return ""
        return order.not_worth_reason(odds, best)

    def _open_stage(
        self, spec: StageSpec, evaluator: Evaluator, baseline: Baseline, workdir: Path
    ) -> tuple[Stage, StageContext] | StageRecord:
        """The stage and its context, or the record of why it does not run."""
        record = self.record
        record.status(f"{spec.name}: loading")
        loaded = self._load_stage(spec.name)
        if isinstance(loaded, StageSkipped):
            return StageRecord(spec.name, spec.name, Status.SKIPPED, str(loaded) or "not available")
        stage = loaded
        stage_dir = workdir / spec.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        now = time.monotonic()
        deadline = now + spec.budget_s if spec.budget_s else None
        left = self._time_left()
        if left is not None:
            later = [self._stage_weight(s) for s in self._runnable_after(spec)]
            share = judge.stage_time_share(self._stage_weight(spec), later, left)
            deadline = min(deadline, now + share) if deadline is not None else now + share
            record.log(
                f"{spec.name}: {share:.0f} s of the {left:.0f} s left in the --time-budget "
                "(its share by the recipe's stage budgets)"
            )

        def note_point(label: str, status: str, reason: str, details: dict[str, Any]) -> None:
            record.add(StageRecord(spec.name, label, Status(status), reason, details=details))

        ctx = StageContext(
            workdir=stage_dir,
            original_model=Path(self.request.model_path).absolute(),
            feeds=baseline.feeds,
            options=dict(spec.options),
            best_standard=evaluator.best.standard,
            best_latency_ms=self._best_ms(),
            target_ms=self.request.target_ms,
            deadline=deadline,
            check_accuracy=evaluator.check_accuracy,
            log=lambda text: record.log(_named(spec.name, text)),
            status=lambda text: record.status(_named(spec.name, text)),
            note_point_fn=note_point,
            warn_fn=lambda text: record.warn(_named(spec.name, text)),
        )
        try:
            reason = stage.skip_reason(evaluator.best.of_runtime(stage_runtime(spec.name)), ctx)
        except Exception as exc:
            return self._stage_failure(spec, exc)
        if reason:
            return StageRecord(spec.name, spec.name, Status.SKIPPED, reason)
        return stage, ctx

    def _stage_items(
        self, spec: StageSpec, stage: Stage, best: Candidate, ctx: StageContext
    ) -> Generator[Candidate | StageRecord, None, None]:
        """The stage's candidates as it yields them, each step run in its scratch directory; an
        exception ends the stage as one record and keeps what was already yielded."""
        workdir = ctx.workdir
        self.record.status(f"{spec.name}: running")
        produced: Iterator[Candidate] | None = None
        try:
            # Some libraries write side files into the current directory (onnxruntime.quantization
            # names external data "<uuid>.data" there): keep them in the stage's scratch space.
            with _working_directory(workdir):
                if stage.isolated:
                    produced = iter(run_in_child(stage, best, ctx))
                else:
                    produced = iter(stage.run(best, ctx))
            while True:
                with _working_directory(workdir):
                    cand = next(produced, None)
                # A stage's native libraries may leave the signal stack unmapped (interrupts.py).
                interrupts.ensure_signal_stack()
                if cand is None:
                    return
                # A path relative to the stage's directory stays valid outside it.
                cand.model_path = workdir / cand.model_path
                cand.extra_files = [workdir / Path(f) for f in cand.extra_files]
                yield cand
        except StageSkipped as exc:
            yield StageRecord(spec.name, spec.name, Status.SKIPPED, str(exc) or "does not apply")
        except (KeyboardInterrupt, SystemExit, MetricError):
            raise
        except MemoryError:
            yield StageRecord(spec.name, spec.name, Status.FAILED, "ran out of memory")
        except Exception as exc:
            yield self._stage_failure(spec, exc)
        finally:
            close = getattr(produced, "close", None)
            if close is not None:
                with _working_directory(workdir):
                    close()

    def _stage_failure(self, spec: StageSpec, exc: BaseException) -> StageRecord:
        """A model a stage cannot handle, or a library that fails on it, must not end the run:
        record it and go on. A programming error raised in lto's own code is raised: recorded as
        a "failed" row, a bug would pass for a limit of the model (the partial report says where
        the run stopped)."""
        if isinstance(exc, (KeyboardInterrupt, SystemExit, MetricError)) or _own_programming_error(exc):
            raise exc
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        where = getattr(exc, "where", None) or where  # an isolated stage says where it raised
        details = {"exception": type(exc).__name__, "where": where, "error_text": full_text(exc)}
        return StageRecord(spec.name, spec.name, Status.FAILED, first_line(exc), details=details)

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, evaluator: Evaluator, baseline: Baseline, base_meas: Measurement) -> PipelineResult:
        record = self.record
        state = evaluator.best
        original = evaluator.original
        best, best_accuracy, kept_chain = state.candidate, state.accuracy, state.kept_chain
        final: dict[str, Any] | None = None
        speedup, speedup_ci = 1.0, (1.0, 1.0)
        value: float | None = None
        lo_v = hi_v = 0.0
        if best is not original:
            record.status(f"final: {best.label} against the baseline, fresh processes")
            comparison = evaluator.measure_artifact(best, max_time_s=self._final_time_s())
            final = comparison.to_json()
            lo, hi = comparison.ratio_ci95
            speedup, speedup_ci = 1.0 / comparison.ratio, (1.0 / hi, 1.0 / lo)
            base_ms, art_ms = comparison.side_ms
            # One figure for the artifact: its row, the baseline's row, the headline and the target
            # verdict all read this measurement.
            row = next(
                r for r in reversed(record.records) if r.label == best.label and r.status == Status.KEPT
            )
            row.reason = (
                f"{speedup:.2f}x (95% CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}) in the final comparison; "
                f"kept in the search: {row.reason}"
            )
            row.speedup, row.speedup_ci95 = speedup, speedup_ci
            row.latency_ms = self._latency(comparison.b, art_ms)
            row.baseline_ms = base_ms
            row.modes = judge.modes_of(comparison, f"{BASELINE_RUNTIME.title} defaults", best.label)
            row.details["final"] = final
            base_row = record.records[0]
            base_row.latency_ms = self._latency(comparison.a, base_ms)
            base_row.baseline_ms = base_ms
            base_row.reason = (
                f"original model, {BASELINE_RUNTIME.title} default settings; measured beside the artifact "
                "in its final comparison"
            )
            record.results += [
                {**comparison.a.to_json(), "label": "baseline (final comparison)"},
                {**comparison.b.to_json(), "label": f"{best.label} (final comparison)"},
            ]
            value, (lo_v, hi_v) = art_ms, self._side_interval(comparison, "b")
            record.log(final_line(best.label, self.metric, comparison, speedup, speedup_ci, row.modes))
            if judge.original_wins_final(comparison):
                record.warnings.append(
                    f"{best.label} measured slower than the baseline side by side "
                    f"(speedup {speedup:.2f}x, CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f}); "
                    "the artifact is the original model"
                )
                self._revert(best.label, speedup, speedup_ci)
                best, kept_chain = original, []
                speedup, speedup_ci = 1.0, (1.0, 1.0)
                # the original ships: its figure is the baseline's in the same measurement
                value, (lo_v, hi_v) = base_ms, self._side_interval(comparison, "a")

        if value is None:  # the original was the best all along: the baseline measured alone
            value, lo_v, hi_v = percentile_ci(base_meas.samples_ms, self.metric)
        verdict, exit_code, met = judge.target_verdict(value, self.request.target_ms, self.metric)
        unverified = judge.unverified_faster(record.records, speedup)
        verdict, exit_code = judge.final_exit(
            exit_code, verdict, unverified, target_ms=self.request.target_ms,
            baseline_ms=(record.records[0].latency_ms or {}).get(self.metric),
            fail_on_unverified=self.request.fail_on_unverified,
        )  # fmt: skip
        best_numerics = (
            "exact"
            if best is original
            else next(
                (r.numerics for r in reversed(record.records) if r.label == best.label and r.numerics),
                numerics(best.precision, False, False),
            )
        )
        if best is original:
            best_accuracy = evaluator.reference_accuracy()
        # The thresholds and metrics go with the figures into the report and the manifest.
        accuracy = {
            **accuracy_json(best_accuracy),
            "thresholds": self.recipe.accuracy.to_json(),
            "metrics": {name: choice.to_json() for name, choice in baseline.choices.items()},
            "sample_source": baseline.rows.source,
            "rows": baseline.rows.purposes,
            "evidence": baseline.evidence.to_json(),
        }
        figures = FinalFigures(
            best=best,
            accuracy=accuracy,
            kept_chain=kept_chain,
            speedup=speedup,
            speedup_ci=speedup_ci,
            final_comparison=final,
            best_ms=value,
            best_ms_ci=(lo_v, hi_v),
            verdict=verdict,
            exit_code=exit_code,
            met=met,
            numerics=best_numerics,
            unverified=self._unverified_section(baseline, unverified),
            time_to_best_s=record.best_at[best.label],
            efficiency=self._efficiency(baseline, value, best.precision),
        )
        report = optimize_report(record, figures)
        section = report["optimize"]
        record.status(f"writing the artifact to {record.out_dir}")
        write_artifact(
            record.out_dir,
            candidate=best,
            input_spec=baseline.input_spec.to_json(),
            outputs=baseline.outputs_spec,
            history=[r.to_json() for r in record.records],
            accuracy=section["accuracy"],
            chain_details=kept_chain,
            report=report,
            report_md=render_markdown(report),
            extra={
                "source_model": report["model"],
                "target": section["target"],
                "speedup": speedup,
                "speedup_ci95": list(speedup_ci),
                "recipe": self.recipe.name,
                "numerics": best_numerics,
                "lifted": section["best"]["lifted"],
            },
            report_writer=write_report,
            force=self.request.force,
        )
        partial_report_path(record.out_dir).unlink(missing_ok=True)
        order.append_history(self.history, self.fingerprint, self._stage_runs(best, original, speedup))
        return PipelineResult(report, record.records, best, exit_code, record.out_dir, verdict)

    def _efficiency(self, baseline: Baseline, latency_ms: float, precision: str) -> dict[str, Any] | None:
        """The artifact's G ops/s against the machine's measured rate; None where either is unknown
        (rates off, dynamic dims): a figure for the report, never a reason for a run to fail."""
        if self.peaks is None or baseline.external_data:
            return None
        shapes = {name: tuple(array.shape) for name, array in baseline.feeds.items()}
        try:
            flops = model_flops(baseline.model_path, shapes)
        except Exception:  # an uncountable graph costs the report one line, nothing more
            return None
        return peaks.efficiency(flops, latency_ms, precision, self.peaks) if flops else None

    def _stage_runs(self, best: Candidate, original: Candidate, speedup: float) -> list[order.StageRun]:
        """What each stage that measured or failed did in this run, for the history: whether it
        won, and every candidate it measured with its speedup and verdict."""
        record = self.record
        winner = next(
            (r.stage for r in reversed(record.records) if r.label == best.label and r.status == "kept"), None
        )
        ran = {r.stage for r in record.records if r.status not in (Status.SKIPPED, Status.BASELINE)}
        shipped = speedup if best is not original else 1.0
        runs = []
        for name, seconds in record.stage_seconds.items():
            if name not in ran:
                continue
            rows = [r for r in record.records if r.stage == name and r.status != Status.SKIPPED]
            measured = tuple((r.label, r.speedup, r.outcome().value) for r in rows)
            unverified = [r.speedup for r in rows if r.status == Status.UNVERIFIED and r.speedup]
            fastest = max(unverified, default=None)
            runs.append(
                order.StageRun(
                    kind=record.model_kind,
                    cpu=self.cpu,
                    stage=name,
                    ran_s=seconds,
                    won=best is not original and name == winner,
                    gain=speedup if best is not original and name == winner else None,
                    measured=measured,
                    unverified_gain=fastest if fastest is not None and fastest > shipped else None,
                )
            )
        return runs

    def _unverified_section(
        self, baseline: Baseline, candidates: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The faster candidates left out, what data would verify them, and the command."""
        if not candidates:
            return None
        return {
            "candidates": candidates,
            "why": baseline.evidence.why_not(),
            "needs": baseline.evidence.needs(),
            "command": self.request.verify_command(),
        }

    def _revert(self, best_label: str, speedup: float, speedup_ci: tuple[float, float]) -> None:
        """The final comparison sent the original back: every kept row says so, in the table and
        as a streamed line, and so does every skip that was decided on a reverted candidate."""
        why = (
            f"reverted: side by side with the original, {best_label} measured "
            f"{speedup:.2f}x (CI {speedup_ci[0]:.2f}–{speedup_ci[1]:.2f})"
        )
        records = self.record.records
        kept = {r.label for r in records if r.status == Status.KEPT}
        for row in records:
            if row.status == Status.KEPT:
                row.status = Status.REVERTED
                row.reason = f"{why}; it had been kept: {row.reason}"
                self.record.progress.record(row)
            elif row.status == Status.SKIPPED and row.details.get("decided_on") in kept:
                row.reason += f" (decided on {row.details['decided_on']}, which was reverted)"


def optimize(
    request: OptimizeRequest,
    *,
    progress: Progress | None = None,
    stage_factory: StageFactory | None = None,
    measure_fn: MeasureFn | None = None,
    compare_fn: CompareFn | None = None,
    open_worker_fn: WorkerFn | None = None,
    known_stages: Sequence[str] | None = None,
) -> PipelineResult:
    """Run `lto optimize` for `request`: choose the recipe, run the pipeline, write the artifact."""
    request.validate()
    recipe, kind = choose_recipe(request, known_stages=known_stages)
    notes = apply_overrides(recipe, request)
    pipeline = Pipeline(
        request,
        recipe,
        model_kind=kind,
        stage_factory=stage_factory,
        measure_fn=measure_fn,
        compare_fn=compare_fn,
        open_worker_fn=open_worker_fn,
        progress=progress,
        recipe_notes=notes,
    )
    return pipeline.run()


__all__ = ["Pipeline", "StageFactory", "optimize"]
