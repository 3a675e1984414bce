"""ONNX Runtime's own graph fusions, saved offline as a portable file.

ORT optimizes a graph every time a session is created; saving the optimized graph once moves
that work offline. Only the EXTENDED level is saved: the ALL/LAYOUT levels add NCHWc kernels
whose weight layout depends on the SIMD width of the CPU that wrote the file, and such a file
runs silently wrong elsewhere (docs/onnxruntime.md#saved-graph-levels). Where ALL would add
them, a second candidate keeps the portable file and lets ORT do the layout transform at load
time on the target CPU.

More fusion is not always faster (docs/onnxruntime.md#fusions-are-not-always-faster:
SkipLayerNormFusion made one BERT export 15 % slower), so when ORT would fuse
SkipLayerNormalization a variant without it is offered too. The pipeline measures all of them.

Options: `levels` (default ["extended", "layout"]): "extended" is always saved; "basic" adds
a constant-folding-only file; "layout"/"all" add the portable layout-at-load candidate.
"""

from __future__ import annotations

from typing import Any, ClassVar

from optimize.errors import UsageError
from optimize.model.onnx_file import NCHWC_DOMAIN, infer_shapes, op_counts, opset_map, read_model, save_model
from optimize.runtimes.onnxruntime.graph import ort_save_optimized
from optimize.stage import Candidate, OnnxRuntimeStage, StageContext, StageSkipped

SKIP_LN_FUSION = "SkipLayerNormFusion"
# Every candidate costs a benchmark; keep the list short.
MAX_CANDIDATES = 3
KNOWN_LEVELS = ("basic", "extended", "layout", "all")


def _added_ops(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in sorted(after.items()) if n > before.get(op, 0)}


class OperatorFusionStage(OnnxRuntimeStage):
    name: ClassVar[str] = "operator-fusion"
    description: ClassVar[str] = "onnxruntime's EXTENDED graph optimizations, saved offline (portable)"

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:
        import onnxruntime as ort

        levels = {str(level).lower() for level in ctx.options.get("levels", ("extended", "layout"))}
        unknown = sorted(levels - set(KNOWN_LEVELS))
        if unknown:
            raise UsageError(
                f"operator-fusion: unknown level {unknown[0]!r}", f"use {', '.join(KNOWN_LEVELS)}"
            )
        disabled = [str(d) for d in candidate.runtime_config.get("disabled_optimizers", [])]
        model = read_model(candidate.model_path)
        before = dict(op_counts(model))
        # ORT's fusions check shapes (SkipLayerNormalization needs both Add inputs' shapes);
        # exports without value_info leave them unfused, so annotate shapes first.
        model, shape_method = infer_shapes(model)
        if shape_method == "none":
            src = candidate.model_path
        else:
            src = ctx.workdir / "shaped.onnx"
            save_model(model, src)
        del model

        extended_path = ctx.workdir / "extended.onnx"
        extended, extended_extra = ort_save_optimized(src, extended_path, "extended", disabled)
        after = dict(op_counts(extended))
        if any(op.startswith(NCHWC_DOMAIN + ":") for op in after):  # never ship CPU-specific layouts
            raise StageSkipped("onnxruntime put NCHWc nodes into an EXTENDED-level graph; not portable")
        nodes_before = sum(before.values())
        if after == before:
            raise StageSkipped("onnxruntime's EXTENDED optimizations change nothing in this graph")

        nchwc_nodes = 0
        if levels & {"layout", "all"}:
            # Would ALL add CPU-specific layout nodes? Probe it; the probe file is never shipped.
            probe_path = ctx.workdir / "all-probe.onnx"
            probe, probe_extra = ort_save_optimized(src, probe_path, "all", disabled)
            nchwc_nodes = sum(n for op, n in op_counts(probe).items() if op.startswith(NCHWC_DOMAIN + ":"))
            for path in [probe_path, *probe_extra]:
                path.unlink(missing_ok=True)

        common: dict[str, Any] = {
            "saved_level": "extended",
            "saved_with": f"onnxruntime {ort.__version__}",
            "opsets": opset_map(extended),
            "isa": [],  # EXTENDED graphs hold no SIMD-width-specific kernels
            "shape_inference": shape_method,
            "nodes_before": nodes_before,
            "nodes_after": sum(after.values()),
            "fused_ops": _added_ops(before, after),
        }

        def make(label: str, path: Any, extra: list[Any], level: str, **details: Any) -> Candidate:
            config = {**candidate.runtime_config, "graph_optimization_level": level}
            return Candidate(
                label=f"{self.name}:{label}",
                model_path=path,
                backend=candidate.backend,
                runtime_config=config,
                standard_ops=candidate.standard_ops and all(":" not in op for op in after),
                precision=candidate.precision,
                details={**common, "runtime_level": level, **details},
                extra_files=list(extra),
            )

        out = [make("extended", extended_path, extended_extra, "disable")]
        if nchwc_nodes and levels & {"layout", "all"}:
            out.append(
                make(
                    "extended+layout-at-load",
                    extended_path,
                    extended_extra,
                    "all",
                    layout_at_load=True,
                    nchwc_nodes_at_all=nchwc_nodes,
                    note="ORT_ENABLE_ALL would add NCHWc nodes; they are made on the target CPU at load time",
                )
            )
        if after.get("com.microsoft:SkipLayerNormalization", 0) > before.get(
            "com.microsoft:SkipLayerNormalization", 0
        ):
            no_skip_path = ctx.workdir / "extended-no-skipln.onnx"
            no_skip, no_skip_extra = ort_save_optimized(
                src, no_skip_path, "extended", [*disabled, SKIP_LN_FUSION]
            )
            no_skip_after = dict(op_counts(no_skip))
            cand = make(
                "extended-no-skipln",
                no_skip_path,
                no_skip_extra,
                "disable",
                disabled_fusions=[SKIP_LN_FUSION],
            )
            cand.details.update(
                nodes_after=sum(no_skip_after.values()), fused_ops=_added_ops(before, no_skip_after)
            )
            # Also in the runtime config: a later stage that raises the level must not re-fuse it.
            cand.runtime_config["disabled_optimizers"] = sorted({*disabled, SKIP_LN_FUSION})
            cand.standard_ops = candidate.standard_ops and all(":" not in op for op in no_skip_after)
            out.append(cand)
        if "basic" in levels and len(out) < MAX_CANDIDATES:
            # BASIC = constant folding and redundancy removal only: the safe fallback when fused
            # kernels turn out slower than the plain ops they replace.
            basic_path = ctx.workdir / "basic.onnx"
            basic, basic_extra = ort_save_optimized(src, basic_path, "basic", disabled)
            basic_after = dict(op_counts(basic))
            if basic_after not in (before, after):
                cand = make("basic", basic_path, basic_extra, "disable")
                cand.details.update(
                    saved_level="basic",
                    nodes_after=sum(basic_after.values()),
                    fused_ops=_added_ops(before, basic_after),
                    opsets=opset_map(basic),
                )
                out.append(cand)
        return out[:MAX_CANDIDATES]
