"""A model in a runtime: the one type that every command passes around.

Stages propose them (as candidates), the pipeline measures and ships them, `lto bench`,
`serve`, `load` and `gate` run them, and an artifact read back from disk is one. Plain data:
`optimize.artifact.resolve_model` turns what a user typed (an ONNX file or an artifact folder)
into one, and `optimize.runtimes.backends.open_model` loads one into its runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The backend the baseline is measured on and a plain ONNX file opens on: ONNX Runtime with its
# default settings. The one place that names it; optimize.runtimes.registry.BASELINE_RUNTIME is
# its runtime's spec (its title for people), for the layers above the runtimes.
BASELINE_BACKEND = "onnxruntime"


@dataclass
class RuntimeModel:
    """A model file, the runtime that runs it and that runtime's configuration."""

    label: str  # short, unique within a run: "baseline", "graph-fusion", "quantize:static-qdq"
    model_path: Path  # the file the backend loads (ONNX, TVM shared library, TensorRT engine)
    backend: str = BASELINE_BACKEND
    runtime_config: dict[str, Any] = field(default_factory=dict)
    # Only ai.onnx-domain ops: a graph that TVM and TensorRT can read.
    standard_ops: bool = True
    precision: str = "fp32"
    # What the stage did, for the report (fused ops, quantization mode, excluded nodes ...).
    details: dict[str, Any] = field(default_factory=dict)
    # Files besides model_path that belong to the model (external data, libraries).
    extra_files: list[Path] = field(default_factory=list)
    # Read from an artifact: its folder, manifest, the inputs it was measured with, and
    # warnings from its checks (another machine than the one it was tuned on, say).
    artifact_dir: Path | None = None
    manifest: dict[str, Any] | None = None
    input_spec: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


__all__ = ["RuntimeModel"]
