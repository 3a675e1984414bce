"""`lto report`: render a JSON report as Markdown (or validate it)."""

from __future__ import annotations

from pathlib import Path

import typer

EPILOG = """
[bold]Examples[/]

  lto report reports/bench.json                 [dim](Markdown on stdout)[/]
  lto report reports/bench.json -o report.md
  lto report reports/bench.json --check         [dim](validate against the schema only)[/]
"""


def report(
    path: Path = typer.Argument(..., help="A JSON report written by lto."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the Markdown here instead of stdout."
    ),
    check: bool = typer.Option(False, "--check", help="Only validate the report against the schema."),
) -> None:
    """Render a report (bench, compare, optimize, load, gate) as Markdown for people."""
    from optimize.cli.common import console
    from optimize.files import check_output_file, write_markdown_atomic
    from optimize.render.markdown import render_markdown
    from optimize.report import load_report

    check_output_file(output, flag="-o", inputs=(path,))
    data = load_report(path)
    if check:
        console.print(f"{path}: valid lto {data['kind']} report (schema {data['schema_version']})")
        return
    text = render_markdown(data)
    if output is not None:
        write_markdown_atomic(output, text)
        console.print(f"wrote {output}")
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command("report", epilog=EPILOG)(report)
