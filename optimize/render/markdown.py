"""Markdown for people: every report kind (`lto report`, an artifact's report.md, CI job summaries).

`render_markdown` writes the parts every report shares (header, latency table, comparison,
warnings), then one section per kind-specific block (`optimize`, `load`, `gate`) found in the
report, rendered by the function `SECTION_RENDERERS` names for that kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from optimize.render.common import comparison_lines, gate_rows, unstable_inputs
from optimize.render.optimize_section import render_markdown_section, summary_lines

# (section, whole report) -> Markdown. The report is passed because some sections need its
# top-level fields (a load section shows the report's `settings`).
SectionRenderer = Callable[[Mapping[str, Any], Mapping[str, Any]], str]


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _source(tensor: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """Where a timed input's values came from, in words."""
    if tensor.get("source") == "file":
        return f"from {spec.get('data_file') or 'a file'}"
    note = tensor.get("note") or tensor.get("generator") or "generated"
    return f"generated: {note}, seed {spec.get('seed', 0)}"


def measurement_rows(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| label | backend | batch | p50 ms | p90 ms | p99 ms | p99.9 ms | mean ms | median 95% CI | CV | "
        "throughput/s | runs | stable |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for m in results:
        lat = m["latency_ms"]
        lo, hi = lat["median_ci95"]
        stability = m["stability"]
        stable = "yes" if stability["stable"] else "no: " + "; ".join(stability["reasons"])
        lines.append(
            f"| {m['label']} | {m['backend']} | {m['batch_size']} | {_ms(lat['p50'])} | {_ms(lat['p90'])} | "
            f"{_ms(lat['p99'])} | {_ms(lat['p999'])} | {_ms(lat['mean'])} | {_ms(lo)}–{_ms(hi)} | "
            f"{lat['cv']:.1%} | {m['throughput_per_s']:.1f} | {m['runs']} | {stable} |"
        )
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    env = report["environment"]
    cpu = env["cpu"]
    lines = [f"# lto {report['kind']} report", ""]
    section = report.get("optimize")
    if report["kind"] == "optimize" and isinstance(section, Mapping):
        lines += summary_lines(section, str((report.get("model") or {}).get("path", "MODEL")))
        if lines[-2:] != ["", ""] and len(lines) > 2:
            lines += ["## Run", ""]
    lines.append(f"- created: {report['created_at']} by lto {report['tool']['version']}")
    if report["tool"].get("command"):
        lines.append(f"- command: `{report['tool']['command']}`")
    if report.get("model"):
        model = report["model"]
        lines.append(
            f"- model: `{model['path']}` ({model['size_bytes']:,} bytes, sha256 {model['sha256'][:12]}…)"
        )
    lines.append(
        f"- machine: {cpu['model']} ({cpu['arch']}, {cpu['logical_cores']} logical cores; "
        f"ISA {', '.join(cpu['isa']) or 'n/a'}); {env['os']}; Python {env['python']}; "
        f"fingerprint `{env['fingerprint']}`"
    )
    if env.get("packages"):
        lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in sorted(env["packages"].items())))
    if env.get("gpu"):
        lines.append(f"- GPU: {env['gpu']}")
    spec = report.get("input_spec")
    if spec:
        desc = ", ".join(f"{t['name']} {t['dtype']}[{'x'.join(map(str, t['shape']))}] ({_source(t, spec)})"
                         for t in spec["inputs"])  # fmt: skip
        lines.append(f"- timed on: {desc}")
    judged = (
        ((section or {}).get("accuracy") or {}).get("sample_source") if isinstance(section, Mapping) else None
    )
    if judged:
        lines.append(f"- accuracy judged on: {judged}")
    if report["results"]:
        lines += ["", "## Latency", "", *measurement_rows(report["results"])]
        lines += [
            "",
            "Latency in milliseconds per batch. The median CI is a bootstrap 95% interval (for a "
            "repeated measurement: an order-statistic interval over its repetitions' medians); "
            "a run is marked unstable when its variation is high or other processes used the CPU "
            "(a repeated one when its repetitions disagree).",
        ]
        if any(str(r.get("label", "")).endswith("(final comparison)") for r in report["results"]):
            lines += [
                "",
                "The final comparison's rows pool every run of each side; the headline's p50s and "
                "speedup are those of its block pairs, so they may differ from these by a little.",
            ]
        lines += _thin_tail_lines(report["results"])
        lines += _repetition_lines(report["results"])
    comparison = report.get("comparison")
    if comparison:
        a, b = comparison["labels"]
        lo, hi = comparison["ratio_ci95"]
        lines += [
            "",
            "## Comparison (side by side)",
            "",
            f"A is {a}, B is {b}.",
            "",
            *[f"- {line}" for line in comparison_lines(comparison)],
            f"- {_verdict_words(lo, hi, a, b)}",
        ]
    if report.get("warnings"):
        lines += ["", "## Warnings", "", *[f"- {w}" for w in report["warnings"]]]
    for kind, render in SECTION_RENDERERS.items():
        if report.get(kind):
            lines += ["", render(report[kind], report)]
    return "\n".join(lines) + "\n"


