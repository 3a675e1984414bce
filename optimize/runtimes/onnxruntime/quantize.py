"""int8 quantization with onnxruntime.quantization: a measured search, accuracy-gated.

The stage walks the points of quant_search.search_space (dynamic/static, per-channel/per-tensor,
op scope, calibration method, attention fused after) in the order they are worth trying, and
yields each point's candidate as soon as it passes the accuracy gate: the pipeline times it
against the best so far and says how it went (ctx.outcomes) before the next point, and stops the
stage once the target is met. Points that cannot win given earlier outcomes are recorded as
skipped with the reason; a point that fails inside ONNX Runtime is retried with the known
workaround, then recorded as failed, and the search goes on.

When a point fails the gate, back-off keeps the fewest and cheapest nodes in float that pass:
structural groups first (the output head; a transformer's late FFN down-projections), then the
nodes ranked by the error they add themselves (quant_sensitivity.py), doubling until one passes
and bisecting back; of the passing choices, the one with the least compute in float wins.

Fixed choices (docs/onnxruntime.md#quantization): U8 activations / S8 weights (S8 activations
are 3x slower on x86); reduce_range only on x86 without VNNI (u8*s8 pair sums saturate int16 in vpmaddubsw);
never dynamic int8 on convolutions (ConvInteger is 4-12x slower); fp16 never on the CPU
provider (it runs through casts).

Options: mode (auto|dynamic|static), per_channel, calibration (minmax|percentile|entropy) narrow
the search; points (labels, in order) replaces it; max_points; calib_data (.npz path or list of
feed dicts), calib_samples, max_backoff_rounds, exclude_nodes, fused_variant, fp16.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from optimize.accuracy import AccuracyResult
from optimize.errors import InputError, LtoError, message_line
from optimize.model.onnx_file import (
    NCHWC_DOMAIN,
    QUANT_OPS,
    constants_to_initializers,
    ensure_node_names,
    file_has_external_data,
    op_counts,
    read_model,
    save_model,
)
from optimize.runtimes.onnxruntime.graph_fusion import detect_transformer, fuse_with_onnxscript
from optimize.runtimes.onnxruntime.quant_search import (
    QuantPoint,
    attention_projections,
    dominated_reason,
    late_ffn_outputs,
    node_costs,
    output_head,
    search_space,
    workaround_for,
)
from optimize.runtimes.onnxruntime.quant_sensitivity import CONV_WEIGHT_OPS, rank_sensitive_nodes
from optimize.runtimes.quantization import (
    backoff_sizes,
    bisect_towards_fewest,
    calibration_samples,
    generated_calibration,
)
from optimize.stage import (
    LIFT_REFERENCE_KEY,
    Candidate,
    OnnxRuntimeStage,
    Outcome,
    StageContext,
    StageSkipped,
    Status,
)
from optimize.system.env import cpu_isa_flags, has_vnni

if TYPE_CHECKING:
    import onnx

STATIC_OP_TYPES = ("Conv", "MatMul", "Gemm")
MATMUL_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Attention", "FusedMatMul", "FusedGemm", "LSTM", "GRU"})
FP16_SKIP_REASON = "fp16 skipped: onnxruntime's CPU provider runs fp16 through casts (never faster)"
NOTHING_TO_QUANTIZE = "onnxruntime's quantizer found nothing to quantize"
DEFAULT_BACKOFF_ROUNDS = 3
# What calibrating a point costs against MinMax on the same rows (2026-12-06, Zen 4, 2 vCPUs, PP-OCR's
# text-line classifier, 16 rows: MinMax 3.4 s, Percentile 4.3 s, Entropy 54 s, each with its gate
# check): under a --time-budget a point is not started when its cost, scaled from the points already
# calibrated in this run, would not fit the stage's share.
CALIBRATION_COST = {"": 1.0, "minmax": 1.0, "percentile": 1.5, "entropy": 16.0}


def expected_point_s(calibration: str, spent: Mapping[str, float]) -> float | None:
    """Seconds a point with this calibration method should take: what one took in this run, else
    the cheapest method seen scaled by CALIBRATION_COST; None before any point ran."""
    if calibration in spent:
        return spent[calibration]
    if not spent:
        return None
    base = min(spent, key=lambda m: CALIBRATION_COST.get(m, 1.0))
    return spent[base] * CALIBRATION_COST.get(calibration, 1.0) / CALIBRATION_COST.get(base, 1.0)


# ---------------------------------------------------------------------------------------------
# What to quantize


def weight_params(model: onnx.ModelProto) -> tuple[int, int]:
    """(parameters in conv weights, parameters in matmul-like weights), read from the dims of
    initializers and Constant nodes (some exporters keep weights in the latter)."""
    sizes = {init.name: int(np.prod(init.dims)) if init.dims else 1 for init in model.graph.initializer}
    for node in model.graph.node:
        value = (
            next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant"
            else None
        )
        if value is not None and node.output:
            sizes[node.output[0]] = int(np.prod(value.dims)) if value.dims else 1
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
    """("static" | "dynamic", why): the family searched first (conv nets: static; else dynamic)."""
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


# ORT's own fused kernels (EXTENDED level) and NCHWc ops: the quantizer does not know them, so a
# graph saved after them would stay mostly float. ORT re-applies them at load time anyway.
ORT_FUSED_OPS = frozenset({"FusedConv", "FusedGemm", "FusedMatMul"})


def quantization_source(candidate: Candidate, ctx: StageContext) -> tuple[Path, str]:
    """The model to quantize: the candidate's, unless ORT-fused kernels would hide its weights."""

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
# The stage: a search over QuantPoints (quant_search.py), each gated and backed off


