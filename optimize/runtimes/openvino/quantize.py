"""`openvino-quantize`: NNCF post-training int8 of the model as an OpenVINO IR, accuracy-gated, with
back-off through NNCF's IgnoredScope driven by a sensitivity ranking.

* Calibration: the user's --calib-data (the same loader as ONNX Runtime's quantize stage), else
  generated inputs with a WARNING in the report.
* Transformers (attention found in the graph: Softmax between MatMuls) are quantized with
  `model_type=TRANSFORMER`, which keeps LayerNorm/Softmax-side ops in float and applies
  SmoothQuant to MatMul inputs; `smooth_quant` = "off" turns it off, "on" forces it.
* NNCF's default PTQ breaks some models (docs/openvino.md: a text recognizer at cos
  0.865, a detector's class scores). When the pipeline's gate (ctx.check_accuracy) fails, the
  quantized nodes are ranked by the error each adds itself, and the most harmful are lifted out
  of int8, more on each retry (10 %, 20 %, 40 % ...), within `max_backoff_rounds` and the
  deadline, then bisected back towards the fewest that pass: every node kept in float costs speed.
* Before any node goes back to float, the quantized IR is checked with the CPU plugin's fused
  subgraphs off (SNIPPETS_MODE=DISABLE, backend.py says why): on an AMX Xeon they broke NNCF's
  int8 MiniLM (token cosine 0.31) that is accurate without them (0.995).
* The accepted IR is proposed at the f32 hint (`int8`, or `int8+fp32` with nodes lifted) and, on
  a CPU with native bf16, at the bf16 hint for its float parts and lifted nodes (`int8+bf16`),
  judged at bf16: where bf16 adds too much error, the back-off goes on at bf16 from where the f32
  one stopped. Each proposed candidate lists its lifted nodes and the precision they run at
  (`details["lifted"]`); the pipeline's gate and bench decide between them.

Options: calib_data, calib_samples, preset (auto|performance|mixed), smooth_quant (auto|on|off),
max_backoff_rounds, exclude_nodes (OpenVINO node names), bf16.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import nncf  # a missing package skips the stage with its name (runtimes.load_stage)
import numpy as np
import openvino as ov

from optimize.accuracy import AccuracyResult
from optimize.errors import InputError, LtoError, message_line
from optimize.model.onnx_file import op_counts, read_model
from optimize.runtimes.openvino.convert import thread_choices
from optimize.runtimes.openvino.ir import (
    candidate,
    precision_hints,
    runtime_config,
    source_model,
    without_snippets,
    worst_cosine,
    write_ir,
)
from optimize.runtimes.openvino.sensitivity import attention_matmuls, quantized_nodes, rank_sensitive_nodes
from optimize.runtimes.quantization import backoff_sizes, bisect_towards_fewest, calibration_samples
from optimize.stage import LIFT_REFERENCE_KEY, Candidate, Stage, StageContext, StageSkipped

DEFAULT_BACKOFF_ROUNDS = 3
_QUANTIZED_ONNX_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
)
_WEIGHT_ONNX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def is_transformer(op_types: Mapping[str, int]) -> bool:
    """Attention in the graph: a Softmax with MatMuls around it (the pattern NNCF's
    ModelType.TRANSFORMER is made for, whatever the inputs are: token ids or image patches)."""
    return op_types.get("Softmax", 0) > 0 and op_types.get("MatMul", 0) >= 2


@dataclass
class _Trial:
    """One quantization the stage tried, and the pipeline gate's verdict on it."""

    step: str
    settings: dict[str, Any]
    excluded: list[str]
    snippets: bool
    candidate: Candidate
    result: AccuracyResult
    quantized: Any  # the ov.Model NNCF returned
    hint: str = "f32"  # the precision of its float parts and of the nodes kept out of int8


_PRECISION_OF_HINT = {"f32": "fp32", "bf16": "bf16"}  # OpenVINO's hint -> lto's precision names


def mixed_precision(hint: str, excluded: list[str]) -> str:
    """int8 alone; or int8 with the rest at bf16, or with nodes lifted out of int8 to fp32."""
    if hint == "bf16":
        return "int8+bf16"
    return "int8+fp32" if excluded else "int8"


_SEARCH_DETAILS = ("lifted", "attempts", "sensitivity", "accuracy_gate")  # the mixed candidate's own


