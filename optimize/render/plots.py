"""Figures for reports, drawn by matplotlib (Agg, no display) as PNG bytes.

One function per figure, each taking plain report data and returning a `Plot` (or None when the
report holds nothing to draw), so the HTML page and the Markdown report show the same images.
Every plot's caption carries the figures it draws, in the units of the JSON report, so a reader
(or a test) can check a picture against its numbers. matplotlib is imported here only, on
first use: `lto --help` never loads it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimize.files import MARKDOWN_MARK

# Colours that stay apart for colour-blind readers (Okabe-Ito), in the order sides are drawn.
_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
_STATUS_COLOURS = {
    "baseline": "#56B4E9",
    "kept": "#009E73",
    "rejected": "#E69F00",
    "reverted": "#CC79A7",
    "unverified": "#0072B2",
    "failed": "#D55E00",
}


@dataclass(frozen=True)
class Plot:
    """One figure: a file name, what it shows, and the PNG."""

    name: str  # file stem: latency_cdf, stage_speedups, load_curve, gate_distributions
    title: str
    caption: str  # the numbers drawn, in words
    png: bytes


def ms(value: float) -> str:
    """Milliseconds as the captions write them (and tests read them)."""
    return f"{value:.3f} ms"


def _figure(width: float = 7.0, height: float = 4.0) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    # The mark in the PNG's text chunk lets a later run recognise the file as lto's own.
    fig.savefig(buffer, format="png", metadata={"Software": "lto", "Description": MARKDOWN_MARK})
    return buffer.getvalue()


def latency_cdf(series: Sequence[tuple[str, Sequence[float]]], title: str = "Latency CDF") -> Plot | None:
    """Cumulative distribution of latency, one line per measurement, p50 and p99 marked."""
    series = [(label, np.asarray(s, dtype=np.float64)) for label, s in series if len(s)]
    if not series:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    words = []
    low = min(float(s.min()) for _, s in series)
    high = max(float(s.max()) for _, s in series)
    for i, (label, samples) in enumerate(series):
        colour = _COLOURS[i % len(_COLOURS)]
        data = np.sort(samples)
        ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", color=colour, label=label)
        p50, p99 = float(np.percentile(data, 50)), float(np.percentile(data, 99))
        ax.axvline(p50, color=colour, linestyle=":", linewidth=1)
        words.append(f"{label}: p50 {ms(p50)}, p99 {ms(p99)}, {data.size:,} runs")
    if low > 0 and high / low > 20:
        _log_axis(ax.xaxis, ax.set_xscale)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of runs at or below")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title)
    return Plot("latency_cdf", title, "; ".join(words) + " (dotted: each p50)", _png(fig))


def stage_speedups(section: Mapping[str, Any]) -> Plot | None:
    """Each timed candidate's speedup vs the baseline with its 95% CI, and the artifact's."""
    bars: list[tuple[str, str, float, float, float]] = []  # label, status, value, lo, hi
    for stage in section.get("stages") or []:
        speed = stage.get("speedup_vs_baseline")
        if not isinstance(speed, (int, float)):
            continue
        lo = hi = float(speed)
        ci = stage.get("speedup_ci95")
        if ci and ci[0] > 0 and ci[1] > 0:
            lo, hi = float(ci[0]), float(ci[1])
        bars.append((str(stage["label"]), str(stage["status"]), float(speed), lo, hi))
    final = section.get("speedup")
    if isinstance(final, (int, float)) and section.get("best"):
        lo, hi = section.get("speedup_ci95") or (final, final)
        bars.append((f"artifact: {section['best']['label']}", "final", float(final), lo, hi))
    if not bars:
        return None
    fig = _figure(7.5, max(2.5, 0.45 * len(bars) + 1.2))
    ax = fig.add_subplot()
    y = np.arange(len(bars))[::-1]
    values = np.array([b[2] for b in bars])
    errors = np.array([[b[2] - b[3] for b in bars], [b[4] - b[2] for b in bars]]).clip(min=0)
    colours = [_STATUS_COLOURS.get(b[1], "#000000") for b in bars]
    ax.barh(y, values, xerr=errors, color=colours, capsize=3, error_kw={"linewidth": 1})
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.set_yticks(y, [_short(b[0], 40) for b in bars], fontsize="small")
    ax.set_xlabel("speedup vs ONNX Runtime defaults (x), 95% CI")
    ax.set_title("Per-stage speedup")
    ax.grid(True, axis="x", alpha=0.3)
    for yi, bar in zip(y, bars, strict=True):
        ax.annotate(f" {bar[2]:.2f}x {bar[1]}", (max(bar[4], bar[2]), yi), va="center", fontsize="x-small")
    words = [f"{b[0]} ({b[1]}): {b[2]:.2f}x (95% CI {b[3]:.2f}-{b[4]:.2f})" for b in bars]
    return Plot("stage_speedups", "Per-stage speedup", "; ".join(words), _png(fig))


def load_curve(search: Mapping[str, Any], slo_ms: float | None) -> Plot | None:
    """Latency against offered load from `lto load --find-max-qps`, the SLO and the max rate."""
    points = [p for p in search.get("curve") or [] if p.get("offered_qps") is not None]
    if not points:
        return None
    tail_key = next((k for k in points[0] if k.startswith("p") and k.endswith("_ms") and k != "p50_ms"), None)
    fig = _figure()
    ax = fig.add_subplot()
    qps = [float(p["offered_qps"]) for p in points]
    for key, colour in (("p50_ms", _COLOURS[0]), (tail_key, _COLOURS[1])):
        if key is None:
            continue
        values = [p.get(key) for p in points]
        xs = [q for q, v in zip(qps, values, strict=True) if v is not None]
        ys = [float(v) for v in values if v is not None]
        ax.plot(xs, ys, marker="o", color=colour, label=key[:-3])
    shown_key = tail_key or "p50_ms"
    failed = [(q, p.get(shown_key)) for q, p in zip(qps, points, strict=True) if not p.get("passed")]
    if failed:
        ax.scatter([q for q, _ in failed], [v or 0 for _, v in failed], marker="x", color="black",
                   zorder=3, label="SLO missed")  # fmt: skip
    if slo_ms is not None:
        ax.axhline(slo_ms, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    best = search.get("max_qps")
    if best:
        ax.axvline(float(best), color=_COLOURS[2], linestyle=":", label=f"max {float(best):.1f} qps")
    ax.set_xlabel("offered load (queries/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency vs load")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    words = [
        f"{p['offered_qps']:.1f} qps: p50 {ms(p['p50_ms']) if p.get('p50_ms') is not None else '-'}"
        + (f", {tail_key[:-3]} {ms(p[tail_key])}" if tail_key and p.get(tail_key) is not None else "")
        + (" (pass)" if p.get("passed") else " (fail)")
        for p in points
    ]
    head = f"max {float(best):.1f} qps within the SLO" if best else "no rate met the SLO"
    return Plot("load_curve", "Latency vs load", head + "; " + "; ".join(words), _png(fig))


def gate_distributions(
    baseline: Sequence[float] | None,
    candidate: Sequence[float] | None,
    gate: Mapping[str, Any],
) -> Plot | None:
    """Before/after: both sides' latency distributions, and each repetition's figure the
    verdict was drawn from (saved reports) beside them."""
    values = gate.get("repetition_values") or {}
    have_samples = bool(baseline) and bool(candidate)
    if not have_samples and not values:
        return None
    panels = 2 if (have_samples and values) else 1
    fig = _figure(7.5 if panels == 2 else 6.0, 4.0)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    metric = str(gate.get("metric", "p50"))
    words = [f"verdict {gate.get('verdict')}"]
    if gate.get("change") is not None and gate.get("change_ci95"):
        lo, hi = gate["change_ci95"]
        change = gate["change"]
        words.append(f"{metric} change {change * 100:+.1f}% (95% CI {lo * 100:+.1f}%..{hi * 100:+.1f}%)")
    if have_samples:
        ax = axes[0]
        data = [np.asarray(baseline, dtype=np.float64), np.asarray(candidate, dtype=np.float64)]
        top = max(float(np.percentile(d, 99.5)) for d in data)
        shown = [d[d <= top] for d in data]  # the far tail squeezes the body into one pixel
        parts = ax.violinplot(shown, showmedians=True)
        for body, colour in zip(parts["bodies"], _COLOURS, strict=False):
            body.set_facecolor(colour)
        if min(float(d.min()) for d in shown) > 0 and top / min(float(d.min()) for d in shown) > 5:
            _log_axis(ax.yaxis, ax.set_yscale)
        ax.set_xticks([1, 2], ["baseline", "candidate"])
        ax.set_ylabel("latency (ms)")
        ax.set_title("All runs (to p99.5)")
        ax.grid(True, axis="y", alpha=0.3)
        for name, d in (("baseline", data[0]), ("candidate", data[1])):
            words.append(f"{name} p50 {ms(float(np.median(d)))}, {d.size:,} runs")
    if values:
        ax = axes[-1]
        for i, name in enumerate(("baseline", "candidate")):
            v = np.asarray(values.get(name) or [], dtype=np.float64)
            if not v.size:
                continue
            jitter = np.linspace(-0.12, 0.12, v.size) if v.size > 1 else np.zeros(1)
            ax.scatter(np.full(v.size, i + 1) + jitter, v, color=_COLOURS[i], zorder=3)
            ax.hlines(float(np.median(v)), i + 0.75, i + 1.25, color=_COLOURS[i])
            words.append(
                f"{name} {metric} per repetition {float(v.min()):.3f}..{float(v.max()):.3f} ms "
                f"(median {ms(float(np.median(v)))}, {v.size} repetitions)"
            )
        ax.set_xticks([1, 2], ["baseline", "candidate"])
        ax.set_xlim(0.5, 2.5)
        ax.set_ylabel(f"{'mean' if metric == 'throughput' else metric} of each repetition (ms)")
        ax.set_title("Per repetition (decided on)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"lto gate: {gate.get('verdict')}")
    return Plot("gate_distributions", "Gate: before and after", "; ".join(words), _png(fig))


def _log_axis(axis: Any, set_scale: Any) -> None:
    """A log scale labelled 0.5, 1, 2 rather than 10^0."""
    from matplotlib.ticker import FormatStrFormatter

    set_scale("log")
    axis.set_major_formatter(FormatStrFormatter("%g"))


def _short(text: str, width: int) -> str:
    """Cut the middle: a stage label's start (the stage) and end (the variant) both matter."""
    if len(text) <= width:
        return text
    left = (width - 1) // 2
    return text[:left] + "…" + text[len(text) - (width - 1 - left) :]


