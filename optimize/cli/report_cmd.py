"""`lto report`: render a JSON report as Markdown or a self-contained HTML page (or validate it)."""

from __future__ import annotations

from pathlib import Path

import typer

from optimize.cli.common import console
from optimize.errors import UsageError
from optimize.files import check_output_file, write_markdown_atomic, write_text_atomic
from optimize.render.html_page import plots_markdown, render_html, write_plot_files
from optimize.render.markdown import render_markdown
from optimize.render.plots import report_plots
from optimize.report import load_report

EPILOG = """
[bold]Examples[/]

  lto report reports/bench.json                 [dim](Markdown on stdout)[/]
  lto report reports/bench.json -o report.md    [dim](plots beside it: report-latency_cdf.png ...)[/]
  lto report reports/gate.json --html gate.html [dim](one page, plots embedded)[/]
  lto report reports/bench.json --check         [dim](validate against the schema only)[/]
"""


def report(
    path: Path = typer.Argument(
        ..., help="A JSON report written by lto, or an artifact folder (its report.json).", show_default=False
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the Markdown here instead of stdout, with its plots as PNG files beside it.",
    ),
    html_out: Path | None = typer.Option(
        None, "--html", help="Write a self-contained HTML page (plots embedded) here.", metavar="FILE.html"
    ),
    check: bool = typer.Option(False, "--check", help="Only validate the report against the schema."),
) -> None:
    """Render a report (bench, compare, optimize, load, gate) for people: Markdown or HTML with plots."""
    if path.is_dir():  # an artifact folder, taken the way every command takes it
        if not (path / "report.json").is_file():
            raise UsageError(
                f"{path} is a folder without a report.json", "pass a report or an artifact folder"
            )
        path = path / "report.json"

    check_output_file(output, flag="-o", inputs=(path,))
    check_output_file(html_out, flag="--html", inputs=(path,))
    if output is not None and html_out is not None and output.resolve() == html_out.resolve():
        raise UsageError("-o and --html name the same file", "give them different paths")
    data = load_report(path)
    if check:
        console.print(f"{path}: valid lto {data['kind']} report (schema {data['schema_version']})")
        return
    text = render_markdown(data)
    plots = None
    if output is not None or html_out is not None:
        plots = report_plots(data)
    if html_out is not None:
        write_text_atomic(html_out, render_html(data, plots, markdown=text))
        console.print(f"wrote {html_out}")
    if output is not None:
        prefix = f"{output.stem}-"
        for plot in plots or []:
            check_output_file(output.parent / f"{prefix}{plot.name}.png", flag="-o (its plots)")
        files = write_plot_files(plots or [], output.parent, prefix=prefix)
        section = plots_markdown(plots or [], [f.name for f in files])
        write_markdown_atomic(output, text.rstrip("\n") + ("\n\n" + section if section else ""))
        console.print(f"wrote {output}" + (f" and {len(files)} plot(s) beside it" if files else ""))
    elif html_out is None:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command("report", epilog=EPILOG)(report)
