"""Plain-text cells shared by the Markdown and the terminal renderers (no rich, no Markdown)."""

from __future__ import annotations

from collections.abc import Mapping
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
            f"max regression {settings.get('max_regression', 0):.1%}, "
            f"min improvement {settings.get('min_improvement', 0):.1%}",
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
