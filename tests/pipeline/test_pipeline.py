"""The pipeline's decisions: kept, rejected (slower / inaccurate), skipped, failed; verdicts and exit codes.

Stages here are tiny fakes handed to the pipeline through its stage factory. Most tests also hand
it a fake comparison function (the measuring seam): synthetic latency samples per candidate label,
so decisions are deterministic and no test depends on timing. One test uses the real benchmark
engine on a candidate that does hundreds of times the work, and asserts only the decision.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from optimize.artifact import load_artifact
from optimize.bench import Comparison, Measurement
from optimize.bench.apart import ApartRun
from optimize.errors import UsageError
from optimize.pipeline import (
    EXIT_TARGET_MET,
    EXIT_TARGET_MISSED,
    OptimizeRequest,
    PipelineResult,
    optimize,
    parse_duration,
    partial_report_path,
)
from optimize.pipeline.record import Progress
from optimize.report import load_report
from optimize.runtimes import registry
from optimize.runtimes.spec import RuntimeSpec, StageInfo
from optimize.runtimes.stages import load_stage
from optimize.stage import LIFT_REFERENCE_KEY, Candidate, Stage, StageContext, StageSkipped
from tests.cli_helpers import run_lto
from tests.conftest import make_matmul_model

# --- fakes -------------------------------------------------------------------------------------

Make = Callable[[Candidate, StageContext], list[Candidate]]


class FakeStage(Stage):
    name = "fake"

    def __init__(self, make: Make | None = None, skip: str | None = None) -> None:
        self.make = make
        self.skip = skip
        self.calls = 0

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        return self.skip

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        self.calls += 1
        assert self.make is not None
        return self.make(candidate, ctx)


def model_candidate(label: str, **model_kw: Any) -> Make:
    """A stage whose candidate is the tiny model rebuilt with `model_kw` (same outputs unless seeded)."""

    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        path = make_matmul_model(ctx.workdir / f"{label}.onnx", **model_kw)
        return [Candidate(label=label, model_path=path, runtime_config={"intra_op_num_threads": 1})]

    return make


def raising(exc: BaseException) -> Make:
    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        raise exc

    return make


def renamed_input(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
    model = onnx.load(str(candidate.model_path))
    old = model.graph.input[0].name
    model.graph.input[0].name = "z"
    for node in model.graph.node:
        node.input[:] = ["z" if i == old else i for i in node.input]
    path = ctx.workdir / "renamed.onnx"
    onnx.save(model, str(path))
    return [Candidate(label="fake-inputs", model_path=path)]


def unloadable(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
    path = ctx.workdir / "broken.onnx"
    path.write_bytes(b"\x08\x07 this is not a model")
    return [Candidate(label="fake-broken", model_path=path)]


class FakeWorker:
    """What the pipeline times a candidate in: here, nothing but a label."""

    def __init__(self, candidate: Candidate) -> None:
        self.label = candidate.label
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeBench:
    """The measuring seam: latency samples drawn around a per-label centre (ms)."""

    ROUNDS, BLOCK = 8, 30

    def __init__(
        self,
        speeds: dict[str, float],
        noise: float = 0.02,
        script: list[float | dict[str, float]] | None = None,
    ) -> None:
        self.speeds = speeds
        self.noise = noise
        # For the n-th comparison: the candidate's centre (a float), or centres by label.
        self.script = script
        self.compared: list[tuple[str, ...]] = []
        self.workers: list[FakeWorker] = []

    def samples(self, label: str, seed: int, centre: float | None = None, n: int = 300) -> list[float]:
        rng = np.random.default_rng(seed)
        centre = self.speeds[label] if centre is None else centre
        return list(centre * (1.0 + self.noise * rng.standard_normal(n)))

    def _measurement(self, label: str, seed: int, centre: float | None = None) -> Measurement:
        return Measurement(label, "onnxruntime", 1, self.samples(label, seed, centre), 0, 0.1, "runs", 0.0)

    def open_worker(self, candidate: Candidate) -> FakeWorker:
        self.workers.append(FakeWorker(candidate))
        return self.workers[-1]

    def measure(self, backend: Any, feeds: Any, settings: Any, label: str, **kw: Any) -> Measurement:
        return self._measurement(label, 0)

    def compare(
        self,
        sides: list[Any],
        feeds: Any,
        settings: Any,
        labels: list[str],
        metric: str = "p50",
        *a: Any,
        **kw: Any,
    ) -> ApartRun:
        self.compared.append(tuple(labels))
        n = len(self.compared)
        step = self.script[n - 1] if self.script and n <= len(self.script) else None
        centres = dict(step) if isinstance(step, dict) else ({labels[-1]: step} if step is not None else {})
        samples = [
            self.samples(label, 1000 * i + n, centres.get(label), self.ROUNDS * self.BLOCK)
            for i, label in enumerate(labels)
        ]
        k = len(labels)

        def run_of(rounds: int, stopped_by: str) -> ApartRun:
            return ApartRun(
                list(labels), ["onnxruntime"] * k, [1] * k, [self.BLOCK] * k,
                [list(side[: rounds * self.BLOCK]) for side in samples], rounds, 0.1, stopped_by, 0,
                metric, [[0.0] * rounds for _ in labels],
            )  # fmt: skip

        give_up = kw.get("give_up")
        early = run_of(4, "given up")  # compare_apart's first look: 4 rounds
        if give_up is not None and give_up(early):
            return early
        return run_of(self.ROUNDS, "runs")


class RecordingProgress(Progress):
    """The streamed lines a display would print, in order."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def record(self, record: Any) -> None:
        self.records.append(copy.copy(record))


def write_recipe(tmp_path: Path, order: list[str], extra: str = "") -> Path:
    path = tmp_path / "test-recipe.toml"
    path.write_text(
        f"order = {json.dumps(order)}\n{extra}\n[accuracy]\nsamples = 4\n"
        "[bench]\nwarmup = 2\nmin_runs = 10\nmax_runs = 300\nmax_time_s = 1.0\n",
        encoding="utf-8",
    )
    return path


