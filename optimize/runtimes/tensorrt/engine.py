"""TensorRT without the ceremony: shape ranges, the runtime module, engine builds and manifests.

Shared by the `tensorrt-build` stage, the `tensorrt` backend and the GPU benchmark. Two runtimes
speak the same Python API here: full TensorRT (`tensorrt`, 10.x and 11.x) and TensorRT-RTX
(`tensorrt_rtx`), which also builds engines on a machine without a GPU. Only one of them is ever
imported into a process: loading two TensorRT flavours side by side crashed
(docs/onnxruntime.md#gpu-providers).

An engine is tied to the TensorRT version and the GPU it was built for, so every engine gets a
JSON manifest beside it (`model.engine.json`) and loading checks it before TensorRT is asked.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimize.data import ShapeRange
from optimize.errors import BackendUnavailable, InputError, LtoError, UsageError
from optimize.files import sha256_bytes, sha256_file, write_bytes_atomic, write_json_atomic, write_text_atomic
from optimize.system.gpu import GpuDevice, GpuStatus

MANIFEST_FORMAT = "lto-tensorrt-engine"
MANIFEST_VERSION = 1

# runtime name (as lto writes it) -> Python module.
RUNTIME_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
# TensorRT flavours that must not share a process with each other.
_FLAVOUR_MODULES = ("tensorrt", "tensorrt_rtx", "tensorrt_lean", "tensorrt_dispatch")

HARDWARE_COMPATIBILITY = ("none", "ampere_plus", "same_compute_capability")

# What a TensorRT-RTX engine targets when no compute capability is set: Ampere and later RTX-class
# parts. Hopper (9.x, H100/H200) is not among them and Turing (7.5) needs an explicit target.
RTX_DEFAULT_TARGETS = ("8.0", "8.6", "8.9", "12.0", "12.1")


def rtx_target(trt: Any, cc: tuple[int, int]) -> Any:
    """TensorRT-RTX's ComputeCapability member for a device, or None when it cannot target it."""
    return getattr(trt.ComputeCapability, f"SM{cc[0]}{cc[1]}", None)


INSTALL_HINT = "install the GPU extra: pip install 'lto-onnx[gpu]' (see docs/gpu.md)"


class EngineBuildError(LtoError):
    """The ONNX parser or the TensorRT builder refused the model. `log` holds TensorRT's messages."""

    def __init__(self, message: str, hint: str | None = None, log: Sequence[str] = ()) -> None:
        super().__init__(message, hint)
        self.log = list(log)


def _input_range(
    name: str,
    dims: Sequence[int | str | None],
    ranges: Mapping[str, ShapeRange],
    pinned: Sequence[int] | None,
) -> ShapeRange:
    """The range of an input without its own --shape: named dims from dim ranges, the rest pinned."""
    lo, opt, hi = [], [], []
    for axis, dim in enumerate(dims):
        if isinstance(dim, int) and dim >= 0:
            values = (dim, dim, dim)
        elif isinstance(dim, str) and dim in ranges:
            rng = ranges[dim]
            if len(rng.min) != 1:
                raise InputError(
                    f"--shape {dim}=... names a dim, so it takes one number per shape (e.g. {dim}=1:8:32)"
                )
            values = (rng.min[0], rng.opt[0], rng.max[0])
        elif pinned is not None and len(pinned) == len(dims):
            values = (pinned[axis],) * 3
        else:
            label = f"dim {dim!r}" if isinstance(dim, str) else "a dynamic dim"
            raise InputError(
                f"no shape for input {name!r}: {label} on axis {axis} has no range",
                f"give --shape {name}=MIN:OPT:MAX"
                + (f" or --shape {dim}=MIN:OPT:MAX" if isinstance(dim, str) else ""),
            )
        lo.append(values[0])
        opt.append(values[1])
        hi.append(values[2])
    return ShapeRange(tuple(lo), tuple(opt), tuple(hi))


