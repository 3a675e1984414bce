"""Markdown rendering: each report kind through `lto report`, and the sections on known data."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optimize.gate import EXIT_CODES, Side, decide
from optimize.render.markdown import gate_section, render_markdown
from optimize.report import load_report, new_report
from optimize.serve.loadgen import HttpEndpoint, LoadResult, LoadSettings, MaxQpsSearch
from optimize.serve.loadgen import load_report as make_load_report
from tests.cli_helpers import run_cli
from tests.render.conftest import KINDS
from tests.test_report import SAMPLE_MEASUREMENT


def _bench_report(tmp_path: Path) -> dict[str, Any]:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"fake model bytes")
    report = new_report("bench", model_path=model, input_spec=None, settings={"x": 1})
    report["results"].append(SAMPLE_MEASUREMENT)
    return report


def test_markdown_rendering_has_the_numbers(tmp_path: Path) -> None:
    report = _bench_report(tmp_path)
    report["comparison"] = {"labels": ["A", "B"], "metric": "p50", "ratio": 0.5, "ratio_ci95": [0.45, 0.55],
                            "speedup": 2.0, "chunks": 8}  # fmt: skip
    text = render_markdown(report)
    assert "| m@b1 | onnxruntime | 1 | 1.100 |" in text
    assert "B is faster than A" in text
    assert report["environment"]["fingerprint"] in text
    # No final comparison among the rows: nothing to tell apart from a headline.
    assert "final comparison's rows pool" not in text


def test_the_final_comparisons_rows_say_they_pool_every_run_unlike_the_headline(tmp_path: Path) -> None:
    # make demo's report.md: rows of 2.498 / 5.355 ms beside a headline of 2.508 / 5.415 ms from
    # the same runs' block pairs; the report says which figure is which.
    report = _bench_report(tmp_path)
    report["results"] = [{**SAMPLE_MEASUREMENT, "label": f"{side} (final comparison)"} for side in ("a", "b")]
    text = render_markdown(report)
    assert "| a (final comparison) | onnxruntime | 1 | 1.100 |" in text
    assert "The final comparison's rows pool every run of each side" in text


def test_a_section_renderer_that_cannot_be_imported_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A renderer that failed to import used to be swallowed: the section came out as raw JSON.
    # Imported with the renderer now, it fails the renderer's import: no report is downgraded.
    monkeypatch.setitem(sys.modules, "optimize.render.optimize_section", None)
    monkeypatch.delitem(sys.modules, "optimize.render.markdown")
    with pytest.raises(ImportError):
        importlib.import_module("optimize.render.markdown")


# -- gate --------------------------------------------------------------------------------------


def _gate_data() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    base_parts = [rng.normal(1.0, 0.01, 40) for _ in range(6)]
    cand_parts = [rng.normal(0.5, 0.01, 40) for _ in range(6)]
    base = Side("base.json", "m", np.concatenate(base_parts), fingerprint="f", repetitions=base_parts)
    cand = Side("cand.json", "m", np.concatenate(cand_parts), fingerprint="f", repetitions=cand_parts)
    return decide(base, cand).to_json()


def test_gate_section_shows_a_p_value_of_zero_as_tiny_not_as_one() -> None:
    data = _gate_data()
    data["mann_whitney"] = {"p_slower": 1.0, "p_faster": 0.0}
    text = gate_section(data)
    assert "| Mann-Whitney U p | | slower 1 / faster <1e-4 |" in text
    assert "faster 1 " not in text and "faster 1 |" not in text


def test_gate_section_has_the_verdict_and_numbers() -> None:
    data = _gate_data()
    text = gate_section(data)
    assert text.startswith(f"## 🚀 lto gate: improved (exit {EXIT_CODES['improved']})")
    assert f"| p50 | {data['baseline_value']:.3f} ms | {data['candidate_value']:.3f} ms |" in text
    assert "| source | `base.json` | `cand.json` |" in text


# -- load --------------------------------------------------------------------------------------


def _step(settings: LoadSettings, qps: float, latency_ms: float, errors: int = 0) -> LoadResult:
    result = LoadResult(
        replace(settings, qps=qps),
        f"poisson {qps:.1f} qps",
        samples_ms=[latency_ms] * 45 + [latency_ms * 2] * 5,
        issued=50 + errors,
        wall_s=0.5,
    )
    result.batch_rows.update({1: 30, 2: 20})
    if errors:
        result.errors["http_503"] = errors
    return result


def test_load_section_of_a_max_qps_search() -> None:
    settings = LoadSettings(qps=100.0, requests=50, slo_ms=2.0, percentile=99.0, warmup=0)
    steps = [_step(settings, 100.0, 0.5), _step(settings, 200.0, 0.8), _step(settings, 400.0, 3.0, errors=4)]
    target = HttpEndpoint("http://127.0.0.1:8000", "mlp", {"x": np.zeros((1, 4), np.float32)})
    report = make_load_report(
        steps,
        target=target,
        backend="remote",
        model_path=None,
        input_spec=None,
        settings=settings,
        search=MaxQpsSearch(200.0, steps),
    )
    report["settings"]["find_max_qps"] = True
    text = render_markdown(report)
    load = text[text.index("## Load") :]
    assert "```" not in text
    assert "- target: `http://127.0.0.1:8000` (http), model `mlp`" in load
    assert "searching the highest rate that meets the SLO; 50 requests" in load and "SLO p99 ≤ 2 ms" in load
    # one row per step: issued, ok, errors, achieved rate (50 ok in 0.5 s), p50
    assert "| poisson 400.0 qps | 54 | 50 | 4 (7.4%) | 100.0 | 3.000 |" in load
    assert "- errors: http_503 4" in load
    assert "| p99 ms |" in load  # the curve's tail column names the SLO's percentile
    assert "| 200.0 | 100.0 | 0.800 | 1.600 | 0.0% | 1.4 | pass |" in load
    assert "| 400.0 | 100.0 | 3.000 | 6.000 | 7.4% | 1.4 | fail |" in load
    assert "Max qps within the SLO: **200.0**" in load
    assert load.rstrip().endswith("Verdict: **PASS**")


# -- every report kind, produced by the real commands ---------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.3f}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_lto_report_renders_every_kind_as_markdown_with_its_numbers(
    reports: dict[str, Path], kind: str
) -> None:
    data = load_report(reports[kind])
    assert data["kind"] == kind
    proc = run_cli("report", reports[kind])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith(f"# lto {kind} report\n")
    assert "```json" not in text and "\n{" not in text, "a section fell back to raw JSON"
    assert f"- model: `{data['model']['path']}`" in text
    for m in data["results"]:  # every measurement's row, with its p50
        assert (
            f"| {m['label']} | {m['backend']} | {m['batch_size']} | {_ms(m['latency_ms']['p50'])} |" in text
        )
    if kind == "compare":
        comparison = data["comparison"]
        assert "## Comparison (side by side)" in text and f"= {comparison['ratio']:.3f} (95% CI" in text
        a_ms, b_ms = comparison["latency_ms"]["A"], comparison["latency_ms"]["B"]
        assert f"A {a_ms:.3f} ms, B {b_ms:.3f} ms" in text
    elif kind == "optimize":
        section = data["optimize"]
        assert "## Optimization" in text
        assert f"**{section['verdict']}** (exit code {section['exit_code']})" in text
        assert f"**{section['speedup']:.2f}x**" in text
        # The answer comes first: what shipped, how much faster, then the run's details.
        assert text.index("## Summary") < text.index("## Run") < text.index("## Optimization")
        assert "**Next**" in text and f"lto serve {section['artifact']}" in text
    elif kind == "load":
        run = data["load"]["runs"][0]
        verdict = data["load"]["verdict"]
        assert "## Load" in text
        assert f"| {run['throughput_per_s']:.1f} |" in text  # achieved rate
        assert f"| {_ms(run['latency_ms']['p99'])} |" in text
        assert f"Verdict: **PASS** (p99 {_ms(verdict['value_ms'])} ms ≤ SLO 10000 ms)" in text
        assert "- scheduled by MLPerf LoadGen" in text and "- LoadGen result: **VALID**" in text
        floor = data["load"]["floor"]["run"]  # the target beside its floor, figures as measured
        p50_ratio = run["latency_ms"]["p50"] / floor["latency_ms"]["p50"]
        assert "### Against the floor" in text and f"| target / floor | {p50_ratio:.2f}x |" in text
    elif kind == "gate":
        gate = data["gate"]
        assert f"lto gate: {gate['verdict']} (exit {gate['exit_code']})" in text
        assert gate["reason"] in text
        if gate["baseline_value"] is None:  # a loaded machine can leave too few chunks to compare
            assert "| p50 | - | - |" in text and gate["verdict"] == "inconclusive"
        else:
            assert f"| p50 | {_ms(gate['baseline_value'])} ms | {_ms(gate['candidate_value'])} ms |" in text


def test_lto_report_writes_the_same_markdown_to_a_file(reports: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "load.md"
    proc = run_cli("report", reports["load"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    # the file also ends with lto's "may replace" marker
    assert out.read_text().startswith(render_markdown(json.loads(reports["load"].read_text())))


def test_markdown_lists_repetitions_and_flags_thin_tails(tmp_path: Path) -> None:
    from tests.gate.test_gate import repetitions, write_bench_report

    path = write_bench_report(tmp_path / "r.json", repetitions(reps=5, seed=1, runs=80))
    report = load_report(path)
    (m,) = report["results"]
    text = render_markdown(report)
    assert "### mlp@b1: 5 repetitions, each a fresh process" in text
    for r in m["repetitions"]:
        assert f"| {r['index']} | {r['runs']} | {r['latency_ms']['p50']:.3f} |" in text
    # 400 runs: enough for a p99 (368), not for a p99.9 (3,688)
    assert m["too_few_runs_for"] == {"p999": 3688}
    assert "- mlp@b1: 400 runs are too few to estimate its tail (p99.9 needs 3,688)" in text


def test_a_mixed_precision_artifact_lists_its_lifted_nodes_and_the_search() -> None:
    from optimize.render.optimize_section import mix_lines

    label = "openvino-quantize:int8-bf16"
    lifted = [{"node": f"n{i}", "precision": "bf16", "added_rel_error": 0.1 / (i + 1)} for i in range(10)]
    attempts = [
        {"step": "defaults", "float_parts": "fp32", "excluded": 0, "accuracy_ok": False, "worst_cosine": 0.9},
        {"step": "lift top 10", "float_parts": "bf16", "excluded": 10, "accuracy_ok": True},
        {"step": "lift top 20", "float_parts": "bf16", "error": "NNCF failed"},
    ]
    section = {
        "best": {"label": label, "precision": "int8+bf16", "lifted": lifted},
        "stages": [{"label": label, "details": {"attempts": attempts}}],
    }
    lines = mix_lines(section)
    assert lines[0].startswith("- precision by layer: int8 where quantized, bf16 elsewhere; 10 node(s)")
    assert "`n0` (0.1)" in lines[0] and "`n7`" in lines[0] and "`n8`" not in lines[0]
    assert lines[0].endswith("and 2 more")
    assert "| defaults | 0 | fp32 | fail (worst cosine 0.9000) |" in lines
    assert "| lift top 10 | 10 | bf16 | pass |" in lines
    assert "| lift top 20 |  | bf16 | NNCF failed |" in lines
    # bf16 with attention kept at f32: no int8 in the words, no error figures.
    attention = [{"node": "qk", "precision": "fp32"}, {"node": "sv", "precision": "fp32"}]
    (line,) = mix_lines({"best": {"label": "b", "precision": "bf16+fp32", "lifted": attention}})
    words = "2 node(s) lifted out of bf16 to pass the accuracy gate, at fp32: `qk`, `sv`"
    assert line == f"- precision by layer: bf16; {words}"
    # A single-precision artifact has no such lines.
    assert mix_lines({"best": {"label": "x", "precision": "int8", "lifted": []}}) == []


def test_a_mixed_precision_artifact_says_what_its_lift_cost_in_speed() -> None:
    from optimize.render.optimize_section import mix_lines

    label = "openvino-quantize:int8-bf16"
    best = {"label": label, "precision": "int8+bf16", "lifted": [{"node": "n0", "precision": "bf16"}]}
    mix = {"label": label, "status": "kept", "speedup_vs_baseline": 2.4, "details": {}}
    twin = {
        "label": f"{label}-unlifted",
        "status": "rejected",
        "reason": "inaccurate: cosine 0.97 < 0.995; timed to price the lift: 2.70x over the baseline",
        "metric": "p50",
        "latency_ms": {"p50": 1.6},
        "versus": {"label": label, "latency_ms": {"p50": 1.8}},
        "ratio_vs_best": 1.6 / 1.8,
        "ratio_ci95": [0.85, 0.93],
        "speedup_vs_baseline": 2.7,
        "details": {"lift_reference_for": label},
    }
    lines = mix_lines({"best": best, "stages": [mix, twin]})
    price = next(line for line in lines if line.startswith("- the price of the lift"))
    assert (
        f"`{label}-unlifted` ran p50 1.600 ms against the mix's 1.800 ms, "
        "side by side in one search comparison" in price
    )
    assert "the lift costs 1.12x in latency, 95% CI 1.08–1.18" in price
    assert price.endswith("it failed the gate (cosine 0.97 < 0.995)")
    # Timed against another best: each one's speedup from its own comparison, said as such.
    apart = {**twin, "versus": {"label": "openvino-convert:bf16", "latency_ms": {"p50": 2.0}}}
    price = next(line for line in mix_lines({"best": best, "stages": [mix, apart]}) if "price" in line)
    assert "ran at 2.70x over the baseline in its comparison (the mix: 2.40x in its own)" in price
    # Not timed (the budget ran out before it), or no twin: no line.
    untimed = {**twin, "speedup_vs_baseline": None}
    assert not any("price" in line for line in mix_lines({"best": best, "stages": [mix, untimed]}))