def run_fake(
    tmp_path: Path,
    stages: dict[str, Stage],
    speeds: dict[str, float],
    extra_recipe: str = "",
    bench: FakeBench | None = None,
    progress: Progress | None = None,
    model: Path | None = None,
    **request_kw: Any,
) -> tuple[PipelineResult, FakeBench]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    model = model or make_matmul_model(tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, list(stages), extra_recipe)
    bench = bench or FakeBench({"baseline": 1.0, **speeds})

    def factory(name: str) -> Stage:
        stage = stages[name]
        if isinstance(stage, StageSkipped):
            raise stage
        return stage

    request = OptimizeRequest(model_path=model, recipe=str(recipe), out_dir=tmp_path / "out", **request_kw)
    result = optimize(request, stage_factory=factory, measure_fn=bench.measure, compare_fn=bench.compare,
                      open_worker_fn=bench.open_worker, known_stages=list(stages),
                      progress=progress)  # fmt: skip
    return result, bench


def by_label(result: PipelineResult) -> dict[str, Any]:
    return {r.label: r for r in result.records}


# --- decisions ---------------------------------------------------------------------------------


def test_a_mixed_candidates_unlifted_twin_is_timed_though_inaccurate_and_never_kept(tmp_path: Path) -> None:
    """The price of a lift: the stage yields the mixed candidate, then the same model with nothing
    lifted (here: inaccurate, and faster); the pipeline times it beside the best and rejects it."""

    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        mixed = model_candidate("q-mixed", extra_work=2)(candidate, ctx)[0]
        plain = model_candidate("q-plain", seed=7)(candidate, ctx)[0]
        plain.details[LIFT_REFERENCE_KEY] = "q-mixed"
        other = model_candidate("q-other", seed=8)(candidate, ctx)[0]  # inaccurate, not a twin
        return [mixed, plain, other]

    speeds = {"q-mixed": 0.5, "q-plain": 0.4, "q-other": 0.3}
    result, bench = run_fake(tmp_path, {"q": FakeStage(make)}, speeds)
    rows = by_label(result)
    assert rows["q-mixed"].status == "kept" and result.best.label == "q-mixed"
    plain = rows["q-plain"]
    assert plain.status == "rejected" and plain.inaccurate
    assert plain.reason.startswith("inaccurate: output 'y'") and "timed to price the lift: " in plain.reason
    assert plain.speedup == pytest.approx(2.5, rel=0.05) and plain.versus["label"] == "q-mixed"
    assert plain.ratio == pytest.approx(0.8, rel=0.05)  # beside the mixed one, in one measurement
    assert ("baseline", "q-mixed", "q-plain") in bench.compared
    assert rows["q-other"].speedup is None and not any("q-other" in c for c in bench.compared)


def test_every_kind_of_stage_decision(tmp_path: Path) -> None:
    stages: dict[str, Any] = {
        "fake-fast": FakeStage(model_candidate("fake-fast", extra_work=2)),
        "fake-slow": FakeStage(model_candidate("fake-slow", extra_work=3)),
        "fake-inaccurate": FakeStage(model_candidate("fake-inaccurate", seed=7)),
        "fake-not-applicable": FakeStage(skip="no attention in this graph"),
        "fake-declines": FakeStage(raising(StageSkipped("unsupported op Loop"))),
        "fake-raises": FakeStage(raising(RuntimeError("boom in the stage"))),
        "fake-missing": StageSkipped("needs the Python package 'tvm', which is not installed"),
        "fake-empty": FakeStage(lambda c, ctx: []),
        "fake-inputs": FakeStage(renamed_input),
        "fake-broken": FakeStage(unloadable),
    }
    result, bench = run_fake(tmp_path, stages, {"fake-fast": 0.5, "fake-slow": 0.9}, target_ms=10.0)
    rows = by_label(result)
    assert rows["baseline"].status == "baseline"
    assert rows["fake-fast"].status == "kept"
    assert rows["fake-fast"].speedup == pytest.approx(2.0, rel=0.05)
    assert rows["fake-slow"].status == "rejected"
    assert rows["fake-slow"].reason.startswith("slower than fake-fast")
    assert rows["fake-slow"].ratio > 1 and rows["fake-slow"].ratio_ci95[0] > 1
    assert rows["fake-inaccurate"].status == "rejected"
    assert rows["fake-inaccurate"].reason.startswith("inaccurate: output 'y'")
    assert rows["fake-not-applicable"].status == "skipped"
    assert rows["fake-not-applicable"].reason == "no attention in this graph"
    assert rows["fake-declines"].status == "skipped" and rows["fake-declines"].reason == "unsupported op Loop"
    assert rows["fake-raises"].status == "failed"
    assert "RuntimeError: boom in the stage" in rows["fake-raises"].reason
    assert rows["fake-missing"].status == "skipped" and "'tvm'" in rows["fake-missing"].reason
    assert rows["fake-empty"].status == "skipped" and "no candidate" in rows["fake-empty"].reason
    assert (
        rows["fake-inputs"].status == "rejected"
        and "changed the model's inputs" in rows["fake-inputs"].reason
    )
    assert rows["fake-broken"].status == "failed" and "does not load" in rows["fake-broken"].reason
    # Only accurate, loadable candidates are benchmarked; a win is confirmed on fresh processes;
    # once a best is kept, a candidate is timed beside it and the baseline in one run.
    # The artifact is measured once more at the end, in 3 fresh pairs of processes.
    assert bench.compared == [
        ("baseline", "fake-fast"),
        ("baseline", "fake-fast"),
        ("baseline", "fake-fast", "fake-slow"),
        *[("baseline", "fake-fast")] * 3,
    ]
    assert "confirmed on fresh processes" in rows["fake-fast"].reason
    # Every speedup is measured against the baseline in its own run, with its CI: never chained.
    slow = rows["fake-slow"]
    assert slow.speedup == pytest.approx(1 / 0.9, rel=0.05)
    assert slow.speedup_ci95[0] < slow.speedup < slow.speedup_ci95[1]
    assert slow.details["comparison_with_baseline"]["labels"] == ["baseline", "fake-slow"]
    # No worker is left open; each candidate had its own.
    assert all(w.closed for w in bench.workers)
    assert {w.label for w in bench.workers} >= {"baseline", "fake-fast", "fake-slow"}

    assert result.best.label == "fake-fast"
    assert result.exit_code == EXIT_TARGET_MET
    art = load_artifact(result.artifact_dir)
    assert art.runtime_config == {"intra_op_num_threads": 1}
    assert len(onnx.load(str(art.model_path)).graph.node) == len(
        onnx.load(str(make_matmul_model(tmp_path / "ref.onnx", extra_work=2))).graph.node
    )
    report = load_report(result.artifact_dir / "report.json")  # validates against the schema
    section = report["optimize"]
    # The headline is the figure the artifact's own row carries: one figure per candidate.
    assert section["speedup"] == rows["fake-fast"].speedup == pytest.approx(2.0, rel=0.05)
    assert section["speedup_ci95"] == list(rows["fake-fast"].speedup_ci95)
    assert section["final_comparison"] == rows["fake-fast"].details["final"]
    assert section["final_comparison"]["isolation"]["process_sets"] == 3
    assert section["final_comparison"]["chunks"] == 3 * FakeBench.ROUNDS
    assert section["best"]["kept_stages"] == ["fake-fast"]
    assert [s["status"] for s in section["stages"]] == [r.status for r in result.records]
    md = (result.artifact_dir / "report.md").read_text()
    for label in rows:
        assert f"| {label} |" in md
    assert not partial_report_path(result.artifact_dir).exists()
    assert not list(tmp_path.glob(".lto-work-*"))  # scratch space cleaned up


