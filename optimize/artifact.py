"""The artifact `lto optimize` hands over: a directory that runs the same way anywhere it may run.

    <dir>/model.onnx (+ external data files, or a compiled library / engine)
    <dir>/manifest.json   backend, runtime configuration, input spec, sha256 of every file,
                          environment, versions, stage history, accuracy, CPU requirements
    <dir>/report.json     the shared report schema, kind "optimize"
    <dir>/report.md       the same for people, linking plots/*.png
    <dir>/report.html     one self-contained page: the report with its plots embedded

It is written through fsio.atomic_directory, so an interrupted run leaves either the previous
directory or the complete new one. `load_artifact` verifies every file's hash and that this
CPU has the instructions the artifact was built for before anything runs it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from optimize.backend import check_thread_settings
from optimize.errors import ModelError, UsageError
from optimize.files import atomic_directory, sha256_file, write_json_atomic, write_markdown_atomic
from optimize.model.onnx_file import NCHWC_DOMAIN, QUANT_OPS, external_data_paths, iter_nodes, load_model
from optimize.model.runtime_model import BASELINE_BACKEND, RuntimeModel
from optimize.render.html_page import artifact_pages
from optimize.system.env import (
    VNNI_FLAGS,
    cpu_isa_flags,
    environment,
    has_vnni,
    machine_fingerprint,
    nchwc_block_width,
)
from optimize.version import __version__

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def cpu_requirements(
    model_path: Path, chain_details: Iterable[Mapping[str, Any]], build_flags: Iterable[str]
) -> dict[str, Any]:
    """What a CPU must have to run this model with the accuracy the manifest reports.

    Sources: stages that say so in their details (`isa_requires`: list of flags, e.g. a TVM
    library compiled for AVX-512; `isa_exact.nchwc_block_width`), NCHWc-blocked ops saved into
    the file (block size is tied to the SIMD width: run elsewhere they give silently wrong
    results), and int8 kernels checked on a VNNI CPU.
    """
    flags = set(build_flags)
    isa: list[dict[str, Any]] = []
    req: dict[str, Any] = {"cpu_isa": isa}
    for details in chain_details:
        # Stages list the flags their output needs under "isa_requires" (or "requires_isa"/"isa").
        stage = details.get("stage", "a stage")
        if details.get("independent_of_chain"):
            # Rebuilt from the source model in another runtime: nothing earlier in the chain is in it.
            isa.clear()
            req.pop("nchwc_block", None)
        flags_needed = [
            flag
            for key in ("isa_requires", "requires_isa", "isa")
            if isinstance(details.get(key), list)
            for flag in details[key]
            if isinstance(flag, str)
        ]
        for flag in dict.fromkeys(flags_needed):
            isa.append({"any_of": [flag], "why": f"{stage} was built for it"})
        # Stages whose output runs on any one of several flags list entries {"any_of": [...], "why"}.
        for entry in details.get("cpu_isa_any") or []:
            if isinstance(entry, dict) and isinstance(entry.get("any_of"), list) and entry["any_of"]:
                isa.append(
                    {"any_of": [str(f) for f in entry["any_of"]], "why": f"{stage}: {entry.get('why', '')}"}
                )
        exact = details.get("isa_exact") or {}
        if "nchwc_block_width" in exact:
            req["nchwc_block"] = exact["nchwc_block_width"]
    if model_path.suffix == ".onnx" and model_path.is_file():
        import onnx

        try:
            model = onnx.load(str(model_path), load_external_data=False)
        except Exception:
            model = None
        if model is not None:
            nodes = list(iter_nodes(model))
            if NCHWC_DOMAIN in {n.domain for n in nodes}:
                req.setdefault("nchwc_block", nchwc_block_width(flags))
            # int8 kernels (u8 activations x s8 weights) checked on a VNNI CPU: without VNNI, x86
            # kernels use 16-bit saturating multiply-adds and the accuracy figures no longer hold.
            if {n.op_type for n in nodes} & QUANT_OPS and has_vnni(flags):
                isa.append(
                    {
                        "any_of": list(VNNI_FLAGS),
                        "why": "int8 kernels were accuracy-checked with VNNI; without it u8s8 sums saturate",
                    }
                )
    return req


def check_cpu(requirements: Mapping[str, Any], flags: Iterable[str]) -> str | None:
    """Why this CPU cannot run the artifact (None: it can)."""
    have = set(flags)
    for entry in requirements.get("cpu_isa", []):
        options = list(entry.get("any_of", []))
        if options and not have & set(options):
            what = options[0] if len(options) == 1 else "one of " + ", ".join(options)
            return f"this CPU lacks {what} ({entry.get('why', 'required by the artifact')})"
    block = requirements.get("nchwc_block")
    if "nchwc_block" in requirements:
        block, here = requirements["nchwc_block"], nchwc_block_width(have)
        if here != block:
            return (
                f"the model holds NCHWc ops blocked for {block}-wide SIMD, this CPU "
                + (f"uses {here}-wide" if here else "has no NCHWc kernels")
                + " (they would give wrong results here)"
            )
    return None


def _copy_model_files(candidate: RuntimeModel, staging: Path) -> tuple[str, list[str]]:
    """Copy the candidate's model and side files; returns (model file name, side file names)."""
    src = candidate.model_path
    model_name = f"model{src.suffix}" if src.suffix else "model"
    shutil.copyfile(src, staging / model_name)
    extras = list(candidate.extra_files) or external_data_paths(src)
    names: list[str] = []
    for extra in extras:
        extra = Path(extra)
        # External-data locations are relative to the model's folder: keep that layout.
        try:
            rel = extra.relative_to(src.parent)
        except ValueError:
            rel = Path(extra.name)
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if extra.is_dir():
            shutil.copytree(extra, dest)
        else:
            shutil.copyfile(extra, dest)
        names.append(rel.as_posix())
    return model_name, names


