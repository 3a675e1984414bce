"""The JSON file that travels next to an exported TVM library.

A `.so` exported from a Relax VM executable knows neither its ONNX input/output names nor the
CPU it was compiled for. The sidecar records both, so `TvmBackend` can check feeds like any
backend and refuse, with the reason, a library whose instructions this CPU lacks (instead of
dying with SIGILL on the first call). It has a fixed name in the library's folder, so it
survives the artifact writer renaming the library to `model.so`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimize.backend import TensorSpec
from optimize.errors import ModelError
from optimize.files import write_json_atomic

SIDECAR_NAME = "tvm_module.json"
FORMAT = "lto-tvm-module/1"


def sidecar_path(library: Path) -> Path:
    return Path(library).parent / SIDECAR_NAME


def write_sidecar(
    library: Path,
    *,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    target: dict[str, Any],
    isa_requires: list[str],
    tvm_version: str,
    tuning: dict[str, Any] | None,
    kernels: dict[str, Any],
) -> Path:
    return write_json_atomic(
        sidecar_path(library),
        {
            "format": FORMAT,
            "library": Path(library).name,
            "inputs": [s.to_json() for s in inputs],
            "outputs": [s.to_json() for s in outputs],
            "target": target,
            "isa_requires": sorted(isa_requires),
            "tvm_version": tvm_version,
            "kernels": kernels,
            "tuning": tuning,
        },
    )


def read_sidecar(library: Path) -> dict[str, Any]:
    path = sidecar_path(library)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"{library.name} has no {SIDECAR_NAME} beside it",
            "a TVM library needs the sidecar lto wrote with it (input/output names, target CPU)",
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"{path} is not an lto TVM sidecar (format {FORMAT})")
    return data


def specs(entries: list[dict[str, Any]]) -> list[TensorSpec]:
    return [TensorSpec(str(e["name"]), str(e["dtype"]), tuple(e["shape"])) for e in entries]
