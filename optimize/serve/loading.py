"""What `serve` and `load --artifact` run: an lto artifact or a plain ONNX file, as N backend instances."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optimize.errors import InputError, UsageError
from optimize.runtime_model import RuntimeModel, resolve_model
from optimize.runtimes.base import Backend

# Protocol "platform" names clients know, by lto backend kind.
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tvm": "tvm", "tensorrt": "tensorrt_plan"}


def platform_of(model: RuntimeModel) -> str:
    return PLATFORMS.get(model.backend, model.backend)


def resolve_served(
    model: str | Path | None, artifact: str | Path | None, name: str | None = None
) -> RuntimeModel:
    """An artifact directory (verified by optimize.artifact) or an ONNX file run by ONNX Runtime."""
    if (model is None) == (artifact is None):
        raise UsageError("give either MODEL.onnx or --artifact DIR", "e.g. lto serve --artifact out/")
    if artifact is not None:
        return resolve_model(artifact, label=name or Path(artifact).resolve().name)
    path = Path(str(model))
    if not path.is_file():
        raise UsageError(f"model not found: {path}", "give an .onnx file or --artifact DIR")
    served = resolve_model(path, label=name or path.stem)
    # Spinning intra-op threads would burn the cores the event loop needs between batches.
    served.runtime_config = {"allow_spinning": False}
    return served


def open_instances(served: RuntimeModel, instances: int) -> list[Backend]:
    """Load the model `instances` times; ONNX Runtime instances split the cores between them."""
    from optimize.env import check_thread_count
    from optimize.runtimes import open_backend

    # Each instance runs in its own thread: bounded like any thread count, before loading any.
    check_thread_count(instances, "--instances", minimum=1)
    config = dict(served.runtime_config)
    if served.backend == "onnxruntime" and instances > 1 and not config.get("intra_op_num_threads"):
        from optimize.env import physical_cores

        cores = physical_cores()
        if instances > cores:
            raise UsageError(
                f"--instances {instances} exceeds the {cores} physical cores here",
                "more instances than cores only adds contention",
            )
        # Threads beyond the cores make every instance slower (oversubscription).
        config["intra_op_num_threads"] = max(1, cores // instances)
    backends: list[Backend] = []
    try:
        for _ in range(instances):
            backends.append(open_backend(served.backend, served.model_path, config))
    except BaseException:
        for backend in backends:
            backend.close()
        raise
    return backends


def calibration_row(
    served: RuntimeModel, backend: Backend, shapes: dict[str, tuple[int, ...]] | None = None
) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """One request's feeds to calibrate the latency model, or None and the reason."""
    from optimize.inputs import InputSpec, feeds_from_spec, resolve_inputs

    try:
        feeds = None
        if served.input_spec and not shapes:
            try:
                feeds = feeds_from_spec(InputSpec.from_json(served.input_spec))
            except (TypeError, KeyError, ValueError):
                # An older or partial spec: keep its shapes, generate the values here.
                shapes = {t["name"]: tuple(t["shape"]) for t in served.input_spec.get("inputs", [])}
        if feeds is None:
            _, feeds = resolve_inputs(served.model_path, shapes or {}, None, batch=1, specs=backend.inputs)
    except InputError as exc:
        return None, f"no calibration ({exc.one_line()}); the latency model learns from the first batches"
    fixed = {s.name for s in backend.inputs if s.shape and isinstance(s.shape[0], int)}
    return {k: v if k in fixed or not v.ndim else np.ascontiguousarray(v[:1]) for k, v in feeds.items()}, None
