"""`lto export --triton`: an artifact as a Triton model, with the settings lto measured.

    REPO/<name>/config.pbtxt              ModelConfig in protobuf text format
    REPO/<name>/1/<model file>            the artifact's model (sha256 checked against its manifest)
    REPO/<name>/inferenceservice.yaml     a KServe InferenceService serving REPO
    REPO/<name>/lto-export.json           what lto decided and why; marks the folder as lto's

Only REPO/<name> is written, whole or not at all (staged beside it, then one rename), and only
when it is missing, empty or an earlier lto export: other models in the repository and folders
lto did not write are never touched. Triton ignores the two extra files in a model folder.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimize.artifact import MANIFEST, read_manifest
from optimize.errors import LtoError, ModelError, UsageError
from optimize.export import kserve
from optimize.export.batching import BatchingPlan, BatchProfile, plan_batching
from optimize.files import atomic_directory, sha256_file, write_json_atomic, write_text_atomic
from optimize.runtimes.registry import RUNTIMES, backend_info, runtime_of_backend
from optimize.runtimes.spec import resolve
from optimize.stats import PERCENTILES
from optimize.triton.model import ModelIO, Tensor, TritonModel, TritonRuntime, instance_group
from optimize.triton.pbtxt import Enum, to_plain, to_text
from optimize.version import __version__

MARKER = "lto-export.json"
# --backend: the runtime's own Triton backend, or lto's runtime inside Triton's python backend.
BACKENDS = ("native", "python")
# The python backend's model, package data: copied as 1/model.py (never imported here: it needs Triton's
# triton_python_backend_utils), with the artifact beside it in 1/artifact/.
PYTHON_MODEL = Path(__file__).with_name("templates") / "model.py"
ARTIFACT_FOLDER = "artifact"
KSERVE_FILE = "inferenceservice.yaml"
VERSION = "1"

# numpy dtype names -> Triton DataType enum names.
TRITON_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
    "object": "TYPE_STRING",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ExportRequest:
    artifact: Path
    repository: Path
    name: str | None = None
    slo_ms: float | None = None
    percentile: float | None = None  # None: the artifact's target percentile, else p99
    instances: int = 1
    profile: BatchProfile | None = None
    storage_uri: str | None = None
    # native: the runtime's own Triton backend (onnxruntime, openvino, tensorrt); python: lto's own
    # runtime inside Triton's python backend (optimize/export/templates/model.py).
    backend: str = "native"
    # The serving configuration searched on this machine (optimize/serve/config_search.py), when the
    # artifact has one and no batch profile was given: its batching and instances are exported.
    serving: dict[str, Any] | None = None


@dataclass
class ExportResult:
    model_dir: Path
    config: dict[str, Any]
    config_text: str
    batching: BatchingPlan | None
    profile: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schema_checked: bool = False
    kserve: dict[str, Any] = field(default_factory=dict)
    kserve_yaml: str = ""
    runtime_settings: dict[str, Any] = field(default_factory=dict)  # lto setting -> what Triton gets

    def to_json(self) -> dict[str, Any]:
        return {
            "model_dir": str(self.model_dir),
            "config_pbtxt": str(self.model_dir / "config.pbtxt"),
            "kserve_yaml": str(self.model_dir / KSERVE_FILE),
            "config": to_plain(self.config),
            "batching": self.batching.to_json() if self.batching else None,
            "batch_profile": self.profile,
            "checked_with_triton_schema": self.schema_checked,
            "runtime_settings": self.runtime_settings,
            "kserve": self.kserve,
            "warnings": self.warnings,
            "notes": self.notes,
        }


# -- reading the artifact ----------------------------------------------------------------------


def verified_manifest(artifact: Path) -> dict[str, Any]:
    """The manifest, after every file's sha256 matched it (the CPU check does not apply here:
    the artifact will run on the serving hosts, whose CPU requirements are passed on as a note)."""
    manifest = read_manifest(artifact)
    if manifest["model_file"] not in manifest["files"]:
        raise ModelError(f"artifact {artifact.name}: the manifest does not list its model file")
    for rel, info in manifest["files"].items():
        path = artifact / rel
        if not path.is_file():
            raise ModelError(f"artifact {artifact.name}: {rel} is missing")
        if sha256_file(path) != info["sha256"]:
            raise ModelError(
                f"artifact {artifact.name}: {rel} was changed after lto wrote it (sha256 mismatch)",
                "re-run lto optimize; never edit an artifact in place",
            )
    return manifest


def triton_model(artifact: Path, manifest: dict[str, Any], backend: str = "native") -> TritonModel:
    """The artifact as Triton runs it: by its runtime's mapping (optimize/runtimes/*/triton.py), or
    in lto's own runtime inside Triton's python backend."""
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}", f"choose one of: {', '.join(BACKENDS)}")
    spec = runtime_of_backend(str(manifest["backend"]))
    if backend == "python":
        return python_model(artifact, manifest, spec.triton)
    if spec.triton is None:
        exportable = ", ".join(s.name for s in RUNTIMES if s.triton)
        raise UsageError(
            f"Triton has no {spec.title} backend, so a {spec.title} artifact cannot be exported to it",
            f"export an artifact of another runtime ({exportable}), serve this one with lto serve, or "
            "export it with --backend python (lto's runtime inside Triton)",
        )
    mapping: TritonModel = resolve(spec.triton)(artifact, manifest)
    return mapping


# -- the model configuration -------------------------------------------------------------------


def _batch_axis_problem(io: ModelIO) -> str | None:
    """Why Triton cannot batch this model along its first axis (None: it can)."""
    for kind, tensors in (("input", io.inputs), ("output", io.outputs)):
        for tensor in tensors:
            if not tensor.dims:
                return f"{kind} {tensor.name!r} is a scalar"
            if tensor.dims[0] != -1:
                return f"{kind} {tensor.name!r} has a fixed first dim ({tensor.dims[0]})"
    return None


def _tensor_config(tensor: Tensor, batched: bool) -> dict[str, Any]:
    dtype = TRITON_TYPES.get(tensor.dtype)
    if dtype is None:
        raise ModelError(f"tensor {tensor.name!r} has dtype {tensor.dtype}, which Triton has no type for")
    dims = list(tensor.dims[1:] if batched else tensor.dims)
    # A batched model whose tensors are [batch] only: Triton wants dims [1] and reshape [].
    extra = {"reshape": {"shape": []}} if batched and not dims else {}
    return {"name": tensor.name, "data_type": Enum(dtype), "dims": dims or [1], **extra}


def _measured_batch(manifest: dict[str, Any]) -> int:
    inputs = manifest["input_spec"].get("inputs") or []
    shape = inputs[0]["shape"] if inputs else []
    return int(shape[0]) if shape else 1


def _slo(request: ExportRequest, manifest: dict[str, Any]) -> tuple[float | None, float, str]:
    """(SLO ms, percentile, where they came from)."""
    target = manifest.get("target") if isinstance(manifest.get("target"), dict) else {}
    percentile = request.percentile
    if percentile is None:
        key = str(target.get("percentile") or "p99")

        percentile = PERCENTILES.get(key, 99.0)
    if request.slo_ms is not None:
        return request.slo_ms, percentile, "--slo-ms"
    if target.get("ms"):
        return float(target["ms"]), percentile, "the artifact's target (lto optimize --target-ms)"
    return None, percentile, ""


def python_model(artifact: Path, manifest: dict[str, Any], native: str | None) -> TritonModel:
    """Triton's python backend running the artifact with lto's own runtime: every setting lto
    measured applies. The tensors are the native mapping's (declared dims, a dynamic batch axis)
    where the runtime has one, else the shapes lto measured (no batching)."""
    kind = str(manifest["backend"])
    config = dict(manifest["runtime_config"])
    gpu = backend_info(kind).device == "gpu"
    runtime = TritonRuntime(
        backend="python", model_file="model.py", instance_kind="KIND_GPU" if gpu else "KIND_CPU"
    )
    runtime.applied = {"lto runtime": kind, **{k: v for k, v in config.items() if v is not None}}
    runtime.warnings.append(
        f"the python backend runs lto's own {kind} runtime: the serving Triton's Python needs lto, the "
        "runtime's packages (pip install lto-onnx and its extra) and NumPy 1.x (the backend's stub is "
        "built against it), or $LTO_PYTHONPATH naming where they are"
    )
    if native is not None:
        io = resolve(native)(artifact, manifest).io
    else:
        io = ModelIO(
            [_pinned(t) for t in manifest["input_spec"]["inputs"]],
            [_pinned(t) for t in manifest["outputs"]],
            batch_limit=0,
        )
    return TritonModel(runtime, io)


def _pinned(tensor: dict[str, Any]) -> Tensor:
    return Tensor(str(tensor["name"]), str(tensor["dtype"]), tuple(int(d) for d in tensor["shape"]))


def build_config(request: ExportRequest, manifest: dict[str, Any], name: str) -> ExportResult:
    artifact = request.artifact
    model = triton_model(artifact, manifest, request.backend)
    runtime, io = model.runtime, model.io
    warnings = list(runtime.warnings)
    notes: list[str] = []
    problem = "the runtime's shapes are fixed (lto measured them pinned)" if io.batch_limit == 0 else ""
    problem = problem or _batch_axis_problem(io)
    plan: BatchingPlan | None = None
    profile_json: dict[str, Any] | None = None
    slo_ms, percentile, slo_source = _slo(request, manifest)
    dynamic: dict[str, Any] | None = None
    if problem:
        max_batch = 0
        notes.append(f"max_batch_size 0 (Triton will not batch): {problem}")
        if request.profile is not None:
            warnings.append("the batch profile was not used: the model cannot be batched")
    elif request.profile is not None and slo_ms is not None:
        plan = plan_batching(request.profile, slo_ms, percentile, io.batch_limit)
        profile_json = request.profile.to_json(percentile)
        warnings += plan.warnings
        notes.append(f"SLO {slo_ms:g} ms at p{percentile:g}, from {slo_source}")
        notes += plan.why
        if request.profile.fingerprint and request.profile.fingerprint != manifest.get("fingerprint"):
            notes.append("the batch profile was measured on another machine than the artifact was tuned on")
        max_batch = plan.max_batch_size
        if plan.max_queue_delay_us is not None:
            dynamic = {
                "preferred_batch_size": plan.preferred_batch_size,
                "max_queue_delay_microseconds": plan.max_queue_delay_us,
            }
    elif request.serving is not None and request.profile is None:
        searched = request.serving
        max_batch = int(searched["max_batch"])
        if io.batch_limit is not None:
            max_batch = min(max_batch, io.batch_limit)
        if max_batch > 1:
            dynamic = {"max_queue_delay_microseconds": round(float(searched["max_wait_ms"]) * 1000)}
        notes.append(
            f"batching as searched for lto serve on this machine (serving.json): max_batch_size {max_batch}, "
            f"queue delay {float(searched['max_wait_ms']):g} ms"
        )
    else:
        max_batch = max(1, _measured_batch(manifest))
        if io.batch_limit is not None:
            max_batch = min(max_batch, io.batch_limit)
        if request.profile is None:
            how = (
                "no batch-latency profile: measure one with --measure-batches 1,2,4,8,16,32 (or lto bench "
                "ARTIFACT --batch 1,2,4,8,16,32 -o bench.json, then --batch-profile bench.json)"
            )
        else:
            how = "no SLO: give --slo-ms (the artifact has no --target-ms to fall back on)"
        warnings.append(
            f"no dynamic batching ({how}); max_batch_size is the batch lto optimize measured ({max_batch})"
        )
    batched = max_batch > 0
    config: dict[str, Any] = {
        "name": name,
        **runtime.config_fields(),
        "max_batch_size": max_batch,
        "input": [_tensor_config(t, batched) for t in io.inputs],
        "output": [_tensor_config(t, batched) for t in io.outputs],
        "dynamic_batching": dynamic,
        "instance_group": instance_group(runtime, request.instances),
        "optimization": runtime.optimization or None,
        "parameters": runtime.parameter_map(),
    }
    threads = int(
        manifest["runtime_config"].get("intra_op_num_threads")
        or manifest["runtime_config"].get("INFERENCE_NUM_THREADS")
        or 0
    )
    if request.instances > 1 and runtime.instance_kind == "KIND_CPU" and not threads:
        warnings.append(
            f"{request.instances} instances each use every core (the artifact leaves the thread count to "
            "the runtime): they will contend; in config.pbtxt, set the thread parameter to the serving "
            "host's cores / instances"
        )
    cpu_isa = manifest["requires"].get("cpu_isa") or []
    for entry in cpu_isa:
        notes.append(
            f"serving hosts need {' or '.join(entry.get('any_of', []))} "
            f"({entry.get('why', 'the artifact needs it')})"
        )
    if manifest["requires"].get("arch"):
        notes.append(f"built for {manifest['requires']['arch']} hosts")
    text = to_text(config)
    result = ExportResult(
        model_dir=request.repository / name,
        config=config,
        config_text=text,
        batching=plan,
        profile=profile_json,
        warnings=warnings,
        notes=notes,
    )
    result.schema_checked = check_with_triton_schema(text)
    cpus = threads * request.instances if runtime.instance_kind == "KIND_CPU" and threads else None
    result.kserve_yaml = kserve.inference_service(
        name=name,
        model_format=runtime.kserve_format,
        storage_uri=request.storage_uri,
        cpu=cpus,
        gpus=1 if runtime.instance_kind == "KIND_GPU" else 0,
        artifact=str(artifact),
    )
    result.kserve = {
        "name": kserve.resource_name(name),
        **kserve.describe(runtime.kserve_format, request.storage_uri),
    }
    result.runtime_settings = runtime.applied
    return result


def check_with_triton_schema(text: str) -> bool:
    """Parse `text` with Triton's ModelConfig schema when tritonclient[grpc] is installed.

    False: the schema is not installed (nothing was checked). A text it rejects is lto's bug.
    """
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError):  # tritonclient without its grpc extra raises RuntimeError
        return False
    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise LtoError(
            f"internal error: the config.pbtxt lto wrote does not parse as Triton's ModelConfig: {exc}"
        ) from None
    return True


# -- writing the model folder ------------------------------------------------------------------


def _is_lto_export(folder: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    tool = marker.get("tool") if isinstance(marker, dict) else None
    return isinstance(tool, dict) and tool.get("name") == "lto" and marker.get("kind") == "triton-export"


def check_model_dir(target: Path, artifact: Path) -> None:
    """Refuse a model folder lto could only write by destroying what it did not write."""
    fix = "choose another --name or --triton folder; lto replaces only empty folders and its own exports"
    shown = f"--triton model folder {target}"
    if target.is_symlink():
        raise UsageError(f"{shown} is a symlink; lto will not replace it", fix)
    resolved, art = target.resolve(), artifact.resolve()
    if resolved == art or art in resolved.parents or resolved in art.parents:
        raise UsageError(f"{shown} overlaps the artifact {artifact}; lto will not write there", fix)
    if target.parent.exists() and not target.parent.is_dir():
        raise UsageError(f"--triton {target.parent} is a file, not a folder", fix)
    if not target.exists():
        return
    if not target.is_dir():
        raise UsageError(f"{shown} is a file; lto will not replace it", fix)
    if _contains_cwd(target):
        raise UsageError(f"{shown} is the working folder or holds it; lto will not replace it", fix)
    if any(target.iterdir()) and not _is_lto_export(target):
        raise UsageError(f"{shown} holds files lto did not export; lto will not replace it", fix)


def _contains_cwd(folder: Path) -> bool:
    cwd = Path.cwd().resolve()
    return cwd == folder.resolve() or folder.resolve() in cwd.parents


def _copy_model(
    artifact: Path, manifest: dict[str, Any], runtime_file: str, version_dir: Path
) -> dict[str, str]:
    """Copy the model (renamed to the file Triton looks for) and its side files; return name -> sha256
    of what was copied, each checked against the artifact's manifest."""
    files = manifest["files"]
    model_rel = str(manifest["model_file"])
    copies = {model_rel: runtime_file}
    for rel in manifest.get("side_files") or []:
        rel = str(rel)
        if rel.endswith(".engine.json"):
            continue  # lto's own record of the engine; Triton does not read it
        if Path(rel).suffix == ".bin" and Path(model_rel).suffix == ".xml":
            copies[rel] = str(Path(runtime_file).with_suffix(".bin"))  # the IR's weights follow its name
        else:
            copies[rel] = rel  # external data: the path the model refers to
    copied: dict[str, str] = {}
    for rel, dest_rel in copies.items():
        dest = version_dir / dest_rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifact / rel, dest)
        digest = sha256_file(dest)
        if digest != files[rel]["sha256"]:
            raise LtoError(
                f"the copy of {rel} does not match the artifact's manifest (sha256); nothing was written"
            )
        copied[f"{VERSION}/{dest_rel}"] = digest
    return copied