_TAIL_NAMES = {"p90": "p90", "p99": "p99", "p999": "p99.9"}


def _thin_tail_lines(results: list[dict[str, Any]]) -> list[str]:
    """A note per measurement whose reported tails come from too few runs to estimate them."""
    lines = []
    for m in results:
        thin = {k: n for k, n in (m.get("too_few_runs_for") or {}).items() if k in _TAIL_NAMES}
        if thin:
            needs = ", ".join(
                f"{_TAIL_NAMES[k]} needs {n:,}" for k, n in sorted(thin.items(), key=lambda kv: kv[1])
            )
            lines.append(
                f"- {m['label']}: {m['runs']:,} runs are too few to estimate its tail ({needs}): "
                "those figures are close to its largest runs, not percentiles."
            )
    return ["", *lines] if lines else []


def _repetition_lines(results: list[dict[str, Any]]) -> list[str]:
    """Each repetition of a `lto bench --repeat` measurement: one process each."""
    lines: list[str] = []
    for m in results:
        reps = m.get("repetitions") or []
        if not reps:
            continue
        stability = m.get("stability") or {}
        spread = stability.get("repetition_spread")
        lines += [
            "",
            f"### {m['label']}: {len(reps)} repetitions, each a fresh process"
            + (f" (spread of their medians {spread:.1%})" if isinstance(spread, (int, float)) else ""),
            "",
            "| repetition | runs | p50 ms | p90 ms | p99 ms | stopped by | other processes' CPU | stable |",
            "|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for r in reps:
            lat = r["latency_ms"]
            load = r.get("foreign_cpu_fraction")
            stable = "yes" if r.get("stable", True) else "no: " + "; ".join(r.get("reasons") or [])
            cells = [str(r.get("index", "")), str(r["runs"]), *(_ms(lat[k]) for k in ("p50", "p90", "p99"))]
            cells += [
                str(r.get("stopped_by") or "-"),
                f"{load:.0%}" if isinstance(load, (int, float)) else "-",
            ]
            lines.append("| " + " | ".join([*cells, stable]) + " |")
    return lines


def _verdict_words(lo: float, hi: float, a: str, b: str) -> str:
    if hi < 1.0:
        return f"{b} is faster than {a} with 95% confidence."
    if lo > 1.0:
        return f"{b} is slower than {a} with 95% confidence."
    return "no difference can be claimed at 95% confidence."


# ---------------------------------------------------------------------------------------------
# gate

_GATE_ICONS = {"pass": "✅", "improved": "🚀", "regressed": "❌", "inconclusive": "⚠️"}


def gate_section(data: Mapping[str, Any]) -> str:
    """Markdown for a gate decision (GateResult.to_json()): a CI job summary, verdict first."""
    verdict = data["verdict"]
    lines = [
        f"## {_GATE_ICONS[verdict]} lto gate: {verdict} (exit {data['exit_code']})",
        "",
        str(data["reason"]),
        "",
        "| | baseline | candidate |",
        "|---|---|---|",
    ]
    for what, base, cand in gate_rows(data):
        if what == "source":
            base, cand = f"`{base}`", f"`{cand}`"
        lines.append(f"| {what} | {base} | {cand} |".replace("|  |", "| |"))
    unstable = unstable_inputs(data)
    if unstable:
        lines += ["", "**Unstable inputs**: the verdict rests on measurements the machine disturbed.", ""]
        lines += [f"- {line}" for line in unstable]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# load (optimize.serve.loadgen.load_report)


def _opt_ms(value: float | None) -> str:
    return _ms(value) if isinstance(value, (int, float)) else "–"


def _load_settings_text(settings: Mapping[str, Any]) -> str:
    """LoadSettings.to_json() in words: arrivals, length, SLO."""
    if settings.get("find_max_qps"):
        arrivals = "open loop (Poisson), searching the highest rate that meets the SLO"
    elif settings.get("qps") is not None:
        arrivals = f"open loop (Poisson) at {settings['qps']:g} qps"
    else:
        arrivals = f"closed loop, {settings.get('concurrency', 1)} in flight"
    if settings.get("requests") is not None:
        length = f"{settings['requests']} requests"
    else:
        length = f"{settings.get('duration_s', 0):g} s and at least {settings.get('min_queries')} requests"
    slo = (
        f"SLO p{settings.get('percentile', 99):g} ≤ {settings['slo_ms']:g} ms"
        if settings.get("slo_ms") is not None
        else "no latency SLO"
    )
    return (
        f"{arrivals}; {length} (after {settings.get('warmup', 0)} warm-up); {slo}, "
        f"at most {settings.get('max_error_rate', 0):.1%} errors; seed {settings.get('seed', 0)}"
    )


def load_section(section: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> str:
    """Markdown for a load report's `load` section; `settings` are the report's (LoadSettings.to_json())."""
    lines = ["## Load", ""]
    target = section.get("target") or {}
    where = f"`{target.get('url') or target.get('name', '?')}` ({target.get('transport', '?')})"
    if target.get("model"):
        where += f", model `{target['model']}`"
    lines.append(f"- target: {where}")
    if settings:
        lines.append(f"- settings: {_load_settings_text(settings)}")
    server = section.get("server")
    if server:
        config = server.get("config") or {}
        lines.append(
            f"- batcher: {server.get('instances', '?')} instance(s), "
            f"max batch {server.get('max_rows', '?')}, max wait {config.get('max_wait_ms', '?')} ms, "
            f"target latency {config.get('target_latency_ms', '?')} ms"
        )
    if section.get("config_search"):
        return "\n".join([*lines, *_config_search_lines(section["config_search"]), "",
                          _load_verdict(section.get("verdict") or {})]) + "\n"  # fmt: skip
    runs = section.get("runs") or []
    search = section.get("max_qps")
    if runs:
        lines += [
            "",
            "| run | issued | ok | errors | throughput/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for run in runs:
            lat = run.get("latency_ms") or {}
            lines.append(
                f"| {run['label']} | {run['issued']} | {run['completed_ok']} | "
                f"{sum(run['errors'].values())} ({run['error_rate']:.1%}) | {run['throughput_per_s']:.1f} | "
                + " | ".join(_opt_ms(lat.get(k)) for k in ("p50", "p90", "p99", "p999", "max"))
                + " |"
            )
        note = "Latency per request in milliseconds"
        if any(run.get("mode") == "poisson" for run in runs):
            note += "; open-loop latencies count from the scheduled arrival, so queueing is included"
        lines += ["", note + "."]
    # A search's steps are summed up by its curve below; like the terminal, detail its last run only.
    for run in runs if search is None else runs[-1:]:
        lines += ["", f"### {'last step: ' if search is not None else ''}{run['label']}", ""]
        if run["errors"]:
            lines.append("- errors: " + ", ".join(f"{k} {v}" for k, v in sorted(run["errors"].items())))
        if run.get("batches_by_rows"):
            lines.append(
                "- batches formed (rows: count): "
                + ", ".join(f"{k}: {v:g}" for k, v in run["batches_by_rows"].items())
            )
        if run.get("scheduler"):
            lines.append(f"- scheduled by {run['scheduler']}")
        mlperf = run.get("mlperf_loadgen") or {}
        if mlperf:
            why = "; ".join(mlperf.get("invalid_because") or [])
            lines.append(f"- LoadGen result: **{mlperf.get('validity')}**" + (f" ({why})" if why else ""))
        loadgen = run.get("loadgen") or {}
        if loadgen.get("cpu_fraction_of_core") is not None:
            lines.append(f"- load generator: {loadgen['cpu_fraction_of_core']:.0%} of a core")
        lines += [f"- warning: {w}" for w in run.get("warnings") or []]
        if run.get("breakdown_ms"):
            lines += ["", "| where the time went | mean ms | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
            for name, stats in run["breakdown_ms"].items():
                lines.append(f"| {name} | {_ms(stats['mean'])} | {_ms(stats['p50'])} | {_ms(stats['p99'])} |")
    if search is not None:
        points = search.get("curve") or []
        # The tail column's key names the SLO's percentile: p99_ms, p99.9_ms, ...
        tail_keys = [
            k for k in (points[0] if points else {}) if k.startswith("p") and k not in ("p50_ms", "passed")
        ]
        tail_key = tail_keys[0] if tail_keys else None
        lines += [
            "",
            "### Latency-throughput curve",
            "",
            f"| offered qps | achieved/s | p50 ms | {tail_key[:-3] + ' ms' if tail_key else 'tail ms'} | "
            "error rate | mean batch | SLO |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        for point in points:
            tail = point.get(tail_key) if tail_key else None
            mean_batch = point.get("mean_batch_rows")
            cells = [
                f"{point['offered_qps']:.1f}",
                f"{point['throughput_per_s']:.1f}",
                _opt_ms(point["p50_ms"]),
                _opt_ms(tail),
                f"{point['error_rate']:.1%}",
                f"{mean_batch:.1f}" if mean_batch else "–",
                "pass" if point["passed"] else "fail",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        best = search.get("max_qps")
        lines += ["", f"Max qps within the SLO: **{best:.1f}**" if best else "No rate met the SLO."]
    if section.get("floor") and runs:
        lines += _floor_lines(section["floor"], runs[-1])
    lines += ["", _load_verdict(section.get("verdict") or {})]
    return "\n".join(lines) + "\n"


def _config_search_lines(found: Mapping[str, Any]) -> list[str]:
    """Each configuration served, its highest rate within the SLO, and the one kept."""
    lines = [
        "",
        "### Serving configurations searched",
        "",
        f"| configuration | max qps, p{found['percentile']:g} ≤ {found['slo_ms']:g} ms, VALID "
        "| rates tried |",
        "|---|---:|---:|",
    ]
    kept_rows = [i for i, t in enumerate(found["tried"]) if t["config"] == found["config"]]
    for i, tried in enumerate(found["tried"]):
        note = " (rematch)" if tried.get("role") == "rematch" else ""
        kept = " **(kept)**" if kept_rows and i == kept_rows[-1] else ""
        rate = "–" if tried.get("max_qps") is None else f"{tried['max_qps']:.1f}"
        lines.append(f"| {tried['label']}{note}{kept} | {rate} | {len(tried['curve'])} |")
    lines += [
        "",
        "A value that held more was served again beside the best (rematch) and kept only when it won"
        " that too.",
    ]
    lines += [
        "",
        f"Written to `{found['written_to']}`; `lto serve --artifact` uses it for the flags not given.",
    ]
    return lines


def _floor_lines(floor: Mapping[str, Any], target: Mapping[str, Any]) -> list[str]:
    """The target beside its floor: the same model in-process behind one greedy worker, same load."""
    run = floor["run"]
    lat, base = run.get("latency_ms") or {}, target.get("latency_ms") or {}
    share = floor.get("offered_share_of_alone")
    lines = [
        "",
        "### Against the floor",
        "",
        f"The floor: `{floor['model']}` in the load's own process, {floor['endpoint']['name']}, no HTTP, "
        f"at the same load. The model alone, batch 1, back to back: {floor['throughput_alone_per_s']:.1f}/s"
        + (f"; the offered rate is {share:.0%} of it." if share else "."),
    ]
    if lat and base and floor.get("max_qps") is None:  # a search's last steps ran at different rates
        lines += [
            "",
            "| | p50 ms | p99 ms | achieved/s | LoadGen |",
            "|---|---:|---:|---:|---|",
            f"| target | {_ms(base['p50'])} | {_ms(base['p99'])} | {target['throughput_per_s']:.1f} | "
            f"{(target.get('mlperf_loadgen') or {}).get('validity', '–')} |",
            f"| floor | {_ms(lat['p50'])} | {_ms(lat['p99'])} | {run['throughput_per_s']:.1f} | "
            f"{(run.get('mlperf_loadgen') or {}).get('validity', '–')} |",
            f"| target / floor | {base['p50'] / lat['p50']:.2f}x | {base['p99'] / lat['p99']:.2f}x | | |",
        ]
    if floor.get("max_qps") is not None:
        its = floor["max_qps"].get("max_qps")
        lines += [
            "",
            f"Max qps within the SLO on the floor: **{its:.1f}**"
            if its
            else "No rate met the SLO on the floor.",
        ]
    return lines


def _load_verdict(verdict: Mapping[str, Any]) -> str:
    value, slo = verdict.get("value_ms"), verdict.get("slo_ms")
    measured = ""
    if value is not None:
        measured = f"p{verdict.get('percentile', 99):g} {value:.3f} ms"
        if slo is not None:
            measured += f" {'≤' if value <= slo else '>'} SLO {slo:g} ms"
    if verdict.get("passed"):
        return "Verdict: **PASS**" + (f" ({measured})" if measured else "")
    # The reasons already say what failed (and by how much).
    facts = list(verdict.get("reasons") or []) or ([measured] if measured else [])
    return "Verdict: **FAIL**" + (f" ({'; '.join(facts)})" if facts else "")


# ---------------------------------------------------------------------------------------------
# dispatch by report kind


def _optimize_section(section: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    return render_markdown_section(section)


def _load_section(section: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    return load_section(section, report.get("settings"))


def _gate_section(section: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    return gate_section(section)


# Report kind -> its section's renderer, in the order sections appear in the Markdown.
SECTION_RENDERERS: dict[str, SectionRenderer] = {
    "optimize": _optimize_section,
    "load": _load_section,
    "gate": _gate_section,
}
