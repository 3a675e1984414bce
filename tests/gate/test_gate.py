"""`lto gate`: verdicts and exit codes on samples with known distributions, outputs, baselines, --rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from optimize.errors import UsageError
from optimize.gate import (
    EXIT_CODES,
    IMPROVED,
    INCONCLUSIVE,
    PASS,
    REGRESSED,
    GateSettings,
    Side,
    decide,
    gate_reports,
    parse_fraction,
    pick_measurement,
)
from optimize.stats import bootstrap_ratio_ci
from sample_models.variants import add_extra_work, count_macs
from tests.cli_helpers import assert_clean_error, run_cli, run_lto
from tests.conftest import SAMPLES, make_matmul_model, sample_path

SPEC = {
    "seed": 0,
    "data_file": None,
    "data_sha256": None,
    "inputs": [
        {"name": "x", "dtype": "float32", "shape": [1, 16], "source": "generated", "generator": "normal"}
    ],
}


def latencies(
    n: int, scale: float = 1.0, sigma: float = 0.08, seed: int = 0, outliers: float = 0.01
) -> np.ndarray:
    """Realistic latency samples: log-normal around 2 ms * scale, plus rare 3x outliers (preemption)."""
    rng = np.random.default_rng(seed)
    x = 2.0 * scale * np.exp(rng.normal(0.0, sigma, n))
    spikes = rng.random(n) < outliers
    x[spikes] *= 3.0
    return x


def side(samples: np.ndarray, **kw: Any) -> Side:
    defaults: dict[str, Any] = {
        "name": "s",
        "label": "m",
        "fingerprint": "abcdef0123456789",
        "input_spec": SPEC,
    }
    return Side(samples_ms=np.asarray(samples, dtype=np.float64), **{**defaults, **kw})


def repetitions(
    scale: float = 1.0,
    reps: int = 10,
    seed: int = 0,
    between: float = 0.03,
    runs: int = 200,
    sigma: float = 0.08,
    outliers: float = 0.003,
) -> list[np.ndarray]:
    """Runs of `reps` processes: each process lands at its own level (log-normal, `between`),
    which no number of runs inside it averages away, as on a real machine."""
    rng = np.random.default_rng(seed)
    levels = np.exp(rng.normal(0.0, between, reps))
    return [
        latencies(runs, scale * level, sigma=sigma, seed=seed * 1000 + i, outliers=outliers)
        for i, level in enumerate(levels)
    ]


def repeated(parts: list[np.ndarray], load: float | None = 0.05, stable: bool = True, **kw: Any) -> Side:
    """A side from a saved report of several repetitions (lto bench --repeat)."""
    stability = {"stable": stable, "reasons": [] if stable else ["the repetitions disagree"],
                 "foreign_cpu_fraction": load}  # fmt: skip
    return side(np.concatenate(parts), repetitions=list(parts), stability=stability, **kw)


# ------------------------------------------------------------------------------ the statistical core


def test_exit_codes_are_distinct_and_avoid_cli_error_codes() -> None:
    assert EXIT_CODES == {PASS: 0, IMPROVED: 10, REGRESSED: 11, INCONCLUSIVE: 12}


@pytest.mark.parametrize(
    "text,value", [("5%", 0.05), ("0.05", 0.05), (" 2.5 % ", 0.025), ("0", 0.0), ("1", 1.0)]
)
def test_parse_fraction(text: str, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "abc", "-5%", "5%%", ""])
def test_parse_fraction_rejects_ambiguous_or_bad(text: str) -> None:
    with pytest.raises(UsageError):
        parse_fraction(text)


def test_equal_distributions_pass() -> None:
    r = decide(repeated(repetitions(seed=1)), repeated(repetitions(seed=2)))
    assert r.verdict == PASS and r.exit_code == 0, r.reason
    assert r.change_ci95 is not None and r.change_ci95[0] < 0 < r.change_ci95[1]
    assert "within the 5% budget" in r.reason
    assert r.ci_method is not None and r.ci_method.startswith("Hodges-Lehmann over 10 x 10 repetitions")
    assert r.repetition_values is not None and len(r.repetition_values["candidate"]) == 10


def test_shift_of_20_percent_regresses() -> None:
    r = decide(repeated(repetitions(seed=1)), repeated(repetitions(1.2, seed=2)))
    assert r.verdict == REGRESSED and r.exit_code == 11, r.reason
    assert r.change == pytest.approx(0.2, abs=0.04)
    assert r.change_ci95 is not None and r.change_ci95[0] > 0.05
    assert r.p_slower is not None and r.p_slower < 1e-3  # over 10 x 10 repetitions, not 4000 runs
    assert "beyond the 5% budget" in r.reason


def test_shift_of_minus_20_percent_improves() -> None:
    r = decide(repeated(repetitions(seed=1)), repeated(repetitions(0.8, seed=2)))
    assert r.verdict == IMPROVED and r.exit_code == 10
    assert r.change == pytest.approx(-0.2, abs=0.04)


def test_significant_but_tiny_change_passes_a_5_percent_budget() -> None:
    # 20 processes a side, 0.3% between them: a +1% shift is significant but inside the budget.
    base = repetitions(reps=20, seed=1, between=0.003, sigma=0.005, outliers=0)
    cand = repetitions(1.01, reps=20, seed=2, between=0.003, sigma=0.005, outliers=0)
    r = decide(repeated(base), repeated(cand))
    assert r.p_slower is not None and r.p_slower < 1e-4
    assert r.verdict == PASS
    assert "a significant change, but within the 5% budget" in r.reason
    # ... and the same samples do fail a budget smaller than the change.
    assert decide(repeated(base), repeated(cand), GateSettings(max_regression=0.001)).verdict == REGRESSED


def test_runs_inside_one_process_are_not_evidence() -> None:
    """The issue's case: two single-process reports 11% apart only because each process landed
    at its own level. Thousands of runs a side make the run-level test certain (p < 1e-4), so
    the gate refuses one-process reports and asks for repetitions."""
    base = side(latencies(3000, seed=1, outliers=0))
    cand = side(latencies(3000, 1.11, seed=2, outliers=0))
    r = decide(base, cand)
    assert r.verdict == INCONCLUSIVE and r.change is None
    assert "too few repetitions: the baseline has 1 and the candidate has 1" in r.reason
    assert "lto bench --repeat 5" in r.reason and "--rerun" in r.reason


def test_process_level_noise_is_inconclusive_never_regressed() -> None:
    # Processes spread by 15%: five a side cannot tell a 10% change from the budget.
    r = decide(
        repeated(repetitions(reps=5, seed=1, between=0.15)),
        repeated(repetitions(1.1, reps=5, seed=2, between=0.15)),
    )
    assert r.verdict == INCONCLUSIVE and r.exit_code == 12
    assert "too noisy" in r.reason and "straddles" in r.reason and "add repetitions" in r.reason


def test_one_odd_repetition_does_not_make_a_regression() -> None:
    cand = repetitions(seed=2)
    cand[3] = cand[3] * 2.5  # one process landed on a busy core
    r = decide(repeated(repetitions(seed=1)), repeated(cand))
    assert r.verdict == PASS, r.reason


def test_unstable_or_differently_loaded_reports_are_inconclusive() -> None:
    base, cand = repetitions(seed=1), repetitions(2.0, seed=2)
    r = decide(repeated(base), repeated(cand, stable=False))
    assert (
        r.verdict == INCONCLUSIVE
        and "the candidate report is unstable (the repetitions disagree)" in r.reason
    )
    r = decide(repeated(base, load=0.05), repeated(cand, load=0.6))
    assert r.verdict == INCONCLUSIVE and "load differed between the reports" in r.reason
    assert "5%" in r.reason and "60%" in r.reason
    assert decide(repeated(base, load=0.5), repeated(cand, load=0.6)).verdict == REGRESSED


def test_a_tail_needs_its_runs_in_every_repetition() -> None:
    base, cand = repetitions(reps=6, seed=1, runs=100), repetitions(1.3, reps=6, seed=2, runs=100)
    r = decide(repeated(base), repeated(cand), GateSettings(metric="p99"))
    assert r.verdict == INCONCLUSIVE and "too few runs per repetition for its p99: 100" in r.reason
    assert "--min-runs 368" in r.reason
    assert decide(repeated(base), repeated(cand), GateSettings(metric="p90")).verdict == REGRESSED  # 36


def test_min_repetitions_is_a_setting() -> None:
    base, cand = repetitions(reps=4, seed=1), repetitions(1.5, reps=4, seed=2)
    assert "too few repetitions" in decide(repeated(base), repeated(cand)).reason
    # 4 a side: the rank test's smallest one-sided p is 1/70, so it needs alpha above 0.014.
    four = GateSettings(min_repetitions=4)
    assert (
        "not significantly shifted (Mann-Whitney p=0.014)"
        in decide(repeated(base), repeated(cand), four).reason
    )
    four = GateSettings(min_repetitions=4, alpha=0.05)
    assert decide(repeated(base), repeated(cand), four).verdict == REGRESSED
    with pytest.raises(UsageError, match="min-repetitions must be at least 4"):
        GateSettings(min_repetitions=3)


def test_different_fingerprints_are_inconclusive_even_with_a_big_shift() -> None:
    r = decide(
        repeated(repetitions(seed=1)), repeated(repetitions(2.0, seed=2), fingerprint="ffffffffffffffff")
    )
    assert r.verdict == INCONCLUSIVE
    assert "different machines" in r.reason and "ffffffffffffffff" in r.reason
    assert r.change is None  # nothing was compared


def test_different_inputs_are_inconclusive() -> None:
    other = json.loads(json.dumps(SPEC))
    other["inputs"][0]["shape"] = [1, 32]
    r = decide(repeated(repetitions(seed=1)), repeated(repetitions(seed=2), input_spec=other))
    assert r.verdict == INCONCLUSIVE
    assert "different inputs" in r.reason and "shape" in r.reason


def test_input_spec_path_and_note_do_not_matter_but_data_hash_does() -> None:
    a = {**SPEC, "data_file": "/ci/a/inputs.npz", "data_sha256": "1" * 64}
    b = {**SPEC, "data_file": "/ci/b/inputs.npz", "data_sha256": "1" * 64}
    base, cand = repetitions(seed=1), repetitions(seed=2)
    assert decide(repeated(base, input_spec=a), repeated(cand, input_spec=b)).verdict == PASS
    c = {**b, "data_sha256": "2" * 64}
    r = decide(repeated(base, input_spec=a), repeated(cand, input_spec=c))
    assert r.verdict == INCONCLUSIVE and "data_sha256" in r.reason


def test_different_batch_sizes_are_inconclusive() -> None:
    r = decide(repeated(repetitions(seed=1)), repeated(repetitions(seed=2), batch_size=8))
    assert r.verdict == INCONCLUSIVE and "batch sizes (1 vs 8)" in r.reason


def test_too_few_samples_are_inconclusive() -> None:
    r = decide(side(latencies(5, seed=1)), side(latencies(500, 3.0, seed=2)))
    assert r.verdict == INCONCLUSIVE and "too few samples" in r.reason


@pytest.mark.parametrize("metric", ["p50", "p90", "p99", "throughput"])
def test_every_metric_sees_a_20_percent_slowdown(metric: str) -> None:
    # 500 runs a process and spikes in 0.3% of runs: p99 measures the bulk's tail, not the spikes.
    base, cand = repetitions(seed=1, runs=500), repetitions(1.2, seed=2, runs=500)
    r = decide(repeated(base), repeated(cand), GateSettings(metric=metric))
    assert r.verdict == REGRESSED, r.reason
    if metric == "throughput":
        # throughput = 1000 * batch / mean latency: 20% slower is ~16.7% less throughput.
        assert r.ratio == pytest.approx(1 / 1.2, abs=0.03)
        assert r.candidate_value is not None and r.baseline_value is not None
        assert r.candidate_value < r.baseline_value
        assert "throughput" in r.reason and "lower" in r.reason


def test_same_inputs_give_the_same_verdict_and_figures() -> None:
    a, b = repetitions(seed=1), repetitions(1.04, seed=2)
    r1, r2 = decide(repeated(a), repeated(b)), decide(repeated(a), repeated(b))
    assert (r1.verdict, r1.change_ci95) == (r2.verdict, r2.change_ci95)


@pytest.mark.slow
def test_error_rates_on_known_distributions() -> None:
    """Over 100 trials of 12 processes a side, 5% apart between processes: no false alarm for
    identical distributions, no more than 5 misses for a 15% shift."""
    false_alarms = misses = 0
    for trial in range(100):
        base = repeated(repetitions(reps=12, seed=10_000 + trial, between=0.05, runs=50))
        same = repeated(repetitions(reps=12, seed=20_000 + trial, between=0.05, runs=50))
        slower = repeated(repetitions(1.15, reps=12, seed=30_000 + trial, between=0.05, runs=50))
        false_alarms += decide(base, same).verdict == REGRESSED
        misses += decide(base, slower).verdict != REGRESSED
    assert false_alarms == 0
    assert misses <= 5


def test_hodges_lehmann_interval_covers_the_true_ratio() -> None:
    from optimize.gate import hodges_lehmann_ratio

    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(400):
        a = np.exp(rng.normal(0.0, 0.1, 6))
        b = np.exp(rng.normal(0.0, 0.1, 7)) * 1.1
        _, lo, hi = hodges_lehmann_ratio(a, b)
        covered += lo <= 1.1 <= hi
    assert 0.92 <= covered / 400 <= 0.99  # a 95% interval, exact under the shift model
    # 4 x 4: the 95% interval is the 1st..16th of the 16 pairwise ratios; 3 x 3 has none.
    ratio, lo, hi = hodges_lehmann_ratio(np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 8.0]))
    assert ratio == pytest.approx(2.0) and (lo, hi) == (pytest.approx(0.5), pytest.approx(8.0))
    assert hodges_lehmann_ratio(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0]))[1:] == (0.0, np.inf)


def chunked(k: int, per: int, scale: float, chunk_sigma: float, seed: int) -> np.ndarray:
    """Interleaved-style samples: k chunks, each slowed by its own load factor (bursts of other jobs)."""
    rng = np.random.default_rng(seed)
    factors = np.exp(rng.normal(0.0, chunk_sigma, k))
    return (2.0 * scale * factors[:, None] * np.exp(rng.normal(0.0, 0.03, (k, per)))).ravel()


@pytest.mark.slow
def test_chunk_bootstrap_keeps_load_bursts_from_becoming_verdicts() -> None:
    """Runs within a chunk share the machine's load, so they are not independent samples.

    Resampling single runs gives a CI that is far too narrow and calls identical models
    "improved" or "regressed"; resampling chunk pairs does not.
    """
    wrong_by_chunks = wrong_by_runs = 0
    for seed in range(40):
        a, b = chunked(12, 100, 1.0, 0.1, 1000 + seed), chunked(12, 100, 1.0, 0.1, 5000 + seed)
        by_chunks = decide(side(a, chunks=12), side(b, chunks=12), GateSettings(resamples=500))
        assert by_chunks.ci_method == "AB/BA bootstrap over 12 interleaved chunk pairs"
        wrong_by_chunks += by_chunks.verdict in (REGRESSED, IMPROVED)
        # Resampling single runs as if independent: the mistake the chunks avoid.
        _, lo, hi = bootstrap_ratio_ci(a, b, "p50", n=500)
        wrong_by_runs += hi < 0.95 or lo > 1.05
    assert wrong_by_chunks == 0
    assert wrong_by_runs > 0  # why the chunks matter


def test_chunk_bootstrap_still_sees_a_real_slowdown() -> None:
    a, b = chunked(30, 50, 1.0, 0.05, 1), chunked(30, 50, 1.2, 0.05, 2)
    r = decide(side(a, chunks=30), side(b, chunks=30))
    assert r.verdict == REGRESSED, r.reason


def order_effect(k: int, scale_b: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One run per side per chunk; whichever side runs second in a chunk is 4x slower.

    That is what a loaded machine did to interleaved runs here. A runs first in even chunks.
    """
    rng = np.random.default_rng(seed)
    a = 2.0 * np.exp(rng.normal(0.0, 0.03, k))
    b = 2.0 * scale_b * np.exp(rng.normal(0.0, 0.03, k))
    second = np.arange(k) % 2
    return a * np.where(second == 1, 4.0, 1.0), b * np.where(second == 0, 4.0, 1.0)


