"""Self-contained HTML pages for reports (`lto report --html`, an artifact's report.html).

The page is the report's Markdown (optimize.render.markdown, rendered by markdown-it-py, which
rich already brings) with the report's plots (optimize.render.plots) embedded as base64 PNGs:
one file to attach to a ticket or open from a CI artifact, no network, no scripts. The same
PNGs are written beside a Markdown report and linked from it.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optimize.files import MARKDOWN_MARK, write_bytes_atomic, write_text_atomic
from optimize.render.markdown import render_markdown
from optimize.render.plots import Plot, report_plots

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; }
td { font-variant-numeric: tabular-nums; }
code { background: #f3f3f3; padding: 0 0.2rem; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85rem; color: #555; }
"""


def markdown_to_html(text: str) -> str:
    from markdown_it import MarkdownIt

    # "commonmark" escapes raw HTML in the input: report text (labels, reasons) stays text.
    return str(MarkdownIt("commonmark", {"html": False}).enable("table").render(text))


def figure_html(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    caption = html.escape(plot.caption)
    return (
        f'<figure id="{plot.name}"><img alt="{html.escape(plot.title)}: {caption}" '
        f'src="data:image/png;base64,{data}"><figcaption><b>{html.escape(plot.title)}.</b> '
        f"{caption}</figcaption></figure>"
    )


def render_html(
    report: Mapping[str, Any], plots: Sequence[Plot] | None = None, markdown: str | None = None
) -> str:
    """The page: the Markdown report's header, the plots, then the rest of the report."""

    text = markdown if markdown is not None else render_markdown(report)
    plots = report_plots(report) if plots is None else plots
    # The plots go after the summary and the header bullets, before the first section of details.
    cut = next(
        (
            m.start()
            for m in re.finditer(r"\n## ", text)
            if not text.startswith(("\n## Summary", "\n## Run"), m.start())
        ),
        -1,
    )
    head, rest = (text, "") if cut < 0 else (text[:cut], text[cut:])
    figures = "".join(figure_html(p) for p in plots)
    section = f"<h2>Plots</h2>\n{figures}\n" if figures else ""
    title = html.escape(f"lto {report.get('kind', '')} report")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{_STYLE}</style></head><body>\n"
        f"{markdown_to_html(head)}\n{section}{markdown_to_html(rest)}\n"
        f"{MARKDOWN_MARK}\n</body></html>\n"
    )


def plots_markdown(plots: Sequence[Plot], paths: Sequence[str]) -> str:
    """A Markdown section linking the plots' PNG files (paths relative to the Markdown file)."""
    if not plots:
        return ""
    lines = ["## Plots", ""]
    for plot, path in zip(plots, paths, strict=True):
        lines += [f"![{plot.title}]({path})", "", f"*{plot.caption}*", ""]
    return "\n".join(lines)


def write_plot_files(plots: Sequence[Plot], folder: Path, prefix: str = "") -> list[Path]:
    """Each plot as `folder/<prefix><name>.png`, written atomically."""
    return [write_bytes_atomic(folder / f"{prefix}{plot.name}.png", plot.png) for plot in plots]


def artifact_pages(staging: Path, report: Mapping[str, Any], report_md: str) -> str:
    """For an artifact being written: plots/*.png and report.html into `staging`; returns
    report.md's text with the plots linked."""
    plots = report_plots(report)
    files = write_plot_files(plots, staging / "plots")
    markdown = report_md.rstrip("\n") + "\n\n" + plots_markdown(plots, [f"plots/{f.name}" for f in files])
    write_text_atomic(staging / "report.html", render_html(report, plots, markdown=report_md))
    return markdown
