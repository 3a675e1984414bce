"""The optimize report in Markdown: the per-stage table (also used by the terminal summary)
and the section of report.md that `lto optimize` writes into its artifact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optimize.model.runtime_model import BASELINE_BACKEND
from optimize.units import index_ranges


def _fmt_ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else str(value)


# Task-metric figures as the reports name them: (key, short name for a table cell, name in words,
# the threshold's key, format).
_TASK_FIGURES = (
    ("top1_agreement_tolerant", "top1", "top-1 agreement", "min_top1", ".3f"),
    ("embedding_cosine", "embedding cos", "embedding cosine", "min_cosine", ".5f"),
    ("decode_agreement", "ctc decode", "CTC decode equal", "min_ctc", ".3f"),
    ("detection_agreement", "detections", "detection agreement", "min_detection", ".3f"),
    ("mask_iou", "mask IoU", "mask IoU", "min_mask_iou", ".3f"),
)


def accuracy_cell(acc: Mapping[str, Any] | None) -> str:
    if not acc:
        return "–"
    worst = acc.get("worst") or {}
    if acc.get("reason") == "reference":
        return "reference"
    if not worst:
        return "–"
    parts = []
    if "cosine" in worst:
        parts.append(f"cos {_num(worst['cosine'], '.6f')}")
    if "slice_cosine" in worst and worst["slice_cosine"] != worst.get("cosine"):
        parts.append(f"slice cos {_num(worst['slice_cosine'], '.6f')}")
    if "top1_agreement" in worst:
        strict, tolerant = (
            worst["top1_agreement"],
            worst.get("top1_agreement_tolerant", worst["top1_agreement"]),
        )
        parts.append(
            f"top1 {strict:.2f}"
            if tolerant == strict
            else f"top1 {tolerant:.2f} outside near-ties ({strict:.2f} strict)"
        )
    for key, short, _, _, _ in _TASK_FIGURES[2:]:  # top-1 above, with its near-ties; embeddings as cos
        if key in worst:
            parts.append(f"{short} {worst[key]:.2f}")
    if "max_abs" in worst:
        parts.append(f"abs {_num(worst['max_abs'], '.2g')}")
    user = acc.get("user_metric")
    if user:
        parts.append(f"{user['name']} {_num(user['score'], '.4g')} ({'pass' if user['ok'] else 'fail'})")
    return ", ".join(parts)


def accuracy_lines(acc: Mapping[str, Any]) -> list[str]:
    """Markdown bullets: the thresholds, and each output's metric with why it was chosen."""
    lines: list[str] = []
    th = acc.get("thresholds") or {}
    if th:
        shown = [f"cosine >= {th.get('min_cosine')} (embeddings, other floats; whole and per slice)",
                 f"task-judged outputs' cosine >= {th.get('min_task_cosine')}"]  # fmt: skip
        for key, label in (("min_top1", "top-1 agreement"), ("min_ctc", "CTC decode equal"),
                           ("min_detection", "detection agreement")):  # fmt: skip
            if th.get(key) is not None:
                shown.append(f"{label} >= {th[key]}")
        for key, label in (("max_rel", "max rel error"), ("max_abs", "max abs error")):
            if th.get(key) is not None:
                shown.append(f"{label} <= {th[key]}")
        lines.append("- accuracy thresholds: " + "; ".join(shown))
    per_output = acc.get("per_output") or {}
    for name, choice in (acc.get("metrics") or {}).items():
        fig = per_output.get(name, {})
        source = " (set by the user)" if choice.get("source") == "override" else ""
        figures = ""
        sl = fig.get("slice")
        if isinstance(sl, Mapping):
            figures = f"; worst slice: {sl['index']} of axis {sl['axis']}, cos {_num(sl['value'], '.6f')}"
        lines.append(f"  - `{name}`: {choice.get('metric')}{source}: {choice.get('why')}{figures}")
    return lines


def speedup_cell(value: Any, ci: Any) -> str:
    """`2.07x (1.98–2.13)`, or `2.07x` without an interval, or `–`."""
    if not isinstance(value, (int, float)):
        return "–"
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
        return f"{value:.2f}x ({ci[0]:.2f}–{ci[1]:.2f})"
    return f"{value:.2f}x"


