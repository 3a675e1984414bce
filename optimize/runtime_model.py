"""A model in a runtime: the one type that every command passes around.

Stages propose them (as candidates), the pipeline measures and ships them, `lto bench`,
`serve`, `load` and `gate` run them, and an artifact read back from disk is one. `resolve_model`
is the one way to turn what a user typed (an ONNX file or an artifact folder) into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.errors import UsageError

if TYPE_CHECKING:
    from optimize.backend import Backend


@dataclass
class RuntimeModel:
    """A model file, the runtime that runs it and that runtime's configuration."""

    label: str  # short, unique within a run: "baseline", "graph-fusion", "quantize:static-qdq"
    model_path: Path  # the file the backend loads (ONNX, TVM shared library, TensorRT engine)
    backend: str = "onnxruntime"
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

    def open(self, overrides: dict[str, Any] | None = None) -> Backend:
        """Load it into its runtime; `overrides` win over the stored runtime configuration."""
        from optimize.runtimes.backends import open_backend

        return open_backend(self.backend, self.model_path, {**self.runtime_config, **(overrides or {})})

    def open_in_worker(self, overrides: dict[str, Any] | None = None) -> Backend:
        """Load it in a worker process of its own, for timing one runtime per process."""
        from optimize.runtimes.worker import open_in_worker

        return open_in_worker(self.backend, self.model_path, {**self.runtime_config, **(overrides or {})})


def resolve_model(path: str | Path, backend: str | None = None, label: str | None = None) -> RuntimeModel:
    """A folder is an artifact (verified: file hashes, CPU compatibility); a file is run on
    `backend`, ONNX Runtime by default, after a check that fails early and clearly."""
    source = Path(path)
    if source.is_dir():
        from optimize.artifact import load_artifact

        loaded = load_artifact(source)
        if backend is not None and backend != loaded.backend:
            raise UsageError(f"{source} is a {loaded.backend} artifact; --runtime {backend} does not apply")
        if label is not None:
            loaded.label = label
        return loaded
    if not source.exists():
        raise UsageError(f"model not found: {source}", "check the path")
    kind = backend or "onnxruntime"
    if source.suffix.lower() == ".onnx" or kind.startswith("onnxruntime"):
        from optimize.onnx_file import load_model

        load_model(source, load_external_data=False)
    elif backend is None:
        raise UsageError(
            f"{source.name} is not an .onnx file", "name its runtime with --runtime (e.g. tensorrt, tvm)"
        )
    return RuntimeModel(label=label or source.stem, backend=kind, model_path=source)


__all__ = ["RuntimeModel", "resolve_model"]
