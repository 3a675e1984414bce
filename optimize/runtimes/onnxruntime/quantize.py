"""int8 quantization with onnxruntime.quantization, chosen by model kind and CPU ISA, accuracy-gated.

What wins where (measured, notes/ort.md §3):
* MatMul-heavy graphs (transformers, MLPs): dynamic int8 (weights S8, activations quantized to U8
  at run time). On a fused graph (com.microsoft ops) shape inference cannot type the tensors,
  so the default tensor type is given.
* Conv nets: static QDQ with calibration, U8 activations / S8 per-channel weights, on Conv,
  MatMul and Gemm; ORT's NHWC int8 kernels then run it. Dynamic int8 on convs is 2-9x slower
  and is never used (Conv is left out of the dynamic op list).
* x86 without VNNI: u8*s8 pairs can saturate the 16-bit intermediate (vpmaddubsw), so weights
  use 7 bits (reduce_range). S8 activations are 3x slower on x86 and are not offered.
* fp16: ORT's CPU provider computes it through casts, so it is never faster there; skipped.

The accuracy gate is the pipeline's (ctx.check_accuracy). When a quantized model fails it,
nodes are ranked by the error they add themselves (per-channel relative error of the node's
output minus that of its inputs, quantized vs float, on calibration inputs), and the most sensitive
are left in float, more on each retry, within `max_backoff_rounds` and the stage's deadline.

Options: mode (auto|dynamic|static), calibration (minmax|entropy|percentile), calib_data
(.npz path or list of feed dicts), calib_samples, max_backoff_rounds, quant_format
(qdq|qoperator), per_channel, exclude_nodes, fp16.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from optimize.accuracy import AccuracyResult
from optimize.errors import InputError, LtoError, message_line
from optimize.runtimes.onnxruntime.quant_sensitivity import (
    CONV_WEIGHT_OPS,
    backoff_sizes,
    rank_sensitive_nodes,
)
from optimize.stage import Candidate, OnnxRuntimeStage, StageContext, StageSkipped

if TYPE_CHECKING:
    import onnx

STATIC_OP_TYPES = ("Conv", "MatMul", "Gemm")
# ORT's dynamic (integer-op) quantizers minus the convolution ones (ConvInteger is slow).
DYNAMIC_OP_TYPES = ("MatMul", "Gemm", "Attention", "Gather", "EmbedLayerNormalization", "LSTM")
MATMUL_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Attention", "FusedMatMul", "FusedGemm", "LSTM", "GRU"})
FP16_SKIP_REASON = "fp16 skipped: onnxruntime's CPU provider runs fp16 through casts (never faster, notes §3)"
DEFAULT_CALIB_SAMPLES = 16
DEFAULT_BACKOFF_ROUNDS = 3


# ---------------------------------------------------------------------------------------------
# What to quantize


def weight_params(model: onnx.ModelProto) -> tuple[int, int]:
    """(parameters in conv weights, parameters in matmul-like weights), read from initializer dims."""
    sizes = {init.name: int(np.prod(init.dims)) if init.dims else 1 for init in model.graph.initializer}
    conv = matmul = 0
    for node in model.graph.node:
        if len(node.input) < 2:
            continue
        size = sizes.get(node.input[1], 0)
        if node.op_type in CONV_WEIGHT_OPS:
            conv += size
        elif node.op_type in MATMUL_WEIGHT_OPS:
            matmul += size
    return conv, matmul


def choose_mode(model: onnx.ModelProto, requested: str) -> tuple[str, str]:
    """("static" | "dynamic", why)."""
    if requested in ("static", "dynamic"):
        return requested, f"mode {requested} from the recipe"
    if requested not in ("auto", ""):
        raise InputError(f"quantize: unknown mode {requested!r}", "use auto, dynamic or static")
    conv, matmul = weight_params(model)
    if conv > matmul:
        return "static", f"conv net ({conv} conv vs {matmul} matmul weights): static QDQ"
    return "dynamic", f"MatMul-heavy ({matmul} matmul vs {conv} conv weights): dynamic int8"


# ---------------------------------------------------------------------------------------------
# Calibration data


def _split_samples(name: str, array: np.ndarray, like: np.ndarray) -> list[np.ndarray]:
    if array.dtype != like.dtype:
        raise InputError(f"calibration array {name!r} is {array.dtype}, the model input is {like.dtype}")
    if array.ndim == like.ndim + 1 and array.shape[1:] == like.shape:
        return [np.require(a, requirements="C") for a in array]  # a scalar input stays 0-d
    if array.ndim == like.ndim and array.shape[1:] == like.shape[1:] and like.ndim > 0:
        batch = like.shape[0]
        if array.shape[0] % batch == 0:
            return [np.ascontiguousarray(array[i : i + batch]) for i in range(0, array.shape[0], batch)]
    raise InputError(
        f"calibration array {name!r} has shape {list(array.shape)}; expected {list(like.shape)} "
        f"or samples stacked on a new first axis, e.g. {[8, *like.shape]}"
    )


def load_calibration(source: Any, like: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Calibration feeds from an .npz path (samples along axis 0) or a list of feed dicts."""
    if isinstance(source, (list, tuple)):
        samples = [dict(s) for s in source]
        for sample in samples:
            missing = sorted(set(like) - set(sample))
            if missing:
                raise InputError(f"calibration sample lacks input {missing[0]!r}")
        return samples
    path = Path(str(source))
    if not path.is_file():
        raise InputError(f"calibration data not found: {path}", "pass an .npz with one array per model input")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:
        raise InputError(f"cannot read calibration data {path}: {exc}") from exc
    missing = sorted(set(like) - set(arrays))
    if missing:
        raise InputError(f"calibration data {path.name} has no array for input {missing[0]!r}")
    per_input = {name: _split_samples(name, arrays[name], like[name]) for name in like}
    counts = {len(v) for v in per_input.values()}
    if len(counts) != 1:
        raise InputError(
            f"calibration data {path.name}: inputs hold different numbers of samples {sorted(counts)}"
        )
    return [{name: per_input[name][i] for name in like} for i in range(counts.pop())]