def table_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the final table: stage, status, the candidate's latency at the target percentile,
    the baseline's in the same measurement, p99, speedup with its 95% CI, accuracy, reason. The
    two latencies and the speedup of a row come from one measurement."""
    metric = (section.get("target") or {}).get("percentile", "p50")
    rows = []
    for r in section.get("stages", []):
        lat = r.get("latency_ms") or {}
        rows.append(
            [
                r["label"],
                r["status"],
                _fmt_ms(lat.get(metric, lat.get("p50"))),
                _fmt_ms(r.get("baseline_ms")),
                _fmt_ms(lat.get("p99")),
                speedup_cell(r.get("speedup_vs_baseline"), r.get("speedup_ci95")),
                accuracy_cell(r.get("accuracy")),
                r.get("reason", ""),
            ]
        )
    return rows


def table_header(section: Mapping[str, Any]) -> list[str]:
    metric = (section.get("target") or {}).get("percentile", "p50")
    return [
        "stage",
        "status",
        f"{metric} ms",
        "baseline ms",
        "p99 ms",
        "speedup (95% CI)",
        "accuracy",
        "reason",
    ]


TABLE_NOTE = (
    "Each row's latency, the baseline's latency beside it and its speedup come from one side-by-side "
    "measurement of that candidate with ONNX Runtime defaults (every side in its own process, one "
    "runtime per process, alternating blocks): the speedup is the median of the per-block-pair "
    "ratios, the two latencies are the pairs' typical level split by that ratio (so the baseline's "
    "divided by the row's gives it), and its interval is the median's, from the same pairs. The "
    "artifact's row and the baseline's come from the final comparison, in fresh processes after the "
    "search. Rows measured at different moments carry the machine's speed at that moment: compare "
    "rows by speedup with its interval (two speedups whose intervals overlap were not measured "
    "apart; only the comparison with the best so far, in the reason, decided). A candidate is kept "
    "only when it is accurate and faster than the best so far by the recipe's minimum with its "
    "ratio's 95% CI below 1, twice (the second time on fresh processes)."
)


def evidence_lines(section: Mapping[str, Any]) -> list[str]:
    """The artifact's numerics, the rows that judged and what they could tell, and the faster
    candidates left out for want of evidence."""
    acc = section.get("accuracy") or {}
    best = section.get("best") or {}
    lines = (
        [f"- numerics: **{best['numerics']}** ({best.get('precision', '?')})"] if best.get("numerics") else []
    )
    rows = acc.get("rows") or {}
    for purpose in ("judge", "calibration"):
        part = rows.get(purpose)
        if not part:
            continue
        where = part.get("flag") or f"generated ({part.get('generated')})"
        file = f" `{part['file']}`" if part.get("file") else ""
        picked = f", samples {index_ranges(part['indices'])}" if part.get("indices") else ""
        verb = "judged accuracy" if purpose == "judge" else "calibrated"
        lines.append(f"- rows that {verb}: {part.get('samples')} from {where}{file}{picked}")
    evidence = acc.get("evidence") or {}
    for name, test in (evidence.get("outputs") or {}).items():
        verdict = "can tell" if test.get("can_tell") else "**cannot tell**"
        lines.append(f"  - output `{name}` ({test.get('metric')}): {verdict}: {test.get('finding')}")
    unverified = section.get("unverified")
    if unverified:
        lines += ["", "**Faster candidates not shipped: lto could not verify them.** "
                  f"{unverified['why']}.", ""]  # fmt: skip
        lines += ["| candidate | numerics | measured speedup | why unverified |", "|---|---|---|---|"]
        for cand in unverified["candidates"]:
            why = str(cand.get("why", "")).replace("|", "\\|")
            lines.append(
                f"| {cand['label']} | {cand.get('numerics') or cand.get('precision')} | "
                f"{cand['speedup']:.2f}x | {why} |"
            )
        lines += ["", f"To verify them, give {unverified['needs']}:", "", "```",
                  str(unverified["command"]), "```"]  # fmt: skip
    return lines


_RUNTIMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO", "tvm": "TVM", "tensorrt": "TensorRT"}
_NUMERICS = {
    "exact": "fp32, exactly the original's numbers",
    "reassociated": "fp32, the same maths in another order",
    "reduced": "reduced precision",
    "quantized": "quantized",
    "mixed": "mixed precision",
}


def _accuracy_words(acc: Mapping[str, Any]) -> str:
    """Each output's task metric and value, with its threshold: what the judging rows showed."""
    th = acc.get("thresholds") or {}
    parts = []
    for name, fig in (acc.get("per_output") or {}).items():
        metric = fig.get("metric")
        shown = [
            f"{words} {format(fig[key], fmt)} (>= {th.get(threshold)})"
            for key, _, words, threshold, fmt in _TASK_FIGURES
            if key in fig
        ]
        if not shown and isinstance(fig.get("cosine"), (int, float)):
            shown.append(f"cosine {fig['cosine']:.5f}")
        if fig.get("passed_by"):
            shown.append(fig["passed_by"])
        if fig.get("padded_positions_ignored"):
            shown.append(f"{fig['padded_positions_ignored']} padded positions not judged")
        parts.append(f"`{name}` ({metric}): {', '.join(shown) or 'compared'}")
    return "; ".join(parts)


