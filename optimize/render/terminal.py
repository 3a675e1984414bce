"""Rich tables for terminals: measurements, optimize runs, gate decisions, load runs, model inspection.

Markdown lives in optimize.render.markdown; the library modules return data and never import rich.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from optimize.render.common import comparison_lines, gate_rows
from optimize.render.optimize_section import accuracy_cell, table_rows
from optimize.stats import tail_flags
from optimize.units import clock_text


def fmt_ms(value: float) -> str:
    """Three significant figures, enough for noisy latencies and narrow enough for 80 columns."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def shorten_label(text: str, width: int) -> str:
    """Fit a label into `width` characters by cutting its middle, keeping a trailing '@b8' whole.

    Labels are shortened, never numbers: the full label is in the JSON and Markdown reports.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head, at, tail = text.rpartition("@")
    suffix = at + tail if head and len(at + tail) < width // 2 else ""
    body = head if suffix else text
    room = width - len(suffix) - 1  # one for the ellipsis
    left = (room + 1) // 2
    right = room - left
    return body[:left] + "…" + (body[len(body) - right :] if right > 0 else "") + suffix


def _fit_first_column(table_for: Any, labels: list[str], console: Console) -> tuple[int, int]:
    """The first column's width that makes the whole table fit the console, and the width the
    table then takes: the other columns keep their natural width (numbers are never cut), the
    labels give way down to 8 characters (enough for a trailing '@b8'). When even that is too
    wide, the table is wider than the console rather than cut."""
    natural = max([len(label) for label in labels] + [5])
    probe = Console(width=10_000, record=True, color_system=None, file=_NullFile())
    probe.print(table_for(natural))
    used = max((len(line) for line in probe.export_text().splitlines()), default=0)
    width = max(8, natural - max(0, used - console.width))
    return width, used - (natural - width)


def _print_fitted(table_for: Any, labels: list[str], console: Console) -> None:
    """Print the table with its labels fitted (see _fit_first_column). A table wider than the
    console goes through a console as wide as it: rich would otherwise cut its last columns."""
    label_width, table_width = _fit_first_column(table_for, labels, console)
    if table_width <= console.width:
        console.print(table_for(label_width))
        return
    wide = Console(
        file=console.file,
        width=table_width,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
    )
    wide.print(table_for(label_width))


class _NullFile:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def tail_marks(m: Mapping[str, Any]) -> dict[str, int]:
    """{percentile key: runs it needs} for the tails a measurement has too few runs to estimate."""
    marks = m.get("too_few_runs_for")
    if marks is None:  # a report written before lto recorded it
        marks = tail_flags(int(m.get("runs") or 0))
    return dict(marks)


def render_measurements(report: dict[str, Any], console: Console) -> None:
    results = report["results"]
    rows: list[list[str]] = []
    thin: dict[str, int] = {}
    for m in results:
        lat = m["latency_ms"]
        lo, hi = lat["median_ci95"]
        half = (hi - lo) / 2 / lat["p50"] if lat["p50"] else 0.0
        marks = {k: n for k, n in tail_marks(m).items() if k in _PCT_NAMES}  # the columns shown
        thin.update(marks)

        def tail(key: str, lat: Mapping[str, Any] = lat, marks: dict[str, int] = marks) -> str:
            return fmt_ms(lat[key]) + ("*" if key in marks else "")

        reps = m.get("repetitions")
        rows.append(
            [
                m["label"],
                str(m["batch_size"]),
                fmt_ms(lat["p50"]),
                tail("p90"),
                tail("p99"),
                tail("p999"),
                f"±{half:.1%}",
                f"{lat['cv']:.0%}",
                f"{m['throughput_per_s']:,.0f}",
                f"{m['runs']}" + (f"/{len(reps)}" if reps else ""),
            ]
        )
    repeated = any(m.get("repetitions") for m in results)

    def table_for(label_width: int) -> Table:
        table = Table(
            title=f"lto {report['kind']}: latency in ms",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            show_edge=False,
            padding=(0, 1),
            collapse_padding=True,
        )
        table.add_column("label", no_wrap=True, overflow="ellipsis", width=label_width)
        runs_col = "runs/reps" if repeated else "runs"
        for col in ("b", "p50", "p90", "p99", "p99.9", "p50 CI", "CV", "thr/s", runs_col):
            table.add_column(col, justify="right", no_wrap=True)
        for row, m in zip(rows, results, strict=True):
            style = None if m["stability"]["stable"] else "yellow"
            table.add_row(escape(shorten_label(row[0], label_width)), *row[1:], style=style)
        return table

    _print_fitted(table_for, [r[0] for r in rows], console)
    for m in results:
        if not m["stability"]["stable"]:
            console.print(
                f"[yellow]unstable[/] {escape(m['label'])}: " + escape("; ".join(m["stability"]["reasons"])),
                highlight=False,
            )
    if thin:
        needs = ", ".join(f"{_PCT_NAMES[k]} {n:,}" for k, n in sorted(thin.items(), key=lambda kv: kv[1]))
        console.print(
            f"[dim]* too few runs to estimate this tail (runs needed: {needs}); it is close to the "
            "largest run, not a percentile: ask for more with --min-runs[/]",
            highlight=False,
        )
    if repeated:
        console.print(
            "[dim]runs/reps: runs pooled over repetitions, each a fresh process; p50 CI is over the "
            "repetitions' medians[/]",
            highlight=False,
        )
    comparison = report.get("comparison")
    if comparison:
        b = comparison["labels"][1]
        lo, hi = comparison["ratio_ci95"]
        ratio = comparison["ratio"]
        if hi < 1.0:
            verdict = f"[green]{escape(b)} is faster[/] ({1 / ratio:.2f}x)"
        elif lo > 1.0:
            verdict = f"[red]{escape(b)} is slower[/] ({ratio:.2f}x the latency)"
        else:
            verdict = "no difference at 95% confidence"
        first, *rest = comparison_lines(comparison)
        console.print(f"{escape(first)}: {verdict}")
        for line in rest:
            console.print(escape(line), highlight=False)


_PCT_NAMES = {"p90": "p90", "p99": "p99", "p999": "p99.9"}


class BudgetProgress:
    """Progress of work whose longest duration is known (--time, --time-budget), with an ETA.

    On a terminal: a bar that fills against the budget and the time left at most. Piped (a CI
    log): a plain line at most every `every_s` seconds, since a live bar prints nothing there.
    The ETA is an upper bound: a measurement may stop early once its CI is narrow enough.
    """

    def __init__(self, console: Console, total_s: float, every_s: float = 10.0, quiet: bool = False) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.console = console
        self.total_s = max(total_s, 1e-9)
        self.every_s = every_s
        self._done_s = 0.0  # time of finished measurements
        self._current: tuple[str, float] = ("", 0.0)
        self._last_line = -1e9
        self._live = console.is_terminal and not quiet
        self._quiet = quiet
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=True,
            disable=not self._live,
        )
        self._task: Any = None

    def __enter__(self) -> BudgetProgress:
        self._bar.__enter__()
        self._task = self._bar.add_task("starting", total=self.total_s, eta="")
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)  # type: ignore[arg-type]

    def update(self, label: str, runs: int, elapsed: float) -> None:
        name, last = self._current
        if label != name or elapsed < last:  # a new measurement started
            self._done_s += last
        self._current = (label, elapsed)
        spent = min(self.total_s, self._done_s + elapsed)
        left = max(0.0, self.total_s - spent)
        eta = f"≤{clock_text(left)} left"
        text = f"measuring {label}: {runs:,} runs, {elapsed:.1f}s"
        if self._live:
            self._bar.update(self._task, description=escape(text), completed=spent, eta=eta)
        elif not self._quiet and spent - self._last_line >= self.every_s:
            self._last_line = spent
            self.console.print(f"{text} ({eta})", highlight=False, markup=False)


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
    table.add_column("baseline", justify="right", overflow="fold")
    table.add_column("candidate", justify="right", overflow="fold")
    # Figures of both sides go in the table; those of the comparison as a whole (the change and
    # its CI, the test, the budget) below it, where they are not squeezed into one narrow column.
    whole: list[tuple[str, str]] = []
    for what, base, cand in gate_rows(data):
        if base == "" and cand:
            whole.append((what, cand))
        else:
            table.add_row(escape(what), escape(base), escape(cand))
    console.print(table)
    for what, value in whole:
        console.print(f"{escape(what)}: {escape(value)}", highlight=False)
    console.print(str(data["reason"]), highlight=False, markup=False)


# ---------------------------------------------------------------------------------------------
# load (optimize.serve.loadgen.load_report)


def render_load(report: dict[str, Any], console: Console) -> None:
    """Human summary: latency, throughput, errors, batches, where the time went, verdict."""
    load = report["load"]
    if load.get("config_search"):
        _render_config_search(load, console)
        return
    for run in load["runs"] if load.get("max_qps") is None else load["runs"][-1:]:
        lat = run["latency_ms"]
        head = (
            f"[bold]{run['label']}[/]: {run['completed_ok']}/{run['issued']} ok, "
            f"{run['throughput_per_s']:.1f}/s"
        )
        console.print(head, highlight=False)
        console.print(f"  scheduled by {run['scheduler']}", highlight=False)
        mlperf = run.get("mlperf_loadgen")
        if mlperf:
            why = "; ".join(mlperf.get("invalid_because") or [])
            console.print(
                f"  LoadGen result: {mlperf.get('validity')}" + (f" ({why})" if why else ""), highlight=False
            )
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
    if load.get("floor"):
        _render_floor(load, console)
    verdict = load["verdict"]
    if report["settings"].get("slo_ms") is not None or not verdict["passed"]:
        word = "[bold green]PASS[/]" if verdict["passed"] else "[bold red]FAIL[/]"
        console.print(
            f"verdict: {word}" + (f" ({'; '.join(verdict['reasons'])})" if verdict["reasons"] else "")
        )


def _render_floor(load: dict[str, Any], console: Console) -> None:
    """The floor beside the target: same load, same scheduler, the model in-process behind one
    greedy worker; and the offered rate as a share of the model's batch-1 throughput alone."""
    floor = load["floor"]
    run = floor["run"]
    target = load["runs"][-1]
    lat, base = run["latency_ms"], target["latency_ms"]
    console.print(f"[bold]floor[/]: {floor['endpoint']['name']}", highlight=False)
    console.print(
        f"  model alone, batch 1, back to back: {floor['throughput_alone_per_s']:.1f}/s"
        + (
            f"; the offered rate is {floor['offered_share_of_alone']:.0%} of it"
            if floor.get("offered_share_of_alone")
            else ""
        ),
        highlight=False,
    )
    if lat and base and floor.get("max_qps") is None:  # a search's last steps ran at different rates
        table = Table(
            "", "p50 ms", "p99 ms", "achieved/s", title="target against its floor", title_justify="left"
        )
        table.add_row(
            "target", f"{base['p50']:.3f}", f"{base['p99']:.3f}", f"{target['throughput_per_s']:.1f}"
        )
        table.add_row("floor", f"{lat['p50']:.3f}", f"{lat['p99']:.3f}", f"{run['throughput_per_s']:.1f}")
        table.add_row(
            "target / floor",
            f"{base['p50'] / lat['p50']:.2f}x" if lat["p50"] else "-",
            f"{base['p99'] / lat['p99']:.2f}x" if lat["p99"] else "-",
            "",
        )
        console.print(table)
    mlperf = run.get("mlperf_loadgen")
    if mlperf:
        console.print(f"  floor's LoadGen result: {mlperf.get('validity')}", highlight=False)
    if floor.get("max_qps") is not None:
        mine, its = (load.get("max_qps") or {}).get("max_qps"), floor["max_qps"].get("max_qps")
        console.print(
            f"  max qps within the SLO: target {_opt_rate(mine)}, floor {_opt_rate(its)}"
            + (f" ({mine / its:.0%} of the floor)" if mine and its else ""),
            highlight=False,
        )