def _copy_artifact(artifact: Path, manifest: dict[str, Any], version_dir: Path) -> dict[str, str]:
    """The python backend's model: model.py (lto's) and the whole artifact beside it, every copy
    checked against the artifact's manifest; return name -> sha256 of what was copied."""
    copied: dict[str, str] = {}
    model_py = version_dir / "model.py"
    shutil.copyfile(PYTHON_MODEL, model_py)
    copied[f"{VERSION}/model.py"] = sha256_file(model_py)
    target = version_dir / ARTIFACT_FOLDER
    for rel, info in [*manifest["files"].items(), (MANIFEST, None)]:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifact / rel, dest)
        digest = sha256_file(dest)
        if info is not None and digest != info["sha256"]:
            raise LtoError(
                f"the copy of {rel} does not match the artifact's manifest (sha256); nothing was written"
            )
        copied[f"{VERSION}/{ARTIFACT_FOLDER}/{rel}"] = digest
    return copied


def preflight(
    artifact: Path, repository: Path, name: str | None, backend: str = "native"
) -> tuple[str, dict[str, Any]]:
    """Everything that can refuse the export, before any measuring: the model name, the folder it
    would replace, the artifact's files, and whether Triton can run its runtime at all."""
    model_name = name or artifact.resolve().name
    if not _NAME.match(model_name) or model_name in (".", ".."):
        raise UsageError(
            f"model name {model_name!r} is not a Triton model folder name",
            "give --name with letters, digits, '_', '.' and '-' only",
        )
    check_model_dir(repository / model_name, artifact)
    manifest = verified_manifest(artifact)
    triton_model(artifact, manifest, backend)
    return model_name, manifest