def profile_for_inputs(
    inputs: Sequence[tuple[str, Sequence[int | str | None]]],
    ranges: Mapping[str, ShapeRange],
    pinned: Mapping[str, Sequence[int]],
) -> dict[str, ShapeRange]:
    """One optimization profile: a range for every input.

    `inputs` are the model's (name, dims) with dynamic dims as str/None/-1. `ranges` come from
    --shape and are keyed by input name (`input_ids=1x16:8x128:32x512`) or, like lto's plain
    --shape, by a named dynamic dim (`sequence=16:128:512`). Dims without a range take the
    benchmark feeds' shape (`pinned`), which must lie inside every range: the engine has to
    run the inputs lto measures.
    """
    names = {name for name, _ in inputs}
    dim_names = {d for _, dims in inputs for d in dims if isinstance(d, str)}
    unknown = sorted(set(ranges) - names - dim_names)
    if unknown:
        raise InputError(
            f"--shape names {unknown[0]!r}, which is neither a model input nor a named dynamic dim",
            f"inputs: {', '.join(sorted(names))}",
        )
    profile: dict[str, ShapeRange] = {}
    for name, dims in inputs:
        shape = pinned.get(name)
        rng = ranges.get(name) or _input_range(name, dims, ranges, shape)
        if len(rng.min) != len(dims):
            raise InputError(
                f"--shape for {name!r} has rank {len(rng.min)}, "
                f"the model's input has rank {len(dims)} ({list(dims)})"
            )
        for axis, dim in enumerate(dims):
            if isinstance(dim, int) and dim >= 0 and not rng.min[axis] == rng.max[axis] == dim:
                raise InputError(
                    f"--shape for {name!r}: axis {axis} is fixed at {dim} in the model, the range gives "
                    f"{rng.min[axis]}..{rng.max[axis]}"
                )
        if shape is not None and not rng.contains(shape):
            raise InputError(
                f"the benchmark input {name!r} has shape {list(shape)}, outside the --shape range "
                f"{list(rng.min)}..{list(rng.max)}",
                "widen the range or pin the benchmark shape inside it",
            )
        profile[name] = rng
    return profile


# --------------------------------------------------------------------------------------------
# The runtime module


def import_runtime(runtime: str = "auto") -> tuple[Any, str]:
    """Import TensorRT and say which one: (module, "tensorrt" | "tensorrt-rtx").

    "auto" prefers full TensorRT (it targets every NVIDIA GPU, TensorRT-RTX only RTX-class
    and Ampere+ parts) and falls back to TensorRT-RTX.
    """
    if runtime not in ("auto", *RUNTIME_MODULES):
        raise UsageError(
            f"unknown TensorRT runtime {runtime!r}", f"choose auto, {', '.join(RUNTIME_MODULES)}"
        )
    wanted = list(RUNTIME_MODULES) if runtime == "auto" else [runtime]
    loaded = [m for m in _FLAVOUR_MODULES if m in sys.modules]
    if loaded:
        # A flavour is already in this process: use it or refuse; never load a second one.
        for name in wanted:
            if RUNTIME_MODULES[name] in loaded:
                return sys.modules[RUNTIME_MODULES[name]], name
        raise BackendUnavailable(
            f"{loaded[0]} is already loaded in this process; "
            f"{' or '.join(wanted)} cannot be loaded beside it",
            "TensorRT flavours crash when mixed in one process: run them in separate processes",
        )
    errors = []
    for name in wanted:
        try:
            return importlib.import_module(RUNTIME_MODULES[name]), name
        except ImportError as exc:  # also the bindings' "libnvinfer.so.N: cannot open shared object file"
            errors.append(f"{RUNTIME_MODULES[name]}: {exc}")
    raise BackendUnavailable(f"TensorRT is not importable ({'; '.join(errors)})", INSTALL_HINT)


def major_version(trt: Any) -> int:
    return int(str(trt.__version__).split(".")[0])


def make_logger(trt: Any, echo: Any = None) -> Any:
    """A TensorRT ILogger that keeps every message, so failures can show TensorRT's own words."""

    class _Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[tuple[str, str]] = []

        def log(self, severity: Any, msg: str) -> None:
            label = str(severity).rsplit(".", 1)[-1]
            self.messages.append((label, msg))
            if echo is not None and label in ("INTERNAL_ERROR", "ERROR"):
                echo(f"TensorRT {label.lower()}: {msg}")

        def lines(self, min_level: str = "VERBOSE") -> list[str]:
            order = ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"]
            limit = order.index(min_level)
            return [f"[{lvl}] {m}" for lvl, m in self.messages if lvl in order and order.index(lvl) <= limit]

        def errors(self) -> list[str]:
            return [m for lvl, m in self.messages if lvl in ("INTERNAL_ERROR", "ERROR")]

    return _Logger()


