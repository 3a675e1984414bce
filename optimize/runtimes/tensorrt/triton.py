"""TensorRT artifacts as Triton models: Triton's TensorRT backend (platform tensorrt_plan) with
the serialized engine as model.plan, its I/O from the JSON lto writes beside the engine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.errors import ModelError, UsageError
from optimize.triton.model import ModelIO, Tensor, TritonModel, TritonRuntime, lost


def tensorrt(config: Mapping[str, Any], engine: Mapping[str, Any]) -> TritonRuntime:
    """Triton's TensorRT backend (platform tensorrt_plan): the serialized engine as model.plan."""
    if engine.get("runtime") == "tensorrt-rtx":
        raise UsageError(
            "this artifact is a TensorRT-RTX engine; Triton's TensorRT backend runs TensorRT engines only",
            "build with the tensorrt runtime (lto optimize --tensorrt on the serving GPU) to export it",
        )
    runtime = TritonRuntime(
        platform="tensorrt_plan", model_file="model.plan", instance_kind="KIND_GPU", kserve_format="tensorrt"
    )
    if config.get("cuda_graph"):
        runtime.optimization["cuda"] = {"graphs": True}
        runtime.applied["cuda_graph"] = True
    runtime.warnings.append(
        f"a TensorRT engine loads only under TensorRT {engine.get('runtime_version', '(unknown)')}: "
        "run a Triton release that ships that version"
        + (
            f", on a GPU of compute capability {', '.join(map(str, engine['compute_capabilities']))}"
            if engine.get("compute_capabilities")
            else ""
        )
    )
    for key in sorted(set(config) - {"cuda_graph", "runtime"}):
        lost(runtime, key, config[key], "not passed to Triton's TensorRT backend")
    return runtime


def tensorrt_io(engine_manifest: Path) -> ModelIO:
    """From the JSON lto writes beside an engine: network I/O (-1 dynamic) and the profile's max."""
    try:
        manifest = json.loads(engine_manifest.read_text(encoding="utf-8"))
        inputs = [
            Tensor(t["name"], t["dtype"], tuple(int(d) for d in t["shape"])) for t in manifest["inputs"]
        ]
        outputs = [
            Tensor(t["name"], t["dtype"], tuple(int(d) for d in t["shape"])) for t in manifest["outputs"]
        ]
        profiles = manifest.get("profiles") or [{}]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{engine_manifest.name}: the engine manifest is unreadable: {exc}") from None
    limits = [int(rng["max"][0]) for rng in (profiles[0] or {}).values() if rng.get("max")]
    return ModelIO(inputs, outputs, min(limits) if limits else None)


def _engine_manifest(artifact: Path, manifest: Mapping[str, Any]) -> Path:
    for rel in manifest.get("side_files") or manifest["files"]:
        if str(rel).endswith(".engine.json"):
            return artifact / rel
    raise ModelError(
        f"artifact {artifact.name}: a TensorRT artifact without its engine manifest (*.engine.json)"
    )


def triton_model(artifact: Path, manifest: Mapping[str, Any]) -> TritonModel:
    engine_json = _engine_manifest(artifact, manifest)
    engine = json.loads(engine_json.read_text(encoding="utf-8"))
    return TritonModel(tensorrt(dict(manifest["runtime_config"]), engine), tensorrt_io(engine_json))
