"""Options and output helpers shared by every command."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def print_json(obj: Any) -> None:
    """Machine output: plain JSON on stdout, nothing else."""
    from optimize.files import _json_default

    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


SHAPE_HELP = "Pin dynamic dims: NAME=1x128 (repeatable), e.g. --shape input_ids=1x128."
INPUT_DATA_HELP = "Real inputs: an .npz file with one array per model input."

ShapeOption = typer.Option([], "--shape", "-s", help=SHAPE_HELP, metavar="NAME=DxD")
InputDataOption = typer.Option(None, "--input-data", help=INPUT_DATA_HELP, metavar="FILE.npz")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
