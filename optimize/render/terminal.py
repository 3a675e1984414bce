"""Rich tables for reports (terminal output only; Markdown lives in optimize.report)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def fmt_ms(value: float) -> str:
    """Three significant figures, enough for noisy latencies and narrow enough for 80 columns."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def render_measurements(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"lto {report['kind']}: latency in ms",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    table.add_column("label", no_wrap=True, overflow="ellipsis", max_width=30)
    for col in ("b", "p50", "p90", "p99", "p99.9", "p50 CI", "CV", "thr/s", "runs"):
        table.add_column(col, justify="right", no_wrap=True)
    unstable: list[str] = []
    for m in report["results"]:
        lat = m["latency_ms"]
        lo, hi = lat["median_ci95"]
        half = (hi - lo) / 2 / lat["p50"] if lat["p50"] else 0.0
        style = None if m["stability"]["stable"] else "yellow"
        table.add_row(
            m["label"],
            str(m["batch_size"]),
            fmt_ms(lat["p50"]),
            fmt_ms(lat["p90"]),
            fmt_ms(lat["p99"]),
            fmt_ms(lat["p999"]),
            f"±{half:.1%}",
            f"{lat['cv']:.0%}",
            f"{m['throughput_per_s']:,.0f}",
            str(m["runs"]),
            style=style,
        )
        if not m["stability"]["stable"]:
            unstable.append(f"{m['label']}: " + "; ".join(m["stability"]["reasons"]))
    console.print(table)
    for line in unstable:
        console.print(f"[yellow]unstable[/] {line}")
    comparison = report.get("comparison")
    if comparison:
        b = comparison["labels"][1]
        lo, hi = comparison["ratio_ci95"]
        ratio = comparison["ratio"]
        if hi < 1.0:
            verdict = f"[green]{b} is faster[/] ({1 / ratio:.2f}x)"
        elif lo > 1.0:
            verdict = f"[red]{b} is slower[/] ({ratio:.2f}x the latency)"
        else:
            verdict = "no difference at 95% confidence"
        console.print(
            f"{comparison['metric']} ratio B/A = [bold]{ratio:.3f}[/] (95% CI {lo:.3f}–{hi:.3f}, "
            f"{comparison['chunks']} interleaved chunks): {verdict}"
        )