def test_crossover_cancels_which_side_ran_second() -> None:
    for seed in range(5):
        a, b = order_effect(41, 1.0, seed)  # odd k: one more chunk with A first
        same = decide(side(a, chunks=41), side(b, chunks=41))
        assert same.verdict == PASS and abs(same.change or 1) < 0.02, same.reason
        a, b = order_effect(41, 1.2, seed)
        assert decide(side(a, chunks=41), side(b, chunks=41)).verdict == REGRESSED


def test_too_few_chunks_are_inconclusive() -> None:
    a, b = chunked(4, 100, 1.0, 0.01, 1), chunked(4, 100, 2.0, 0.01, 2)
    r = decide(side(a, chunks=4), side(b, chunks=4))
    assert r.verdict == INCONCLUSIVE and "too few interleaved chunks (4" in r.reason


def test_settings_are_validated() -> None:
    with pytest.raises(UsageError, match="unknown metric"):
        GateSettings(metric="p75")
    with pytest.raises(UsageError, match="alpha"):
        GateSettings(alpha=0.9)


def test_pick_measurement_prefers_label_then_final_then_last() -> None:
    report = {"results": [{"label": "original"}, {"label": "final"}, {"label": "fused"}]}
    assert pick_measurement(report)["label"] == "final"
    assert pick_measurement({"results": report["results"][::2]})["label"] == "fused"
    assert pick_measurement(report, "original")["label"] == "original"
    with pytest.raises(UsageError, match="no measurement labelled 'nope'"):
        pick_measurement(report, "nope")
    # An optimize report: the shipped artifact's row from the final side-by-side comparison.
    optimized = {
        "optimize": {"best": {"label": "ort-extended"}},
        "results": [
            {"label": "baseline"},
            {"label": "ort-extended"},
            {"label": "quantize-int8"},  # measured after, rejected
            {"label": "baseline (final comparison)"},
            {"label": "ort-extended (final comparison)"},
        ],
    }
    assert pick_measurement(optimized)["label"] == "ort-extended (final comparison)"
    optimized["results"] = optimized["results"][:3]
    assert pick_measurement(optimized)["label"] == "ort-extended"


