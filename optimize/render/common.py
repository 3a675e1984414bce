"""Plain-text cells shared by the Markdown and the terminal renderers (no rich, no Markdown)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def pct(x: float) -> str:
    """A signed change: +4.2%."""
    return f"{x * 100:+.1f}%"


def fmt_p(p: float | None) -> str:
    """A p-value for a table cell; None (not computed) is '-', never a made-up 1."""
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def gate_value(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}/s" if metric == "throughput" else f"{v:.3f} ms"


def _spread(values: list[float] | None, metric: str) -> str:
    """'0.412..0.455 ms' or '2,401..2,510/s': the range of a side's repetitions."""
    if not values:
        return "-"
    if metric == "throughput":  # the gate decides throughput on mean latency per repetition
        return f"{min(values):.3g}..{max(values):.3g} ms mean"
    return f"{min(values):.3g}..{max(values):.3g} ms"


def unstable_inputs(data: Mapping[str, Any]) -> list[str]:
    """One sentence per side of a gate decision that was measured unstable."""
    lines = []
    for name in ("baseline", "candidate"):
        side = data.get(name) or {}
        if side and not side.get("stable", True):
            reasons = "; ".join(side.get("unstable_reasons") or []) or "flagged unstable"
            lines.append(f"the {name} ({side.get('name', '?')}) was measured unstable: {reasons}")
    return lines


def gate_rows(data: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(what, baseline, candidate) rows of a gate decision (GateResult.to_json())."""
    metric = data["metric"]
    base, cand = data.get("baseline") or {}, data.get("candidate") or {}
    rows = [
        ("source", str(base.get("name", "-")), str(cand.get("name", "-"))),
        (
            metric,
            gate_value(data.get("baseline_value"), metric),
            gate_value(data.get("candidate_value"), metric),
        ),
        ("runs", str(base.get("runs", "-")), str(cand.get("runs", "-"))),
    ]
    if base.get("repetitions", 1) > 1 or cand.get("repetitions", 1) > 1:
        rows.append(("repetitions", str(base.get("repetitions", "-")), str(cand.get("repetitions", "-"))))
    values = data.get("repetition_values") or {}
    if values and max(len(v or []) for v in values.values()) > 1:
        rows.append(
            (
                f"{metric} per repetition",
                _spread(values.get("baseline"), metric),
                _spread(values.get("candidate"), metric),
            )
        )
    loads = (base.get("foreign_cpu_fraction"), cand.get("foreign_cpu_fraction"))
    if any(isinstance(x, (int, float)) for x in loads):
        rows.append(
            ("other processes' CPU", *[f"{x:.0%}" if isinstance(x, (int, float)) else "-" for x in loads])
        )
    stable = (base.get("stable", True), cand.get("stable", True))
    if not all(stable):
        rows.append(("stable", *["yes" if s else "NO" for s in stable]))
    if data.get("change") is not None and data.get("change_ci95"):
        lo, hi = data["change_ci95"]
        rows.append(("change, + = worse (95% CI)", "", f"{pct(data['change'])} ({pct(lo)} .. {pct(hi)})"))
        rows.append(("CI from", "", str(data.get("ci_method") or "-")))
        mw = data.get("mann_whitney") or {}
        # `is None`, not `or`: a p-value of 0 is the strongest evidence, not a missing value.
        rows.append(
            (
                "Mann-Whitney U p",
                "",
                f"slower {fmt_p(mw.get('p_slower'))} / faster {fmt_p(mw.get('p_faster'))}",
            )
        )
    settings = data.get("settings") or {}
    rows.append(
        (
            "budget",
            "",
            f"{settings.get('max_regression', 0):.1%} slower, "
            f"{settings.get('min_improvement', 0):.1%} faster",
        )
    )
    runs = data.get("interleaved_runs") or []
    if len(runs) > 1:
        rows.append(
            (
                "interleaved runs",
                "",
                ", ".join(f"run {r['run']}: {r['verdict']} ({pct(r.get('change') or 0)})" for r in runs),
            )
        )
    if data.get("baseline_written"):
        rows.append(("baseline written", "", str(data["baseline_written"])))
    return rows


def pairs_word(comparison: Mapping[str, Any]) -> str:
    """What one unit of a comparison's interval was: a block pair of two worker processes, or a
    chunk pair in one process (reports written before December 2026)."""
    if comparison.get("process") == "own worker per side":
        return "block pairs, each side in its own process"
    return "interleaved chunks"


def modes_sentence(paired: Mapping[str, Any], a_label: str, b_label: str) -> str:
    """Where a comparison's pair ratios fell in two groups (optimize.stats.paired_ratio): each
    group's block pairs, process sets, both sides' latency and the speedup of B over A, which
    side changed speed, and which group the comparison's figure is ("" with one group)."""
    modes = paired.get("modes") or []
    if len(modes) != 2:
        return ""
    sets = (paired.get("overall") or {}).get("process_sets") or []

    def group(mode: Mapping[str, Any]) -> str:
        where = f" (process sets {_set_list(mode['process_sets'])} of {len(sets)})" if len(sets) > 1 else ""
        return (
            f"in {mode['pairs']} block pairs{where} {a_label} {mode['a_ms']:.3g} ms and {b_label} "
            f"{mode['b_ms']:.3g} ms ({1.0 / mode['ratio']:.2f}x)"
        )

    moved = {"A": a_label, "B": b_label}.get(str(paired.get("moved")), "both sides")
    figure = 1.0 / paired["figure"]["ratio"]
    first, other = sorted(modes, key=lambda m: abs(m["ratio"] - paired["figure"]["ratio"]))
    return (
        f"two speeds ({moved} changed): {group(first)}; {group(other)}; the figure is "
        f"{figure:.2f}x, the first, the one nearer no difference"
    )


def _set_list(groups: Sequence[int]) -> str:
    return ", ".join(str(int(g) + 1) for g in groups)


def comparison_lines(comparison: Mapping[str, Any]) -> list[str]:
    """A comparison in words (plain text): its ratio with the interval and what it was taken over,
    both sides' latency in the same pairs, and the two speeds of a side that had them."""
    lo, hi = comparison["ratio_ci95"]
    ratio, metric = comparison["ratio"], comparison["metric"]
    paired = comparison.get("paired")
    if paired:
        fig = paired["figure"]
        sets = len((paired.get("overall") or fig).get("process_sets") or [0])
        where = f"{sets} fresh pairs of processes" if sets > 1 else "one pair of processes"
        over = f"the median of {fig['pairs']} block-pair ratios from {where}"
    else:
        over = f"{comparison['chunks']} {pairs_word(comparison)}"
    lines = [f"{metric} ratio B/A = {ratio:.3f} (95% CI {lo:.3f}–{hi:.3f}; {over})"]
    side_ms = comparison.get("latency_ms")
    if side_ms:
        # The latency table pools every run of each side; the ratio is taken over block pairs, so
        # the table's p50s divided need not give it: say which figures give it.
        where = " over those block pairs" if paired else " in this comparison"
        pooled = " (the latency table pools every run of each side)" if paired else ""
        lines.append(f"{metric}{where}: A {side_ms['A']:.3f} ms, B {side_ms['B']:.3f} ms{pooled}")
    if paired:
        sentence = modes_sentence(paired, "A", "B")
        if sentence:
            lines.append(sentence)
    return lines