def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        table[rel] = {"sha256": sha256_file(path), "size_bytes": path.stat().st_size}
    return table


def write_artifact(
    out_dir: Path,
    *,
    candidate: RuntimeModel,
    input_spec: Mapping[str, Any],
    outputs: list[dict[str, Any]],
    history: list[dict[str, Any]],
    accuracy: Mapping[str, Any],
    chain_details: list[Mapping[str, Any]],
    report: Mapping[str, Any],
    report_md: str,
    extra: Mapping[str, Any] | None = None,
    report_writer: Any = None,
    force: bool = False,
) -> Path:
    """Write the artifact directory atomically. `report_writer(path, report)` validates + writes.

    `out_dir` is replaced only under fsio.check_output_dir's rule (`force`: also a folder that
    looks like a damaged artifact).
    """

    env = environment()
    with atomic_directory(out_dir, force=force) as staging:
        model_name, side_files = _copy_model_files(candidate, staging)
        if report_writer is not None:
            report_writer(staging / "report.json", dict(report))
        else:
            write_json_atomic(staging / "report.json", report)
        # The plots (plots/*.png) and report.html go in the same staging folder: all or nothing.

        write_markdown_atomic(staging / "report.md", artifact_pages(staging, report, report_md))
        manifest: dict[str, Any] = {
            "manifest_version": MANIFEST_VERSION,
            "lto_version": __version__,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "backend": candidate.backend,
            "model_file": model_name,
            "side_files": side_files,
            "runtime_config": candidate.runtime_config,
            "precision": candidate.precision,
            "input_spec": dict(input_spec),
            "outputs": outputs,
            "requires": {
                "arch": env["cpu"]["arch"],
                **cpu_requirements(staging / model_name, chain_details, cpu_isa_flags()),
            },
            "environment": env,
            "fingerprint": env["fingerprint"],
            "versions": {"lto": __version__, **env.get("packages", {})},
            "stages": history,
            "accuracy": dict(accuracy),
            **dict(extra or {}),
            "files": _file_table(staging),
        }
        write_json_atomic(staging / MANIFEST, manifest)
    return out_dir


