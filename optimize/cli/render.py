"""Rich tables for reports (terminal output only; Markdown lives in optimize.report)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def render_measurements(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"lto {report['kind']}", title_justify="left")
    for col in (
        "label",
        "batch",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "median 95% CI",
        "CV",
        "thr/s",
        "runs",
    ):
        table.add_column(col, justify="left" if col == "label" else "right")
    unstable: list[str] = []
    for m in report["results"]:
        lat = m["latency_ms"]
        lo, hi = lat["median_ci95"]
        style = None if m["stability"]["stable"] else "yellow"
        table.add_row(
            m["label"],
            str(m["batch_size"]),
            f"{lat['p50']:.3f}",
            f"{lat['p90']:.3f}",
            f"{lat['p99']:.3f}",
            f"{lat['p999']:.3f}",
            f"{lo:.3f}–{hi:.3f}",
            f"{lat['cv']:.1%}",
            f"{m['throughput_per_s']:.1f}",
            f"{m['runs']} ({m['stopped_by']})",
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
