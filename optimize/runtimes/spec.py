"""What a runtime folder declares about itself: one `RuntimeSpec`, in its `spec.py`.

Everything the rest of lto needs to know about a runtime without importing it: the backends
that run its models, the stages that make candidates for it with their option schemas, what
it runs on, how `lto serve` splits it into instances, and how `lto export --triton` maps it.
Code is named as "module:attribute" and imported only when used, so `lto --help` never pays
for TVM or TensorRT, and a runtime whose library is missing is skipped with its reason.
Adding a runtime is a folder with a `spec.py` and one line in `optimize.runtimes.registry`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optimize.options import Schema


@dataclass(frozen=True)
class StageInfo:
    """A stage as its runtime declares it (the class is imported only when the stage runs)."""

    name: str  # as recipes and --enable/--disable name it
    target: str  # "module:Class"
    options: Mapping[str, Schema] = field(default_factory=dict)  # optimize.options schemas
    # Quantizes: --quantize turns it on and off, --calib-data is handed to it.
    quantizes: bool = False


@dataclass(frozen=True)
class BackendInfo:
    """A backend kind (as artifacts and --runtime name it), its class, and how `lto serve` runs it."""

    kind: str
    target: str  # "module:Class", a subclass of optimize.backend.Backend
    # The platform name KServe v2 clients know (model metadata).
    platform: str
    # The runtime setting that is one instance's thread count (None: serve cannot split it).
    threads_setting: str | None = None
    # Settings added when several instances share the machine, unless the artifact sets them.
    several_instances: Mapping[str, Any] = field(default_factory=dict)
    # Starts its own worker process when its config says process="isolated", instead of being
    # hosted by optimize.runtimes.worker (it must set its environment before its library loads).
    own_worker: bool = False
    device: str = "cpu"  # cpu | gpu: where its models run (a Triton instance's kind)


@dataclass(frozen=True)
class RuntimeOption:
    """A setting a runtime takes on `lto optimize` as `--runtime-option RUNTIME.NAME=VALUE`: one
    option of one of its stages, typed and checked by that stage's schema."""

    name: str  # as the command line names it, after "RUNTIME."
    stage: str  # the stage it sets
    help: str
    example: str  # a value, for --help
    key: str = ""  # the stage's option it sets, when not `name`

    @property
    def stage_key(self) -> str:
        return self.key or self.name


@dataclass(frozen=True)
class RuntimeSpec:
    name: str  # the folder's name
    title: str  # as people write it ("ONNX Runtime")
    backends: Sequence[BackendInfo]
    stages: Sequence[StageInfo] = ()
    # One of the CPU runtimes `lto optimize --runtime auto` searches side by side.
    searched: bool = False
    # "module:function" mapping an artifact to an optimize.triton.model.TritonModel:
    # (artifact dir, manifest) -> TritonModel. None: Triton has no backend for this runtime.
    triton: str | None = None
    # What `lto optimize --runtime-option` may set for this runtime.
    options: Sequence[RuntimeOption] = ()


def resolve(target: str) -> Any:
    """The attribute named by "module:attribute", imported now."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


__all__ = ["BackendInfo", "RuntimeOption", "RuntimeSpec", "StageInfo", "resolve"]