def read_manifest(directory: Path) -> dict[str, Any]:
    import json

    path = directory / MANIFEST
    if not directory.is_dir():
        raise ModelError(f"artifact {directory} does not exist or is not a directory")
    if not path.is_file():
        raise ModelError(
            f"{directory} is not an lto artifact (no {MANIFEST})", "give a directory written by lto optimize"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"artifact {directory.name}: {MANIFEST} is unreadable: {exc}") from None
    if not isinstance(manifest, dict):
        raise ModelError(
            f"artifact {directory.name}: {MANIFEST} must hold a JSON object, not {_json_type(manifest)}"
        )
    for key in ("backend", "model_file", "runtime_config", "input_spec", "files", "requires"):
        if key not in manifest:
            raise ModelError(f"artifact {directory.name}: {MANIFEST} lacks {key!r}")
    _check_manifest_types(directory.name, manifest)
    if manifest.get("manifest_version", 0) > MANIFEST_VERSION:
        raise ModelError(
            f"artifact {directory.name} was written by a newer lto "
            f"(manifest v{manifest['manifest_version']})",
            "upgrade lto",
        )
    return manifest


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


# What each manifest field must be (JSON types), checked before anything reads it: a hand-edited
# or damaged manifest is refused naming the field, never an internal error further on.
_MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "backend": (str,),
    "model_file": (str,),
    "runtime_config": (dict,),
    "input_spec": (dict,),
    "files": (dict,),
    "requires": (dict,),
    "manifest_version": (int,),
    "fingerprint": (str, type(None)),
}
_INPUT_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "dtype": (str,),
    "shape": (list,),
    "source": (str,),
    "generator": (str,),
    "low": (int,),
    "high": (int,),
    "note": (str,),
}


def _check_manifest_types(name: str, manifest: Mapping[str, Any]) -> None:
    def bad(field: str, want: str, value: Any, show: bool = False) -> ModelError:
        import json

        got = json.dumps(value, default=str)[:80] if show else _json_type(value)
        return ModelError(
            f"artifact {name}: {MANIFEST} field {field!r} must be {want}, not {got}",
            "re-run lto optimize; never edit an artifact in place",
        )

    def is_a(value: Any, types: tuple[type, ...]) -> bool:
        return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)

    names = {str: "a string", dict: "an object", list: "an array", int: "a whole number"}
    for key, types in _MANIFEST_FIELDS.items():
        if key in manifest and not is_a(manifest[key], types):
            raise bad(key, " or ".join(names.get(t, "null") for t in types), manifest[key])
    for rel, info in manifest["files"].items():
        if not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise bad(f"files.{rel}", 'an object with a "sha256" string', info, show=True)
    spec = manifest["input_spec"]
    for key, types in (
        ("seed", (int,)),
        ("data_file", (str, type(None))),
        ("data_sha256", (str, type(None))),
    ):
        if key in spec and not is_a(spec[key], types):
            raise bad(f"input_spec.{key}", " or ".join(names.get(t, "null") for t in types), spec[key])
    inputs = spec.get("inputs")
    if not isinstance(inputs, list):
        raise bad("input_spec.inputs", "an array", inputs)
    for i, tensor in enumerate(inputs):
        where = f"input_spec.inputs[{i}]"
        if not isinstance(tensor, dict):
            raise bad(where, "an object", tensor)
        for key in tensor:
            if key not in _INPUT_FIELDS:
                raise ModelError(f"artifact {name}: {MANIFEST} field '{where}.{key}' is not known")
        for key, types in _INPUT_FIELDS.items():
            if key in ("name", "dtype", "shape") and key not in tensor:
                raise ModelError(f"artifact {name}: {MANIFEST} lacks '{where}.{key}'")
            if key in tensor and not is_a(tensor[key], types):
                raise bad(f"{where}.{key}", names[types[0]], tensor[key])
        if not all(is_a(d, (int,)) and d >= 0 for d in tensor["shape"]):
            raise bad(f"{where}.shape", "an array of whole numbers", tensor["shape"], show=True)
    cpu_isa = manifest["requires"].get("cpu_isa", [])
    if not isinstance(cpu_isa, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("any_of", []), list)
        and all(isinstance(f, str) for f in e.get("any_of", []))
        for e in cpu_isa
    ):
        raise bad("requires.cpu_isa", 'an array of {"any_of": [strings]}', cpu_isa, show=True)
    if not is_a(manifest["requires"].get("arch"), (str, type(None))):
        raise bad("requires.arch", "a string", manifest["requires"]["arch"])
    # Thread counts: the same bound as --threads, so a manifest cannot start 100000 threads.

    try:
        check_thread_settings(str(manifest["backend"]), manifest["runtime_config"])
    except UsageError as exc:
        raise ModelError(f"artifact {name}: {MANIFEST} runtime_config: {exc.message}", exc.hint) from None


