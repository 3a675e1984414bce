"""Open a model in a runtime, here or in a worker process of its own: the backend registry,
read from the runtime specs.

Apart from the stages on purpose: `lto serve`, `bench` and the worker processes open backends
and never load the optimizer's stage interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.backend import Backend
from optimize.model.runtime_model import RuntimeModel
from optimize.runtimes.registry import backend_info
from optimize.runtimes.spec import resolve
from optimize.runtimes.worker import SubprocessBackend
from optimize.system.env import physical_cores


def backend_class(kind: str) -> type[Backend]:
    """The class behind backend `kind` (its module imported now; it may raise BackendUnavailable)."""
    cls: type[Backend] = resolve(backend_info(kind).target)
    return cls


def open_backend(kind: str, model_path: str | Path, config: Mapping[str, Any] | None = None) -> Backend:
    """Load `model_path` into the runtime named `kind` with its runtime configuration."""
    return backend_class(kind)(model_path, config)


def open_in_worker(kind: str, model_path: str | Path, config: Mapping[str, Any] | None = None) -> Backend:
    """`kind` loaded in a worker process of its own, for comparisons measured one runtime per
    process (optimize.bench.apart). A backend that starts its own worker (TVM: its child needs
    TVM's thread settings before TVM is imported) is asked to; every other is hosted by a
    SubprocessBackend."""
    info = backend_info(kind)
    settings = dict(config or {})
    if info.own_worker:
        return open_backend(kind, model_path, {**settings, "process": "isolated"})
    return SubprocessBackend(model_path, settings, hosted_kind=kind, hosted_class=info.target)


def shared_cores(kind: str, config: Mapping[str, Any], instances: int) -> dict[str, Any]:
    """The settings over `config` for one of `instances` instances of backend `kind` sharing this
    host's cores: its thread count capped at its share (threads beyond the cores make every
    instance slower, also when the artifact was tuned as the only model on the machine), and the
    runtime's settings for several instances (OpenVINO unpinned). Empty for one instance."""
    if instances <= 1:
        return {}
    info = backend_info(kind)
    settings: dict[str, Any] = {}
    if info.threads_setting is not None:
        share = max(1, physical_cores() // instances)
        settings[info.threads_setting] = min(int(config.get(info.threads_setting) or share), share)
    for key, value in info.several_instances.items():
        if config.get(key) is None:
            settings[key] = value
    return settings


def open_model(model: RuntimeModel, overrides: Mapping[str, Any] | None = None) -> Backend:
    """Load `model` into its runtime; `overrides` win over its stored runtime configuration."""
    return open_backend(model.backend, model.model_path, {**model.runtime_config, **(overrides or {})})


def open_model_in_worker(model: RuntimeModel, overrides: Mapping[str, Any] | None = None) -> Backend:
    """`model` in a worker process of its own, for timing one runtime per process."""
    return open_in_worker(model.backend, model.model_path, {**model.runtime_config, **(overrides or {})})


__all__ = [
    "backend_class",
    "open_backend",
    "open_in_worker",
    "open_model",
    "open_model_in_worker",
    "shared_cores",
]
