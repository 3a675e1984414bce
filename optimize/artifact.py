"""The artifact `lto optimize` hands over: a directory that runs the same way anywhere it may run.

    <dir>/model.onnx (+ external data files, or a compiled library / engine)
    <dir>/manifest.json   backend, runtime configuration, input spec, sha256 of every file,
                          environment, versions, stage history, accuracy, CPU requirements
    <dir>/report.json     the shared report schema, kind "optimize"
    <dir>/report.md       the same for people

It is written through fsio.atomic_directory, so an interrupted run leaves either the previous
directory or the complete new one. `load_artifact` verifies every file's hash and that this
CPU has the instructions the artifact was built for before anything runs it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from optimize.errors import ModelError
from optimize.fsio import atomic_directory, sha256_file, write_json_atomic, write_text_atomic
from optimize.onnx_utils import NCHWC_DOMAIN, QUANT_OPS, has_vnni, iter_nodes, nchwc_block_width
from optimize.stages.base import Candidate

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1

VNNI_FLAGS = ["avx512_vnni", "avx_vnni", "amx_int8"]


def external_data_files(model_path: Path) -> list[Path]:
    """Side files holding an ONNX model's external tensors (relative to the model's folder)."""
    if model_path.suffix != ".onnx" or not model_path.is_file():
        return []
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # not our job to judge the file here; the backend load reports it
        return []
    locations: set[str] = set()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return [model_path.parent / loc for loc in sorted(locations)]


def _all_tensors(graph: Any) -> Iterator[Any]:
    """Initializers and tensor attributes of a graph and all its subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


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
        flags_needed = [
            flag
            for key in ("isa_requires", "requires_isa", "isa")
            if isinstance(details.get(key), list)
            for flag in details[key]
            if isinstance(flag, str)
        ]
        for flag in dict.fromkeys(flags_needed):
            isa.append({"any_of": [flag], "why": f"{stage} was built for it"})
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
                        "any_of": [f for f in VNNI_FLAGS],
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


def _copy_model_files(candidate: Candidate, staging: Path) -> tuple[str, list[str]]:
    """Copy the candidate's model and side files; returns (model file name, side file names)."""
    src = candidate.model_path
    model_name = f"model{src.suffix}" if src.suffix else "model"
    shutil.copyfile(src, staging / model_name)
    extras = list(candidate.extra_files) or external_data_files(src)
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
    candidate: Candidate,
    input_spec: Mapping[str, Any],
    outputs: list[dict[str, Any]],
    history: list[dict[str, Any]],
    accuracy: Mapping[str, Any],
    chain_details: list[Mapping[str, Any]],
    report: Mapping[str, Any],
    report_md: str,
    extra: Mapping[str, Any] | None = None,
    report_writer: Any = None,
) -> Path:
    """Write the artifact directory atomically. `report_writer(path, report)` validates + writes."""
    from optimize import __version__
    from optimize.env import cpu_isa_flags, environment

    env = environment()
    with atomic_directory(out_dir) as staging:
        model_name, side_files = _copy_model_files(candidate, staging)
        if report_writer is not None:
            report_writer(staging / "report.json", dict(report))
        else:
            write_json_atomic(staging / "report.json", report)
        write_text_atomic(staging / "report.md", report_md)
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
        _make_readable(staging)
    return out_dir


def _make_readable(root: Path) -> None:
    """Temp files are created private (0600/0700); an artifact is meant to be shared and served."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for path in root.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@dataclass
class LoadedArtifact:
    directory: Path
    backend: str
    model_path: Path
    runtime_config: dict[str, Any]
    input_spec: dict[str, Any]
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


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
    for key in ("backend", "model_file", "runtime_config", "input_spec", "files", "requires"):
        if key not in manifest:
            raise ModelError(f"artifact {directory.name}: {MANIFEST} lacks {key!r}")
    if manifest.get("manifest_version", 0) > MANIFEST_VERSION:
        raise ModelError(
            f"artifact {directory.name} was written by a newer lto "
            f"(manifest v{manifest['manifest_version']})",
            "upgrade lto",
        )
    return manifest


def load_artifact(directory: str | Path, cpu_flags: Iterable[str] | None = None) -> LoadedArtifact:
    """Verify an artifact (file hashes, CPU compatibility) and say how to run it.

    Refuses with ModelError, naming the reason, when a file is missing or changed, or this CPU
    lacks an instruction set the artifact needs. A different machine fingerprint is only a
    warning: the artifact runs correctly, its recorded timings just do not apply.
    """
    import platform

    from optimize.env import cpu_isa_flags, machine_fingerprint

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
    return LoadedArtifact(
        directory=root,
        backend=str(manifest["backend"]),
        model_path=root / manifest["model_file"],
        runtime_config=dict(manifest["runtime_config"]),
        input_spec=dict(manifest["input_spec"]),
        manifest=manifest,
        warnings=warnings,
    )


__all__ = [
    "LoadedArtifact",
    "check_cpu",
    "cpu_requirements",
    "external_data_files",
    "load_artifact",
    "read_manifest",
    "write_artifact",
]
