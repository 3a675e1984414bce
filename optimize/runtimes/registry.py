"""The runtimes lto knows: one line per runtime folder.

Each folder's `spec.py` says what the runtime offers (optimize.runtimes.spec); `FOLDERS` is the
only place that names them all, so adding a runtime is its folder and one line here. Specs are
light: nothing here imports a runtime library.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from optimize.errors import UsageError
from optimize.model.runtime_model import BASELINE_BACKEND
from optimize.options import Schema, check_table
from optimize.runtimes.spec import BackendInfo, RuntimeOption, RuntimeSpec, StageInfo

# In the order a full recipe runs their stages.
FOLDERS = (
    "onnxruntime",
    "openvino",
    "tvm",
    "tensorrt",
)
RUNTIMES: list[RuntimeSpec] = [importlib.import_module(f"optimize.runtimes.{f}.spec").SPEC for f in FOLDERS]


def backend_infos() -> dict[str, BackendInfo]:
    return {info.kind: info for spec in RUNTIMES for info in spec.backends}


def backend_info(kind: str) -> BackendInfo:
    try:
        return backend_infos()[kind]
    except KeyError:
        raise UsageError(
            f"unknown backend {kind!r}", f"choose one of: {', '.join(sorted(backend_infos()))}"
        ) from None


def runtime_of_backend(kind: str) -> RuntimeSpec:
    """The runtime whose folder holds backend `kind`."""
    for spec in RUNTIMES:
        if any(info.kind == kind for info in spec.backends):
            return spec
    backend_info(kind)  # raises, naming the known kinds
    raise AssertionError("unreachable")


def stage_infos() -> dict[str, StageInfo]:
    """Every stage a runtime declares, by name, in the order a full recipe runs them."""
    return {stage.name: stage for spec in RUNTIMES for stage in spec.stages}


def stage_runtime(name: str) -> str | None:
    """The runtime whose candidates stage `name` makes."""
    return next((spec.name for spec in RUNTIMES for stage in spec.stages if stage.name == name), None)


def searched_runtimes() -> tuple[str, ...]:
    """The CPU runtimes `lto optimize --runtime auto` searches side by side."""
    return tuple(spec.name for spec in RUNTIMES if spec.searched)


def quantize_stages() -> tuple[str, ...]:
    """Stages that quantize, whatever the runtime: --quantize and --calib-data apply to each."""
    return tuple(name for name, stage in stage_infos().items() if stage.quantizes)


def runtime_options() -> dict[str, RuntimeOption]:
    """Every option `lto optimize --runtime-option` takes, by its full name ("tvm.trials")."""
    return {f"{spec.name}.{option.name}": option for spec in RUNTIMES for option in spec.options}


def _typed(text: str, schema: Schema) -> Any:
    """The command line's text as the schema's type, where it reads as one (else the text, which
    the schema check then refuses with what it expected)."""
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return text
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_runtime_options(texts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`--runtime-option RUNTIME.NAME=VALUE` flags as {stage: {option: value}}, each checked
    against the option's stage schema; an unknown name or a bad value is one UsageError."""
    known = runtime_options()
    out: dict[str, dict[str, Any]] = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        option = known.get(name.strip())
        if not sep or option is None:
            what = "is not RUNTIME.NAME=VALUE" if not sep else "names no runtime option"
            raise UsageError(f"--runtime-option {text!r} {what}", f"known: {', '.join(known) or 'none'}")
        schema = stage_infos()[option.stage].options[option.stage_key]
        runtime = name.strip().partition(".")[0]
        checked = check_table("--runtime-option ", runtime, {option.stage_key: _typed(raw, schema)},
                              {option.stage_key: schema})  # fmt: skip
        out.setdefault(option.stage, {}).update(checked)
    return out


# The runtime the baseline runs on (optimize.model.runtime_model.BASELINE_BACKEND), for its title in help
# texts and reports.
BASELINE_RUNTIME: RuntimeSpec = runtime_of_backend(BASELINE_BACKEND)

__all__ = [
    "BASELINE_BACKEND",
    "BASELINE_RUNTIME",
    "FOLDERS",
    "RUNTIMES",
    "backend_info",
    "backend_infos",
    "parse_runtime_options",
    "quantize_stages",
    "runtime_of_backend",
    "runtime_options",
    "searched_runtimes",
    "stage_infos",
    "stage_runtime",
]