# ------------------------------------------------------------------------------ reports through the CLI


def write_bench_report(
    path: Path,
    samples: np.ndarray | list[np.ndarray],
    *,
    fingerprint: str | None = None,
    labels: tuple[str, ...] = ("mlp@b1",),
    batch: int = 1,
    spec: dict[str, Any] | None = None,
    model: str = "models/mlp.onnx",
    load: float = 0.05,
) -> Path:
    """A bench report: one process's runs (an array), or repetitions (a list of arrays) merged
    the way `lto bench --repeat` merges them."""
    from optimize.bench import Measurement
    from optimize.bench.repeat import merge_measurements
    from optimize.report import new_report, write_report

    report = new_report("bench", input_spec=spec or SPEC)
    report["model"] = {"path": model, "sha256": "0" * 64, "size_bytes": 1}
    if fingerprint:
        report["environment"]["fingerprint"] = fingerprint
    parts = samples if isinstance(samples, list) else [samples]

    def measurement(label: str, runs: np.ndarray) -> dict[str, Any]:
        return Measurement(
            label, "onnxruntime", batch, [float(s) for s in runs], 10, 1.0, "time", load
        ).to_json()

    report["results"] = [
        merge_measurements([measurement(label, p) for p in parts])
        if len(parts) > 1
        else measurement(label, parts[0])
        for label in labels
    ]
    write_report(path, report)
    return path


