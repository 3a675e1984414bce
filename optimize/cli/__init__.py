"""The `lto` command line. Command modules only parse arguments and call into the package."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from optimize.cli.common import err_console, mark_command_start, reset_consoles
from optimize.errors import LtoError, first_line
from optimize.system import interrupts
from optimize.version import __version__

try:  # typer >= 0.29 vendors click; older releases depend on it
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click import ClickException  # type: ignore[no-redef]

app = typer.Typer(
    name="lto",
    help="Offline latency optimization for ONNX models: measure, optimize, serve and gate.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)

# Each module registers its command(s) on `app`. They import heavy libraries inside the
# command functions only, so `lto --help` stays fast.
COMMAND_MODULES = [
    "optimize.cli.inspect_cmd",
    "optimize.cli.bench_cmd",
    "optimize.cli.report_cmd",
    "optimize.cli.gate_cmd",
    "optimize.cli.optimize_cmd",
    "optimize.cli.serve_cmd",
    "optimize.cli.load_cmd",
    "optimize.cli.export_cmd",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lto {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Offline latency optimization for ONNX models."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every failure becomes one line on stderr and an exit code."""

    mark_command_start()
    reset_consoles()
    interrupts.install_handlers()
    try:
        rc = app(args=argv, standalone_mode=False)
    except LtoError as exc:
        err_console.print(f"[bold red]error:[/] {exc.one_line()}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    except typer.Abort:
        _interrupted(KeyboardInterrupt())
    except OSError as exc:
        err_console.print(f"[bold red]error:[/] {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        sys.exit(1)
    except Exception as exc:
        if os.environ.get("LTO_DEBUG"):
            raise
        err_console.print(
            f"[bold red]internal error:[/] {first_line(exc)} "
            "(set LTO_DEBUG=1 for the traceback and please report it)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
    stopped_by = interrupts.received()
    if stopped_by is not None:  # typer returns 130 for a KeyboardInterrupt it caught
        _interrupted(stopped_by)
    sys.exit(rc if isinstance(rc, int) else 0)


def _interrupted(exc: KeyboardInterrupt) -> None:
    """One line that says which signal stopped what, then its exit code (130 or 143)."""

    doing = interrupts.activity()
    err_console.print(
        f"[bold red]{interrupts.describe(exc)}[/]"
        + (f" while {doing}" if doing else "")
        + "; nothing more was written, previous results were left intact",
        highlight=False,
        soft_wrap=True,
    )
    sys.exit(interrupts.exit_code(exc))