def mix_lines(section: Mapping[str, Any], limit: int = 8) -> list[str]:
    """For a mixed-precision artifact: which nodes were lifted out of its main precision, to what,
    and the search that chose them (each rung: nodes lifted, the precision they ran at, the gate)."""
    best = section.get("best") or {}
    lifted = best.get("lifted") or []
    if not lifted:
        return []
    main, _, rest = str(best.get("precision")).partition("+")
    names = ", ".join(
        f"`{e['node']}`" + (f" ({e['added_rel_error']:.3g})" if "added_rel_error" in e else "")
        for e in lifted[:limit]
    )
    more = f" and {len(lifted) - limit} more" if len(lifted) > limit else ""
    errors = f" (relative error each added in {main})" if "added_rel_error" in lifted[0] else ""
    elsewhere = f"{main} where quantized, {rest or 'fp32'} elsewhere" if main == "int8" else f"{main}"
    lines = [
        f"- precision by layer: {elsewhere}; {len(lifted)} node(s) lifted out of {main} to pass the "
        f"accuracy gate, at {lifted[0]['precision']}{errors}: {names}{more}"
    ]
    stages = section.get("stages") or []
    lines += lift_price_lines(stages, best)
    row = next((r for r in stages if r.get("label") == best.get("label")), {})
    attempts = (row.get("details") or {}).get("attempts") or []
    if attempts:
        head = "| search step | nodes out of int8 | float parts at | accuracy gate |"
        lines += ["", head, "|---|---|---|---|"]
        for a in attempts:
            gate = a.get("error") or a.get("skipped") or ("pass" if a.get("accuracy_ok") else "fail")
            if "worst_cosine" in a:
                gate += f" (worst cosine {a['worst_cosine']:.4f})"
            step = a.get("step") or a.get("group")
            lines.append(f"| {step} | {a.get('excluded', '')} | {a.get('float_parts', 'fp32')} | {gate} |")
        lines.append("")
    return lines


# Set in a candidate's details by the stage that priced a lift (optimize.stage.LIFT_REFERENCE_KEY;
# render does not import the stage layer): the label of the mixed candidate it is the twin of.
_LIFT_REFERENCE = "lift_reference_for"


def lift_price_lines(stages: list[Mapping[str, Any]], best: Mapping[str, Any]) -> list[str]:
    """What the shipped mix's lift cost in speed: its twin with nothing lifted, timed though it
    failed the gate. Side by side with the mix in one measurement when the mix was the best then;
    else each one's speedup over the baseline, from its own comparison."""
    twin = next(
        (
            r
            for r in stages
            if (r.get("details") or {}).get(_LIFT_REFERENCE) == best.get("label")
            and r.get("speedup_vs_baseline")
        ),
        None,
    )
    if twin is None:
        return []
    failed = str(twin.get("reason", "")).partition("; timed to price the lift")[0]
    failed = failed.removeprefix("inaccurate: ")
    metric = twin.get("metric") or "p50"
    versus = twin.get("versus") or {}
    mine, theirs = (twin.get("latency_ms") or {}).get(metric), (versus.get("latency_ms") or {}).get(metric)
    if versus.get("label") == best.get("label") and mine and theirs:
        lo, hi = twin.get("ratio_ci95") or (None, None)
        interval = f", 95% CI {1 / hi:.2f}–{1 / lo:.2f}" if lo and hi else ""
        cost = (
            f"ran {metric} {mine:.3f} ms against the mix's {theirs:.3f} ms, side by side in one search "
            f"comparison: the lift costs {theirs / mine:.2f}x in latency{interval}"
        )
    else:
        mix = next(
            (r for r in stages if r.get("label") == best.get("label") and r.get("speedup_vs_baseline")), {}
        )
        theirs_x = f"{float(mix['speedup_vs_baseline']):.2f}x in its own" if mix else "not timed beside it"
        cost = (
            f"ran at {float(twin['speedup_vs_baseline']):.2f}x over the baseline in its comparison "
            f"(the mix: {theirs_x})"
        )
    return [f"- the price of the lift: with nothing lifted, `{twin.get('label')}` {cost}; it failed "
            f"the gate ({failed})"]  # fmt: skip


