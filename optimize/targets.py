"""What a command measures: an ONNX file, or an artifact directory written by `lto optimize`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimize.errors import UsageError


@dataclass
class Target:
    """A model in a runtime, ready to be opened as a Backend."""

    label: str
    backend: str
    model_path: Path
    runtime_config: dict[str, Any] = field(default_factory=dict)
    stored_input_spec: dict[str, Any] | None = None  # from an artifact's manifest
    artifact_dir: Path | None = None
    manifest: dict[str, Any] | None = None


def resolve_target(path: str | Path, backend: str | None = None, label: str | None = None) -> Target:
    """A model file is run on `backend` (ONNX Runtime by default); a directory is an artifact.

    Artifacts are verified first (file hashes, CPU compatibility) by `optimize.artifact`.
    """
    source = Path(path)
    if source.is_dir():
        from optimize.artifact import load_artifact

        loaded = load_artifact(source)
        if backend is not None and backend != loaded.backend:
            raise UsageError(f"{source} is a {loaded.backend} artifact; --backend {backend} does not apply")
        return Target(
            label=label or source.name,
            backend=loaded.backend,
            model_path=loaded.model_path,
            runtime_config=dict(loaded.runtime_config),
            stored_input_spec=loaded.input_spec,
            artifact_dir=source,
            manifest=loaded.manifest,
        )
    if not source.exists():
        raise UsageError(f"model not found: {source}", "check the path")
    kind = backend or "onnxruntime"
    if source.suffix.lower() == ".onnx" or kind.startswith("onnxruntime"):
        from optimize.model import load_model

        # Fail on a corrupt or unsupported model with a clear message before any runtime sees it.
        load_model(source, load_external_data=False)
    elif backend is None:
        raise UsageError(
            f"{source.name} is not an .onnx file", "name its runtime with --backend (e.g. tensorrt, tvm)"
        )
    return Target(label=label or source.stem, backend=kind, model_path=source)