def export_triton(request: ExportRequest) -> ExportResult:
    """Check, derive and write REPO/<name>; the result says what was written and why."""
    artifact = request.artifact
    if request.instances < 1:
        raise UsageError("--instances must be at least 1")
    name, manifest = preflight(artifact, request.repository, request.name, request.backend)
    target = request.repository / name
    result = build_config(request, manifest, name)
    runtime_file = str(result.config["default_model_filename"])
    # Written whole or not at all, with this module's rule for what may be replaced, checked
    # again just before the swap.
    with atomic_directory(
        target,
        check=lambda t: check_model_dir(t, artifact),
        writable_hint="choose a writable --triton folder",
    ) as staging:
        version_dir = staging / VERSION
        version_dir.mkdir()
        if request.backend == "python":
            copied = _copy_artifact(artifact, manifest, version_dir)
        else:
            copied = _copy_model(artifact, manifest, runtime_file, version_dir)
        write_text_atomic(staging / "config.pbtxt", result.config_text)
        write_text_atomic(staging / KSERVE_FILE, result.kserve_yaml)
        write_json_atomic(
            staging / MARKER,
            {
                "tool": {"name": "lto", "version": __version__},
                "kind": "triton-export",
                "artifact": {
                    "dir": str(artifact),
                    "backend": manifest["backend"],
                    "model_file": manifest["model_file"],
                    "model_sha256": manifest["files"][manifest["model_file"]]["sha256"],
                },
                "files": copied,
                **{k: v for k, v in result.to_json().items() if k != "model_dir"},
            },
        )
    return result


__all__ = [
    "ExportRequest",
    "ExportResult",
    "check_with_triton_schema",
    "export_triton",
    "preflight",
    "verified_manifest",
]