# --------------------------------------------------------------------------------------------
# Manifest


def manifest_path(engine_path: str | Path) -> Path:
    return Path(f"{engine_path}.json")


def check_manifest(
    manifest: Mapping[str, Any],
    runtime: str,
    runtime_version: str,
    device: GpuDevice | None,
    engine_bytes: bytes | None = None,
) -> str | None:
    """Why this engine must not be loaded here (None: it may be). Pure: testable without a GPU."""
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"not an lto engine manifest (format {manifest.get('format')!r})"
    if int(manifest.get("manifest_version", 0)) > MANIFEST_VERSION:
        return f"manifest version {manifest.get('manifest_version')} is newer than this lto understands"
    if manifest.get("runtime") != runtime:
        return f"engine was built with {manifest.get('runtime')}, this process runs {runtime}"
    built_version = str(manifest.get("runtime_version"))
    if built_version != runtime_version:
        return (
            f"engine was built with {manifest.get('runtime')} {built_version}, "
            f"this machine has {runtime_version}; "
            "TensorRT engines only load in the version that built them"
        )
    if engine_bytes is not None and manifest.get("engine_sha256") not in (None, sha256_bytes(engine_bytes)):
        return "the engine file changed after its manifest was written"
    if device is None:
        return "no CUDA device to run the engine on"
    built_gpu = manifest.get("gpu") or {}
    level = str(manifest.get("hardware_compatibility_level", "none"))
    cc = device.compute_capability
    built_cc_text = built_gpu.get("compute_capability")
    built_cc = tuple(int(x) for x in built_cc_text.split(".")) if built_cc_text else None
    if level == "ampere_plus":
        if cc < (8, 0):
            return (
                "engine needs an Ampere or newer GPU (compute capability >= 8.0), "
                f"this {device.name} is {device.sm}"
            )
        return None
    if runtime == "tensorrt-rtx" and not built_gpu:
        # TensorRT-RTX builds ahead of time for its supported GPUs, without a device at build time.
        targets = manifest.get("compute_capabilities") or list(RTX_DEFAULT_TARGETS)
        if device.sm not in targets:
            return (
                f"engine was built for compute capabilities {', '.join(targets)}, "
                f"this {device.name} is {device.sm}"
            )
        return None
    if built_cc is not None and built_cc != cc:
        return (
            f"engine was built for compute capability {built_cc_text} ({built_gpu.get('name')}), "
            f"this {device.name} is {device.sm}"
        )
    if level == "none" and built_gpu.get("name") and built_gpu.get("name") != device.name:
        return (
            f"engine was built on {built_gpu.get('name')}, this GPU is {device.name}; rebuild it here "
            "(or build with hardware_compatibility=same_compute_capability)"
        )
    return None


# --------------------------------------------------------------------------------------------
# Build


@dataclass
class BuildSettings:
    runtime: str = "auto"
    builder_optimization_level: int | None = None  # TensorRT's default is 3; 0..5
    workspace_bytes: int | None = None
    hardware_compatibility: str = "none"
    timing_cache: Path | None = None  # a file; read if present, written back after the build
    precision: str = "fp32"  # recorded only: strongly typed networks take precision from the graph


@dataclass
class BuildResult:
    engine_path: Path
    manifest: dict[str, Any]
    build_s: float
    log: list[str]


def _parser_errors(parser: Any) -> list[str]:
    out = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        desc = err.desc()
        node_name = err.node_name() if hasattr(err, "node_name") else ""
        op = err.node_operator() if hasattr(err, "node_operator") else ""
        where = f"node {node_name!r} (op {op})" if node_name or op else f"node #{err.node()}"
        out.append(f"{where}: {desc}")
    return out