def test_gain_below_the_minimum_improvement_is_rejected(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {"fake-bit-faster": FakeStage(model_candidate("fake-bit-faster"))}
    bench = FakeBench({"baseline": 1.0, "fake-bit-faster": 0.99}, noise=0.001)
    result, _ = run_fake(
        tmp_path, stages, {}, bench=bench, extra_recipe="[decision]\nmin_improvement = 0.05\n"
    )
    row = by_label(result)["fake-bit-faster"]
    assert row.status == "rejected"
    assert row.ratio_ci95[1] < 1.0  # faster with confidence, but by less than the recipe asks
    assert "below the recipe's 5% minimum" in row.reason
    assert result.best.label == "baseline"


def test_a_win_that_does_not_repeat_is_rejected(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {"fake-lucky": FakeStage(model_candidate("fake-lucky"))}
    bench = FakeBench({"baseline": 1.0, "fake-lucky": 0.5}, script=[0.5, 1.0])
    result, _ = run_fake(tmp_path, stages, {}, bench=bench)
    row = by_label(result)["fake-lucky"]
    assert row.status == "rejected"
    assert "did not repeat on fresh processes" in row.reason
    assert row.details["comparison"]["ratio"] < 0.6 and row.details["confirmation"]["ratio"] > 0.9
    assert result.best.label == "baseline"


# x wins twice over the baseline; y then wins twice over x, but in the same runs measures slower
# than the baseline (x's worker ran slow there), and so it does alone with the baseline at the end.
CONTRADICTED = [0.5, 0.5, {"x": 2.0, "y": 1.5}, {"x": 2.0, "y": 1.5}, *[{"y": 1.5}] * 3]


def test_a_best_measured_slower_than_the_baseline_ships_the_original(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {
        "fake-x": FakeStage(model_candidate("x", extra_work=1)),
        "fake-y": FakeStage(model_candidate("y", extra_work=2)),
    }
    bench = FakeBench({"baseline": 1.0, "x": 0.5, "y": 0.4}, script=CONTRADICTED)
    progress = RecordingProgress()
    result, _ = run_fake(tmp_path, stages, {}, bench=bench, progress=progress)
    # Kept when measured, then shown as reverted in the table and as a streamed line.
    rows = by_label(result)
    assert rows["y"].status == rows["x"].status == "reverted"
    assert rows["y"].reason.startswith("reverted: side by side with the original, y measured 0.67x")
    assert "it had been kept" in rows["y"].reason
    assert [r.status for r in progress.records if r.label == "y"] == ["kept", "reverted"]
    assert result.best.label == "baseline"
    section = result.report["optimize"]
    assert section["speedup"] == 1.0 and section["final_comparison"]["ratio"] > 1.4
    assert any("y measured slower than the baseline side by side" in w for w in section["warnings"])
    art = load_artifact(result.artifact_dir)
    assert art.manifest["files"]["model.onnx"]["sha256"] == art.manifest["source_model"]["sha256"]


def test_no_winner_still_gives_the_baseline_artifact(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {"fake-same": FakeStage(model_candidate("fake-same"))}
    result, bench = run_fake(tmp_path, stages, {"fake-same": 1.0})
    assert by_label(result)["fake-same"].status == "rejected"
    assert "not faster than baseline with confidence" in by_label(result)["fake-same"].reason
    assert result.best.label == "baseline"
    assert bench.compared == [("baseline", "fake-same")]  # no final comparison of the baseline with itself
    art = load_artifact(result.artifact_dir)
    assert art.manifest["files"]["model.onnx"]["sha256"] == art.manifest["source_model"]["sha256"]
    assert art.runtime_config == {}


def test_target_missed_exit_code_and_verdict(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {"fake-fast": FakeStage(model_candidate("fake-fast"))}
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5}, target_ms=0.1)
    assert result.exit_code == EXIT_TARGET_MISSED == 3
    assert result.verdict.startswith("target missed: best p50 0.")
    assert result.verdict.endswith("> 0.1 ms")
    assert result.report["optimize"]["target"]["met"] is False
    assert load_artifact(result.artifact_dir).backend == "onnxruntime"  # still written


def test_no_target_exits_zero(tmp_path: Path) -> None:
    result, _ = run_fake(tmp_path, {"fake-fast": FakeStage(model_candidate("fake-fast"))}, {"fake-fast": 0.5})
    assert result.exit_code == 0
    assert result.verdict == "no target given"


@pytest.mark.parametrize(
    ("target", "mode", "runs", "reason"),
    [
        (10.0, "auto", False, "already meets the 10 ms target"),
        (0.1, "auto", True, ""),
        (None, "auto", True, ""),  # no target: the fastest accurate model is wanted
        (10.0, "always", True, ""),
        (0.1, "never", False, "--quantize never"),
    ],
)
def test_quantization_runs_only_while_above_target(
    tmp_path: Path, target: float | None, mode: str, runs: bool, reason: str
) -> None:
    quant = FakeStage(model_candidate("quantize:fake"))
    extra = '[stages.quantize]\nrun_when = "above-target"\n'
    result, _ = run_fake(tmp_path, {"quantize": quant}, {"quantize:fake": 0.5}, extra_recipe=extra,
                         target_ms=target, quantize=mode)  # fmt: skip
    assert quant.calls == (1 if runs else 0)
    if not runs:
        row = by_label(result)["quantize"]
        assert row.status == "skipped" and reason in row.reason


def test_stop_at_target(tmp_path: Path) -> None:
    second = FakeStage(model_candidate("fake-second"))
    stages: dict[str, Stage] = {"fake-first": FakeStage(model_candidate("fake-first")), "fake-second": second}
    result, _ = run_fake(tmp_path, stages, {"fake-first": 0.5, "fake-second": 0.25}, target_ms=0.8,
                         stop_at_target=True)  # fmt: skip
    assert by_label(result)["fake-first"].status == "kept"
    assert by_label(result)["fake-second"].status == "skipped"
    assert "target met with 95% confidence" in by_label(result)["fake-second"].reason
    assert second.calls == 0
    assert result.exit_code == 0


def test_time_budget_skips_the_remaining_stages(tmp_path: Path) -> None:
    stage = FakeStage(model_candidate("fake-fast"))
    result, _ = run_fake(tmp_path, {"fake-fast": stage}, {"fake-fast": 0.5}, time_budget_s=1e-9)
    assert stage.calls == 0
    assert "--time-budget is used up" in by_label(result)["fake-fast"].reason


class DeadlineProbe(FakeStage):
    """Records the seconds its context's deadline left it, and yields `count` candidates."""

    def __init__(self, label: str, count: int = 1) -> None:
        super().__init__(model_candidate(label))
        self.label, self.count = label, count
        self.seconds_given: float | None = None

    def run(self, candidate: Candidate, ctx: StageContext) -> Any:
        assert ctx.deadline is not None
        self.seconds_given = ctx.deadline - time.monotonic()
        for i in range(self.count):
            path = make_matmul_model(ctx.workdir / f"{self.label}{i}.onnx", extra_work=2)
            yield Candidate(label=f"{self.label}{i}", model_path=path)


def test_the_time_budget_is_shared_by_the_stages_recipe_budgets(tmp_path: Path) -> None:
    # A stage cannot spend the time of the stages after it: it gets its recipe budget's share of
    # what is left, so a later runtime's stages still run under a short --time-budget.
    first, second = DeadlineProbe("fake-first"), DeadlineProbe("fake-second")
    extra = "[stages.fake-first]\nbudget_s = 100\n[stages.fake-second]\nbudget_s = 300\n"
    run_fake(tmp_path, {"fake-first": first, "fake-second": second},
             {"fake-first0": 0.5, "fake-second0": 0.4}, extra_recipe=extra, time_budget_s=400)  # fmt: skip
    assert first.seconds_given is not None and second.seconds_given is not None
    assert 90 < first.seconds_given <= 100.5  # 100 / (100 + 300) of 400 s
    assert 250 < second.seconds_given <= 400  # the last stage: all that is left


def test_a_stage_whose_share_is_spent_measures_only_its_first_candidate(tmp_path: Path) -> None:
    greedy, later = DeadlineProbe("fake-greedy", count=3), DeadlineProbe("fake-later")
    # The greedy stage's share is about 1 ms of the 100 s: spent before its second candidate.
    extra = "[stages.fake-greedy]\nbudget_s = 1\n[stages.fake-later]\nbudget_s = 100000\n"
    speeds = {"fake-greedy0": 0.5, "fake-greedy1": 0.4, "fake-greedy2": 0.3, "fake-later0": 0.45}
    result, _ = run_fake(tmp_path, {"fake-greedy": greedy, "fake-later": later}, speeds,
                         extra_recipe=extra, time_budget_s=100)  # fmt: skip
    rows = by_label(result)
    assert rows["fake-greedy0"].status == "kept"
    assert rows["fake-greedy1"].status == "skipped"
    assert "share of the --time-budget was used up" in rows["fake-greedy1"].reason
    assert "fake-greedy2" not in rows
    assert rows["fake-later0"].status == "kept"


def test_a_runtime_that_cannot_load_reserves_no_time(tmp_path: Path) -> None:
    first = DeadlineProbe("fake-first")
    missing = StageSkipped("needs the Python package 'openvino', which is not installed")
    # Were the missing stage counted, the first would get 1000 / 1300 of 400 s, about 308 s.
    extra = "[stages.fake-first]\nbudget_s = 1000\n[stages.fake-missing]\nbudget_s = 300\n"
    result, _ = run_fake(tmp_path, {"fake-first": first, "fake-missing": missing},
                         {"fake-first0": 0.5}, extra_recipe=extra, time_budget_s=400)  # fmt: skip
    assert first.seconds_given is not None and first.seconds_given > 390
    assert by_label(result)["fake-missing"].status == "skipped"


def test_disabled_and_enabled_stages(tmp_path: Path) -> None:
    stage = FakeStage(model_candidate("fake-fast"))
    extra = "[stages.fake-fast]\nenabled = false\n"
    result, _ = run_fake(tmp_path, {"fake-fast": stage}, {"fake-fast": 0.5}, extra_recipe=extra)
    assert (
        "disabled in recipe test-recipe (turn on with --enable fake-fast)"
        in by_label(result)["fake-fast"].reason
    )
    shutil.rmtree(tmp_path / "out")
    result, _ = run_fake(
        tmp_path, {"fake-fast": stage}, {"fake-fast": 0.5}, extra_recipe=extra, enable=["fake-fast"]
    )
    assert by_label(result)["fake-fast"].status == "kept"
    with pytest.raises(UsageError, match="stage 'nope' is not in recipe"):
        run_fake(tmp_path, {"fake-fast": stage}, {"fake-fast": 0.5}, disable=["nope"])


def test_stage_gets_the_accuracy_service_and_context(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def make(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        bad = Candidate("probe", make_matmul_model(ctx.workdir / "bad.onnx", seed=3))
        seen["bad"] = ctx.check_accuracy(bad)
        seen["good"] = ctx.check_accuracy(candidate)
        seen["target"], seen["best"] = ctx.target_ms, ctx.best_latency_ms
        seen["options"] = ctx.options
        return []

    extra = '[stages.quantize]\nmode = "static"\n'
    run_fake(tmp_path, {"quantize": FakeStage(make)}, {}, extra_recipe=extra, target_ms=0.5,
             calib_data=make_calib(tmp_path))  # fmt: skip
    assert seen["good"].ok and not seen["bad"].ok and "cosine" in seen["bad"].reason
    assert seen["target"] == 0.5 and seen["best"] == pytest.approx(1.0, rel=0.05)
    assert seen["options"]["mode"] == "static"
    # The calibration half of the user's rows, from lto's own file (the other half judges).
    assert seen["options"]["calib_data"].endswith("calib-data.npz")


def test_stages_run_in_their_scratch_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Libraries that drop side files into the current directory must not litter the user's."""
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    monkeypatch.chdir(user_dir)

    def litter(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        Path("1234-uuid.data").write_bytes(b"side file")
        make_matmul_model(Path("relative.onnx"), extra_work=1)
        return [Candidate(label="fake-relative", model_path=Path("relative.onnx"))]

    result, _ = run_fake(tmp_path, {"fake-relative": FakeStage(litter)}, {"fake-relative": 0.5})
    assert by_label(result)["fake-relative"].status == "kept"
    assert result.best.model_path.is_absolute()
    assert list(user_dir.iterdir()) == []
    assert load_artifact(result.artifact_dir).backend == "onnxruntime"


def make_calib(tmp_path: Path) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))
    return path


def test_external_data_goes_through_stages_into_the_artifact(tmp_path: Path) -> None:
    from optimize.model.onnx_file import save_model

    src = tmp_path / "ext"
    src.mkdir()
    model = onnx.load(str(make_matmul_model(tmp_path / "plain.onnx", features=64, out=32)))
    onnx.save_model(model, str(src / "tiny.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="tiny.onnx.data", size_threshold=0)  # fmt: skip

    def rewrite(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        loaded = onnx.load(str(candidate.model_path))  # weights read from the side file
        path = ctx.workdir / "rewritten.onnx"
        extra = save_model(loaded, path, external=True)
        return [Candidate(label="fake-rewrite", model_path=path, extra_files=extra)]

    stages = {"fake-rewrite": FakeStage(rewrite), "fake-raises": FakeStage(raising(ValueError("2 GB")))}
    recipe = write_recipe(tmp_path, list(stages))
    bench = FakeBench({"baseline": 1.0, "fake-rewrite": 0.5})
    request = OptimizeRequest(model_path=src / "tiny.onnx", recipe=str(recipe), out_dir=tmp_path / "out")
    result = optimize(request, stage_factory=stages.__getitem__, measure_fn=bench.measure,
                      compare_fn=bench.compare, open_worker_fn=bench.open_worker,
                    known_stages=list(stages))  # fmt: skip
    assert by_label(result)["fake-raises"].reason == (
        "ValueError: 2 GB (the model keeps its weights as external data)"
    )
    assert result.best.label == "fake-rewrite"
    assert result.report["optimize"]["external_data"] is True
    assert (
        "- the model stores its weights as external data" in (result.artifact_dir / "report.md").read_text()
    )
    art = load_artifact(result.artifact_dir)
    assert art.manifest["side_files"] == ["rewritten.onnx.data"]
    import onnxruntime as ort

    x = np.ones((1, 64), dtype=np.float32)
    run = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    np.testing.assert_array_equal(run(art.model_path), run(src / "tiny.onnx"))


# --- interruption and crashes ------------------------------------------------------------------


def test_ctrl_c_leaves_no_artifact_but_a_partial_report(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {
        "fake-fast": FakeStage(model_candidate("fake-fast")),
        "fake-interrupt": FakeStage(raising(KeyboardInterrupt())),
    }
    with pytest.raises(KeyboardInterrupt):
        run_fake(tmp_path, stages, {"fake-fast": 0.5})
    out = tmp_path / "out"
    assert not out.exists()
    partial = load_report(partial_report_path(out))
    section = partial["optimize"]
    assert section["partial"] is True and section["stopped_by"] == "interrupted by Ctrl-C (SIGINT)"
    assert [s["label"] for s in section["stages"]] == ["baseline", "fake-fast"]
    # The partial report names what the user could have had, with its figures.
    best = section["best_so_far"]
    assert best["label"] == "fake-fast"
    assert "fake-fast" in best["summary"] and "x vs the baseline" in best["summary"]
    assert section["stages"][1]["status"] == "kept"
    assert not list(tmp_path.glob(".lto-work-*")) and not list(tmp_path.glob(".out.*"))


def test_a_programming_error_in_lto_is_raised_not_recorded_as_a_failed_stage(tmp_path: Path) -> None:
    """An AttributeError raised in lto's own code is a bug of lto's, not a limit of the model: the
    run stops with it (and a partial report). A TypeError raised outside lto (here: the test's own
    stage code, standing for a library a stage calls) stays a "failed" row."""
    from optimize.accuracy.evidence import numerics_of_precision

    def buggy(candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        numerics_of_precision(None)  # type: ignore[arg-type]  # None.lower() inside optimize/accuracy/evidence.py
        return []

    stages: dict[str, Stage] = {
        "fake-fast": FakeStage(model_candidate("fake-fast")),
        "fake-bug": FakeStage(buggy),
    }
    with pytest.raises(AttributeError):
        run_fake(tmp_path / "a", stages, {"fake-fast": 0.5})
    assert load_report(partial_report_path(tmp_path / "a" / "out"))["optimize"]["partial"] is True
    library = {"fake-fast": FakeStage(model_candidate("fake-fast")),
               "fake-lib": FakeStage(raising(TypeError("unsupported operand in a library")))}  # fmt: skip
    result, _ = run_fake(tmp_path / "b", library, {"fake-fast": 0.5})
    assert by_label(result)["fake-lib"].status == "failed"


def test_crash_in_measurement_leaves_a_partial_report(tmp_path: Path) -> None:
    class Broken(FakeBench):
        def measure(self, *a: Any, **kw: Any) -> Measurement:
            raise RuntimeError("bench exploded")

    with pytest.raises(RuntimeError):
        run_fake(tmp_path, {"fake-fast": FakeStage(model_candidate("fake-fast"))}, {},
                 bench=Broken({"baseline": 1.0}))  # fmt: skip
    assert not (tmp_path / "out").exists()
    data = json.loads(partial_report_path(tmp_path / "out").read_text())
    assert data["optimize"]["stopped_by"] == "RuntimeError: bench exploded"


# --- real measurement --------------------------------------------------------------------------


def test_real_bench_rejects_a_much_slower_candidate(tmp_path: Path) -> None:
    """No fakes in the measuring path: 300 extra MatMuls per run make the candidate slower by far."""
    slow = FakeStage(model_candidate("fake-slow", extra_work=300))
    model = make_matmul_model(tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, ["fake-slow"])
    request = OptimizeRequest(
        model_path=model, recipe=str(recipe), out_dir=tmp_path / "out", target_ms=1000.0
    )
    result = optimize(request, stage_factory=lambda name: slow, known_stages=["fake-slow"])
    row = by_label(result)["fake-slow"]
    assert row.accuracy["ok"] is True  # same outputs: only speed can reject it
    assert row.status == "rejected", row.reason
    assert result.best.label == "baseline"
    assert result.exit_code == 0
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    import onnxruntime as ort

    art = load_artifact(result.artifact_dir)
    got = ort.InferenceSession(str(art.model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


# --- stage registry ----------------------------------------------------------------------------


def test_missing_stage_module_or_dependency_is_a_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stages = (
        StageInfo("ghost", "optimize.runtimes.no_such_stage_module:Ghost"),
        StageInfo("needs-dep", "lto_test_stage_with_dep:Whatever"),
    )
    ghosts = RuntimeSpec(name="ghosts", title="Ghosts", backends=(), stages=stages)
    monkeypatch.setattr(registry, "RUNTIMES", [*registry.RUNTIMES, ghosts])
    with pytest.raises(StageSkipped, match="not available in this build"):
        load_stage("ghost")
    (tmp_path / "lto_test_stage_with_dep.py").write_text("import lto_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(StageSkipped, match="needs the Python package 'lto_no_such_dependency'"):
        load_stage("needs-dep")
    with pytest.raises(UsageError, match="unknown stage"):
        load_stage("never-registered")


def test_parse_duration() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1h30m") == 5400
    with pytest.raises(UsageError, match="bad duration"):
        parse_duration("ten minutes")


# --- the command line --------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    # Needs a process: the exit statuses of the real `lto optimize` (0 met, 3 missed, 2 usage),
    # and stderr to the end of the interpreter, where shutdown would print what is left over.
    model = make_matmul_model(tmp_path / "tiny.onnx")
    recipe = write_recipe(tmp_path, ["operator-fusion", "tvm-tune"], "[stages.tvm-tune]\nenabled = false\n")
    out = tmp_path / "art"
    met = run_lto("optimize", model, "--recipe", recipe, "-o", out, "--target-ms", "1000", "--json")
    assert met.returncode == 0, met.stderr
    report = json.loads(met.stdout)
    assert report["kind"] == "optimize" and report["optimize"]["exit_code"] == 0
    assert [s["stage"] for s in report["optimize"]["stages"]] == ["baseline", *[
        s["stage"] for s in report["optimize"]["stages"][1:]]]  # fmt: skip
    assert load_artifact(out).backend == "onnxruntime"

    missed = run_lto("optimize", model, "--recipe", recipe, "-o", out, "--target-ms", "0.000001",
                     "--time-budget", "10m")  # fmt: skip
    assert missed.returncode == 3, missed.stderr
    assert "target missed" in missed.stdout and "stage" in missed.stdout
    # Piped, as in a CI log: the time left of the budget, and each stage's share of it.
    assert re.search(r"\(\d+m\d\ds of the 10m00s budget left\)", missed.stderr), missed.stderr
    # The seconds depend on how long the baseline took: the sentence, not the figure, is checked.
    share = re.search(r"operator-fusion: (\d+) s of the (\d+) s left in the --time-budget", missed.stderr)
    assert share and share[1] == share[2] and 590 <= int(share[1]) <= 600, missed.stderr

    bad = write_recipe(tmp_path, ["operator-fusion"], '[stages.operator-fusion]\nspeed = "max"\n')
    usage = run_lto("optimize", model, "--recipe", bad, "-o", out)
    assert usage.returncode == 2
    assert "stages.operator-fusion.speed: unknown key" in usage.stderr
    assert "Traceback" not in usage.stderr
    assert run_lto("optimize", model, "--target-percentile", "p42").returncode == 2
    assert run_lto("optimize", tmp_path / "missing.onnx").returncode == 2


# --- stages that search: candidates one at a time, decisions that agree --------------------------


class SearchingStage(Stage):
    """Yields candidates one by one and writes down what it saw between them."""

    name = "fake-search"

    def __init__(self, labels: list[tuple[str, dict[str, Any]]], fail_after: int | None = None) -> None:
        self.labels = labels
        self.fail_after = fail_after
        self.seen: list[tuple[dict[str, str], float | None]] = []
        self.closed = False

    def run(self, candidate: Candidate, ctx: StageContext) -> Any:
        try:
            for i, (label, model_kw) in enumerate(self.labels):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("the quantizer crashed")
                if label.startswith("skip-"):
                    ctx.skip_point(label, "dominated by an earlier point", {"why": "test"})
                    continue
                path = make_matmul_model(ctx.workdir / f"{label}.onnx", **model_kw)
                yield Candidate(label=label, model_path=path)
                self.seen.append((dict(ctx.outcomes), ctx.best_latency_ms))
        finally:
            self.closed = True


def test_a_searching_stage_learns_each_outcome_before_the_next_candidate(tmp_path: Path) -> None:
    stage = SearchingStage(
        [("q-bad", {"seed": 7}), ("q-fast", {"extra_work": 1}), ("skip-q", {}), ("q-slow", {"extra_work": 2})]
    )
    speeds = {"q-fast": 0.5, "q-slow": 0.9}
    result, _ = run_fake(tmp_path, {"fake-search": stage}, speeds)
    rows = by_label(result)
    assert [o for o, _ in stage.seen] == [
        {"q-bad": "inaccurate"},
        {"q-bad": "inaccurate", "q-fast": "kept"},
        {"q-bad": "inaccurate", "q-fast": "kept", "q-slow": "slower"},
    ]
    # The best's latency the stage sees drops once q-fast is kept (measured alone, ~0.5 ms).
    assert stage.seen[0][1] == pytest.approx(1.0, rel=0.05)
    assert stage.seen[1][1] == pytest.approx(0.5, rel=0.05)
    assert rows["skip-q"].status == "skipped" and rows["skip-q"].reason == "dominated by an earlier point"
    assert rows["q-slow"].versus["label"] == "q-fast"  # measured against the best so far, same run
    assert rows["q-slow"].versus["latency_ms"]["p50"] < rows["q-slow"].latency_ms["p50"]
    assert result.best.label == "q-fast" and stage.closed


def test_a_search_stops_once_the_target_is_met(tmp_path: Path) -> None:
    stage = SearchingStage([("q-fast", {"extra_work": 1}), ("q-never", {"extra_work": 2})])
    extra = '[stages.fake-search]\nrun_when = "above-target"\n'
    result, bench = run_fake(tmp_path, {"fake-search": stage}, {"q-fast": 0.5}, extra, target_ms=0.7)
    assert "q-never" not in by_label(result)
    assert stage.closed  # the pipeline closed the generator: its cleanup ran
    assert all("q-never" not in pair for pair in bench.compared)
    assert result.exit_code == EXIT_TARGET_MET


def test_a_stage_that_fails_midway_keeps_what_it_yielded(tmp_path: Path) -> None:
    stage = SearchingStage([("q-fast", {"extra_work": 1}), ("q-next", {})], fail_after=1)
    result, _ = run_fake(tmp_path, {"fake-search": stage}, {"q-fast": 0.5})
    rows = by_label(result)
    assert rows["q-fast"].status == "kept"
    assert rows["fake-search"].status == "failed"
    assert rows["fake-search"].reason == "RuntimeError: the quantizer crashed"
    assert result.best.label == "q-fast"


def test_target_skip_and_final_verdict_read_the_same_figure(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {
        "fake-fast": FakeStage(model_candidate("fake-fast", extra_work=1)),
        "fake-later": FakeStage(model_candidate("fake-later", extra_work=2)),
    }
    extra = '[stages.fake-later]\nrun_when = "above-target"\n'
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5, "fake-later": 0.4}, extra, target_ms=0.7)
    skip = by_label(result)["fake-later"]
    assert skip.status == "skipped"
    figure = skip.reason.split("(")[1].split(" ms")[0]
    assert skip.reason.startswith(f"the best p50 ({figure} ms, measured alone) already meets")
    assert result.verdict == f"target met: p50 {figure} ms <= 0.7 ms"


def test_a_skip_decided_on_a_reverted_candidate_says_so(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {
        "fake-x": FakeStage(model_candidate("x", extra_work=1)),
        "fake-y": FakeStage(model_candidate("y", extra_work=2)),
        "fake-later": FakeStage(model_candidate("fake-later", extra_work=3)),
    }
    extra = '[stages.fake-later]\nrun_when = "above-target"\n'
    bench = FakeBench({"baseline": 1.0, "x": 0.5, "y": 0.4}, script=CONTRADICTED)
    result, _ = run_fake(tmp_path, stages, {}, extra, bench=bench, target_ms=0.45)
    rows = by_label(result)
    assert rows["y"].status == "reverted"
    assert rows["fake-later"].reason.endswith("(decided on y, which was reverted)")
    assert result.best.label == "baseline"
    assert result.verdict.startswith("target missed: best p50 ")  # the original, measured alone


def test_a_close_runner_up_meets_the_final_best_in_a_runoff(tmp_path: Path) -> None:
    """y lost to x by less than the recipe's minimum gain; z beat x later. Stages run greedily,
    so y never met z: the runoff measures them side by side before the artifact is chosen."""
    stages: dict[str, Stage] = {
        "fake-x": FakeStage(model_candidate("x", extra_work=1)),
        "fake-y": FakeStage(model_candidate("y", extra_work=2)),
        "fake-z": FakeStage(model_candidate("z", extra_work=3)),
    }
    result, bench = run_fake(tmp_path, stages, {"x": 0.5, "y": 0.48, "z": 0.45})
    ys = [r for r in result.records if r.label == "y"]
    assert [r.versus["label"] for r in ys] == ["x", "z"]
    assert ys[0].status == "rejected" and "gain below" in ys[0].reason
    assert ys[1].status == "rejected" and ys[1].reason.startswith("slower than z")
    assert ("baseline", "z", "y") in bench.compared and result.best.label == "z"
    assert any(line.startswith("runoff: y against z") for line in result.report["optimize"]["log"])


def test_the_report_says_what_each_runtime_achieved(tmp_path: Path) -> None:
    stages: dict[str, Stage] = {
        "fake-x": FakeStage(model_candidate("x", extra_work=1)),
        "fake-y": FakeStage(model_candidate("y", extra_work=2)),
        "fake-bad": FakeStage(model_candidate("bad", seed=7)),
    }
    result, _ = run_fake(tmp_path, stages, {"x": 0.5, "y": 0.6, "bad": 0.1})
    runtimes = result.report["optimize"]["runtimes"]
    # The inaccurate (fastest) candidate does not count; the kept one is ONNX Runtime's best.
    assert runtimes == {
        "onnxruntime": {
            "label": "x",
            "speedup": pytest.approx(2.0, rel=0.05),
            "precision": "fp32",
            "status": "kept",
        }
    }


def test_the_original_ships_when_the_artifact_measures_slower_even_without_confidence() -> None:
    from optimize.pipeline import judge

    bench = FakeBench({"a": 1.0})
    a, b = bench._measurement("a", 1), bench._measurement("a", 2)
    assert judge.original_wins_final(Comparison(a, b, "p50", 1.05, (0.9, 1.2), 8))  # slower, CI holds 1
    assert not judge.original_wins_final(Comparison(a, b, "p50", 0.95, (0.8, 1.1), 8))


class TwoSpeedBaseline(FakeBench):
    """The baseline runs at 1 ms in most blocks and at 2 ms in every third one (ONNX Runtime's
    default pool on some models); the other sides run at one speed."""

    def compare(self, sides: list[Any], feeds: Any, settings: Any, labels: list[str], metric: str = "p50",
                *a: Any, **kw: Any) -> ApartRun:  # fmt: skip
        run = super().compare(sides, feeds, settings, labels, metric, *a, **kw)
        base = np.asarray(run.samples[0]).reshape(run.rounds, self.BLOCK)
        base[2::3] *= 2.0
        run.samples[0] = list(base.ravel())
        return run


def test_a_baseline_at_two_speeds_is_named_and_every_figure_is_against_its_fast_mode(tmp_path: Path) -> None:
    stages: dict[str, Any] = {"fake-fast": FakeStage(model_candidate("fake-fast", extra_work=2))}
    bench = TwoSpeedBaseline({"baseline": 1.0, "fake-fast": 0.5})
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5}, bench=bench)
    rows = by_label(result)
    section = result.report["optimize"]
    # The headline is the speedup a user can count on (against the baseline's fast mode: 2x), not
    # the 4x of its slow blocks, and it lies inside its own interval.
    assert section["speedup"] == pytest.approx(2.0, rel=0.05)
    lo, hi = section["speedup_ci95"]
    assert lo <= section["speedup"] <= hi
    artifact = rows["fake-fast"]
    assert artifact.modes is not None and artifact.modes["moved"] == "ONNX Runtime defaults"
    assert sorted(round(x) for x in artifact.modes["speedups"]) == [2, 4]
    assert "two speeds (ONNX Runtime defaults changed)" in artifact.modes["sentence"]
    # The row's two latencies divide into its speedup: the fast mode's baseline, not a mixture.
    assert artifact.baseline_ms / artifact.latency_ms["p50"] == pytest.approx(artifact.speedup, rel=0.05)
    assert rows["baseline"].latency_ms["p50"] == pytest.approx(artifact.baseline_ms)
    assert any("two speeds" in line for line in section["log"] if line.startswith("final:"))


OPENVINO_FAILURE = """Exception from src/inference/src/cpp/core.cpp:84:
Exception from src/frontends/onnx/frontend/src/frontend.cpp:163:
Check 'unsupported_operations.empty()' failed at src/frontends/onnx/frontend/src/frontend.cpp:163:
FrontEnd API failed with GeneralFailure:
Conversion is failed for: Conv-15, ReduceMean-15 rank has to be known
"""


def test_a_runtime_failure_keeps_its_cause_in_the_reason_and_its_whole_text_in_the_report(
    tmp_path: Path,
) -> None:
    stages: dict[str, Any] = {"fake-raises": FakeStage(raising(RuntimeError(OPENVINO_FAILURE)))}
    result, _ = run_fake(tmp_path, stages, {})
    row = by_label(result)["fake-raises"]
    assert row.status == "failed"
    assert row.reason.startswith("RuntimeError: FrontEnd API failed with GeneralFailure: Conversion is")
    assert "core.cpp" not in row.reason  # the lines that only say where it was raised are dropped
    stage = next(s for s in result.report["optimize"]["stages"] if s["label"] == "fake-raises")
    assert stage["details"]["error_text"] == OPENVINO_FAILURE.strip()


def test_a_stage_line_names_the_stage_once() -> None:
    from optimize.pipeline.stage_run import _named

    # "openvino-convert: openvino-convert:bf16: inaccurate ..." named the stage twice.
    assert (
        _named("openvino-convert", "openvino-convert:bf16: inaccurate") == "openvino-convert:bf16: inaccurate"
    )
    assert _named("quantize", "7 point(s) to search") == "quantize: 7 point(s) to search"


def test_the_latency_plot_draws_the_baseline_and_the_artifact(tmp_path: Path) -> None:
    """The first plot drew only the baseline: the final pair's labels no longer matched."""
    from optimize.render.plots import report_plots

    stages: dict[str, Any] = {"fake-fast": FakeStage(model_candidate("fake-fast", extra_work=2))}
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5})
    cdf = next(p for p in report_plots(result.report) if p.name == "latency_cdf")
    assert "baseline (final comparison)" in cdf.caption and "fake-fast (final comparison)" in cdf.caption
    md = (tmp_path / "out" / "report.md").read_text()
    assert "- timed on: x float32" in md and "(generated: " in md
    assert "- accuracy judged on: generated" in md
