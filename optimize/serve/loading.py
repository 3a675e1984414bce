"""What `serve` and `load --artifact` run: an lto artifact or a plain ONNX file, as N backend instances."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optimize.artifact import resolve_model
from optimize.backend import Backend
from optimize.data import embedding_vocab_sizes
from optimize.errors import InputError, UsageError
from optimize.model.onnx_file import load_model
from optimize.model.runtime_model import RuntimeModel
from optimize.runtimes.backends import open_backend, shared_cores
from optimize.runtimes.registry import backend_info, backend_infos
from optimize.runtimes.warmup import one_request
from optimize.system.env import check_thread_count, physical_cores


def platform_of(model: RuntimeModel) -> str:
    """The protocol "platform" name clients know for the model's runtime (its spec says it)."""
    info = backend_infos().get(model.backend)
    return info.platform if info is not None else model.backend


def resolve_served(
    model: str | Path | None, artifact: str | Path | None, name: str | None = None
) -> RuntimeModel:
    """An artifact folder (verified by optimize.artifact), given as MODEL like every command takes
    it or with --artifact, or an ONNX file run by ONNX Runtime."""
    if (model is None) == (artifact is None):
        raise UsageError("give either MODEL.onnx or an artifact folder", "e.g. lto serve out/model")
    if artifact is None and Path(str(model)).is_dir():
        artifact = model
    if artifact is not None:
        return resolve_model(artifact, label=name or Path(artifact).resolve().name)
    path = Path(str(model))
    if not path.is_file():
        raise UsageError(f"model not found: {path}", "give an .onnx file or an artifact folder")
    served = resolve_model(path, label=name or path.stem)
    # Spinning intra-op threads would burn the cores the event loop needs between batches.
    served.runtime_config = {"allow_spinning": False}
    return served


def open_instances(served: RuntimeModel, instances: int, threads: int | None = None) -> list[Backend]:
    """Load the model `instances` times; ONNX Runtime and OpenVINO instances split the cores
    between them, or use `threads` threads each when given."""

    # Each instance runs in its own thread: bounded like any thread count, before loading any.
    check_thread_count(instances, "--instances", minimum=1)
    config = dict(served.runtime_config)
    info = backend_info(served.backend)
    key = info.threads_setting  # one instance's thread count, where serve can split the runtime
    if threads is not None:
        if key is None:
            splittable = ", ".join(kind for kind, i in backend_infos().items() if i.threads_setting)
            raise UsageError(f"--threads applies to {splittable} models, not {served.backend}")
        check_thread_count(threads, "--threads", minimum=1)
        config[key] = threads
    if key is not None and instances > 1 and threads is None and instances > physical_cores():
        raise UsageError(
            f"--instances {instances} exceeds the {physical_cores()} physical cores here",
            "more instances than cores only adds contention",
        )
    config.update(shared_cores(served.backend, config, instances))
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

    try:
        return one_request(served, backend, shapes), None
    except InputError as exc:
        return None, f"no calibration ({exc.one_line()}); the latency model learns from the first batches"


@dataclass
class InputLimits:
    """What a request's values may be, read from the model's embedding tables."""

    # Input name -> values must lie in [0, limit): rows of the table it indexes.
    value_limits: dict[str, int] = field(default_factory=dict)
    # Rows of the position table: the longest sequence the model takes.
    max_sequence: int | None = None


def _onnx_source(served: RuntimeModel) -> Path | None:
    """The ONNX graph behind the served model: the model itself, or the one in its artifact."""
    if served.model_path.suffix == ".onnx":
        return served.model_path
    if served.artifact_dir is not None:
        return next(iter(sorted(Path(served.artifact_dir).glob("*.onnx"))), None)
    return None


def input_limits(served: RuntimeModel) -> InputLimits:
    """Vocabulary and token-type tables (as optimize.data finds them for generated inputs) and
    the position table: an embedding whose indices the graph computes (a Range or Slice over
    positions), named as exporters name it. Empty when the model has none or cannot be read."""

    path = _onnx_source(served)
    if path is None:
        return InputLimits()
    try:
        vocab = embedding_vocab_sizes(path)
        model = load_model(path, load_external_data=False)
    except Exception:  # a limit we cannot read is a check we skip, never a server that won't start
        return InputLimits()
    tables = {i.name: int(i.dims[0]) for i in model.graph.initializer if len(i.dims) == 2}
    inputs = {v.name for v in model.graph.input}
    positions = [
        tables[node.input[0]]
        for node in model.graph.node
        if node.op_type == "Gather"
        and node.input[0] in tables
        and "position" in node.input[0].lower()
        and node.input[1] not in inputs
    ]
    return InputLimits(vocab, min(positions) if positions else None)