def summary_lines(section: Mapping[str, Any], model_path: str) -> list[str]:
    """What shipped, how much faster with its interval, the accuracy evidence, what was left out
    and what would unlock it, and the commands to use it next: the answer, before the details."""
    if section.get("partial") or "verdict" not in section:
        return []
    best = section.get("best") or {}
    out = str(section.get("artifact", "OUT"))
    runtime = _RUNTIMES.get(str(best.get("backend")), str(best.get("backend")))
    numerics = _NUMERICS.get(str(best.get("numerics")), str(best.get("numerics")))
    slo, shi = section["speedup_ci95"]
    stages = section.get("stages") or []
    base = next((r for r in stages if r.get("status") == "baseline"), {})
    metric = (section.get("target") or {}).get("percentile", "p50")
    if best.get("label") == "baseline":
        head = (
            f"**Shipped the original model**, on {_RUNTIMES[BASELINE_BACKEND]} defaults: no candidate was "
            f"both accurate and faster on this machine (p50 {section['target']['best_ms']:.3f} ms)."
        )
    else:
        row = next((r for r in reversed(stages) if r.get("label") == best.get("label")), {})
        ms = (row.get("latency_ms") or {}).get(metric)
        base_ms = row.get("baseline_ms") or (base.get("latency_ms") or {}).get(metric)
        figures = f": {metric} {ms:.3f} ms against {base_ms:.3f} ms" if ms and base_ms else ""
        head = (
            f"**Shipped `{best.get('label')}`**: {runtime}, {best.get('precision')} ({numerics}), "
            f"**{section['speedup']:.2f}x** faster than ONNX Runtime defaults (95% CI {slo:.2f}–{shi:.2f}"
            f"{figures}, side by side, each in its own process)."
        )
    lines = ["## Summary", "", head, ""]
    lifted = best.get("lifted") or []
    if lifted:
        lines.append(
            f"- **Precision by layer**: {best.get('precision')}, {len(lifted)} node(s) lifted out of "
            f"{str(best.get('precision')).partition('+')[0]} at {lifted[0]['precision']} to pass the "
            "accuracy gate (Optimization below lists them)."
        )
    acc = section.get("accuracy") or {}
    evidence = acc.get("evidence") or {}
    source = acc.get("sample_source") or "?"
    tell = (
        "these rows can tell a right candidate from a wrong one"
        if evidence.get("can_tell")
        else (f"these rows cannot verify a reduced or quantized candidate: {evidence.get('why_not')}")
    )
    lines.append(f"- **Accuracy**, judged on {source}: {_accuracy_words(acc) or 'reference'}; {tell}.")
    target = section.get("target") or {}
    if target.get("ms") is None:
        lines.append("- **Target**: none given (`--target-ms` sets one).")
    else:
        met = "met" if target.get("met") else "**missed**"
        lo, hi = target["best_ms_ci95"]
        lines.append(
            f"- **Target** {target['percentile']} <= {target['ms']:g} ms: {met} "
            f"({target['best_ms']:.3f} ms, 95% CI {lo:.3f}–{hi:.3f})."
        )
    unverified = section.get("unverified")
    if unverified:
        fastest = unverified["candidates"][0]
        lines.append(
            f"- **Left out**: {len(unverified['candidates'])} faster candidate(s) the rows could not verify "
            f"(fastest: `{fastest['label']}` at {fastest['speedup']:.2f}x); to verify them, give "
            f"{unverified['needs']}: `{unverified['command']}`."
        )
    else:
        inaccurate = sum(
            1 for r in stages if r.get("status") == "rejected" and "inaccurate" in str(r.get("reason"))
        )
        lines.append(
            "- **Left out**: nothing faster that the rows could not verify"
            + (f"; {inaccurate} candidate(s) failed the accuracy gate (table below)." if inaccurate else ".")
        )
    found, elapsed = section.get("time_to_best_s", 0), section.get("elapsed_s", 0)
    lines.append(
        f"- **Found** after {found:.0f} s of a {elapsed:.0f} s "
        f"run; exit code {section.get('exit_code')} ({section.get('verdict')})."
    )
    lines += ["", "**Next**", "", "```bash",
              f"lto bench {out} --compare {model_path}   # the speedup, measured again here",
              f"lto serve {out} --port 8000   # a KServe v2 HTTP endpoint with dynamic batching",
              f"lto export {out} --triton models/   # a Triton model repository, a KServe service",
              "```", ""]  # fmt: skip
    use = f'In Python, `optimize.load("{out}")` runs it with the settings lto measured.'
    if best.get("backend") == "openvino":
        config = best.get("runtime_config") or {}
        settings = {k: v for k, v in config.items() if v is not None}
        use += (
            f" It is an OpenVINO IR (`{out}/model.xml` + `model.bin`): OpenVINO runs it as "
            f'`openvino.Core().compile_model("{out}/model.xml", "CPU", {settings})` '
            "(the settings are also in `manifest.json`)."
        )
    elif best.get("backend") == "onnxruntime":
        use += f" It is an ONNX model (`{out}/model.onnx`); its session settings are in `manifest.json`."
    lines += [use, ""]
    return lines