def unlifted(chosen: _Trial, tried: list[_Trial], user_excluded: list[str]) -> Candidate | None:
    """The chosen mixed trial's int8 with nothing lifted, at the same float precision and fused
    subgraph setting: yielded after it and timed though it fails the gate, so that the report can
    say what lifting cost in speed. None when nothing was lifted or it did not pass (no lift to
    price), or no trial quantized the same way with nothing lifted."""
    if not chosen.result.ok or len(chosen.excluded) <= len(user_excluded):
        return None
    plain = next((t for t in tried if t.excluded == user_excluded and t.settings == chosen.settings), None)
    if plain is None:
        return None
    mixed = chosen.candidate
    details = {k: v for k, v in mixed.details.items() if k not in _SEARCH_DETAILS}
    details.update(
        {
            "excluded_nodes": list(user_excluded),
            "quantized_nodes": plain.candidate.details.get("quantized_nodes"),
            LIFT_REFERENCE_KEY: mixed.label,
        }
    )
    return replace(
        plain.candidate,
        label=f"{mixed.label}-unlifted",
        precision=mixed_precision(chosen.hint, user_excluded),
        runtime_config=dict(mixed.runtime_config),
        details=details,
        extra_files=list(plain.candidate.extra_files),
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """NNCF draws progress bars and logs freely; keep them off lto's progress display."""
    nncf_logger = logging.getLogger("nncf")
    level = nncf_logger.level
    nncf_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        nncf_logger.setLevel(level)


class OpenVinoQuantizeStage(Stage):
    name: ClassVar[str] = "openvino-quantize"
    description: ClassVar[str] = "OpenVINO int8 with NNCF post-training quantization, accuracy-gated"

    def skip_reason(self, candidate_in: Candidate, ctx: StageContext) -> str | None:

        source, _ = source_model(candidate_in, ctx)
        ops = {op.rpartition(":")[2] for op in op_counts(read_model(source, load_external_data=False))}
        if ops & _QUANTIZED_ONNX_OPS:
            return "the model is already quantized"
        if not ops & _WEIGHT_ONNX_OPS:
            return "no MatMul, Gemm or Conv to quantize"
        return None

    def run(self, candidate_in: Candidate, ctx: StageContext) -> list[Candidate]:

        source, why = source_model(candidate_in, ctx)
        ops = {op.rpartition(":")[2]: n for op, n in op_counts(read_model(source, False)).items()}
        transformer = is_transformer(ops)
        float_model = ov.Core().read_model(str(source))
        samples, calibration = calibration_samples(ctx, "NNCF int8")
        settings = self._settings(ctx.options, transformer)
        ctx.log(
            f"NNCF int8 of {why}: "
            + ("transformer (attention found)" if transformer else "no attention: default model type")
            + f", {len(samples)} calibration samples ({calibration['source']})"
        )
        threads = thread_choices(ctx.options)[0]
        user_excluded = [str(n) for n in ctx.options.get("exclude_nodes", [])]
        rounds = int(ctx.options.get("max_backoff_rounds", DEFAULT_BACKOFF_ROUNDS))
        attempts: list[dict[str, Any]] = []
        tried: list[_Trial] = []

        def trial(
            step: str, trial_settings: dict[str, Any], excluded: list[str], snippets: bool, hint: str = "f32"
        ) -> _Trial:
            """Quantize (or reuse an IR quantized the same way), then ask the pipeline's gate at the
            precision the candidate will run: its float parts, and the nodes kept out of int8, at
            `hint` (f32, or bf16 where the CPU has it)."""
            same = next((t for t in tried if t.settings == trial_settings and t.excluded == excluded), None)
            if same is not None:
                quantized, ir = same.quantized, same.candidate.model_path
            else:
                quantized = self._quantize(float_model, samples, trial_settings, excluded)
                ir = write_ir(quantized, ctx.workdir / f"int8-{len(tried)}", source)
            nodes = quantized_nodes(quantized)
            if not nodes:
                raise StageSkipped("NNCF found nothing to quantize in this model")
            details = {"source": why, "calibration": calibration, "nncf": nncf.__version__, **trial_settings}
            cand = candidate(
                f"{self.name}:int8" + ("-bf16" if hint == "bf16" else ""),
                ir,
                precision=mixed_precision(hint, excluded),
                precision_hint=hint,
                config=runtime_config(hint, threads),
                details={**details, "quantized_nodes": len(nodes), "excluded_nodes": list(excluded)},
            )
            if not snippets:
                why_off = next(
                    (
                        t.result.reason
                        for t in tried
                        if t.snippets and t.excluded == excluded and t.hint == hint
                    ),
                    "",
                )
                cand = without_snippets(cand, f"with them on it failed the accuracy gate ({why_off})")
            result = ctx.check_accuracy(cand)
            done = _Trial(step, dict(trial_settings), list(excluded), snippets, cand, result, quantized, hint)
            tried.append(done)
            attempts.append(
                {
                    "step": step,
                    "float_parts": _PRECISION_OF_HINT[hint],
                    "excluded": len(excluded),
                    "snippets": snippets,
                    **result.attempt_summary(),
                }
            )
            how = f"{len(excluded)} node(s) out of int8" + ("" if snippets else ", fused subgraphs off")
            verdict = "pass" if result.ok else "fail: " + result.reason
            ctx.log(f"int8 {step} ({how}, float parts at {hint}): {verdict}")
            return done

        def optional(
            step: str, trial_settings: dict[str, Any], excluded: list[str], snippets: bool, hint: str = "f32"
        ) -> _Trial | None:
            """A later rung: its failure is recorded and the ladder goes on from the best so far."""
            try:
                return trial(step, trial_settings, excluded, snippets, hint)
            except Exception as exc:
                error = exc.one_line() if isinstance(exc, LtoError) else message_line(exc)
                attempts.append({"step": step, "float_parts": _PRECISION_OF_HINT[hint], "error": error})
                ctx.log(f"int8 {step}: failed: {error}")
                return None

        def tried_at(hint: str) -> list[_Trial]:
            return [t for t in tried if t.hint == hint]

        def passed_at(hint: str) -> bool:
            return any(t.result.ok for t in tried_at(hint))

        def best(hint: str = "f32") -> _Trial:
            """At `hint`: the passing trial with the fewest nodes out of int8 (the earliest of
            equals: fused subgraphs on), else the closest to passing."""
            mine = tried_at(hint)
            passing = [t for t in mine if t.result.ok]
            if passing:
                return min(passing, key=lambda t: (len(t.excluded), not t.snippets))
            return max(mine, key=lambda t: worst_cosine(t.result))

        def out_of_time() -> bool:
            return ctx.deadline is not None and time.monotonic() >= ctx.deadline

        def back_off(base: _Trial, ranked: list[str], hint: str, start: int) -> None:
            """Lift the first nodes of `ranked` out of int8 (they run at `hint`), more each round
            (10 %, 20 %, 40 % ... of them, past the `start` already known to fail), then bisect
            back towards the fewest that pass."""

            def lift_passes(size: int) -> bool:
                lifted = [*base.excluded, *ranked[:size]]
                done = optional(f"lift top {size}", base.settings, lifted, base.snippets, hint)
                return done is not None and done.result.ok

            last_fail, first_pass = start, None
            sizes = [size for size in backoff_sizes(len(ranked), 8) if size > start][:rounds]
            for size in sizes:
                if out_of_time():
                    skipped = {"skipped": "stage deadline reached", "float_parts": _PRECISION_OF_HINT[hint]}
                    attempts.append({"step": f"lift top {size}", **skipped})
                    return
                if lift_passes(size):
                    first_pass = size
                    break
                last_fail = size
            if first_pass is not None:
                bisect_towards_fewest(last_fail, first_pass, lift_passes, out_of_time)

        # The ladder at f32, cheapest and fastest-running first, stopping at the first accurate
        # model: NNCF's defaults; transformers: SmoothQuant the other way, then attention's own
        # MatMuls (activation x activation) in float; the CPU plugin's fused subgraphs off (same
        # IR); then nodes out of int8 by the error they add, bisected towards the fewest.
        trial("defaults", settings, user_excluded, True)
        if not best().result.ok and transformer and ctx.options.get("smooth_quant", "auto") == "auto":
            toggled = {**settings, "smooth_quant": "off" if settings["smooth_quant"] == "on" else "on"}
            optional(f"smooth_quant {toggled['smooth_quant']}", toggled, user_excluded, True)
        if not best().result.ok and transformer and not out_of_time():
            attention = [n for n in attention_matmuls(float_model) if n not in user_excluded]
            if attention:
                optional("attention MatMuls in float", best().settings, [*user_excluded, *attention], True)
        if not best().result.ok and not out_of_time():
            top = best()
            optional("fused subgraphs off", top.settings, top.excluded, False)
        ranking: list[tuple[str, float]] = []
        probe = [*samples[:4], dict(ctx.feeds)]  # the rows the ranking compares nodes on
        base = best()
        if not base.result.ok and rounds > 0 and not out_of_time():
            ctx.log(f"int8: still inaccurate ({base.result.reason}); ranking nodes by the error they add")
            ranking = rank_sensitive_nodes(float_model, base.quantized, probe)
            back_off(base, [n for n, _ in ranking if n not in base.excluded], "f32", 0)
        chosen = best()
        out = [self._finished(chosen, ranking, attempts)]
        if "bf16" in precision_hints(ctx.options):
            # The same int8 with its float parts at bf16: judged at bf16, where it runs. Nodes that
            # bf16 leaves too far off come out of int8 too, the fewest that pass, at bf16 (a node
            # cannot run at f32 under OpenVINO's bf16 hint: docs/mixed-precision.md).
            optional("float parts at bf16", chosen.settings, chosen.excluded, chosen.snippets, "bf16")
            if not passed_at("bf16") and chosen.snippets and not out_of_time():
                optional("float parts at bf16", chosen.settings, chosen.excluded, False, "bf16")
            if not passed_at("bf16") and chosen.result.ok and rounds > 0 and not out_of_time():
                if not ranking:
                    ranking = rank_sensitive_nodes(float_model, chosen.quantized, probe)
                # On from where the f32 back-off stopped: chosen is base plus a prefix of the ranking.
                ranked = [n for n, _ in ranking if n not in base.excluded]
                snippets = best("bf16").snippets if tried_at("bf16") else chosen.snippets
                known = len(chosen.excluded) - len(base.excluded)
                back_off(replace(base, snippets=snippets), ranked, "bf16", known)
            if tried_at("bf16"):
                out.append(self._finished(best("bf16"), ranking, attempts))
        finals = [chosen, *([best("bf16")] if tried_at("bf16") else [])]
        out.extend(ref for ref in (unlifted(t, tried, user_excluded) for t in finals) if ref is not None)
        return out

    @staticmethod
    def _finished(
        chosen: _Trial, ranking: list[tuple[str, float]], attempts: list[dict[str, Any]]
    ) -> Candidate:
        """The chosen trial's candidate with what the report shows of the search: every attempt,
        the ten most harmful nodes, and each node kept out of int8 with the precision it runs at."""
        cand = chosen.candidate
        added = dict(ranking)
        cand.details["lifted"] = [
            {
                "node": name,
                "precision": _PRECISION_OF_HINT[chosen.hint],
                **({"added_rel_error": round(added[name], 6)} if name in added else {}),
            }
            for name in chosen.excluded
        ]
        if ranking:
            cand.details["sensitivity"] = [
                {"node": n, "added_rel_error": round(e, 6)} for n, e in ranking[:10]
            ]
        cand.details["attempts"] = list(attempts)
        cand.details["accuracy_gate"] = "passed" if chosen.result.ok else "failed"
        return cand

    # -- steps ---------------------------------------------------------------------------------

    @staticmethod
    def _settings(options: Mapping[str, Any], transformer: bool) -> dict[str, Any]:
        preset = str(options.get("preset", "auto"))
        smooth = str(options.get("smooth_quant", "auto"))
        if preset not in ("auto", "performance", "mixed"):
            raise InputError(f"openvino-quantize: unknown preset {preset!r}", "use auto, performance, mixed")
        if smooth not in ("auto", "on", "off"):
            raise InputError(f"openvino-quantize: unknown smooth_quant {smooth!r}", "use auto, on or off")
        if preset == "auto":
            # NNCF's own choice: symmetric (performance) for CNNs, mixed for transformers, whose
            # activations are not centred on zero.
            preset = "mixed" if transformer else "performance"
        if smooth == "auto":
            smooth = "on" if transformer else "off"
        return {
            "model_type": "transformer" if transformer else "default",
            "preset": preset,
            "smooth_quant": smooth,
        }

    @staticmethod
    def _quantize(
        model: Any, samples: list[dict[str, np.ndarray]], settings: Mapping[str, Any], excluded: list[str]
    ) -> Any:
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
        )

        kwargs: dict[str, Any] = {
            "subset_size": len(samples),
            "preset": nncf.QuantizationPreset.MIXED
            if settings["preset"] == "mixed"
            else nncf.QuantizationPreset.PERFORMANCE,
        }
        if settings["model_type"] == "transformer":
            kwargs["model_type"] = nncf.ModelType.TRANSFORMER
        # SmoothQuant: NNCF applies it to transformers' MatMuls (alpha 0.95); -1 turns it off.
        alpha = 0.95 if settings["smooth_quant"] == "on" else -1
        kwargs["advanced_parameters"] = AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha)
        )
        if excluded:
            kwargs["ignored_scope"] = nncf.IgnoredScope(names=list(excluded))
        try:
            with _quiet():
                return nncf.quantize(model, nncf.Dataset(samples), **kwargs)
        except nncf.ValidationError as exc:  # e.g. an exclude_nodes name the model does not have
            raise InputError(f"openvino-quantize: {message_line(exc)}") from exc


__all__ = ["OpenVinoQuantizeStage", "is_transformer"]