def _render_config_search(load: dict[str, Any], console: Console) -> None:
    """Each configuration served and its highest rate within the SLO; the one kept and where."""
    found = load["config_search"]
    table = Table("configuration", f"max qps, p{found['percentile']:g} <= {found['slo_ms']:g} ms, VALID",
                  "rates tried", title="serving configurations", title_justify="left")  # fmt: skip
    kept_at = _kept_row(found)
    for i, tried in enumerate(found["tried"]):
        note = (" (rematch)" if tried.get("role") == "rematch" else "") + (" (kept)" if i == kept_at else "")
        table.add_row(tried["label"] + note, _opt_rate(tried["max_qps"]), str(len(tried["curve"])))
    console.print(table)
    best = found.get("max_qps")
    console.print(
        f"kept: {next(t['label'] for t in found['tried'] if t['config'] == found['config'])}"
        + (f", {best:.1f}/s" if best else ", no rate met the SLO")
        + f"; written to {found['written_to']}",
        highlight=False,
        soft_wrap=True,
    )


def _kept_row(found: dict[str, Any]) -> int | None:
    """The row of the kept configuration whose rate the search reports: the last time it was served."""
    rows = [i for i, t in enumerate(found["tried"]) if t["config"] == found["config"]]
    return rows[-1] if rows else None