def _network_io(network: Any, trt: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def spec(t: Any) -> dict[str, Any]:
        import numpy as np

        return {
            "name": t.name,
            "dtype": np.dtype(trt.nptype(t.dtype)).name,
            "shape": [int(d) for d in t.shape],
        }

    return (
        [spec(network.get_input(i)) for i in range(network.num_inputs)],
        [spec(network.get_output(i)) for i in range(network.num_outputs)],
    )


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    profile: Mapping[str, ShapeRange] | None,
    settings: BuildSettings,
    gpu: GpuStatus | None,
    log_path: Path | None = None,
    echo: Any = None,
) -> BuildResult:
    """Parse `onnx_path`, build a strongly typed engine with one profile, write it and its manifest.

    On a parser or builder failure raises EngineBuildError whose message names the offending
    node and whose full TensorRT log is written to `log_path`.
    """

    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    trt, runtime = import_runtime(settings.runtime)
    logger = make_logger(trt, echo)
    started = time.perf_counter()

    def fail(message: str, hint: str) -> EngineBuildError:
        lines = logger.lines()
        if log_path is not None:
            write_text_atomic(log_path, "\n".join(lines) + "\n")
            hint = f"{hint}; full TensorRT log: {log_path}"
        return EngineBuildError(message, hint, lines)

    builder = trt.Builder(logger)
    flags = 0
    # TensorRT 10 and TensorRT-RTX: ask for strong typing so precision comes from the graph (fp16
    # weights, Q/DQ int8). TensorRT 11 is always strongly typed and deprecates the flag.
    if runtime == "tensorrt-rtx" or major_version(trt) < 11:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = _parser_errors(parser) or logger.errors() or ["unknown parser error"]
        raise fail(
            f"TensorRT's ONNX parser rejected {onnx_path.name}: {errors[0]}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            "that layer is not supported by this TensorRT; exclude the stage or export without that op",
        )

    config = builder.create_builder_config()
    if settings.builder_optimization_level is not None:
        level = int(settings.builder_optimization_level)
        if not 0 <= level <= 5:
            raise UsageError(f"builder_optimization_level must be 0..5, got {level}")
        config.builder_optimization_level = level
    if settings.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(settings.workspace_bytes))
    hw = settings.hardware_compatibility
    if hw not in HARDWARE_COMPATIBILITY:
        raise UsageError(
            f"unknown hardware_compatibility {hw!r}", f"choose one of: {', '.join(HARDWARE_COMPATIBILITY)}"
        )
    if hw != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, hw.upper())

    device = gpu.device if gpu is not None and gpu.usable else None
    targets: list[str] = []
    if runtime == "tensorrt-rtx":
        # Build for the GPU that is here when there is one TensorRT-RTX can target (a smaller,
        # specialised engine); otherwise its portable default set.
        member = rtx_target(trt, device.compute_capability) if device is not None else None
        if member is not None:
            config.num_compute_capabilities = 1
            config.set_compute_capability(member, 0)
            targets = [device.sm] if device is not None else []
        else:
            targets = list(RTX_DEFAULT_TARGETS)

    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if profile:
        opt_profile = builder.create_optimization_profile()
        for tensor in inputs:
            rng = profile.get(tensor.name)
            if rng is None:
                raise InputError(
                    f"no shape range for input {tensor.name!r}", f"give --shape {tensor.name}=MIN:OPT:MAX"
                )
            try:
                opt_profile.set_shape(tensor.name, rng.min, rng.opt, rng.max)
            except (ValueError, TypeError) as exc:
                raise InputError(f"TensorRT rejected the shape range for {tensor.name!r}: {exc}") from exc
        config.add_optimization_profile(opt_profile)
    elif any(-1 in tuple(t.shape) for t in inputs):
        dyn = next(t.name for t in inputs if -1 in tuple(t.shape))
        raise InputError(
            f"input {dyn!r} has dynamic dims and no shape range", f"give --shape {dyn}=MIN:OPT:MAX"
        )

    cache_info: dict[str, Any] | None = None
    timing_cache = None
    with warnings.catch_warnings():
        # TensorRT-RTX keeps the timing-cache API but deprecates it (its tactics are chosen at run time).
        warnings.simplefilter("ignore", DeprecationWarning)
        if settings.timing_cache is not None:
            cache_info = {"path": str(settings.timing_cache), "loaded_bytes": 0}
            blob = b""
            if settings.timing_cache.is_file():
                blob = settings.timing_cache.read_bytes()
            try:
                timing_cache = config.create_timing_cache(blob)
            except Exception:  # TensorRT raises its own types for a corrupt cache
                timing_cache = None
            if timing_cache is None and blob:
                cache_info["discarded"] = "unreadable cache file; started a new one"
                timing_cache = config.create_timing_cache(b"")
            # ignore_mismatch=False: a cache from another GPU is refused rather than trusted.
            if timing_cache is not None and config.set_timing_cache(timing_cache, False):
                cache_info["loaded_bytes"] = len(blob) if "discarded" not in cache_info else 0
            else:
                cache_info["discarded"] = (
                    "TensorRT refused the cache (other GPU or version); started a new one"
                )
                timing_cache = config.create_timing_cache(b"")
                config.set_timing_cache(timing_cache, True)
                cache_info["loaded_bytes"] = 0

        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            errors = logger.errors() or ["the builder returned no engine"]
            raise fail(
                f"TensorRT could not build an engine from {onnx_path.name}: {errors[-1]}",
                "see the log for the layer; try a larger workspace_mb or a lower builder_optimization_level",
            )
        engine_bytes = bytes(serialized)
        if settings.timing_cache is not None and cache_info is not None:
            updated = config.get_timing_cache()
            if updated is not None:
                data = bytes(updated.serialize())
                write_bytes_atomic(settings.timing_cache, data)
                cache_info["written_bytes"] = len(data)
            if runtime == "tensorrt-rtx":
                cache_info["note"] = (
                    "TensorRT-RTX chooses kernels at run time; its timing cache holds no entries"
                )

    write_bytes_atomic(engine_path, engine_bytes)
    build_s = time.perf_counter() - started
    io_in, io_out = _network_io(network, trt)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "manifest_version": MANIFEST_VERSION,
        "runtime": runtime,
        "runtime_version": str(trt.__version__),
        # TensorRT-RTX engines are built ahead of time without binding to the build machine's GPU.
        "gpu": device.to_json() if device is not None and runtime == "tensorrt" else None,
        "build_machine_gpu": device.to_json() if device is not None else None,
        "cuda_driver_version": gpu.cuda_driver_version if gpu is not None else None,
        "compute_capabilities": targets,
        "hardware_compatibility_level": hw,
        "precision": settings.precision,
        "strongly_typed": True,
        # TensorRT may run fp32 convolutions and matmuls in TF32 on Ampere and later unless this is off.
        "tf32_allowed": bool(config.get_flag(trt.BuilderFlag.TF32))
        if hasattr(trt.BuilderFlag, "TF32")
        else None,
        "builder_optimization_level": int(config.builder_optimization_level),
        "workspace_bytes": settings.workspace_bytes,
        "profiles": [{name: rng.to_json() for name, rng in (profile or {}).items()}],
        "inputs": io_in,
        "outputs": io_out,
        "source_model": onnx_path.name,
        "source_model_sha256": _file_sha256(onnx_path),
        "engine_sha256": sha256_bytes(engine_bytes),
        "engine_bytes": len(engine_bytes),
        "timing_cache": cache_info,
        "build_s": round(build_s, 3),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(manifest_path(engine_path), manifest)
    lines = logger.lines("WARNING")
    if log_path is not None:
        write_text_atomic(log_path, "\n".join(logger.lines()) + "\n")
    return BuildResult(engine_path, manifest, build_s, lines)


def _file_sha256(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return sha256_file(path)
    return None


def timing_cache_file(cache_dir: Path, runtime: str, runtime_version: str, gpu: GpuStatus | None) -> Path:
    """One timing cache per (TensorRT version, GPU model): caches are not portable across either."""
    device = gpu.device if gpu is not None and gpu.usable else None
    gpu_key = (
        re.sub(r"[^A-Za-z0-9]+", "-", f"{device.name}-sm{device.sm}" if device else "no-gpu")
        .strip("-")
        .lower()
    )
    return cache_dir / "tensorrt" / f"timing-{runtime}-{runtime_version}-{gpu_key}.cache"
