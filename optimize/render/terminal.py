"""Rich tables for terminals: measurements, optimize runs, gate decisions, load runs, model inspection.

Markdown lives in optimize.render.markdown; the library modules return data and never import rich.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from optimize.render.common import gate_rows

if TYPE_CHECKING:
    from optimize.pipeline.summary import StageRecord


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


# ---------------------------------------------------------------------------------------------
# gate

_GATE_STYLES = {"pass": "green", "improved": "bold green", "regressed": "bold red", "inconclusive": "yellow"}


def render_gate(data: Mapping[str, Any], console: Console) -> None:
    """A gate decision (GateResult.to_json()): baseline and candidate side by side, reason below."""
    verdict = data["verdict"]
    table = Table(
        title=f"lto gate: [{_GATE_STYLES[verdict]}]{verdict}[/] (exit {data['exit_code']})",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("baseline", justify="right")
    table.add_column("candidate", justify="right")
    for row in gate_rows(data):
        table.add_row(*row)
    table.caption = str(data["reason"])
    table.caption_justify = "left"
    console.print(table)


# ---------------------------------------------------------------------------------------------
# load (optimize.serve.loadgen.load_report)


def render_load(report: dict[str, Any], console: Console) -> None:
    """Human summary: latency, throughput, errors, batches, where the time went, verdict."""
    load = report["load"]
    for run in load["runs"] if load.get("max_qps") is None else load["runs"][-1:]:
        lat = run["latency_ms"]
        head = (
            f"[bold]{run['label']}[/]: {run['completed_ok']}/{run['issued']} ok, "
            f"{run['throughput_per_s']:.1f}/s"
        )
        console.print(head, highlight=False)
        if lat:
            console.print(
                f"  latency ms  p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}  "
                f"p99.9 {lat['p999']:.3f}  max {lat['max']:.3f}",
                highlight=False,
            )
        if run["errors"]:
            console.print("  errors: " + ", ".join(f"{k} {v}" for k, v in sorted(run["errors"].items())))
        if run["batches_by_rows"]:
            console.print(
                "  batches formed (rows: count): "
                + ", ".join(f"{k}: {v:g}" for k, v in run["batches_by_rows"].items()),
                highlight=False,
            )
        if run["breakdown_ms"]:
            table = Table(
                "phase", "mean ms", "p50 ms", "p99 ms", title="where the time went", title_justify="left"
            )
            for name, stats in run["breakdown_ms"].items():
                table.add_row(name, f"{stats['mean']:.3f}", f"{stats['p50']:.3f}", f"{stats['p99']:.3f}")
            console.print(table)
        lg = run["loadgen"]
        console.print(f"  load generator: {lg['cpu_fraction_of_core']:.0%} of a core", highlight=False)
        for warning in run["warnings"]:
            console.print(f"  [yellow]warning:[/] {warning}", highlight=False)
    if load.get("max_qps") is not None:
        curve = load["max_qps"]
        table = Table("offered qps", "achieved/s", "p50 ms", "tail ms", "errors", "mean batch", "SLO",
                      title="latency-throughput curve", title_justify="left")  # fmt: skip
        for point in curve["curve"]:
            tail = next(
                (v for k, v in point.items() if k.startswith("p") and k not in ("p50_ms", "passed")), None
            )
            table.add_row(
                f"{point['offered_qps']:.1f}",
                f"{point['throughput_per_s']:.1f}",
                f"{point['p50_ms']:.3f}" if point["p50_ms"] is not None else "-",
                f"{tail:.3f}" if tail is not None else "-",
                f"{point['error_rate']:.1%}",
                f"{point['mean_batch_rows']:.1f}" if point["mean_batch_rows"] else "-",
                "pass" if point["passed"] else "fail",
            )
        console.print(table)
        mq = curve["max_qps"]
        console.print(f"max qps within the SLO: {mq:.1f}" if mq else "no rate met the SLO", highlight=False)
    verdict = load["verdict"]
    if report["settings"].get("slo_ms") is not None or not verdict["passed"]:
        word = "[bold green]PASS[/]" if verdict["passed"] else "[bold red]FAIL[/]"
        console.print(
            f"verdict: {word}" + (f" ({'; '.join(verdict['reasons'])})" if verdict["reasons"] else "")
        )


# ---------------------------------------------------------------------------------------------
# inspect (optimize.inspection.inspect_model)


def _si(n: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _bytes(n: float) -> str:
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{int(n)} B"


def _shape_text(shape: list[int | str | None] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def render_inspection(info: dict[str, Any], console: Console) -> None:
    """An inspection (optimize.inspection.inspect_model): summary, inputs/outputs, ops and compute, checks."""
    params = info["parameters"]
    summary = Table(title=escape(info["path"]), title_justify="left", show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    opsets = ", ".join(f"{d} {v}" for d, v in info["opset_imports"].items())
    producer = " ".join(x for x in (info["producer"]["name"], info["producer"]["version"]) if x) or "-"
    summary.add_row("file", f"{_bytes(info['size_bytes'])}  sha256 {info['sha256'][:16]}")
    summary.add_row("IR / opset", f"IR {info['ir_version']}  ({opsets})")
    summary.add_row("producer", producer)
    summary.add_row("nodes", str(info["node_count"]))
    dtypes = ", ".join(f"{k} {_si(v['count'])} ({_bytes(v['bytes'])})" for k, v in params["by_dtype"].items())
    summary.add_row(
        "parameters",
        f"{params['count']:,} in {params['tensors']} initializers, {_bytes(params['bytes'])}: {dtypes}",
    )
    ext = info["external_data"]
    summary.add_row(
        "external data", f"yes: {', '.join(ext['files'])} ({_bytes(ext['bytes'])})" if ext["used"] else "no"
    )
    for key, value in info["metadata"].items():
        summary.add_row(escape(f"meta {key}"), escape(value))
    console.print(summary)

    io = Table(title="inputs and outputs", title_justify="left")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind, values in (("in", info["inputs"]), ("out", info["outputs"])):
        for v in values:
            io.add_row(kind, escape(v["name"]), v["dtype"], escape(_shape_text(v["shape"])))
    console.print(io)

    compute = info["compute"]
    costs = {(r["domain"], r["op_type"]): r for r in compute.get("by_op_type", [])}
    ops = Table(title="ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("domain")
    ops.add_column("count", justify="right")
    if compute["available"]:
        ops.add_column("MACs", justify="right")
        ops.add_column("FLOPs", justify="right")
        ops.add_column("share", justify="right")
    total = compute.get("flops") or 0
    for row in info["ops"]:
        cells = [escape(row["op_type"]), row["domain"], str(row["count"])]
        if compute["available"]:
            cost = costs.get((row["domain"], row["op_type"]))
            if cost:
                share = f"{cost['flops'] / total:.1%}" if total else "-"
                cells += [_si(cost["macs"]) if cost["macs"] else "-", _si(cost["flops"]), share]
            else:
                cells += ["-", "-", ""]
        ops.add_row(*cells)
    console.print(ops)

    if compute["available"]:
        shapes = ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in compute["input_shapes"].items())
        console.print(
            f"[bold]compute[/] at {shapes}: {_si(compute['macs'], 'MAC')}, {_si(compute['flops'], 'FLOP')}"
            f"  [dim](shapes from {compute['shape_engine']})[/]"
        )
        if compute["not_counted"]:
            listed = ", ".join(f"{k} x{v}" for k, v in compute["not_counted"].items())
            console.print(f"[yellow]not counted[/] (no cost model): {listed}; totals are a lower bound")
        if compute["unknown_shapes"]:
            listed = ", ".join(f"{k} x{v}" for k, v in compute["unknown_shapes"].items())
            console.print(f"[yellow]shape unknown[/] for {listed}; totals are a lower bound")
    else:
        console.print(f"[bold]compute[/]: {escape(compute['reason'])}")

    checks = info["checks"]
    for label, key in (("onnx.checker (full)", "checker"), ("shape inference (strict)", "shape_inference")):
        item = checks[key]
        status = "[green]ok[/]" if item["ok"] else f"[red]failed[/]: {escape(item['error'])}"
        console.print(f"[bold]{label}[/]: {status}", highlight=False)


_STATUS_STYLE = {"kept": "green", "rejected": "yellow", "skipped": "dim", "failed": "red", "baseline": "cyan"}


def optimize_row_line(record: StageRecord) -> str:
    """One streamed line per stage record (an optimize.pipeline StageRecord) as it lands."""
    style = _STATUS_STYLE.get(record.status, "")
    p50 = f" p50 {record.latency_ms['p50']:.3f} ms" if record.latency_ms else ""
    return f"[{style}]{record.status:>8}[/] {escape(record.label)}{p50}  [dim]{escape(record.reason)}[/]"


def render_optimize_summary(
    report: Mapping[str, Any],
    artifact_dir: Any,
    verdict: str,
    exit_code: int,
    console: Console,
    err_console: Console,
) -> None:
    """The per-stage table, the artifact's headline figures, the verdict and the warnings."""
    from pathlib import Path

    from optimize.render.optimize_section import TABLE_HEADER, TABLE_NOTE, accuracy_cell, table_rows

    section = report["optimize"]
    table = Table(
        title=f"lto optimize: {escape(Path(report['model']['path']).name)}",
        title_justify="left",
        caption=escape(TABLE_NOTE),
        caption_justify="left",
    )
    for name in TABLE_HEADER:
        table.add_column(name, justify="right" if name in ("p50 ms", "p99 ms", "speedup") else "left",
                         overflow="fold", max_width=60 if name == "reason" else None)  # fmt: skip
    for row in table_rows(section):
        style = _STATUS_STYLE.get(row[1], "")
        table.add_row(*[escape(c) for c in row], style=style if row[1] != "skipped" else "dim")
    console.print(table)
    slo, shi = section["speedup_ci95"]
    console.print(
        f"artifact: [bold]{escape(str(artifact_dir))}[/] ({escape(section['best']['label'])}), "
        f"[bold]{section['speedup']:.2f}x[/] vs ONNX Runtime defaults "
        f"(95% CI {slo:.2f}–{shi:.2f}, side by side); "
        f"accuracy: {escape(accuracy_cell(section.get('accuracy')))}",
        highlight=False,
        soft_wrap=True,
    )
    colour = "green" if exit_code == 0 else "yellow"
    console.print(f"[bold {colour}]{escape(verdict)}[/] (exit code {exit_code})", highlight=False)
    for warning in section.get("warnings", []):
        err_console.print(f"[yellow]warning:[/] {escape(str(warning))}", highlight=False, soft_wrap=True)