def _opt_rate(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}/s"


# ---------------------------------------------------------------------------------------------
# inspect (optimize.model.inspection.inspect_model)


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
    """An inspection (optimize.model.inspection.inspect_model): summary, inputs/outputs, ops and
    compute, checks."""
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


# "reverted": kept, then sent back by the final side-by-side comparison with the original.
_STATUS_STYLE = {
    "kept": "green",
    "rejected": "yellow",
    "reverted": "yellow",
    "unverified": "magenta",
    "skipped": "dim",
    "failed": "red",
    "baseline": "cyan",
}


def optimize_row_line(row: Mapping[str, Any]) -> str:
    """One streamed line per row of an optimize report's stage table, as it lands: the row's
    latency beside the one its verdict compares with (the best so far, in the same run), the
    reason, and its speedup over the baseline with the baseline's latency in that same run."""
    status, latency = str(row["status"]), row.get("latency_ms") or {}
    style = _STATUS_STYLE.get(status, "")
    metric = str(row.get("metric") or "p50")
    label = escape(str(row["label"]))
    figures = ""
    value = latency.get(metric)
    versus = row.get("versus") or {}
    versus_ms = (versus.get("latency_ms") or {}).get(metric)
    if isinstance(value, (int, float)):
        figures = f" {metric} {value:.3f} ms"
        if isinstance(versus_ms, (int, float)):
            figures += f" vs {escape(str(versus.get('label', 'best')))} {versus_ms:.3f} ms"
    reason = escape(str(row.get("reason", "")))
    speedup, base_ms = row.get("speedup_vs_baseline"), row.get("baseline_ms")
    if (
        status != "baseline"
        and versus.get("label") != "baseline"
        and isinstance(speedup, (int, float))
        and isinstance(base_ms, (int, float))
    ):
        ci = row.get("speedup_ci95")
        interval = f", CI {ci[0]:.2f}–{ci[1]:.2f}" if ci else ""
        reason += f"; vs the baseline ({base_ms:.3f} ms in that run): {speedup:.2f}x{interval}"
    name = "" if status == label else f" {label}"
    return f"[{style}]{status:>8}[/]{name}{figures}  [dim]{reason}[/]"