def six(scale: float, seed: int) -> list[np.ndarray]:
    """Six processes of 100 runs each, 1% apart (a quiet machine)."""
    return repetitions(scale, reps=6, seed=seed, runs=100, between=0.01)


@pytest.fixture
def reports(tmp_path: Path) -> dict[str, Path]:
    return {
        "base": write_bench_report(tmp_path / "base.json", six(1.0, 1)),
        "same": write_bench_report(tmp_path / "same.json", six(1.0, 2)),
        "slow": write_bench_report(tmp_path / "slow.json", six(1.25, 3)),
        "fast": write_bench_report(tmp_path / "fast.json", six(0.75, 4)),
        "other_machine": write_bench_report(
            tmp_path / "other.json", six(1.0, 5), fingerprint="0123456789abcdef"
        ),
        "one_process": write_bench_report(tmp_path / "one.json", latencies(600, seed=6)),
    }


@pytest.mark.parametrize(
    "which,code,verdict", [("same", 0, "pass"), ("slow", 11, "regressed"), ("fast", 10, "improved"),
                           ("other_machine", 12, "inconclusive"), ("one_process", 12, "inconclusive")]
)  # fmt: skip
def test_cli_exit_codes_and_json(reports: dict[str, Path], which: str, code: int, verdict: str) -> None:
    proc = run_cli("gate", "--baseline", reports["base"], "--candidate", reports[which], "--json")
    assert proc.returncode == code, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"] == verdict and data["exit_code"] == code
    assert data["metric"] == "p50" and data["settings"]["max_regression"] == 0.05
    assert data["baseline"]["runs"] == 600 and data["candidate"]["name"] == str(reports[which])
    assert data["baseline"]["repetitions"] == 6
    if which != "other_machine":  # not compared at all
        assert len(data["repetition_values"]["baseline"]) == 6
    assert isinstance(data["reason"], str) and "\n" not in data["reason"]


