"""The search order (optimize/pipeline/order.py): the likeliest win per second first, from the
corpus prior and this machine's history; what a run records; when a comparison gives up; the
default time budget and the time to the best artifact."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from optimize.errors import UsageError
from optimize.pipeline import order
from optimize.pipeline.request import DEFAULT_TIME_BUDGET_S, OptimizeRequest
from optimize.recipes import StageSpec
from optimize.stage import Status
from optimize.system.env import MACHINE_CLASSES, cpu_class, cpu_isa_flags
from optimize.units import limit_parser
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model
from tests.pipeline.test_pipeline import FakeStage, by_label, model_candidate, run_fake, write_recipe
from tests.pipeline.values import row, run_record

PRIORS = [
    {"kind": "transformer", "cpu": "bf16", "stage": "openvino-convert", "tried": 3, "won": 3, "gain": 2.8,
     "cost_s": 30},
    {"kind": "transformer", "cpu": "bf16", "stage": "quantize", "tried": 3, "won": 0, "gain": 1.0,
     "cost_s": 25},
    {"kind": "transformer", "cpu": "avx2", "stage": "quantize", "tried": 2, "won": 2, "gain": 1.6,
     "cost_s": 25},
    {"kind": "cnn", "cpu": "bf16", "stage": "memory-layout", "tried": 4, "won": 1, "gain": 1.3, "cost_s": 20},
]  # fmt: skip
STAGES = [StageSpec(name) for name in ("graph-fusion", "memory-layout", "quantize", "openvino-convert")]


def _names(planned: list[tuple[StageSpec, order.Odds]]) -> list[str]:
    return [spec.name for spec, _ in planned]


def test_the_likeliest_win_per_second_runs_first_and_the_recipe_breaks_ties() -> None:
    bf16 = order.plan(STAGES, "transformer", "bf16", priors=PRIORS)
    assert _names(bf16)[0] == "openvino-convert"
    # memory-layout won once for another kind on this CPU; graph-fusion has no record (even odds of
    # a small win at a high assumed cost); quantize lost every time here, so it comes last.
    assert _names(bf16) == ["openvino-convert", "memory-layout", "graph-fusion", "quantize"]
    avx2 = order.plan(STAGES, "transformer", "avx2", priors=PRIORS)
    assert _names(avx2)[0] == "quantize"
    # No row for this kind: the stage's rows on this CPU class for other kinds stand in.
    odds = order.odds_for("memory-layout", "transformer", "bf16", PRIORS, [])
    assert odds.source == "corpus, other kinds" and odds.tried == 4 and odds.won == 1
    unknown = order.odds_for("tvm-tune", "cnn", "bf16", PRIORS, [])
    assert unknown.source == "no record" and unknown.p_win == 0.5
    assert _names(order.plan(STAGES, "transformer", "bf16", "recipe", priors=PRIORS)) == [
        s.name for s in STAGES
    ]
    with pytest.raises(UsageError, match="--search-order 'random'"):
        order.plan(STAGES, "transformer", "bf16", "random", priors=PRIORS)


def test_the_expected_gain_is_over_the_best_so_far() -> None:
    winner = order.odds_for("openvino-convert", "transformer", "bf16", PRIORS, [])
    loser = order.odds_for("quantize", "transformer", "bf16", PRIORS, [])
    assert winner.expected_gain(1.0) > winner.expected_gain(2.0) > winner.expected_gain(4.0) > 0
    assert winner.expected_gain(1.0) > loser.expected_gain(1.0)
    # Against a best at 2.8x, a stage that never won (gain 1.1x) here is not worth a default run...
    measured_here = replace(loser, runs_here=2)
    assert "expected gain over the best so far (2.80x)" in order.not_worth_reason(measured_here, 2.8)
    assert "won 0 of 3 (corpus)" in order.not_worth_reason(measured_here, 2.8)
    # ...but one never run on this machine is: the prior was measured on another one.
    assert order.not_worth_reason(loser, 2.8) == ""
    # Against the original it is, and the likely winner is worth it against its own record.
    assert order.not_worth_reason(measured_here, 1.0) == "" and order.not_worth_reason(winner, 2.8) == ""
    # The order is chosen again as the best improves: a frequent small win first while nothing won,
    # a rarer big one once the small win is already in hand.
    small = (StageSpec("small"), order.Odds("small", 4, 4, 1.3, 20, "corpus"))
    big = (StageSpec("big"), order.Odds("big", 9, 1, 3.0, 20, "corpus"))
    assert _names(order.rank([big, small], best=1.0)) == ["small", "big"]
    assert _names(order.rank([small, big], best=1.5)) == ["big", "small"]


def test_this_machines_history_refines_the_prior(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    win = order.StageRun("transformer", "bf16", "quantize", ran_s=10.0, won=True, gain=3.5)
    for _ in range(6):
        order.append_history(history, "this-machine", [win])
    order.append_history(history, "another-machine", [win])
    with history.open("a") as fh:
        fh.write("{not json\n")  # a damaged line is skipped: the history is a cache
        # Written by an lto that recorded wins only: a loss there may have been an unverified
        # fastest candidate, so it is no evidence against the stage.
        legacy = {"fingerprint": "this-machine", "kind": "transformer", "cpu": "bf16", "stage": "quantize",
                  "ran_s": 9.0, "won": False, "gain": None}  # fmt: skip
        fh.write(json.dumps(legacy) + "\n")
    past = order.read_history(history, "this-machine")
    assert len(past) == 6 and all(row["fingerprint"] == "this-machine" for row in past)
    odds = order.odds_for("quantize", "transformer", "bf16", PRIORS, past)
    assert odds.tried == 9 and odds.won == 6 and odds.source == "corpus + 6 run(s) here"
    assert odds.gain == pytest.approx(3.5) and odds.cost_s == pytest.approx(10.0)
    assert _names(order.plan(STAGES, "transformer", "bf16", priors=PRIORS, history=past))[0] == "quantize"
    assert order.read_history(None, "this-machine") == []


def test_the_history_file_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LTO_HISTORY", "off")
    assert order.history_path() is None
    monkeypatch.setenv("LTO_HISTORY", str(tmp_path / "h.jsonl"))
    assert order.history_path() == tmp_path / "h.jsonl"
    monkeypatch.delenv("LTO_HISTORY")
    monkeypatch.setenv("LTO_CACHE_DIR", str(tmp_path / "cache"))
    assert order.history_path() == tmp_path / "cache" / "history.jsonl"


def test_the_committed_prior_reads_and_names_known_stages() -> None:
    from optimize.runtimes.registry import stage_infos

    rows = order.load_priors()
    assert rows, "recipes/priors/search-order.toml holds the corpus prior"
    assert {row["stage"] for row in rows} <= set(stage_infos())
    assert {row["cpu"] for row in rows} <= set(MACHINE_CLASSES)
    assert all(0 <= row["won"] <= row["tried"] and row["cost_s"] > 0 for row in rows)


def test_a_candidate_that_cannot_win_is_no_longer_timed(tmp_path: Path) -> None:
    stages = {
        "fake-fast": FakeStage(model_candidate("fake-fast")),
        "fake-slow": FakeStage(model_candidate("fake-slow")),
    }
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5, "fake-slow": 0.8})
    rows = by_label(result)
    slow = rows["fake-slow"].details["comparison"]
    assert rows["fake-slow"].status == "rejected" and slow["stopped_by"] == "given up"
    assert rows["fake-fast"].status == "kept"
    assert rows["fake-fast"].details["comparison"]["stopped_by"] != "given up"


def test_time_to_best_and_the_search_go_into_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = tmp_path / "history.jsonl"
    monkeypatch.setenv("LTO_HISTORY", str(history))
    stages = {"fake-fast": FakeStage(model_candidate("fake-fast"))}
    result, _ = run_fake(tmp_path, stages, {"fake-fast": 0.5})
    section = result.report["optimize"]
    assert 0 < section["time_to_best_s"] <= section["elapsed_s"]
    assert [s["stage"] for s in section["search"]["stages"]] == ["fake-fast"]
    assert section["search"]["history"] == str(history)
    assert set(section["stage_seconds"]) == {"fake-fast"}
    assert result.report["settings"]["time_budget_default"] is False
    (line,) = [json.loads(text) for text in history.read_text().splitlines()]
    assert line["stage"] == "fake-fast" and line["won"] is True and line["gain"] == section["speedup"]


def test_under_the_default_budget_a_stage_not_worth_its_time_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prior = tmp_path / "prior.toml"
    cpu = cpu_class(cpu_isa_flags())
    rows = [("fake-fast", 5, 2.0), ("fake-meh", 0, 1.0)]
    prior.write_text("".join(
        f"[[stage]]\nkind = 'default'\ncpu = '{cpu}'\nstage = '{name}'\ntried = 5\nwon = {won}\n"
        f"gain = {gain}\ncost_s = 10\n\n"
        for name, won, gain in rows
    ))  # fmt: skip
    monkeypatch.setenv("LTO_SEARCH_PRIOR", str(prior))
    # This machine has run fake-meh on this kind before (a stage never run here is always tried).
    history = tmp_path / "history.jsonl"
    monkeypatch.setenv("LTO_HISTORY", str(history))
    from optimize.system.env import machine_fingerprint

    order.append_history(
        history, machine_fingerprint(), [order.StageRun("default", cpu, "fake-meh", 5.0, False, None)]
    )
    stages = {name: FakeStage(model_candidate(name)) for name in ("fake-meh", "fake-fast")}
    speeds = {"fake-fast": 0.5, "fake-meh": 0.45}
    result, _ = run_fake(tmp_path, stages, speeds, time_budget_s=120, default_budget=True)
    rows_by_label = by_label(result)
    assert [r.stage for r in result.records][1] == "fake-fast"  # the likely winner first
    assert rows_by_label["fake-meh"].status == "skipped" and "won 0 of 6" in rows_by_label["fake-meh"].reason
    # An explicit budget runs it (the order stays).
    (tmp_path / "explicit").mkdir()
    result, _ = run_fake(tmp_path / "explicit", stages, speeds, time_budget_s=120)
    assert by_label(result)["fake-meh"].status != "skipped"


def test_the_default_budget_and_none(tmp_path: Path) -> None:
    parse = limit_parser("--time-budget")
    assert parse("90s") == 90 and math.isinf(parse("none")) and math.isinf(parse("OFF"))
    model = make_matmul_model(tmp_path / "tiny.onnx")
    assert (
        "2m00s, the default" in OptimizeRequest(model, time_budget_s=120, default_budget=True).budget_line()
    )
    assert "the full search" in OptimizeRequest(model).budget_line()
    recipe = write_recipe(tmp_path, ["operator-fusion"])
    proc = run_cli("optimize", model, "--recipe", recipe, "-o", tmp_path / "a", "--json")
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("time budget: 2m00s, the default") and "--time-budget none" in first
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["settings"]["time_budget_s"] == DEFAULT_TIME_BUDGET_S
    assert report["settings"]["time_budget_default"] is True
    proc = run_cli("optimize", model, "--recipe", recipe, "-o", tmp_path / "b", "--time-budget", "none")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == "time budget: none, the full search (--time-budget none)"
    assert "found after" in proc.stdout and "no time budget" in proc.stdout


def test_a_stage_whose_fastest_candidate_was_unverified_is_tried_again_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A YOLO-style detector's static int8 measured 2.39x, the fastest, but the rows could not verify
    it; the history wrote a loss, and the next run, given photos that could, skipped the stage."""
    from tests.pipeline.test_unverified import classifier_model, confident_rows, int8_stage

    history = tmp_path / "history.jsonl"
    monkeypatch.setenv("LTO_HISTORY", str(history))
    prior = tmp_path / "prior.toml"
    cpu = cpu_class(cpu_isa_flags())
    prior.write_text(  # the corpus: fake-int8 never won on this kind and CPU class
        f"[[stage]]\nkind = 'default'\ncpu = '{cpu}'\nstage = 'fake-int8'\ntried = 7\nwon = 0\n"
        "gain = 1.0\ncost_s = 10\n"
    )
    monkeypatch.setenv("LTO_SEARCH_PRIOR", str(prior))
    model = classifier_model(tmp_path / "cls.onnx")
    stages = {"fake-int8": int8_stage("fake-int8", lambda p: classifier_model(p, 0.001))}
    first, _ = run_fake(tmp_path / "a", stages, {"fake-int8": 0.4}, model=model,
                        time_budget_s=120, default_budget=True)  # fmt: skip
    assert by_label(first)["fake-int8"].status == "unverified"
    (line,) = [json.loads(text) for text in history.read_text().splitlines()]
    assert line["won"] is False and line["unverified_gain"] == pytest.approx(2.5, rel=0.1)
    assert line["measured"][0]["verdict"] == "unverified"
    odds = order.odds_for(
        "fake-int8",
        "default",
        cpu,
        order.load_priors(prior),
        order.read_history(history, line["fingerprint"]),
    )
    assert odds.won == 1 and odds.gain == pytest.approx(2.5, rel=0.1) and odds.runs_here == 1
    # The second run, given rows that can verify it, tries the stage and ships it.
    second, _ = run_fake(tmp_path / "b", stages, {"fake-int8": 0.4}, model=model, time_budget_s=120,
                         default_budget=True, eval_data=confident_rows(tmp_path / "e.npz", 16))  # fmt: skip
    assert by_label(second)["fake-int8"].status == "kept"


