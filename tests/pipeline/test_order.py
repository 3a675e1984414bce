"""The search order (optimize/pipeline/order.py): the likeliest win per second first, from the
corpus prior and this machine's history; what a run records; when a comparison gives up; the
default time budget and the time to the best artifact."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from optimize.errors import UsageError
from optimize.pipeline import order
from optimize.pipeline.evaluate import BestSoFar
from optimize.pipeline.request import DEFAULT_TIME_BUDGET_S, OptimizeRequest
from optimize.recipes import StageSpec
from optimize.stage import Candidate
from optimize.units import limit_parser
from tests.cli_helpers import run_cli
from tests.conftest import make_matmul_model
from tests.pipeline.test_pipeline import FakeStage, by_label, model_candidate, run_fake, write_recipe

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


def test_this_machines_history_refines_the_prior(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    win = order.Outcome("transformer", "bf16", "quantize", ran_s=10.0, won=True, gain=3.5)
    for _ in range(6):
        order.append_history(history, "this-machine", [win])
    order.append_history(history, "another-machine", [win])
    with history.open("a") as fh:
        fh.write("{not json\n")  # a damaged line is skipped: the history is a cache
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
    assert {row["cpu"] for row in rows} <= {"bf16", "vnni", "avx2", "other"}
    assert all(0 <= row["won"] <= row["tried"] and row["cost_s"] > 0 for row in rows)


def test_a_stage_starts_from_its_own_runtimes_best(tmp_path: Path) -> None:
    original = Candidate(label="baseline", model_path=tmp_path / "m.onnx")
    best = BestSoFar(original)
    ir = Candidate(label="openvino-convert:bf16", model_path=tmp_path / "m.xml", backend="openvino")
    best.adopt(ir, worker=_Closed(), speedup=2.5, accuracy=best.accuracy)
    assert best.candidate is ir
    assert best.of_runtime("onnxruntime") is original  # not an IR it cannot read
    assert best.of_runtime("openvino") is ir and best.of_runtime("tvm") is ir
    fused = Candidate(label="operator-fusion", model_path=tmp_path / "f.onnx")
    best.adopt(fused, worker=_Closed(), speedup=2.6, accuracy=best.accuracy)
    assert best.of_runtime("onnxruntime") is fused and best.of_runtime("openvino") is ir


class _Closed:
    def close(self) -> None:
        pass


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
