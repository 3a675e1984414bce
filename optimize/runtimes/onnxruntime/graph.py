"""ONNX Runtime's own graph rewriting, saved to a file a stage can hand on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.model.onnx_file import file_has_external_data, read_model, save_model
from optimize.runtimes.onnxruntime.backend import session_options

if TYPE_CHECKING:
    import onnx


def ort_save_optimized(
    src: str | Path,
    dst: str | Path,
    level: str,
    disabled_optimizers: Sequence[str] = (),
) -> tuple[onnx.ModelProto, list[Path]]:
    """Let onnxruntime optimize `src` at `level` and write the result to `dst`, opsets stripped.

    Returns the written model (weights loaded) and the side files it needs.
    """
    import onnxruntime as ort

    src, dst = Path(src), Path(dst)
    external = file_has_external_data(src)
    config: dict[str, Any] = {"graph_optimization_level": level, "optimized_model_filepath": str(dst)}
    if external:
        # ORT writes big initializers to a side file only when told to; without it a >2 GB model fails.
        config["config_entries"] = {
            "session.optimized_model_external_initializers_file_name": dst.name + ".data",
            "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
        }
    so = session_options(config)
    kwargs: dict[str, Any] = {"providers": ["CPUExecutionProvider"]}
    if disabled_optimizers:
        kwargs["disabled_optimizers"] = list(disabled_optimizers)
    ort.InferenceSession(str(src), so, **kwargs)
    model = read_model(dst)
    extra = save_model(model, dst, external=external)
    return model, extra