def test_a_class_without_rows_is_ordered_by_the_nearest_class_but_never_skipped_by_it() -> None:
    """A Zen 4 (vector bf16) has no rows of its own: the AMX Xeon's rows order its search, and
    under the default budget none of its stages is left out on their strength."""

    def row(cpu: str, stage: str, won: int, gain: float) -> dict[str, Any]:
        return {"kind": "cnn", "cpu": cpu, "stage": stage, "tried": 6, "won": won, "gain": gain, "cost_s": 15}

    priors = [row("amx", "openvino-convert", 4, 2.5), row("amx", "memory-layout", 0, 1.0),
              row("avx2", "memory-layout", 6, 1.5)]  # fmt: skip
    assert set(order.NEAREST_CLASSES) == set(MACHINE_CLASSES)
    assert all(set(near) <= set(MACHINE_CLASSES) for near in order.NEAREST_CLASSES.values())
    convert = order.odds_for("openvino-convert", "cnn", "bf16", priors, [])
    layout = order.odds_for("memory-layout", "cnn", "bf16", priors, [])
    assert convert.source == "corpus, amx machines" and convert.won == 4 and convert.runs_here == 0
    assert layout.won == 0 and layout.source == "corpus, amx machines"  # amx is nearer than avx2
    stages = [StageSpec("memory-layout"), StageSpec("openvino-convert")]
    assert _names(order.plan(stages, "cnn", "bf16", priors=priors)) == ["openvino-convert", "memory-layout"]
    assert order.not_worth_reason(layout, best=2.5) == ""  # never run here: run it
    # The class's own rows, once it has some, come first.
    own = [*priors, {"kind": "cnn", "cpu": "bf16", "stage": "memory-layout", "tried": 2, "won": 2,
                     "gain": 1.9, "cost_s": 10}]  # fmt: skip
    assert order.odds_for("memory-layout", "cnn", "bf16", own, []).source == "corpus"


