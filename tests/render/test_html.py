"""HTML pages and plots: every report kind rendered, its images present and carrying the JSON's numbers."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import numpy as np
import pytest

from optimize.report import load_report, write_report
from optimize.serve.loadgen import HttpEndpoint, LoadSettings, MaxQpsSearch
from optimize.serve.loadgen import load_report as make_load_report
from tests.cli_helpers import run_cli
from tests.render.conftest import KINDS
from tests.render.test_markdown import _step

PNG = b"\x89PNG\r\n\x1a\n"


def figures(page: str) -> dict[str, tuple[bytes, str]]:
    """{figure id: (PNG bytes, caption)} of a page."""
    found = {}
    pattern = (
        r'<figure id="(\w+)"><img alt="[^"]*" src="data:image/png;base64,([^"]+)">'
        r"<figcaption><b>[^<]*</b> (.*?)</figcaption>"
    )
    for name, data, caption in re.findall(pattern, page, flags=re.S):
        found[name] = (base64.b64decode(data), html.unescape(re.sub(r"<[^>]+>", "", caption)))
    return found


def ms(value: float) -> str:
    return f"{value:.3f} ms"


def render(path: Path, tmp_path: Path) -> tuple[str, dict[str, tuple[bytes, str]]]:
    out = tmp_path / f"{path.stem}.html"
    proc = run_cli("report", path, "--html", out)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Self-contained: no scripts, no stylesheets or images fetched from anywhere.
    assert "<script" not in page and "<link" not in page and 'src="http' not in page
    found = figures(page)
    assert found, "no figure in the page"
    for png, _ in found.values():
        assert png.startswith(PNG) and len(png) > 5000  # a real image, not an empty canvas
    return page, found


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_every_report_kind_renders_as_a_page_with_plots_of_its_numbers(
    reports: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    data = load_report(reports[kind])
    page, found = render(reports[kind], tmp_path)
    assert f"<h1>lto {kind} report</h1>" in page
    results = data["results"]
    if kind in ("bench", "compare", "load"):
        caption = found["latency_cdf"][1]
        for m in results:
            samples = np.asarray(m["samples_ms"])
            assert f"{m['label']}: p50 {ms(float(np.percentile(samples, 50)))}" in caption
            assert f"{len(samples):,} runs" in caption
    elif kind == "optimize":
        section = data["optimize"]
        caption = found["stage_speedups"][1]
        lo, hi = section["speedup_ci95"]
        assert f"{section['speedup']:.2f}x (95% CI {lo:.2f}-{hi:.2f})" in caption
        for stage in section["stages"]:
            if isinstance(stage.get("speedup_vs_baseline"), (int, float)):
                assert f"{stage['label']} ({stage['status']}): {stage['speedup_vs_baseline']:.2f}x" in caption
        finals = [m for m in results if m["label"].endswith("(final comparison)")]
        cdf = found["latency_cdf"][1]
        for m in finals or results[:1]:
            assert f"{m['label']}: p50 {ms(float(np.percentile(m['samples_ms'], 50)))}" in cdf
    elif kind == "gate":
        gate = data["gate"]
        caption = found["gate_distributions"][1]
        assert f"verdict {gate['verdict']}" in caption
        base, cand = results
        assert f"baseline p50 {ms(float(np.median(base['samples_ms'])))}" in caption
        assert f"candidate p50 {ms(float(np.median(cand['samples_ms'])))}" in caption


@pytest.mark.slow
def test_a_gate_of_saved_reports_plots_each_repetition(tmp_path: Path) -> None:
    from tests.gate.test_gate import repetitions, write_bench_report

    base = write_bench_report(tmp_path / "base.json", repetitions(reps=6, seed=1, runs=60, between=0.01))
    slow = write_bench_report(tmp_path / "slow.json", repetitions(1.3, reps=6, seed=2, runs=60, between=0.01))
    out = tmp_path / "gate.json"
    proc = run_cli("gate", "--baseline", base, "--candidate", slow, "-o", out)
    assert proc.returncode == 11, proc.stdout + proc.stderr
    gate = load_report(out)["gate"]
    _, found = render(out, tmp_path)
    caption = found["gate_distributions"][1]
    lo, hi = gate["change_ci95"]
    assert f"p50 change {gate['change'] * 100:+.1f}% (95% CI {lo * 100:+.1f}%..{hi * 100:+.1f}%)" in caption
    for side in ("baseline", "candidate"):
        values = gate["repetition_values"][side]
        assert f"{side} p50 per repetition {min(values):.3f}..{max(values):.3f} ms" in caption
        assert f"{len(values)} repetitions" in caption


def test_a_max_qps_search_plots_latency_against_load(tmp_path: Path) -> None:
    settings = LoadSettings(qps=100.0, requests=50, slo_ms=2.0, percentile=99.0, warmup=0)
    steps = [_step(settings, 100.0, 0.5), _step(settings, 200.0, 0.8), _step(settings, 400.0, 3.0, errors=4)]
    target = HttpEndpoint("http://127.0.0.1:8000", "mlp", {"x": np.zeros((1, 4), np.float32)})
    report = make_load_report(steps, target=target, backend="remote", model_path=None, input_spec=None,
                              settings=settings, search=MaxQpsSearch(200.0, steps))  # fmt: skip
    path = write_report(tmp_path / "load.json", report)
    _, found = render(path, tmp_path)
    caption = found["load_curve"][1]
    assert caption.startswith("max 200.0 qps within the SLO")
    for point in report["load"]["max_qps"]["curve"]:
        verdict = "pass" if point["passed"] else "fail"
        figures_of_point = f"p50 {ms(point['p50_ms'])}, p99 {ms(point['p99_ms'])} ({verdict})"
        assert f"{point['offered_qps']:.1f} qps: {figures_of_point}" in caption


@pytest.mark.slow
def test_markdown_to_a_file_links_the_same_images(reports: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    page_path = tmp_path / "bench.html"
    proc = run_cli("report", reports["bench"], "-o", out, "--html", page_path)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "## Plots" in text and "![Latency CDF](bench-latency_cdf.png)" in text
    image = (tmp_path / "bench-latency_cdf.png").read_bytes()
    assert image.startswith(PNG)
    assert figures(page_path.read_text())["latency_cdf"][0] == image  # the very same picture
    # Written by lto, so a second run may replace them; a file lto did not write is refused.
    assert run_cli("report", reports["bench"], "-o", out).returncode == 0
    (tmp_path / "mine.md").write_text("my notes\n")
    proc = run_cli("report", reports["bench"], "--html", tmp_path / "mine.md")
    assert proc.returncode == 2 and "lto did not write" in proc.stderr


@pytest.mark.slow
def test_the_optimize_artifact_carries_report_html_and_linked_plots(reports: dict[str, Path]) -> None:
    folder = reports["optimize"].parent
    page = (folder / "report.html").read_text()
    found = figures(page)
    assert {"latency_cdf", "stage_speedups"} <= set(found)
    markdown = (folder / "report.md").read_text()
    for name in ("latency_cdf", "stage_speedups"):
        assert f"(plots/{name}.png)" in markdown
        assert (folder / "plots" / f"{name}.png").read_bytes() == found[name][0]
    # The new files are hashed in the manifest like every other file of the artifact.
    from optimize.artifact import load_artifact

    files = load_artifact(folder).manifest["files"]
    assert {"report.html", "plots/latency_cdf.png", "plots/stage_speedups.png"} <= set(files)


def test_lto_help_does_not_import_matplotlib() -> None:
    import subprocess
    import sys

    from tests.cli_helpers import ROOT

    code = "import sys\nfrom optimize.cli import app\nprint('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"