def _budget_words(report: Mapping[str, Any]) -> str:
    settings = report.get("settings") or {}
    if "time_budget_s" not in settings:
        return ""
    budget = settings["time_budget_s"]
    if budget is None:
        return " (no time budget: the full search)"
    default = ", the default" if settings.get("time_budget_default") else ""
    over = (report.get("optimize") or {}).get("over_budget")
    if over:
        step = f"; it ran out at: {over['step']}" if over.get("step") else ""
        default += f"; over it by {clock_text(over['seconds'])}{step}"
    return f" (time budget {clock_text(budget)}{default})"


def render_optimize_summary(
    report: Mapping[str, Any],
    artifact_dir: Any,
    verdict: str,
    exit_code: int,
    console: Console,
    err_console: Console,
    shown: set[str] | frozenset[str] = frozenset(),
) -> None:
    """The per-stage table, the artifact's headline figures, the verdict and the warnings not
    already `shown` as the run went (each warning once)."""
    from pathlib import Path

    section = report["optimize"]
    # The rows' reasons and accuracy were streamed as each stage finished (optimize_row_line)
    # and are in report.md: this table only lines the figures up, one line per stage.
    rows = [[row[0], row[1], row[2], row[3], row[5]] for row in table_rows(section)]
    metric = (section.get("target") or {}).get("percentile", "p50")
    original = (section.get("best") or {}).get("label") == "baseline"
    ends = (
        "the baseline's row measured alone (the original ships)"
        if original
        else "the artifact's and the baseline's rows from the final comparison"
    )

    def table_for(label_width: int) -> Table:
        table = Table(
            title=f"lto optimize: {escape(Path(report['model']['path']).name)}",
            title_justify="left",
            caption=f"Each row: its {metric}, the baseline's {metric} beside it and the speedup "
            f"(95% CI) from one side-by-side run; {ends}. Speedups whose intervals overlap were "
            "not measured apart. Reasons above and in report.md",
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            show_edge=False,
            collapse_padding=True,
        )
        table.add_column("stage", no_wrap=True, width=label_width)
        table.add_column("status", no_wrap=True)
        for name in (f"{metric} ms", "baseline ms", "speedup (95% CI)"):
            table.add_column(name, justify="right", no_wrap=True)
        for row in rows:
            style = _STATUS_STYLE.get(row[1], "")
            cells = [escape(shorten_label(row[0], label_width)), *[escape(c) for c in row[1:]]]
            table.add_row(*cells, style=style)
        return table

    _print_fitted(table_for, [r[0] for r in rows], console)
    slo, shi = section["speedup_ci95"]
    console.print(
        f"artifact: [bold]{escape(str(artifact_dir))}[/] ({escape(section['best']['label'])}), "
        f"[bold]{section['speedup']:.2f}x[/] vs ONNX Runtime defaults "
        f"(95% CI {slo:.2f}–{shi:.2f}, each in its own process); "
        f"numerics: {escape(str(section['best'].get('numerics', '?')))}; "
        f"accuracy: {escape(accuracy_cell(section.get('accuracy')))}",
        highlight=False,
        soft_wrap=True,
    )
    if section.get("time_to_best_s") is not None:
        console.print(
            f"found after {clock_text(section['time_to_best_s'])} of a "
            f"{clock_text(section['elapsed_s'])} run{_budget_words(report)}",
            highlight=False,
            soft_wrap=True,
        )
    acc = section.get("accuracy") or {}
    if acc.get("sample_source"):
        console.print(f"judged on: {escape(str(acc['sample_source']))}", highlight=False, soft_wrap=True)
    unverified = section.get("unverified")
    if unverified:
        console.print(
            f"[magenta]not shipped, unverified:[/] {escape(str(unverified['why']))}",
            highlight=False,
            soft_wrap=True,
        )
        for cand in unverified["candidates"]:
            kind = escape(str(cand.get("numerics") or cand.get("precision")))
            console.print(
                f"  {escape(str(cand['label']))} ({kind}) measured {cand['speedup']:.2f}x "
                "vs ONNX Runtime defaults",
                highlight=False,
                soft_wrap=True,
            )
        console.print(
            f"to verify them, give {escape(str(unverified['needs']))}:", highlight=False, soft_wrap=True
        )
        console.print(f"  {escape(str(unverified['command']))}", highlight=False, soft_wrap=True)
    colour = "green" if exit_code == 0 else "yellow"
    console.print(f"[bold {colour}]{escape(verdict)}[/] (exit code {exit_code})", highlight=False)
    for warning in section.get("warnings", []):
        if str(warning) not in shown:
            err_console.print(f"[yellow]warning:[/] {escape(str(warning))}", highlight=False, soft_wrap=True)
