"""Options and output helpers shared by every command."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TypeVar

import typer
from rich.console import Console

from optimize.errors import UsageError
from optimize.files import _json_default
from optimize.system.env import process_age_s

console = Console()
err_console = Console(stderr=True)

# A process that is older than this when main() starts did not start for this command: a test or a
# program that calls main() itself. Its command's clock then starts at the call.
_FRESH_PROCESS_S = 10.0
_command_started = time.monotonic()


def mark_command_start() -> None:
    """When this command began (main() calls it first): the process's own start when it started
    for the command, so that a --time-budget counts the interpreter and imports too."""
    global _command_started
    age = process_age_s()
    _command_started = time.monotonic() - (age if age < _FRESH_PROCESS_S else 0.0)


def command_started() -> float:
    """time.monotonic() at this command's start (see mark_command_start)."""
    return _command_started


def reset_consoles() -> None:
    """Set both consoles up again from this run's environment and streams, as at start-up.

    rich reads COLUMNS, NO_COLOR, FORCE_COLOR, TERM and whether the stream is a terminal when a
    console is made. Made once at import, the consoles would keep the first run's settings when
    `main()` runs again in the same process (the tests run it in-process). They are set up in
    place because the command modules hold them by name.
    """
    for each in (console, err_console):
        each.__init__(stderr=each.stderr)  # type: ignore[misc]


def print_json(obj: Any) -> None:
    """Machine output: plain JSON on stdout, nothing else."""

    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


SHAPE_HELP = "Pin dynamic dims: NAME=1x128 (repeatable), e.g. --shape input_ids=1x128."
INPUT_DATA_HELP = "Real inputs: an .npz file with one array per model input."

ShapeOption = typer.Option([], "--shape", "-s", help=SHAPE_HELP, metavar="NAME=DxD")
InputDataOption = typer.Option(None, "--input-data", help=INPUT_DATA_HELP, metavar="FILE.npz")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")

# Units in help texts, one wording for every command (parsers: optimize/units.py).
DURATION_UNITS_HELP = "90s, 1.5s, 10m, 1h30m; a bare number is seconds"
PERCENTILE_UNITS_HELP = "p50, p90, p95, p99, p99.9; a bare number such as 99 is still accepted"

_T = TypeVar("_T")


def deprecated_alias(value: _T | None, old_value: _T | None, flag: str, old_flag: str) -> _T | None:
    """The value of `flag`, or of its hidden deprecated spelling `old_flag` with a warning."""
    if old_value is None:
        return value
    if value is not None:
        raise UsageError(f"{old_flag} is the old name of {flag}: give one of them")
    err_console.print(f"[yellow]warning:[/] {old_flag} is deprecated, use {flag}", highlight=False)
    return old_value


def given_on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave option `name` (by its parameter name) rather than taking its default.
    By the source's name: typer carries its own copy of click, whose enum is not click's."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"