def test_cli_table_and_markdown(reports: dict[str, Path], tmp_path: Path) -> None:
    # Needs a process: CI reads the verdict from the exit status of the real `lto gate`.
    summary = tmp_path / "summary.md"
    proc = run_lto("gate", "--baseline", reports["base"], "--candidate", reports["slow"],
                   "--max-regression", "0.1", "--markdown", summary)  # fmt: skip
    assert proc.returncode == 11
    assert "regressed" in proc.stdout and "beyond the 10% budget" in proc.stdout
    text = summary.read_text()
    assert text.startswith("## ❌ lto gate: regressed (exit 11)")
    assert "| p50 |" in text and "| runs | 600 | 600 |" in text and "beyond the 10% budget" in text
    assert "| repetitions | 6 | 6 |" in text and "| p50 per repetition |" in text
    assert "Unstable inputs" not in text


def test_markdown_says_when_an_input_was_unstable(reports: dict[str, Path], tmp_path: Path) -> None:
    report = json.loads(reports["same"].read_text())
    report["results"][0]["stability"].update(stable=False, reasons=["the repetitions disagree: p50 1..2 ms"])
    (tmp_path / "shaky.json").write_text(json.dumps(report))
    summary = tmp_path / "summary.md"
    proc = run_cli("gate", "--baseline", reports["base"], "--candidate", tmp_path / "shaky.json",
                   "--markdown", summary)  # fmt: skip
    assert proc.returncode == 12
    text = summary.read_text()
    assert "the candidate report is unstable" in text and "**Unstable inputs**" in text
    assert "the repetitions disagree: p50 1..2 ms" in text and "| stable | yes | NO |" in text