def load_artifact(directory: str | Path, cpu_flags: Iterable[str] | None = None) -> RuntimeModel:
    """Verify an artifact (file hashes, CPU compatibility) and say how to run it.

    Refuses with ModelError, naming the reason, when a file is missing or changed, or this CPU
    lacks an instruction set the artifact needs. A different machine fingerprint is only a
    warning: the artifact runs correctly, its recorded timings just do not apply.
    """
    import platform

    root = Path(directory)
    manifest = read_manifest(root)
    files: dict[str, Any] = manifest["files"]
    if manifest["model_file"] not in files:
        raise ModelError(
            f"artifact {root.name}: the manifest does not list the model file {manifest['model_file']}"
        )
    for rel, info in files.items():
        path = root / rel
        if not path.is_file():
            raise ModelError(f"artifact {root.name}: {rel} is missing")
        if sha256_file(path) != info.get("sha256"):
            raise ModelError(
                f"artifact {root.name}: {rel} was changed after lto wrote it (sha256 mismatch)",
                "re-run lto optimize; never edit an artifact in place",
            )
    requires = manifest["requires"]
    arch = requires.get("arch")
    if arch and arch != platform.machine():
        raise ModelError(f"artifact {root.name} was built for {arch}, this machine is {platform.machine()}")
    flags = set(cpu_flags) if cpu_flags is not None else cpu_isa_flags()
    why = check_cpu(requires, flags)
    if why:
        raise ModelError(
            f"artifact {root.name} cannot run on this CPU: {why}", "re-run lto optimize on this machine"
        )
    warnings: list[str] = []
    if manifest.get("fingerprint") and manifest["fingerprint"] != machine_fingerprint():
        warnings.append(
            "this machine differs from the one the artifact was tuned on (fingerprint "
            f"{manifest['fingerprint']}): its recorded latencies may not hold here"
        )
    return RuntimeModel(
        label=root.name,
        model_path=root / manifest["model_file"],
        backend=str(manifest["backend"]),
        runtime_config=dict(manifest["runtime_config"]),
        precision=str(manifest.get("precision") or "fp32"),
        artifact_dir=root,
        manifest=manifest,
        input_spec=dict(manifest["input_spec"]),
        warnings=warnings,
    )


def resolve_model(path: str | Path, backend: str | None = None, label: str | None = None) -> RuntimeModel:
    """A folder is an artifact (verified: file hashes, CPU compatibility); a file is run on
    `backend`, ONNX Runtime by default, after a check that fails early and clearly."""
    source = Path(path)
    if source.is_dir():
        loaded = load_artifact(source)
        if backend is not None and backend != loaded.backend:
            raise UsageError(f"{source} is a {loaded.backend} artifact; --runtime {backend} does not apply")
        if label is not None:
            loaded.label = label
        return loaded
    if not source.exists():
        raise UsageError(f"model not found: {source}", "check the path")
    kind = backend or BASELINE_BACKEND
    if source.suffix.lower() == ".onnx" or kind.startswith("onnxruntime"):
        load_model(source, load_external_data=False)
    elif backend is None:
        raise UsageError(
            f"{source.name} is not an .onnx file", "name its runtime with --runtime (e.g. tensorrt, tvm)"
        )
    return RuntimeModel(label=label or source.stem, backend=kind, model_path=source)


__all__ = [
    "check_cpu",
    "cpu_requirements",
    "load_artifact",
    "read_manifest",
    "resolve_model",
    "write_artifact",
]