@dataclass
class _Tried:
    """One quantization of one point: its file, exclusions and the gate's verdict."""

    candidate: Candidate
    excluded: list[str]
    result: AccuracyResult
    group: str


class QuantizeStage(OnnxRuntimeStage):
    name: ClassVar[str] = "quantize"
    description: ClassVar[str] = (
        "int8 search: dynamic/static, per-channel/tensor, op scope, calibration; gated, backed off"
    )

    def skip_reason(self, candidate: Candidate, ctx: StageContext) -> str | None:

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

    def run(self, candidate: Candidate, ctx: StageContext) -> Iterator[Candidate]:

        opts = ctx.options
        flags = cpu_isa_flags()
        vnni = has_vnni(flags)
        source, source_note = quantization_source(candidate, ctx)
        if source_note:
            ctx.log(source_note)
        model = read_model(source, load_external_data=False)
        family, why = choose_mode(model, "auto")
        kind = "conv" if family == "static" else "matmul"
        conv, matmul = weight_params(model)
        transformer = detect_transformer(model) is not None
        del model
        requested = str(opts.get("mode", "auto")).lower()
        if requested not in ("auto", "dynamic", "static"):
            raise InputError(f"quantize: unknown mode {requested!r}", "use auto, dynamic or static")
        points = self._points(kind, requested, (conv > 0, matmul > 0), transformer, opts)
        ctx.log(f"{why}; {'VNNI' if vnni else 'no VNNI'} CPU; {len(points)} point(s) to search")
        if opts.get("fp16"):
            ctx.log(FP16_SKIP_REASON)
        common: dict[str, Any] = {
            "source": source_note or "the best candidate's model",
            "model_kind": why,
            "cpu": {
                "vnni": vnni,
                "flags": sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}),
            },
            "activation_type": "uint8",
            "weight_type": "int8",
            # Without VNNI, u8*s8 pair sums overflow int16 in vpmaddubsw; 7-bit weights cannot.
            "reduce_range": bool(flags & {"sse2", "avx", "avx2"}) and not vnni,
        }
        search = _Search(self, candidate, ctx, source, common)
        explicit = bool(opts.get("points")) or requested != "auto"
        tried: dict[QuantPoint, Outcome] = {}
        # "Nothing to quantize" on every point is one skip of the stage, not a row per point.
        nothing: list[tuple[str, str, dict[str, Any]]] = []
        empty_scopes: dict[str, str] = {}
        spent: dict[str, float] = {}  # seconds each calibration method's points took, by method
        for point in points:
            label = f"{self.name}:{point.label}"
            if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                ctx.note_point(label, Status.SKIPPED, "the stage budget was spent", point.to_json())
                continue
            expected = expected_point_s(point.calibration, spent)
            left = None if ctx.deadline is None else ctx.deadline - time.monotonic()
            if left is not None and expected is not None and expected > left:
                why = (
                    f"the stage budget left ({left:.0f} s) is less than this point is expected to take "
                    f"(about {expected:.0f} s, from the points before it)"
                )
                ctx.note_point(label, Status.SKIPPED, why, point.to_json())
                continue
            if point.scope in empty_scopes:  # same op scope, same nothing to quantize
                tried[point] = Outcome.FAILED
                nothing.append((label, empty_scopes[point.scope], point.to_json()))
                continue
            if reason := dominated_reason(point, tried, explicit):
                ctx.note_point(label, Status.SKIPPED, reason, point.to_json())
                continue
            started = time.monotonic()
            try:
                found = search.point(point)
            except StageSkipped as exc:
                tried[point] = Outcome.FAILED
                if str(exc).startswith(NOTHING_TO_QUANTIZE):
                    nothing.append((label, str(exc), point.to_json()))
                    empty_scopes.setdefault(point.scope, str(exc))
                else:
                    ctx.note_point(label, Status.SKIPPED, str(exc), point.to_json())
                continue
            except (InputError, KeyboardInterrupt):
                raise
            except Exception as exc:  # one failing point never ends the search
                tried[point] = Outcome.FAILED
                line = exc.one_line() if isinstance(exc, LtoError) else message_line(exc)
                ctx.log(f"{point.label} failed: {line}")
                ctx.note_point(label, Status.FAILED, line, {**point.to_json(), **search.failure_details})
                continue
            took = time.monotonic() - started
            spent[point.calibration] = max(spent.get(point.calibration, 0.0), took)
            if not found.result.ok:
                tried[point] = Outcome.INACCURATE
                tries = len(found.candidate.details.get("attempts", [])) - 1
                why_not = f"inaccurate: {found.result.reason} (no back-off choice passed, {tries} tried)"
                ctx.note_point(label, Status.REJECTED, why_not, found.candidate.details)
                continue
            yield found.candidate
            tried[point] = ctx.outcomes.get(found.candidate.label, Outcome.SLOWER)
            if search.unlifted is not None:
                yield search.unlifted
        if nothing and len(nothing) == len(tried):
            raise StageSkipped(nothing[0][1])
        for label, reason, details in nothing:
            ctx.note_point(label, Status.SKIPPED, reason, details)

    @staticmethod
    def _points(
        kind: str, requested: str, weights: tuple[bool, bool], transformer: bool, opts: Mapping[str, Any]
    ) -> list[QuantPoint]:
        has_conv, has_matmul = weights
        per_channel = opts.get("per_channel")
        calibration = opts.get("calibration")
        points = search_space(
            kind if requested == "auto" else ("matmul" if requested == "dynamic" else "conv"),
            has_matmul_weights=has_matmul,
            has_conv_weights=has_conv,
            transformer=transformer and bool(opts.get("fused_variant", True)),
            mode=requested,
            per_channel=None if per_channel is None else bool(per_channel),
            calibration=None if calibration is None else str(calibration).lower(),
        )
        if requested == "static" and kind == "matmul":  # a transformer forced to static: MatMul scope first
            points.sort(key=lambda p: p.scope != "matmul")
        wanted = [str(p) for p in opts.get("points", [])]
        if wanted:
            every = {p.label: p for p in _all_points()}
            unknown = [w for w in wanted if w not in every]
            if unknown:
                raise InputError(
                    f"quantize: unknown point {unknown[0]!r}", f"known points: {', '.join(sorted(every))}"
                )
            points = [every[w] for w in wanted]
        limit = opts.get("max_points")
        return points[: int(limit)] if limit else points