def report_plots(report: Mapping[str, Any]) -> list[Plot]:
    """Every figure a report of any kind supports, in reading order."""
    plots: list[Plot | None] = []
    results = [r for r in report.get("results") or [] if isinstance(r, Mapping)]
    kind = report.get("kind")
    if kind == "optimize":
        section = report.get("optimize") or {}
        plots.append(latency_cdf(_optimize_cdf_series(results, section), "Latency CDF: baseline vs artifact"))
        plots.append(stage_speedups(section))
    elif kind == "gate":
        gate = report.get("gate") or {}
        by_side = {str(r.get("label", "")).split(":", 1)[0]: r.get("samples_ms") for r in results}
        base, cand = by_side.get("baseline"), by_side.get("candidate")
        if (base is None or cand is None) and len(results) == 2:  # --rerun: A then B
            base, cand = results[0].get("samples_ms"), results[1].get("samples_ms")
        plots.append(gate_distributions(base, cand, gate))
    elif kind == "load":
        load = report.get("load") or {}
        if load.get("max_qps"):
            settings = report.get("settings") or {}
            plots.append(load_curve(load["max_qps"], settings.get("slo_ms")))
        plots.append(latency_cdf([(str(r["label"]), r["samples_ms"]) for r in results]))
    else:  # bench, compare
        plots.append(latency_cdf([(str(r["label"]), r["samples_ms"]) for r in results]))
    return [p for p in plots if p is not None]


def _optimize_cdf_series(
    results: Sequence[Mapping[str, Any]], section: Mapping[str, Any]
) -> list[tuple[str, Sequence[float]]]:
    """The final side-by-side pair when there was one, else the baseline's measurement."""
    finals = [r for r in results if str(r.get("label", "")).endswith("(final comparison)")]
    if len(finals) >= 2:
        return [(str(r["label"]), r["samples_ms"]) for r in finals[-2:]]
    return [(str(results[0]["label"]), results[0]["samples_ms"])] if results else []
