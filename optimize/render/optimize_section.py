"""The optimize report in Markdown: the per-stage table (also used by the terminal summary)
and the section of report.md that `lto optimize` writes into its artifact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _fmt_ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


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
        cos = worst["cosine"]
        parts.append(f"cos {cos:.6f}" if isinstance(cos, float) else f"cos {cos}")
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
    if "max_abs" in worst:
        mab = worst["max_abs"]
        parts.append(f"abs {mab:.2g}" if isinstance(mab, float) else f"abs {mab}")
    return ", ".join(parts)


def table_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the final table: stage, status, p50, p99, speedup, accuracy, reason."""
    rows = []
    for r in section.get("stages", []):
        lat = r.get("latency_ms") or {}
        speed = r.get("speedup_vs_baseline")
        rows.append(
            [
                r["label"],
                r["status"],
                _fmt_ms(lat.get("p50")),
                _fmt_ms(lat.get("p99")),
                f"{speed:.2f}x" if isinstance(speed, (int, float)) else "–",
                accuracy_cell(r.get("accuracy")),
                r.get("reason", ""),
            ]
        )
    return rows


TABLE_HEADER = ["stage", "status", "p50 ms", "p99 ms", "speedup", "accuracy", "reason"]
TABLE_NOTE = (
    "p50/p99 come from each candidate's own interleaved comparison and carry the machine's load at that "
    "moment; compare rows by speedup: the baseline's speedup chained through each candidate's ratio "
    "against the best so far. A candidate is kept only when it is accurate and faster by the recipe's "
    "minimum with its ratio's 95% CI below 1, twice (the second time on fresh sessions)."
)


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
            f"**{section['speedup']:.2f}x** vs the ONNX Runtime default baseline "
            f"(95% CI {slo:.2f}–{shi:.2f}, measured side by side)"
        )
        acc = section.get("accuracy") or {}
        samples = section.get("accuracy_samples")
        lines.append(f"- accuracy of the artifact on {samples} input samples: {accuracy_cell(acc)}")
        if section.get("external_data"):
            lines.append("- the model stores its weights as external data; the artifact carries them")
    lines += ["", "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
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