def _all_points() -> list[QuantPoint]:
    every = search_space("matmul", has_matmul_weights=True, has_conv_weights=True, transformer=True)
    return list({p.label: p for p in every}.values())


class _Search:
    """State shared by the points of one run: prepared models and calibration, made once."""

    def __init__(
        self, stage: QuantizeStage, base: Candidate, ctx: StageContext, source: Path, common: dict[str, Any]
    ) -> None:
        self.stage, self.base, self.ctx, self.source, self.common = stage, base, ctx, source, common
        self._prepared: dict[bool, tuple[Path, str]] = {}
        self._calibration: tuple[list[dict[str, np.ndarray]], dict[str, Any]] | None = None
        self.failure_details: dict[str, Any] = {}
        # Nodes in float with which a point passed the gate (by its unfused form).
        self.passed_with: dict[QuantPoint, list[str]] = {}
        # The last point's int8 with nothing lifted, when it passed only with nodes lifted.
        self.unlifted: Candidate | None = None

    def calibration(self) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
        if self._calibration is None:
            self._calibration = calibration_samples(self.ctx)
        return self._calibration

    def prepared(self, static: bool) -> tuple[Path, str]:
        if static not in self._prepared:
            self._prepared[static] = _prepare(self.source, self.ctx, static)
        return self._prepared[static]

    def point(self, point: QuantPoint) -> _Tried:
        """Quantize at `point`, gate it, back off until it passes; the cheapest passing choice."""
        ctx, opts = self.ctx, self.ctx.options
        self.failure_details, self.unlifted = {}, None
        static = point.mode == "static"
        prepared, prep_note = self.prepared(static)
        calibration, calib_info = self.calibration() if static else ([], {})
        settings = {**self.common, **point.to_json(), "preprocess": prep_note}
        if static:
            settings["calibration_data"] = calib_info
        quantizer = _Quantizer(prepared, ctx.workdir, point, settings, calibration)
        user_excluded = [str(n) for n in opts.get("exclude_nodes", [])]
        rounds = int(opts.get("max_backoff_rounds", opts.get("max_retries", DEFAULT_BACKOFF_ROUNDS)))
        attempts: list[dict[str, Any]] = []

        def attempt(excluded: list[str], group: str) -> _Tried | None:
            try:
                cand = quantizer.quantize(self.base, excluded, len(attempts))
            except Exception as exc:
                attempts.append({"group": group, "excluded": len(excluded), "error": message_line(exc)})
                if not excluded or excluded == user_excluded:
                    self.failure_details = {"attempts": attempts, "workarounds": quantizer.workarounds}
                    raise
                return None
            result = ctx.check_accuracy(cand)
            attempts.append({"group": group, "excluded": len(excluded), **result.attempt_summary()})
            return _Tried(cand, excluded, result, group)

        ctx.status and ctx.status(f"{point.label}: quantizing")
        first = attempt(user_excluded, "none")
        assert first is not None
        if not first.candidate.details["quantized_ops"]:
            raise StageSkipped(
                f"{NOTHING_TO_QUANTIZE} (weights inside If/Loop subgraphs or ops it does not support)"
            )
        chosen, ranking = first, []
        twin = self.passed_with.get(_unfused(point))
        if not first.result.ok and point.fuse_after and twin:
            # The same quantization without fusion passed with these nodes in float: start there.
            again = attempt(twin, "as without fusion")
            if again is not None and again.result.ok:
                chosen = again
        if not chosen.result.ok and rounds > 0:
            ctx.log(f"{point.label}: accuracy gate failed ({first.result.reason}); backing off")
            chosen, ranking = self._back_off(point, quantizer, first, user_excluded, rounds, attempt)
        if chosen.result.ok:
            self.passed_with[_unfused(point)] = chosen.excluded
        cand = chosen.candidate
        cand.details.update(
            attempts=attempts,
            accuracy_gate="passed" if chosen.result.ok else "failed",
            backoff_group=chosen.group,
            workarounds=list(quantizer.workarounds),
        )
        if ranking:
            cand.details["sensitivity"] = [
                {"node": n, "added_rel_error": round(e, 6)} for n, e in ranking[:10]
            ]
        added = dict(ranking)
        cand.details["lifted"] = [
            {
                "node": n,
                "precision": "fp32",
                **({"added_rel_error": round(added[n], 6)} if n in added else {}),
            }
            for n in chosen.excluded
        ]
        if chosen.result.ok and len(chosen.excluded) > len(user_excluded):
            # The same point with nothing lifted, timed though it failed: the price of the lift.
            plain = first.candidate
            self.unlifted = replace(
                plain,
                label=f"{cand.label}-unlifted",
                details={**plain.details, LIFT_REFERENCE_KEY: cand.label},
                extra_files=list(plain.extra_files),
            )
        return chosen

    def _back_off(
        self,
        point: QuantPoint,
        quantizer: _Quantizer,
        first: _Tried,
        user_excluded: list[str],
        rounds: int,
        attempt: Any,
    ) -> tuple[_Tried, list[tuple[str, float]]]:
        """Keep the fewest, cheapest nodes in float that pass: structural groups first (the output
        head; a transformer's late FFN down-projections; its attention projections, apart from
        the FFN), then the nodes ranked by the error they add, doubling until one passes and
        bisecting back towards fewer."""

        ctx = self.ctx
        calibration = self.calibration()[0] if point.mode == "static" else []
        samples = (calibration[:4] or generated_calibration(ctx, 2)) + [dict(ctx.feeds)]
        nodes = quantizer.quantizable_nodes()
        ranking = rank_sensitive_nodes(
            quantizer.prepared, first.candidate.model_path, nodes, samples, ctx.workdir
        )
        ranked = [name for name, _ in ranking if name not in user_excluded]
        model = read_model(quantizer.prepared, load_external_data=False)
        costs = node_costs(model, nodes)
        groups = [("output head", output_head(model, ranked))]
        if point.mode == "dynamic" or "MatMul" in (point.op_types() or ["MatMul"]):
            groups.append(("late FFN down-projections", late_ffn_outputs(model, ranked)))
            groups.append(("attention projections", attention_projections(model, ranked)))
        del model

        def out_of_time() -> bool:
            return ctx.deadline is not None and time.monotonic() >= ctx.deadline

        passing: list[_Tried] = []
        seen: set[frozenset[str]] = set()
        for name, group in groups:
            if not group or len(group) >= len(ranked) or frozenset(group) in seen or out_of_time():
                continue
            seen.add(frozenset(group))
            tried = attempt([*user_excluded, *group], name)
            if tried is not None and tried.result.ok:
                passing.append(tried)

        def cost(excluded: Sequence[str]) -> float:
            return sum(costs.get(n, 0.0) for n in excluded)

        last_fail, first_pass = 0, None
        for size in backoff_sizes(len(ranked), rounds):
            if out_of_time() or (passing and cost(ranked[:size]) >= min(cost(t.excluded) for t in passing)):
                break  # a longer prefix keeps more compute in float than a group that passed
            tried = attempt([*user_excluded, *ranked[:size]], f"top {size} by added error")
            if tried is not None and tried.result.ok:
                passing.append(tried)
                first_pass = size
                break
            last_fail = size

        def prefix_passes(size: int) -> bool:
            tried = attempt([*user_excluded, *ranked[:size]], f"top {size} by added error")
            if tried is not None and tried.result.ok:
                passing.append(tried)
                return True
            return False

        if first_pass is not None:
            bisect_towards_fewest(last_fail, first_pass, prefix_passes, out_of_time)
        if not passing:
            return first, ranking
        best = min(passing, key=lambda t: (cost(t.excluded), len(t.excluded)))
        ctx.log(
            f"{point.label}: passes with {len(best.excluded)} node(s) in float ({best.group}), "
            f"{len(passing)} passing choice(s)"
        )
        return best, ranking


