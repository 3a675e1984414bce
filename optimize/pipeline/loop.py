"""The run of `lto optimize`: baseline, stages in recipe order, every candidate checked and
measured against the best so far and the baseline, then the artifact.

Roles, each in its own file: `baseline` prepares what every candidate is judged against;
`evaluate` loads, checks and times (through the bench engine only), owns every process it starts
and holds the best so far; `stage_run` opens and runs one stage; `budget` keeps the --time-budget;
`judge` decides; the loop runs the stages in `order` and writes what happens into the run's
`record`; `final` measures the artifact once more and writes it; `summary` builds the report.
A stage only proposes candidates (STYLE.md).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from optimize.bench import BenchSettings, Measurement, peaks
from optimize.model.onnx_file import file_has_external_data
from optimize.pipeline import judge, order
from optimize.pipeline.baseline import Baseline, prepare_baseline, prepare_inputs
from optimize.pipeline.budget import TimeBudget
from optimize.pipeline.evaluate import BestSoFar, CompareFn, Evaluator, MeasureFn, WorkerFn, open_candidate
from optimize.pipeline.final import FinalStep
from optimize.pipeline.record import Progress, RunRecord, StageRecord, latency_figures
from optimize.pipeline.request import OptimizeRequest, apply_overrides, choose_recipe, default_out_dir
from optimize.pipeline.stage_run import StageFactory, StageOpener, StageRun
from optimize.pipeline.summary import PipelineResult, write_partial_report
from optimize.recipes import Recipe, StageSpec
from optimize.runtimes.registry import BASELINE_BACKEND, BASELINE_RUNTIME
from optimize.runtimes.stages import load_stage
from optimize.stage import Candidate, Outcome, Status
from optimize.system import interrupts
from optimize.system.env import cpu_isa_flags, machine_fingerprint

# The reason the baseline's row gives until the final comparison measures it beside the artifact.
BASELINE_ALONE_REASON = (
    f"original model, {BASELINE_RUNTIME.title} default settings; measured alone at the start, "
    "for the search's target decisions (every speedup is measured side by side)"
)


def _missing_folders(path: Path) -> list[Path]:
    """The folders of `path` that do not exist yet, deepest first (mkdir would create them)."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    return missing


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
        deadline = self.record.started + request.time_budget_s if request.time_budget_s else None
        self.budget = TimeBudget(deadline)
        self.record.deadline = deadline
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
        # Absolute: stages run inside their scratch directory (stage_run.py).
        original = Candidate(label="baseline", model_path=model_path.absolute(), runtime_config={})
        record.status(f"baseline: loading the original model on {BASELINE_RUNTIME.title} defaults")
        t0 = time.monotonic()
        with open_candidate(original) as backend:
            baseline = prepare_baseline(record, original.model_path, prepared, backend)
        evaluator = Evaluator(
            record, baseline, self.settings, measure_fn=self.measure_fn, compare_fn=self.compare_fn,
            open_worker_fn=self.open_worker_fn,
        )  # fmt: skip
        self.budget.estimates = evaluator
        evaluator.time_left = self.budget.time_left
        record.log(order.plan_line(self.plan, self.record.model_kind, self.cpu))
        with evaluator:
            base_meas = evaluator.start_baseline()
            record.results.append({**base_meas.to_json(), "label": "baseline (alone, at the start)"})
            record.became_best("baseline")
            row = self._baseline_row(base_meas, elapsed_s=time.monotonic() - t0)
            record.add(row)
            # The search's target decisions (skipping a stage, stopping a search, --stop-at-target)
            # read the best candidate measured alone, as the user's process runs it; the final
            # verdict reads the artifact's figure in its final comparison (what the table shows).
            evaluator.best.begin(row, base_meas)
            self._stages(evaluator, StageOpener(record, self.stage_factory, self.budget, workdir))
        # The search's workers are closed: the final comparison starts fresh processes of its own.
        return self._finish(evaluator, baseline, base_meas)

    def _baseline_row(self, base_meas: Measurement, elapsed_s: float) -> StageRecord:
        latency = latency_figures(base_meas, self.metric)
        return StageRecord(
            stage="baseline",
            label="baseline",
            status=Status.BASELINE,
            reason=BASELINE_ALONE_REASON,
            latency_ms=latency,
            speedup=1.0,
            baseline_ms=latency[self.metric],
            metric=self.metric,
            accuracy={"ok": True, "reason": "reference", "per_output": {}, "worst": {}},
            backend=BASELINE_BACKEND,
            runtime_config={},
            precision="fp32",
            elapsed_s=elapsed_s,
        )

    def _stages(self, evaluator: Evaluator, opener: StageOpener) -> None:
        """Every stage of the recipe in order, then the runoff among close runners-up."""
        record, best = self.record, evaluator.best
        runners_up: list[tuple[StageSpec, Candidate, StageRecord]] = []
        stop_reason = ""
        if self._stop_at_target(best):
            stop_reason = "the baseline already meets the target (--stop-at-target)"
        self._remaining = list(self.plan)
        while self._remaining:
            if self.request.search_order == "gain":  # the best changed: so may the order
                self._remaining = order.rank(self._remaining, best.speedup)
            (spec, odds), self._remaining = self._remaining[0], self._remaining[1:]
            t_stage = time.monotonic()
            reason = self._pre_skip_reason(spec, stop_reason, best, odds) or self._not_worth_reason(
                spec, odds, best.speedup
            )
            if reason:
                # Which candidate a target-based skip was decided on (the final comparison may revert it).
                basis = {"decided_on": best.candidate.label}
                record.add(StageRecord(spec.name, spec.name, Status.SKIPPED, reason, details=basis))
                continue
            opened = opener.open(spec, [s for s, _ in self._remaining], evaluator)
            if isinstance(opened, StageRecord):
                opened.elapsed_s = time.monotonic() - t_stage
                record.add(opened)
                continue
            runners_up += self._run_stage(evaluator, opened, t_stage)
            if not stop_reason and self._stop_at_target(best):
                stop_reason = f"target met with 95% confidence after {spec.name} (--stop-at-target)"
        if not stop_reason:
            self._runoff(evaluator, runners_up)

    def _run_stage(
        self, evaluator: Evaluator, run: StageRun, t_stage: float
    ) -> list[tuple[StageSpec, Candidate, StageRecord]]:
        """Evaluate the stage's candidates as it yields them, until it ends, its share of the
        budget is spent or the target it runs for is met. Returns the accurate candidates it lost
        with (the runoff's runners-up)."""
        record, spec, ctx = self.record, run.spec, run.ctx
        runners_up: list[tuple[StageSpec, Candidate, StageRecord]] = []
        produced = 0
        candidates = run.candidates()
        try:
            for cand in candidates:
                produced += 1
                why = self.budget.unmeasured_reason(ctx.deadline, produced)
                if why:
                    record.add(StageRecord(spec.name, cand.label, Status.SKIPPED, why, details=cand.details))
                    break
                row = self._evaluate_and_adopt(evaluator, spec, cand, t_stage)
                ctx.outcomes[cand.label] = row.outcome()
                if row.status == Status.KEPT:
                    ctx.best_latency_ms = evaluator.best.alone_ms(self.metric)
                elif row.outcome() == Outcome.SLOWER:
                    runners_up.append((spec, cand, row))
                best_ms = evaluator.best.alone_ms(self.metric)
                if judge.search_done(spec, self.request.target_ms, best_ms):
                    record.log(
                        f"{spec.name}: the best {self.metric} ({best_ms:.3f} ms, measured "
                        f"alone) meets the {self.request.target_ms:g} ms target; the stage stops here"
                    )
                    break
        finally:
            candidates.close()  # a generator stage stops here, its cleanup runs
            if run.ended is not None:  # a failure, or a skip raised once it ran
                run.ended.elapsed_s = time.monotonic() - t_stage
                record.add(run.ended)
            record.stage_seconds[spec.name] = time.monotonic() - t_stage
        if produced == 0 and not any(r.stage == spec.name for r in record.records):
            record.add(StageRecord(spec.name, spec.name, Status.SKIPPED, "the stage produced no candidate"))
        return runners_up

    def _evaluate_and_adopt(
        self, evaluator: Evaluator, spec: StageSpec, cand: Candidate, t_stage: float
    ) -> StageRecord:
        """Check and time `cand` against the best so far; a kept one becomes the best."""
        row, worker, accuracy = evaluator.evaluate(spec.name, cand)
        interrupts.ensure_signal_stack()  # the candidate ran here to be checked (interrupts.py)
        row.elapsed_s = time.monotonic() - t_stage
        self.record.add(row)
        if worker is not None and row.speedup is not None:  # kept: the worker is now the best's
            evaluator.adopt(cand, worker, row, accuracy)
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
            if self.budget.used_up() or self.budget.too_little_time():
                break
            self.record.log(f"runoff: {cand.label} against {best.candidate.label}, side by side")
            self._evaluate_and_adopt(evaluator, by_label[cand.label], cand, time.monotonic())

    # -- the rules that skip a stage or stop the search ------------------------------------------

    def _stop_at_target(self, best: BestSoFar) -> bool:
        """--stop-at-target: whether the best, measured alone, meets the target with confidence."""
        if not self.request.stop_at_target or best.alone is None:
            return False
        return judge.target_met(best.alone.samples_ms, self.metric, self.request.target_ms, confident=True)

    def _pre_skip_reason(
        self, spec: StageSpec, stop_reason: str, best: BestSoFar, odds: order.Odds | None = None
    ) -> str:
        reason = judge.pre_skip_reason(
            spec,
            self.request,
            self.recipe,
            stop_reason=stop_reason,
            best_latency_ms=best.alone_ms(self.metric),
            time_left_s=self.budget.time_left(),
        )
        if reason or not spec.enabled:
            return reason
        # A stage with no record has a placeholder cost, not a measured one.
        return self.budget.too_little_time(odds.cost_s if odds is not None and odds.tried > 0 else 0.0)

    def _not_worth_reason(self, spec: StageSpec, odds: order.Odds, best: float) -> str:
        """Under the default time budget and the gain order, a stage not worth its time."""
        if not (self.request.default_budget and self.request.search_order == "gain" and spec.enabled):
            return ""
        return order.not_worth_reason(odds, best)

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, evaluator: Evaluator, baseline: Baseline, base_meas: Measurement) -> PipelineResult:
        final = FinalStep(self.record, evaluator, baseline, self.peaks)
        headline = final.headline(base_meas, self.budget.final_time_s(self.settings.max_time_s))
        result = final.write(final.figures(headline), self.recipe.name)
        shipped = headline.best is not evaluator.original
        winner = evaluator.best.row.stage if shipped and evaluator.best.row is not None else None
        runs = order.stage_runs(self.record, self.cpu, winner, headline.speedup if shipped else 1.0)
        order.append_history(self.history, self.fingerprint, runs)
        return result


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