def generated_calibration(ctx: StageContext, count: int) -> list[dict[str, np.ndarray]]:
    """Inputs drawn like the benchmark inputs (token ids in the vocab, masks of ones), other seeds."""
    from optimize.inputs import generate_feeds, resolve_inputs

    shapes = {name: tuple(int(d) for d in array.shape) for name, array in ctx.feeds.items()}
    spec, _ = resolve_inputs(ctx.original_model, shapes)
    # Seeds far from the benchmark seed so calibration never sees the accuracy-check inputs.
    return [generate_feeds(spec, 1_000 + i) for i in range(count)]


# ORT's own fused kernels (EXTENDED level) and NCHWc ops: the quantizer does not know them, so a
# graph saved after them would stay mostly float. ORT re-applies them at load time anyway.
ORT_FUSED_OPS = frozenset({"FusedConv", "FusedGemm", "FusedMatMul"})


def quantization_source(candidate: Candidate, ctx: StageContext) -> tuple[Path, str]:
    """The model to quantize: the candidate's, unless ORT-fused kernels would hide its weights."""
    from optimize.onnx_file import NCHWC_DOMAIN, op_counts, read_model

    ops = op_counts(read_model(candidate.model_path, load_external_data=False))
    blocking = sorted(op for op in ORT_FUSED_OPS if ops.get(f"com.microsoft:{op}", 0))
    if any(op.startswith(NCHWC_DOMAIN + ":") for op in ops):
        blocking.append("NCHWc")
    if not blocking or candidate.model_path == ctx.original_model:
        return candidate.model_path, ""
    return ctx.original_model, (
        f"quantizing the original model: the best candidate holds ORT-fused {', '.join(blocking)} "
        "that the quantizer cannot handle (ORT fuses the quantized graph again at load time)"
    )


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._samples = list(samples)
        self._it = iter(self._samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return dict(sample) if (sample := next(self._it, None)) is not None else None

    def rewind(self) -> None:
        self._it = iter(self._samples)


# ---------------------------------------------------------------------------------------------
# The stage


class QuantizeStage(OnnxRuntimeStage):
    name: ClassVar[str] = "quantize"
    description: ClassVar[str] = (
        "int8: dynamic for MatMul-heavy models, static QDQ with calibration for conv nets"
    )

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:
        from optimize.onnx_file import QUANT_OPS, op_counts, read_model

        if reason := super().skip_reason(candidate, ctx):
            return reason
        if candidate.precision != "fp32":
            return f"the model is already {candidate.precision}"
        ops = {
            op.rpartition(":")[2]
            for op in op_counts(read_model(candidate.model_path, load_external_data=False))
        }
        if ops & QUANT_OPS:
            return "the model is already quantized"
        if not ops & (CONV_WEIGHT_OPS | MATMUL_WEIGHT_OPS):
            return "no Conv, MatMul, Gemm or Attention to quantize"
        return None

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        from optimize.env import cpu_isa_flags, has_vnni
        from optimize.onnx_file import read_model

        opts = ctx.options
        flags = cpu_isa_flags()
        vnni = has_vnni(flags)
        x86 = bool(flags & {"sse2", "avx", "avx2"})
        source, source_note = quantization_source(candidate, ctx)
        if source_note:
            ctx.log(source_note)
        model = read_model(source, load_external_data=False)
        mode, why = choose_mode(model, str(opts.get("mode", "auto")).lower())
        del model
        ctx.log(f"{why}; {'VNNI' if vnni else 'no VNNI'} CPU")
        notes: dict[str, Any] = {"source": source_note or "the best candidate's model"}
        if opts.get("fp16"):
            ctx.log(FP16_SKIP_REASON)
            notes["fp16"] = FP16_SKIP_REASON
        settings: dict[str, Any] = {
            "mode": mode,
            "mode_reason": why,
            "cpu": {
                "vnni": vnni,
                "flags": sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}),
            },
            "activation_type": "uint8",
            "weight_type": "int8",
            # Without VNNI, u8*s8 pair sums overflow int16 in vpmaddubsw; 7-bit weights cannot.
            "reduce_range": x86 and not vnni,
            "per_channel": bool(opts.get("per_channel", mode == "static")),
        }
        calibration: list[dict[str, np.ndarray]] = []
        if mode == "static":
            calibration, settings["calibration"] = self._calibration(ctx)

        # (label suffix, source model): the candidate itself, and for an unfused transformer
        # also its fused graph, where Attention becomes QAttention (notes §3: the fastest int8 BERT).
        sources: list[tuple[str, Path, dict[str, Any]]] = [("", source, {})]
        if mode == "dynamic" and opts.get("fused_variant", True):
            fused = self._fused_source(source, ctx)
            if fused is not None:
                sources.append(fused)
        out: list[Candidate] = []
        errors: dict[str, str] = {}
        skipped: list[str] = []
        for tag, source, extra_details in sources:
            if tag and ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                errors[tag] = "stage deadline reached"
                break
            try:
                cand = self._gated(source, tag, candidate, ctx, dict(settings), calibration)
            except StageSkipped as exc:
                skipped.append(str(exc))
                continue
            except Exception as exc:  # one failing variant must not take the others down
                errors[tag or "plain"] = exc.one_line() if isinstance(exc, LtoError) else message_line(exc)
                ctx.log(f"variant {tag or 'plain'} failed: {errors[tag or 'plain']}")
                continue
            cand.details.update(notes)
            cand.details.update(extra_details)
            out.append(cand)
        if not out and skipped and not errors:
            raise StageSkipped(skipped[0])
        if not out:
            raise LtoError("quantization failed: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
        for cand in out:
            cand.details["failed_variants"].update(errors)
        return out

    def _fused_source(self, source: Path, ctx: StageContext) -> tuple[str, Path, dict[str, Any]] | None:
        from optimize.onnx_file import op_counts, read_model
        from optimize.runtimes.onnxruntime.graph_fusion import detect_transformer, fuse_transformer

        model = read_model(source, load_external_data=False)
        if (
            any(op.startswith("com.microsoft:") for op in op_counts(model))
            or detect_transformer(model) is None
        ):
            return None
        del model
        try:
            details, _ = fuse_transformer(source, ctx.workdir / "fused.onnx", {})
        except StageSkipped:
            return None
        if not details["attention_fused"]:
            return None
        return "fused", ctx.workdir / "fused.onnx", {"fused_ops": details["fused_ops"]}

    def _gated(
        self,
        source: Path,
        tag: str,
        base: Candidate,
        ctx: StageContext,
        settings: dict[str, Any],
        calibration: list[dict[str, np.ndarray]],
    ) -> Candidate:
        """Quantize `source`, check it, and back off on sensitive nodes until the gate passes."""
        opts = ctx.options
        prepared, settings["preprocess"] = self._prepare(source, tag, base, ctx, settings["mode"])
        quantizer = _Quantizer(prepared, ctx.workdir, settings, opts, calibration, tag)
        user_excluded = [str(n) for n in opts.get("exclude_nodes", [])]
        rounds = int(opts.get("max_backoff_rounds", opts.get("max_retries", DEFAULT_BACKOFF_ROUNDS)))

        attempts: list[dict[str, Any]] = []
        cand = self._attempt(quantizer, base, user_excluded, 0, attempts, ctx)
        if cand is None:
            raise LtoError(attempts[-1]["error"])
        if not cand.details["quantized_ops"]:
            raise StageSkipped(
                "onnxruntime's quantizer found nothing to quantize "
                "(weights inside If/Loop subgraphs or ops it does not support)"
            )
        result = ctx.check_accuracy(cand)
        attempts[-1].update(_gate_summary(result))
        if not result.ok and rounds > 0:
            ctx.log(
                f"{cand.label}: accuracy gate failed ({result.reason}); ranking nodes by the error they add"
            )
            # Calibration inputs plus the benchmark inputs: the ranking should not fit one sample.
            samples = (calibration[:4] or generated_calibration(ctx, 2)) + [dict(ctx.feeds)]
            ranking = rank_sensitive_nodes(
                prepared, cand.model_path, quantizer.quantizable_nodes(), samples, ctx.workdir
            )
            ranked = [name for name, _ in ranking if name not in user_excluded]
            for round_index, size in enumerate(backoff_sizes(len(ranked), rounds), start=1):
                if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                    attempts.append({"attempt": round_index, "skipped": "stage deadline reached"})
                    break
                excluded = [*user_excluded, *ranked[:size]]
                retry = self._attempt(quantizer, base, excluded, round_index, attempts, ctx)
                if retry is None:
                    continue
                cand = retry
                result = ctx.check_accuracy(cand)
                attempts[-1].update(_gate_summary(result))
                verdict = "pass" if result.ok else "fail"
                ctx.log(f"{cand.label} back-off {round_index}: {size} node(s) kept in float -> {verdict}")
                if result.ok:
                    break
            cand.details["sensitivity"] = [
                {"node": n, "added_rel_error": round(e, 6)} for n, e in ranking[:10]
            ]
        cand.details["attempts"] = attempts
        cand.details["accuracy_gate"] = "passed" if result.ok else "failed"
        return cand

    # -- steps -------------------------------------------------------------------------------

    def _prepare(
        self, source: Path, tag: str, base: Candidate, ctx: StageContext, mode: str
    ) -> tuple[Path, str]:
        """A copy with every node named (exclusion is by name), pre-processed for static quantization."""
        from optimize.onnx_file import ensure_node_names, file_has_external_data, read_model, save_model

        suffix = f"-{tag}" if tag else ""
        note = "none"
        external = file_has_external_data(source)
        if mode == "static":
            from onnxruntime.quantization.shape_inference import quant_pre_process

            pre = ctx.workdir / f"preprocessed{suffix}.onnx"
            try:
                with _quiet():
                    quant_pre_process(str(source), str(pre), auto_merge=True, save_as_external_data=external)
                source, note = pre, "quant_pre_process (symbolic shapes, ORT basic optimizations)"
            except Exception as exc:
                note = f"quant_pre_process failed, quantizing the model as is: {message_line(exc)}"
                ctx.log(note)
        model = read_model(source)
        ensure_node_names(model)
        prepared = ctx.workdir / f"prepared{suffix}.onnx"
        save_model(model, prepared, external=external or None)
        return prepared, note

    def _calibration(self, ctx: StageContext) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
        count = int(ctx.options.get("calib_samples", DEFAULT_CALIB_SAMPLES))
        source = ctx.options.get("calib_data")
        if source is not None:
            samples = load_calibration(source, ctx.feeds)
            origin = str(source) if not isinstance(source, (list, tuple)) else "list"
            return samples, {"source": origin, "samples": len(samples)}
        ctx.log(
            f"WARNING: calibrating on {count} generated inputs (no --calib-data); activation ranges from "
            "synthetic data may not match real inputs. Pass --calib-data FILE.npz for representative ranges."
        )
        return generated_calibration(ctx, count), {"source": "generated", "samples": count}

    def _attempt(
        self,
        quantizer: _Quantizer,
        base: Candidate,
        excluded: list[str],
        index: int,
        attempts: list[dict[str, Any]],
        ctx: StageContext,
    ) -> Candidate | None:
        try:
            cand = quantizer.quantize(base, excluded, index)
        except Exception as exc:  # a failing variant is recorded, never a crash
            attempts.append({"attempt": index, "excluded": len(excluded), "error": message_line(exc)})
            ctx.log(f"quantization attempt {index} failed: {message_line(exc)}")
            return None
        attempts.append({"attempt": index, "excluded": len(excluded)})
        return cand


class _Quantizer:
    """One configured quantization of one prepared model; each call writes a new file."""

    def __init__(
        self,
        prepared: Path,
        workdir: Path,
        settings: dict[str, Any],
        opts: Mapping[str, Any],
        calibration: list[dict[str, np.ndarray]],
        tag: str = "",
    ) -> None:
        self.prepared = prepared
        self.workdir = workdir
        self.settings = settings
        self.opts = opts
        self.calibration = calibration
        from optimize.onnx_file import file_has_external_data

        self.external = file_has_external_data(prepared)
        self.tag = tag
        self.failed_variants: dict[str, str] = {}
        self._calib_cache: Path | None = None

    def quantizable_nodes(self) -> list[str]:
        from optimize.onnx_file import read_model

        ops = STATIC_OP_TYPES if self.settings["mode"] == "static" else DYNAMIC_OP_TYPES
        model = read_model(self.prepared, load_external_data=False)
        return [n.name for n in model.graph.node if n.op_type in ops and n.op_type != "Gather"]

    def _gemm_names(self) -> set[str]:
        from optimize.onnx_file import read_model

        model = read_model(self.prepared, load_external_data=False)
        return {n.name for n in model.graph.node if n.op_type == "Gemm"}

    def quantize(self, base: Candidate, excluded: list[str], index: int) -> Candidate:
        from optimize.onnx_file import QUANT_OPS, op_counts, read_model, save_model

        suffix = f"-{self.tag}" if self.tag else ""
        out = self.workdir / f"{self.settings['mode']}-int8{suffix}-{index}.onnx"
        if self.settings["mode"] == "dynamic":
            # The dynamic quantizer splits Gemm into "<name>_MatMul" + "<name>_Add" before it
            # matches names, so a Gemm is excluded under its MatMul's name too.
            gemms = self._gemm_names()
            self._dynamic(out, [*excluded, *(f"{n}_MatMul" for n in excluded if n in gemms)])
            label = "dynamic-int8"
        else:
            label = self._static(out, excluded)
        label += suffix
        model = read_model(out)
        extra = save_model(model, out, external=self.external or None)  # strips unused opsets
        _check_loads(out)
        ops = op_counts(model)
        config = dict(base.runtime_config)
        if config.get("graph_optimization_level", "all") in ("disable", "basic"):
            # int8 speed comes from ORT fusing Q/DQ into integer kernels (EXTENDED) and NHWC (LAYOUT).
            config["graph_optimization_level"] = "all"
        return Candidate(
            label=f"quantize:{label}",
            model_path=out,
            backend=base.backend,
            runtime_config=config,
            standard_ops=all(":" not in op for op in ops),
            precision="int8",
            details={
                **self.settings,
                "quantized_ops": {op: n for op, n in ops.items() if op.rpartition(":")[2] in QUANT_OPS},
                "excluded_nodes": list(excluded),
                "failed_variants": dict(self.failed_variants),
            },
            extra_files=extra,
        )

    def _dynamic(self, out: Path, excluded: list[str]) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from optimize.onnx_file import op_counts, read_model

        ops = op_counts(read_model(self.prepared, load_external_data=False))
        extra: dict[str, Any] = {}
        if any(":" in op for op in ops):
            # Fused graphs: shape inference cannot see through com.microsoft ops (notes §3).
            extra["DefaultTensorType"] = onnx.TensorProto.FLOAT
        with _quiet():
            quantize_dynamic(
                str(self.prepared),
                str(out),
                op_types_to_quantize=list(DYNAMIC_OP_TYPES),
                per_channel=self.settings["per_channel"],
                reduce_range=self.settings["reduce_range"],
                weight_type=QuantType.QInt8,
                nodes_to_exclude=excluded,
                use_external_data_format=self.external,
                extra_options=extra,
            )

    def _static(self, out: Path, excluded: list[str]) -> str:
        """Static quantization, falling back to QDQ + MinMax when a requested variant fails."""
        method = str(self.opts.get("calibration", self.opts.get("calibrate_method", "minmax"))).lower()
        fmt = str(self.opts.get("quant_format", "qdq")).lower()
        if method not in ("minmax", "entropy", "percentile"):
            raise InputError(f"quantize: unknown calibration {method!r}", "use minmax, entropy or percentile")
        if fmt not in ("qdq", "qoperator"):
            raise InputError(f"quantize: unknown quant_format {fmt!r}", "use qdq or qoperator")
        variants = [(fmt, method)]
        if (fmt, method) != ("qdq", "minmax"):
            variants.append(("qdq", "minmax"))
        errors = []
        for fmt_i, method_i in variants:
            key = f"{fmt_i}-{method_i}"
            if key in self.failed_variants:
                continue
            try:
                self._static_one(out, excluded, fmt_i, method_i)
                _check_loads(out)
            except Exception as exc:  # e.g. Entropy "Too many bins" on masks, QOperator type errors
                self.failed_variants[key] = message_line(exc)
                errors.append(f"{key}: {message_line(exc)}")
                continue
            self.settings["quant_format"], self.settings["calibration_method"] = fmt_i, method_i
            return f"static-{fmt_i}"
        raise LtoError("; ".join(errors))

    def _static_one(self, out: Path, excluded: list[str], fmt: str, method: str) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        calib_method = {
            "minmax": CalibrationMethod.MinMax,
            "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile,
        }[method]
        kwargs: dict[str, Any] = {
            "quant_format": QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
            "activation_type": QuantType.QUInt8,
            "weight_type": QuantType.QInt8,
            "per_channel": self.settings["per_channel"],
            "reduce_range": self.settings["reduce_range"],
            "calibrate_method": calib_method,
            "op_types_to_quantize": list(STATIC_OP_TYPES),
            "nodes_to_exclude": excluded,
            "use_external_data_format": self.external,
        }
        reader: Any = _Reader(self.calibration)
        if method == "entropy":
            # quantize_static does not pass num_bins on, which makes Entropy equal MinMax (notes §3);
            # run the calibrator here and hand quantize_static its ranges.
            kwargs["calibration_cache_path"] = str(self._entropy_cache())
            reader = None
        with _quiet():
            quantize_static(str(self.prepared), str(out), reader, **kwargs)

    def _entropy_cache(self) -> Path:
        if self._calib_cache is not None:
            return self._calib_cache
        from onnxruntime.quantization import CalibrationMethod
        from onnxruntime.quantization.calibrate import create_calibrator
        from onnxruntime.quantization.quantize import save_tensors_data

        cache = self.workdir / "entropy-ranges.json"
        calibrator = create_calibrator(
            str(self.prepared),
            list(STATIC_OP_TYPES),
            augmented_model_path=str(self.workdir / "augmented.onnx"),
            calibrate_method=CalibrationMethod.Entropy,
            extra_options={"num_bins": 2048, "num_quantized_bins": 128},
        )
        with _quiet():
            calibrator.collect_data(_Reader(self.calibration))
            save_tensors_data(calibrator.compute_data(), str(cache))
        self._calib_cache = cache
        return cache


# ---------------------------------------------------------------------------------------------


def _check_loads(path: Path) -> None:
    """Fail now, not in the pipeline, when onnxruntime cannot load the quantized file."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _gate_summary(result: AccuracyResult) -> dict[str, Any]:
    worst = min((m.get("cosine", 1.0) for m in result.per_output.values()), default=None)
    summary: dict[str, Any] = {"accuracy_ok": result.ok}
    if worst is not None:
        summary["worst_cosine"] = round(float(worst), 6)
    if result.reason:
        summary["reason"] = result.reason
    return summary


@contextlib.contextmanager
def _quiet() -> Any:
    """onnxruntime.quantization prints and logs warnings freely; keep them off the progress display."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


__all__ = ["QuantizeStage", "load_calibration"]
