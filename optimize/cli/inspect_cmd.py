"""`lto inspect`: parse flags, call optimize.model.inspection, print tables or JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from optimize.artifact import load_artifact
from optimize.cli.common import JsonOption, ShapeOption, console, print_json
from optimize.data import parse_shape_args
from optimize.errors import UsageError
from optimize.model.inspection import inspect_model
from optimize.render.terminal import render_inspection

EPILOG = """
[bold]Examples[/]

  lto inspect sample_models/resnet_tiny.onnx
  lto inspect sample_models/bert_tiny.onnx --shape input_ids=1x128   [dim](pins batch, sequence everywhere)[/]
  lto inspect sample_models/bert_tiny.onnx --shape batch=1 --shape sequence=384
  lto inspect model.onnx --shape pixel_values=8x3x224x224 --json > model-info.json

FLOPs/MACs are computed only when every dynamic dim is pinned; MatMul/Gemm/Conv MACs are exact,
elementwise ops count 1 FLOP per element (convention in optimize/model/inspection.py).
"""


def inspect(
    model: Path = typer.Argument(..., help="ONNX model file, or an artifact folder.", show_default=False),
    shape: list[str] = ShapeOption,
    json_out: bool = JsonOption,
) -> None:
    """Show an ONNX model's versions, inputs/outputs, ops, parameters, FLOPs and validity."""

    info = inspect_model(artifact_model(model), parse_shape_args(shape))
    if json_out:
        print_json(info)
    else:
        render_inspection(info, console)


def artifact_model(path: Path) -> Path:
    """The ONNX file to inspect: the path itself, or an artifact folder's model (verified)."""
    if not path.is_dir():
        return path
    if not (path / "manifest.json").is_file():
        raise UsageError(
            f"{path} is a directory, not an ONNX file nor an artifact lto wrote (no manifest.json)",
            "pass the .onnx file, or a folder lto optimize wrote",
        )
    loaded = load_artifact(path)
    if loaded.model_path.suffix.lower() != ".onnx":
        raise UsageError(
            f"{path} holds a {loaded.backend} model ({loaded.model_path.name}); lto inspect reads ONNX files",
            "inspect the ONNX model it was made from",
        )
    return loaded.model_path


def register(app: typer.Typer) -> None:
    app.command("inspect", epilog=EPILOG)(inspect)
