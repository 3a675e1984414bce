"""Build TensorRT engines from the best standard-op graph: the usual winner on an NVIDIA GPU.

Precision comes from the graph, never from builder flags: TensorRT 11 is strongly typed (and we
ask TensorRT 10 and TensorRT-RTX for strong typing too). So FP16 means converting the ONNX graph
to float16 first (float32 inputs and outputs kept, so the engine is a drop-in), and INT8 means
the Q/DQ nodes the quantization stage wrote, built as they are.

Options (recipe `tensorrt-build:` block):
  precisions: [fp32, fp16]          graphs to build when the input has no Q/DQ nodes
  shapes: ["input_ids=1x128:8x128:32x128"]   optimization-profile ranges (default: the benchmark shapes)
  builder_optimization_level: 3     0..5; higher builds slower and may run faster
  workspace_mb: 1024                builder workspace limit (default: TensorRT's, the whole GPU)
  hardware_compatibility: none      none | ampere_plus | same_compute_capability
  timing_cache: true                keep TensorRT's kernel timings in lto's cache dir and reuse them
  cache_dir: (lto's cache)          where the timing cache lives ($LTO_CACHE_DIR or ~/.cache/lto)
  runtime: auto                     auto | tensorrt | tensorrt-rtx
  cuda_graph: false                 candidates replay a captured CUDA graph (batch-1 latency)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from optimize.data import model_input_specs, parse_shape_ranges
from optimize.errors import LtoError, UsageError
from optimize.files import cache_root
from optimize.model.onnx_file import op_counts, read_model, save_model
from optimize.runtimes.tensorrt.engine import (
    BuildSettings,
    EngineBuildError,
    build_engine,
    import_runtime,
    profile_for_inputs,
    rtx_target,
    timing_cache_file,
)
from optimize.stage import Candidate, Stage, StageContext, StageSkipped
from optimize.system import gpu
from optimize.system.gpu import GpuStatus

PRECISIONS = ("fp32", "fp16")
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def default_cache_dir(options: dict[str, Any]) -> Path:

    return Path(options["cache_dir"]) if options.get("cache_dir") else cache_root()


def has_qdq(model_path: Path) -> bool:

    ops = op_counts(read_model(model_path, load_external_data=False))
    return any(ops.get(op, 0) or ops.get(f"ai.onnx:{op}", 0) for op in _QDQ_OPS)


def convert_fp16(src: Path, dst: Path) -> list[Path]:
    """Write a float16 copy of `src` whose inputs and outputs stay float32.

    onnxruntime.transformers' converter, not onnxconverter-common's: with keep_io_types the
    latter left a float16 value feeding a float32 graph output on BERT
    (docs/onnxruntime.md#fp16-converters), the former produced loadable graphs on every model measured.
    """
    import contextlib
    import io

    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(read_model(src))
    # The converter prints a warning for every constant it clamps into fp16 range.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        model.convert_float_to_float16(keep_io_types=True)
    return save_model(model.model, dst)


class TensorrtBuildStage(Stage):
    name: ClassVar[str] = "tensorrt-build"
    description: ClassVar[str] = "TensorRT engine (strongly typed: fp32, fp16 graph, or the Q/DQ int8 graph)"

    def __init__(self, gpu_probe: Callable[[], GpuStatus] | None = None) -> None:
        # Injectable so tests can play a machine with a GPU; the default asks the driver once.
        self._gpu_probe = gpu_probe

    def _gpu(self) -> GpuStatus:

        return (self._gpu_probe or gpu.gpu_status)()

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        status = self._gpu()
        if not status.usable:
            return f"no usable NVIDIA GPU: {status.reason}"

        try:
            trt, runtime = import_runtime(str(ctx.options.get("runtime", "auto")))
        except LtoError as exc:
            return exc.one_line()
        device = status.device
        if (
            runtime == "tensorrt-rtx"
            and device is not None
            and rtx_target(trt, device.compute_capability) is None
        ):
            return (
                f"only TensorRT-RTX is installed and it cannot target {device.name} "
                f"(compute capability {device.sm}); "
                "install full TensorRT: pip install 'lto-onnx[gpu]'"
            )
        source = ctx.best_standard
        if not source.standard_ops or source.model_path.suffix != ".onnx":
            return f"needs a standard-op ONNX graph, the best one is {source.label!r} ({source.backend})"
        return None

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:

        opts = ctx.options
        status = self._gpu()
        source = ctx.best_standard
        trt, runtime = import_runtime(str(opts.get("runtime", "auto")))

        if has_qdq(source.model_path):
            jobs = [("int8", source.model_path)]
        else:
            precisions = [str(p) for p in opts.get("precisions", PRECISIONS)]
            bad = [p for p in precisions if p not in PRECISIONS]
            if bad:
                raise UsageError(f"tensorrt-build: unknown precision {bad[0]!r}", "choose from fp32, fp16")
            jobs = []
            for precision in precisions:
                if precision == "fp16":
                    fp16_path = ctx.workdir / "model_fp16.onnx"
                    ctx.log("converting the graph to float16 (float32 inputs and outputs kept)")
                    convert_fp16(source.model_path, fp16_path)
                    jobs.append(("fp16", fp16_path))
                else:
                    jobs.append(("fp32", source.model_path))

        ranges = parse_shape_ranges(opts.get("shapes") or [])
        pinned = {name: tuple(arr.shape) for name, arr in ctx.feeds.items()}

        model_inputs = [(s.name, s.shape) for s in model_input_specs(source.model_path)]
        profile = profile_for_inputs(model_inputs, ranges, pinned)

        workspace_mb = opts.get("workspace_mb")
        cache = timing_cache_file(default_cache_dir(opts), runtime, str(trt.__version__), status)
        settings_base = {
            "runtime": runtime,
            "builder_optimization_level": opts.get("builder_optimization_level"),
            "workspace_bytes": int(workspace_mb) * (1 << 20) if workspace_mb else None,
            "hardware_compatibility": str(opts.get("hardware_compatibility", "none")),
            "timing_cache": cache if opts.get("timing_cache", True) else None,
        }
        cuda_graph = bool(opts.get("cuda_graph", False))
        candidates: list[Candidate] = []
        failures: list[LtoError] = []
        for precision, onnx_path in jobs:
            ctx.log(f"building a {precision} engine with {runtime} {trt.__version__}")
            engine_path = ctx.workdir / f"model_{precision}.engine"
            try:
                result = build_engine(
                    onnx_path,
                    engine_path,
                    profile,
                    BuildSettings(precision=precision, **settings_base),
                    status,
                    log_path=ctx.workdir / f"tensorrt_{precision}.log",
                )
            except EngineBuildError as exc:
                ctx.log(f"{precision} engine failed: {exc.one_line()}")
                failures.append(exc)
                continue
            m = result.manifest
            device = status.device
            candidates.append(
                Candidate(
                    label=f"tensorrt:{precision}",
                    model_path=result.engine_path,
                    backend="tensorrt",
                    runtime_config={"cuda_graph": cuda_graph},
                    standard_ops=False,
                    precision=precision,
                    details={
                        "runtime": runtime,
                        "runtime_version": m["runtime_version"],
                        "gpu": device.name if device else None,
                        "compute_capability": device.sm if device else None,
                        "hardware_compatibility_level": m["hardware_compatibility_level"],
                        "source": source.label,
                        "profile": m["profiles"][0],
                        "builder_optimization_level": m["builder_optimization_level"],
                        "workspace_bytes": m["workspace_bytes"],
                        "timing_cache": m["timing_cache"],
                        "build_s": m["build_s"],
                        "engine_bytes": m["engine_bytes"],
                        "manifest": str(Path(f"{result.engine_path}.json").name),
                    },
                    extra_files=[Path(f"{result.engine_path}.json")],
                )
            )
        if not candidates:
            if failures:
                raise failures[0]
            raise StageSkipped("nothing to build")
        return candidates