def _unfused(point: QuantPoint) -> QuantPoint:
    return replace(point, fuse_after=False)


def _prepare(source: Path, ctx: StageContext, static: bool) -> tuple[Path, str]:
    """A copy with every node named (exclusion is by name); for static quantization pre-processed
    and at opset >= 13, where DequantizeLinear takes the per-channel axis."""

    suffix = "static" if static else "dynamic"
    notes = []
    external = file_has_external_data(source)
    if static:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = ctx.workdir / f"preprocessed-{suffix}.onnx"
        try:
            with _quiet():
                quant_pre_process(str(source), str(pre), auto_merge=True, save_as_external_data=external)
            source = pre
            notes.append("quant_pre_process (symbolic shapes, ORT basic optimizations)")
        except Exception as exc:
            why = message_line(exc)
            if why == type(exc).__name__:  # a bare `assert` inside onnxruntime's shape inference
                why = f"it raised {why} with no message (onnxruntime's symbolic shape inference)"
            notes.append(f"quant_pre_process failed, quantizing the model as is: {why}")
            ctx.log(notes[-1])
    model = read_model(source)
    if moved := constants_to_initializers(model):
        notes.append(f"{moved} Constant nodes made initializers (the quantizer reads weights there)")
    if static:
        opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
        if 0 < opset < 13:
            from onnx import version_converter

            try:
                model = version_converter.convert_version(model, 13)
                notes.append(f"opset {opset} -> 13 (per-channel DequantizeLinear needs its axis)")
            except Exception as exc:
                notes.append(f"opset {opset} kept, conversion to 13 failed: {message_line(exc)}")
    ensure_node_names(model)
    prepared = ctx.workdir / f"prepared-{suffix}.onnx"
    save_model(model, prepared, external=external or None)
    return prepared, "; ".join(notes) or "none"