def render_markdown_section(section: Mapping[str, Any]) -> str:
    """The optimize part of report.md (called by optimize.report.render_markdown)."""
    lines = ["## Optimization", ""]
    if section.get("partial"):
        lines += [f"**Partial report: the run stopped early ({section.get('stopped_by', 'unknown')}).** "
                  "No artifact was written.", ""]  # fmt: skip
        best = section.get("best_so_far")
        if best:
            lines += [f"- {best['summary']}", ""]
    recipe = section.get("recipe") or {}
    if recipe:
        kind = section.get("model_kind", "?")
        lines.append(f"- recipe: `{recipe.get('name')}` ({recipe.get('source')}); model kind: {kind}")
    if "verdict" in section:
        target = section["target"]
        lo, hi = target["best_ms_ci95"]
        lines.append(
            f"- verdict: **{section['verdict']}** (exit code {section['exit_code']}); best "
            f"{target['percentile']} {target['best_ms']:.3f} ms (95% CI {lo:.3f}–{hi:.3f}) "
            f"at batch {target['batch_size']}"
        )
        slo, shi = section["speedup_ci95"]
        lines.append(
            f"- artifact: `{section['best']['label']}` on {section['best']['backend']}, "
            f"**{section['speedup']:.2f}x** vs the {_RUNTIMES[BASELINE_BACKEND]} default baseline "
            f"(95% CI {slo:.2f}–{shi:.2f}, side by side, each in its own process)"
        )
        eff = section.get("efficiency")
        if eff and eff.get("share_of_peak") is not None:
            lines.append(
                f"- efficiency: {eff['model_flops'] / 1e9:.3g} GFLOP per run in {eff['latency_ms']:.3f} ms: "
                f"{eff['achieved_gops']:.0f} G ops/s, {eff['share_of_peak']:.0%} of this machine's measured "
                f"{eff['peak_precision']} matrix-product rate ({eff['peak_gops']:.0f} G ops/s)"
            )
        if section.get("time_to_best_s") is not None:
            lines.append(
                f"- found after {section['time_to_best_s']:.0f} s of a {section['elapsed_s']:.0f} s run "
                "(the best became the best then; the rest of the run confirmed nothing beat it)"
            )
        acc = section.get("accuracy") or {}
        samples = section.get("accuracy_samples")
        source = acc.get("sample_source")
        lines.append(
            f"- accuracy of the artifact on {samples} input samples"
            + (f" ({source})" if source else "")
            + f": {accuracy_cell(acc)}"
        )
        lines += accuracy_lines(acc)
        lines += mix_lines(section)
        lines += evidence_lines(section)
        if section.get("external_data"):
            lines.append("- the model stores its weights as external data; the artifact carries them")
    header = table_header(section)
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table_rows(section):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines += [
        "",
        TABLE_NOTE,
    ]
    warnings = section.get("warnings") or []
    if warnings:
        lines += ["", "Warnings:", *[f"- {w}" for w in warnings]]
    return "\n".join(lines) + "\n"