@pytest.mark.slow
def test_cli_output_is_a_valid_gate_report(reports: dict[str, Path], tmp_path: Path) -> None:
    from optimize.render.markdown import render_markdown
    from optimize.report import load_report

    out = tmp_path / "gate.json"
    proc = run_cli("gate", "--baseline", reports["base"], "--candidate", reports["same"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    report = load_report(out)  # validates against the schema
    assert report["kind"] == "gate" and report["gate"]["verdict"] == "pass"
    assert "lto gate: pass" in render_markdown(report)
    # The evidence goes with the verdict: both measurements, their runs and repetitions.
    assert [r["label"] for r in report["results"]] == ["baseline: mlp@b1", "candidate: mlp@b1"]
    assert [len(r["repetitions"]) for r in report["results"]] == [6, 6]


@pytest.mark.slow
def test_metric_and_budget_options(tmp_path: Path) -> None:
    # 25% slower fails a 5% budget and passes a 50% one, on every metric. 500 runs a process:
    # enough for each process's p99 (368), which 100 runs are not.
    def report(name: str, scale: float, seed: int) -> Path:
        parts = repetitions(scale, reps=6, seed=seed, runs=500, between=0.01, outliers=0)
        return write_bench_report(tmp_path / name, parts)

    base, slow = report("base.json", 1.0, 1), report("slow.json", 1.25, 3)
    for metric in ("p50", "p90", "p99", "throughput"):
        strict = gate_reports(slow, baseline_file=base, settings=GateSettings(metric))
        loose = gate_reports(slow, baseline_file=base, settings=GateSettings(metric, max_regression=0.5))
        assert (strict.verdict, loose.verdict) == (REGRESSED, PASS), (metric, strict.reason, loose.reason)
    proc = run_cli(
        "gate", "--baseline", base, "--candidate", slow, "--percentile", "p99", "--max-regression", "50%",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["metric"] == "p99"
    # The old spelling still works, with a warning: --metric means a Python function in optimize.
    old = run_cli("gate", "--baseline", base, "--candidate", slow, "-m", "p99", "--max-regression", "50%")
    assert old.returncode == 0 and "--metric is deprecated, use --percentile" in old.stderr


def test_cli_picks_the_final_measurement_or_the_label(tmp_path: Path) -> None:
    base = write_bench_report(tmp_path / "b.json", six(1.0, 1))
    # An optimize-style report: "original" is slow, "final" is the shipped artifact.
    write_bench_report(tmp_path / "c.json", six(1.0, 2), labels=("original", "final"))
    report = json.loads((tmp_path / "c.json").read_text())
    report["results"][0]["samples_ms"] = [s * 2 for s in report["results"][0]["samples_ms"]]
    (tmp_path / "c.json").write_text(json.dumps(report))
    assert gate_reports(tmp_path / "c.json", baseline_file=base).verdict == PASS
    picked = gate_reports(tmp_path / "c.json", baseline_file=base, label="original", baseline_label="mlp@b1")
    assert (
        picked.verdict == REGRESSED and picked.candidate is not None and picked.candidate.label == "original"
    )
    assert_clean_error(
        run_cli("gate", "--baseline", base, "--candidate", tmp_path / "c.json", "--label", "nope"),
        2,
        "no measurement labelled",
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-regression", "5"], "ambiguous --max-regression"),
        (["--percentile", "p75"], "--percentile p75 is not one lto reports"),
        (["--update-baseline"], "--update-baseline needs --baseline-dir"),
        (["--shape", "x=1x16"], "apply to --rerun only"),
    ],
)
def test_cli_usage_errors(reports: dict[str, Path], args: list[str], needle: str) -> None:
    assert_clean_error(
        run_cli("gate", "--baseline", reports["base"], "--candidate", reports["same"], *args), 2, needle
    )


def test_cli_missing_or_sampleless_reports(reports: dict[str, Path], tmp_path: Path) -> None:
    assert_clean_error(
        run_cli("gate", "--baseline", tmp_path / "nope.json", "--candidate", reports["same"]), 2, "not found"
    )
    report = json.loads(reports["same"].read_text())
    report["results"][0]["samples_ms"] = report["results"][0]["samples_ms"][:-5]
    (tmp_path / "cut.json").write_text(json.dumps(report))
    assert_clean_error(
        run_cli("gate", "--baseline", reports["base"], "--candidate", tmp_path / "cut.json"),
        2,
        "do not add up to its samples_ms",
    )
    proc = run_cli("gate", "--baseline", reports["base"], "--candidate", reports["one_process"])
    assert proc.returncode == 12 and "too few repetitions" in proc.stdout


# ------------------------------------------------------------------------------ baselines per machine


def test_baseline_dir_lifecycle(reports: dict[str, Path], tmp_path: Path) -> None:
    from optimize.system.env import machine_fingerprint

    bdir = tmp_path / "baselines"
    stored = bdir / machine_fingerprint() / "mlp.json"

    def gate(which: str, update: bool = False, force: bool = False) -> str:
        result = gate_reports(
            reports[which], baseline_dir=bdir, update_baseline=update, force_update_baseline=force
        )
        return result.verdict

    def stored_results() -> list:
        return json.loads(stored.read_text())["results"]

    def results_of(which: str) -> list:
        return json.loads(reports[which].read_text())["results"]

    # No baseline yet: inconclusive (exit 12); --update-baseline stores the candidate.
    proc = run_cli("gate", "--baseline-dir", bdir, "--candidate", reports["base"], "--json")
    assert proc.returncode == 12 and "no baseline stored" in json.loads(proc.stdout)["reason"]
    assert not stored.exists()
    proc = run_cli(
        "gate", "--baseline-dir", bdir, "--candidate", reports["base"], "--update-baseline", "--json"
    )
    assert proc.returncode == 12 and json.loads(proc.stdout)["baseline_written"] == str(stored)
    assert stored_results() == results_of("base")

    # A pass or a regression does not move the baseline, so small slowdowns cannot creep in.
    assert gate("same", update=True) == PASS
    assert gate("slow", update=True) == REGRESSED
    assert stored_results() == results_of("base")

    # An improvement does; the next comparison is against it.
    assert gate("fast", update=True) == IMPROVED
    assert stored_results() == results_of("fast")
    assert gate("same") == REGRESSED

    # --force-update-baseline accepts even a regression, on purpose.
    assert gate("slow", force=True) == REGRESSED
    assert stored_results() == results_of("slow")
    assert sorted(p.name for p in stored.parent.iterdir()) == ["mlp.json"]  # atomic: no temp files left


def test_a_small_or_unstable_report_never_becomes_the_baseline(
    reports: dict[str, Path], tmp_path: Path
) -> None:
    bdir = tmp_path / "baselines"
    # One process: too few repetitions to ever compare against, with or without force.
    for force in (False, True):
        result = gate_reports(
            reports["one_process"], baseline_dir=bdir, update_baseline=not force, force_update_baseline=force
        )
        assert result.verdict == INCONCLUSIVE and result.baseline_written is None
        assert "not stored as the baseline: it holds 1 repetition(s)" in result.reason
    assert not bdir.exists() or not any(bdir.rglob("*.json"))
    # Unstable: refused too, even when it looks like an improvement.
    assert gate_reports(reports["base"], baseline_dir=bdir, update_baseline=True).baseline_written
    shaky = json.loads(reports["fast"].read_text())
    shaky["results"][0]["stability"].update(stable=False, reasons=["the repetitions disagree"])
    (tmp_path / "shaky.json").write_text(json.dumps(shaky))
    result = gate_reports(tmp_path / "shaky.json", baseline_dir=bdir, force_update_baseline=True)
    assert result.baseline_written is None and "it is unstable (the repetitions disagree)" in result.reason


def test_baseline_dir_keeps_machines_apart(reports: dict[str, Path], tmp_path: Path) -> None:
    bdir = tmp_path / "baselines"
    assert gate_reports(reports["base"], baseline_dir=bdir, update_baseline=True).baseline_written
    # Another machine's report finds no baseline of its own rather than this machine's.
    other = gate_reports(reports["other_machine"], baseline_dir=bdir)
    assert other.verdict == INCONCLUSIVE and "no baseline stored" in other.reason
    assert other.baseline_file == str(bdir / "0123456789abcdef" / "mlp.json")
    assert_clean_error(
        run_cli("gate", "--baseline-dir", bdir, "--candidate", reports["base"], "--name", "../escape"),
        2,
        "bad baseline name",
    )
    assert_clean_error(
        run_cli(
            "gate", "--baseline", reports["base"], "--baseline-dir", bdir, "--candidate", reports["same"]
        ),
        2,
        "exactly one",
    )


# ------------------------------------------------------------------------------ real measurements


@pytest.mark.parametrize("name,shape", [("mlp_small.onnx", (2, 256)), ("resnet_tiny.onnx", (2, 3, 64, 64))])
def test_slower_model_keeps_outputs_and_adds_work(tmp_path: Path, name: str, shape: tuple[int, ...]) -> None:
    model = onnx.load(str(sample_path(name)))
    slow, layers = add_extra_work(model, 0.15)
    assert layers >= 1
    assert count_macs(slow) / count_macs(model) - 1 == pytest.approx(0.15, abs=0.02)
    onnx.save(slow, str(tmp_path / "slow.onnx"))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    a = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(tmp_path / "slow.onnx"), providers=["CPUExecutionProvider"])
    feeds = {a.get_inputs()[0].name: x}
    for out_a, out_b in zip(a.run(None, feeds), b.run(None, feeds), strict=True):
        np.testing.assert_array_equal(out_a, out_b)


def _model(tmp_path: Path) -> Path:
    path = SAMPLES / "mlp_small.onnx"
    return path if path.exists() else make_matmul_model(tmp_path / "mlp.onnx", 256, 10)


@pytest.mark.slow
@pytest.mark.timing
def test_rerun_model_against_itself_is_not_regressed(tmp_path: Path) -> None:
    model = _model(tmp_path)
    summary = tmp_path / "s.md"
    proc = run_cli("gate", "--rerun", "--baseline", model, "--candidate", model, "--shape", "batch=1",
                   "--time", "2", "--json", "--markdown", summary)  # fmt: skip
    assert proc.returncode in (0, 12), (proc.stdout, proc.stderr)
    data = json.loads(proc.stdout)
    assert data["verdict"] in ("pass", "inconclusive")
    assert data["interleaved_runs"][0]["run"] == 1 and data["baseline"]["runs"] >= 20
    if data["change"] is not None:  # decided on chunk pairs, not on single runs
        assert "interleaved chunk pairs" in data["ci_method"]
    assert "lto gate:" in summary.read_text()


@pytest.mark.slow
@pytest.mark.timing
def test_rerun_flags_a_much_slower_model(tmp_path: Path) -> None:
    model = _model(tmp_path)
    slow = tmp_path / "slow.onnx"
    onnx.save(add_extra_work(onnx.load(str(model)), 3.0)[0], str(slow))
    out = tmp_path / "gate.json"
    proc = run_cli("gate", "--rerun", "--baseline", model, "--candidate", slow, "--shape", "batch=1",
                   "--time", "2", "--json", "-o", out)  # fmt: skip
    data = json.loads(proc.stdout)
    assert proc.returncode == 11, (data["reason"], proc.stderr)
    assert [r["run"] for r in data["interleaved_runs"]] == [1, 2]  # confirmed by a second interleaved run
    assert "confirmed" in data["reason"]
    from optimize.report import load_report

    report = load_report(out)
    assert report["kind"] == "gate" and len(report["results"]) == 2 and report["comparison"]["chunks"] >= 4


def test_rerun_usage_errors(tmp_path: Path) -> None:
    model = _model(tmp_path)
    assert_clean_error(run_cli("gate", "--rerun", "--candidate", model), 2, "--rerun needs --baseline")
    assert_clean_error(
        run_cli("gate", "--rerun", "--baseline", model, "--candidate", model, "--update-baseline"),
        2,
        "apply to reports",
    )
    assert_clean_error(
        run_cli("gate", "--rerun", "--baseline", tmp_path / "nope.onnx", "--candidate", model), 2, "not found"
    )
