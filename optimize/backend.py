"""The one interface every runtime implements: load a model, run a batch, describe itself.

A backend never decides anything and never times itself: `optimize.bench` measures, the
pipeline decides. Keeping runtimes this small is what lets `bench`, `optimize` and `serve`
treat ONNX Runtime, TVM and TensorRT artifacts the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from optimize.errors import InputError, UsageError
from optimize.system.env import check_thread_count


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype name and shape of a model input or output.

    A dimension is an int when fixed, a str when it is a named dynamic dim ("batch"),
    and None when it is dynamic without a name.
    """

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


# Runtime configuration keys that are thread counts (ONNX Runtime's, TVM's).
THREAD_SETTINGS = ("intra_op_num_threads", "inter_op_num_threads", "num_threads")


def check_thread_settings(kind: str, config: Mapping[str, Any]) -> None:
    """Refuse a thread count out of bounds in a runtime configuration (a recipe, a manifest, flags)."""

    for key in THREAD_SETTINGS:
        if config.get(key) is not None:
            check_thread_count(config[key], f"{kind} setting {key}")


def check_feeds(
    specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray], data_file: str | None = None
) -> None:
    """Raise InputError naming the first array that does not fit the model's inputs: names,
    dtypes, ranks and fixed dims. `data_file` names where the arrays came from (--input-data)."""
    expected = {spec.name: spec for spec in specs}

    def what(name: str) -> str:
        return f"{data_file} array {name!r}" if data_file else f"input {name!r}"

    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        message = (
            f"{data_file} has an array {unknown[0]!r} that is not a model input"
            if data_file
            else f"unknown input {unknown[0]!r}"
        )
        raise InputError(message, f"the model's inputs are: {', '.join(expected)}")
    for name, spec in expected.items():
        if name not in feeds:
            if data_file:
                raise InputError(
                    f"{data_file} has no array for input {name!r}", "add one array per model input"
                )
            raise InputError(f"input {name!r} is missing", "give every model input")
        array = feeds[name]
        if str(array.dtype) != spec.dtype:
            raise InputError(f"{what(name)} has dtype {array.dtype}, the model expects {spec.dtype}")
        if len(array.shape) != len(spec.shape):
            raise InputError(
                f"{what(name)} has rank {array.ndim} (shape {list(array.shape)}), "
                f"the model expects rank {len(spec.shape)} (shape {list(spec.shape)})"
            )
        for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
            if isinstance(want, int) and want >= 0 and got != want:
                raise InputError(
                    f"{what(name)} has size {got} on axis {axis}, the model expects {want} "
                    f"(shape {list(spec.shape)})"
                )


class Backend(ABC):
    """A model loaded into one runtime, ready to run.

    Subclasses set `kind` and implement the four abstract members. `config` is the
    backend's runtime configuration (thread counts, session options ...) as plain JSON
    data, so that an artifact can store it and a later run can load it identically.
    """

    kind: ClassVar[str]

    def __init__(self, model_path: str | Path, config: Mapping[str, Any] | None = None) -> None:
        self.model_path = Path(model_path)
        self.config: dict[str, Any] = dict(config or {})

    @property
    @abstractmethod
    def inputs(self) -> list[TensorSpec]: ...

    @property
    @abstractmethod
    def outputs(self) -> list[TensorSpec]: ...

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Hot path: no checks here; call `check_feeds` once beforehand."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What ran: runtime name and version, device, effective configuration."""

    def prepare(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Make runs of exactly these input shapes as fast as the runtime can: a server calls it
        for each batch shape it will form, before any request. The default has nothing to do."""

    def close(self) -> None:
        """Release the runtime's resources. The default has nothing to release."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def config_with_defaults(self, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """The runtime configuration over `defaults`; an unknown key is a usage error naming it."""
        unknown = sorted(set(self.config) - set(defaults))
        if unknown:
            raise UsageError(
                f"unknown {self.kind} setting {unknown[0]!r}", f"known settings: {', '.join(defaults)}"
            )
        check_thread_settings(self.kind, self.config)
        return {**defaults, **self.config}

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Raise InputError naming the first input that does not fit the model."""
        check_feeds(self.inputs, feeds)