class _Quantizer:
    """One point on one prepared model; each call writes a new file. Known ONNX Runtime failures
    are retried with their workaround (quant_search.WORKAROUNDS), kept for later calls."""

    def __init__(
        self,
        prepared: Path,
        workdir: Path,
        point: QuantPoint,
        settings: dict[str, Any],
        calibration: list[dict[str, np.ndarray]],
    ) -> None:

        self.prepared = prepared
        self.workdir = workdir
        self.point = point
        self.settings = settings
        self.calibration = calibration
        self.external = file_has_external_data(prepared)
        self.workarounds: list[str] = []
        self._extra: dict[str, Any] = {}
        self._ranges: Path | None = None

    def quantizable_nodes(self) -> list[str]:

        ops = self.point.op_types()
        model = read_model(self.prepared, load_external_data=False)
        return [
            n.name
            for n in model.graph.node
            if (n.op_type in ops if ops else n.op_type in STATIC_OP_TYPES) and n.op_type != "Gather"
        ]

    def quantize(self, base: Candidate, excluded: list[str], index: int) -> Candidate:

        out = self.workdir / f"{self.point.label}-{index}.onnx"
        while True:
            try:
                self._quantize(out, excluded)
                break
            except Exception as exc:
                fix = workaround_for(message_line(exc), self.workarounds)
                if fix is None:
                    raise
                self.workarounds.append(fix.name)
                self._extra.update(fix.extra_options)
        if self.point.fuse_after:
            out = self._fuse(out)
        model = read_model(out)
        extra = save_model(model, out, external=self.external or None)  # strips unused opsets
        _check_loads(out)
        ops = op_counts(model)
        config = dict(base.runtime_config)
        if config.get("graph_optimization_level", "all") in ("disable", "basic"):
            # int8 speed comes from ORT fusing Q/DQ into integer kernels (EXTENDED) and NHWC (LAYOUT).
            config["graph_optimization_level"] = "all"
        return Candidate(
            label=f"quantize:{self.point.label}",
            model_path=out,
            backend=base.backend,
            runtime_config=config,
            standard_ops=all(":" not in op for op in ops),
            # Nodes kept out of int8 run at fp32: two precisions by layer (evidence: "mixed").
            precision="int8+fp32" if excluded else "int8",
            details={
                **self.settings,
                "quantized_ops": {op: n for op, n in ops.items() if op.rpartition(":")[2] in QUANT_OPS},
                "excluded_nodes": list(excluded),
            },
            extra_files=extra,
        )

    def _quantize(self, out: Path, excluded: list[str]) -> None:
        if self.point.mode == "dynamic":
            # The dynamic quantizer splits Gemm into "<name>_MatMul" + "<name>_Add" before it
            # matches names, so a Gemm is excluded under its MatMul's name too.
            gemms = self._gemm_names()
            self._dynamic(out, [*excluded, *(f"{n}_MatMul" for n in excluded if n in gemms)])
        else:
            self._static(out, excluded)

    def _fuse(self, quantized: Path) -> Path:

        fused = quantized.with_name(quantized.stem + "-mha.onnx")
        details, _ = fuse_with_onnxscript(quantized, fused)
        if not details["attention_fused"]:
            raise StageSkipped("attention did not fuse in the quantized graph")
        self.settings["fused_ops"] = details["fused_ops"]
        return fused

    def _gemm_names(self) -> set[str]:

        model = read_model(self.prepared, load_external_data=False)
        return {n.name for n in model.graph.node if n.op_type == "Gemm"}

    def _dynamic(self, out: Path, excluded: list[str]) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        ops = op_counts(read_model(self.prepared, load_external_data=False))
        extra: dict[str, Any] = dict(self._extra)
        if any(":" in op for op in ops):
            # Fused graphs: shape inference cannot see through com.microsoft ops
            # (docs/onnxruntime.md#quantization).
            extra["DefaultTensorType"] = onnx.TensorProto.FLOAT
        with _quiet():
            quantize_dynamic(
                str(self.prepared),
                str(out),
                op_types_to_quantize=self.point.op_types(),
                per_channel=self.point.per_channel,
                reduce_range=self.settings["reduce_range"],
                weight_type=QuantType.QInt8,
                nodes_to_exclude=excluded,
                use_external_data_format=self.external,
                extra_options=extra,
            )

    def _static(self, out: Path, excluded: list[str]) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        extra: dict[str, Any] = dict(self._extra)
        if self.point.symmetric_activations:
            extra["ActivationSymmetric"] = True
        kwargs: dict[str, Any] = {
            "quant_format": QuantFormat.QDQ,
            "activation_type": QuantType.QUInt8,
            "weight_type": QuantType.QInt8,
            "per_channel": self.point.per_channel,
            "reduce_range": self.settings["reduce_range"],
            "calibrate_method": _METHODS[self.point.calibration](CalibrationMethod),
            "nodes_to_exclude": excluded,
            "use_external_data_format": self.external,
            "extra_options": extra,
            # Ranges are computed once per point: back-off rounds only change which nodes use them.
            "calibration_cache_path": str(self._calibrated_ranges()),
        }
        if self.point.op_types() is not None:
            kwargs["op_types_to_quantize"] = self.point.op_types()
        with _quiet():
            quantize_static(str(self.prepared), str(out), None, **kwargs)

    def _calibrated_ranges(self) -> Path:
        """Activation ranges by the point's method. quantize_static does not pass num_bins on
        (Entropy then equals MinMax, docs/onnxruntime.md#quantization), so the calibrator runs here
        with its settings."""
        if self._ranges is not None:
            return self._ranges
        from onnxruntime.quantization import CalibrationMethod
        from onnxruntime.quantization.calibrate import create_calibrator
        from onnxruntime.quantization.quantize import save_tensors_data

        method = self.point.calibration
        extra = {"num_bins": 2048, "num_quantized_bins": 128} if method == "entropy" else {}
        cache = self.workdir / f"ranges-{self.point.scope}-{method}.json"
        if not cache.exists():
            calibrator = create_calibrator(
                str(self.prepared),
                self.point.op_types() or [],
                augmented_model_path=str(self.workdir / f"augmented-{self.point.scope}-{method}.onnx"),
                calibrate_method=_METHODS[method](CalibrationMethod),
                use_external_data_format=self.external,
                extra_options=extra,
            )
            with _quiet():
                calibrator.collect_data(_Reader(self.calibration))
                save_tensors_data(calibrator.compute_data(), str(cache))
        self._ranges = cache
        return cache


_METHODS: dict[str, Callable[[Any], Any]] = {
    "minmax": lambda m: m.MinMax,
    "percentile": lambda m: m.Percentile,
    "entropy": lambda m: m.Entropy,
}


# ---------------------------------------------------------------------------------------------


def _check_loads(path: Path) -> None:
    """Fail now, not in the pipeline, when onnxruntime cannot load the quantized file."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


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


__all__ = ["QuantizeStage"]