def test_what_each_stage_did_goes_into_the_history(tmp_path: Path) -> None:
    record = run_record(tmp_path)
    record.records += [
        row("baseline", Status.BASELINE, speedup=1.0),
        row("fuse", Status.KEPT, stage="fuse", speedup=1.4),
        row("quantize:a", Status.UNVERIFIED, stage="quantize", speedup=2.0),
        row("quantize:b", Status.REJECTED, stage="quantize", speedup=1.1, inaccurate=True),
        row("quantize:c", Status.SKIPPED, stage="quantize"),
        row("tvm-tune", Status.SKIPPED, stage="tvm-tune"),
    ]
    record.stage_seconds = {"fuse": 3.0, "quantize": 20.0, "tvm-tune": 0.1}
    runs = {run.stage: run for run in order.stage_runs(record, "avx2", winner="fuse", shipped_speedup=1.4)}
    assert set(runs) == {"fuse", "quantize"}  # a stage that only skipped taught nothing
    assert runs["fuse"].won and runs["fuse"].gain == 1.4 and runs["fuse"].measured == (("fuse", 1.4, "kept"),)
    quantize = runs["quantize"]
    assert not quantize.won and quantize.gain is None
    assert quantize.measured == (("quantize:a", 2.0, "unverified"), ("quantize:b", 1.1, "inaccurate"))
    assert quantize.unverified_gain == 2.0  # faster than what shipped: it must not count against the stage
    assert order.stage_runs(record, "avx2", winner=None, shipped_speedup=2.5)[1].unverified_gain is None
