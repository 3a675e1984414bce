"""Blocked/NHWC layouts for conv nets, and the session settings that matter for latency.

ORT's NchwcTransformer (fp32 Conv/Pool -> NCHW16c/8c) and NhwcTransformer (int8 QLinearConv) run
at session creation at the LAYOUT/ALL levels; they are most of ORT's CNN speed
(docs/onnxruntime.md#layout-transformers: 1.7x fp32, 2.1x int8). A file saved after them is tied
to the SIMD width of this CPU, so the portable candidate ships the unchanged file with runtime
level "all", and the saved-layout candidate records the ISA and NCHWc block width it needs, for
the artifact loader to check.

Thread settings (docs/onnxruntime.md#threads): intra-op threads = physical cores, one inter-op
thread, sequential execution, never more threads than cores; spinning on or off is measured, not
assumed. The other knobs measured there (memory arena and pattern, denormals-as-zero, dynamic block
base) were within noise and stay at ORT's defaults, to keep the measured search small.

Options: `layout` (default true), `search_threads` (true), `search_spinning` (true),
`threads` (fewer threads than the physical cores read from this machine; never more).
"""

from __future__ import annotations

from typing import Any, ClassVar

from optimize.model.onnx_file import NCHWC_DOMAIN, op_counts, read_model
from optimize.runtimes.onnxruntime.graph import ort_save_optimized
from optimize.stage import Candidate, OnnxRuntimeStage, StageContext, StageSkipped
from optimize.system.env import cpu_isa_flags, nchwc_block_width, nchwc_isa_requires, physical_cores

_CONV_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "com.microsoft:FusedConv",
        "QLinearConv",
        "com.microsoft:QLinearConv",
    }
)
_LAYOUT_LEVELS = ("layout", "all")


class MemoryLayoutStage(OnnxRuntimeStage):
    name: ClassVar[str] = "memory-layout"
    description: ClassVar[str] = (
        "NCHWc/NHWC layout for conv nets and latency session settings (threads, spinning)"
    )

    def run(self, candidate: Candidate, ctx: StageContext) -> list[Candidate]:

        ops = op_counts(read_model(candidate.model_path, load_external_data=False))
        conv_net = any(ops.get(op, 0) for op in _CONV_OPS)
        want_layout = bool(ctx.options.get("layout", True))
        search_threads = bool(ctx.options.get("search_threads", True))
        search_spinning = bool(ctx.options.get("search_spinning", True))
        if not search_threads and not (conv_net and want_layout):
            raise StageSkipped("no conv layers to re-layout and the thread search is off")
        cores = physical_cores()
        if ctx.options.get("threads"):
            # More threads than cores only adds contention (2-3x slower, docs/onnxruntime.md#threads).
            cores = max(1, min(int(ctx.options["threads"]), cores))
        base = dict(candidate.runtime_config)
        level = str(base.get("graph_optimization_level", "all"))
        disabled = [str(d) for d in base.get("disabled_optimizers", [])]
        layout_disabled = bool({"NchwcTransformer", "NhwcTransformer"} & set(disabled))
        if conv_net and want_layout and level not in _LAYOUT_LEVELS and not layout_disabled:
            level = "all"  # the layout transformers run only at LAYOUT/ALL, on the target CPU
        threads: dict[str, Any] = (
            {"intra_op_num_threads": cores, "inter_op_num_threads": 1, "execution_mode": "sequential"}
            if search_threads
            else {}
        )
        common: dict[str, Any] = {"physical_cores": cores, "conv_net": conv_net}
        layout_note = (
            "layout transform at load time (portable)"
            if conv_net and level in _LAYOUT_LEVELS
            else "no layout change"
        )

        def make(label: str, config: dict[str, Any], **details: Any) -> Candidate:
            return Candidate(
                label=f"{self.name}:{label}",
                model_path=candidate.model_path,
                backend=candidate.backend,
                runtime_config=config,
                standard_ops=candidate.standard_ops,
                precision=candidate.precision,
                details={**common, **details},
                extra_files=list(candidate.extra_files),
            )

        out: list[Candidate] = []
        if cores == 1:
            spin_options: tuple[bool, ...] = (False,)  # spinning on the only core just steals it
        else:
            spin_options = (True, False) if search_spinning else (bool(base.get("allow_spinning", True)),)
        for spin in spin_options:
            config = {**base, **threads, "graph_optimization_level": level, "allow_spinning": spin}
            name = f"threads{cores}" if search_threads else "layout"
            out.append(make(f"{name}{'-spin' if spin else '-nospin'}", config, layout=layout_note))

        block = nchwc_block_width(cpu_isa_flags())
        if conv_net and want_layout and block is not None and not layout_disabled:
            # The ISA-specific variant: layout done offline, nothing left to do at load time.
            path = ctx.workdir / "layout-all.onnx"
            saved, extra = ort_save_optimized(candidate.model_path, path, "all", disabled)
            saved_ops = op_counts(saved)
            nchwc = sum(n for op, n in saved_ops.items() if op.startswith(NCHWC_DOMAIN + ":"))
            if nchwc:
                # Same spinning choices as above, so the pipeline compares layouts like with like.
                for spin in spin_options:
                    config = {
                        **base,
                        **threads,
                        "graph_optimization_level": "disable",
                        "allow_spinning": spin,
                    }
                    cand = make(
                        f"nchwc{block}-saved{'-spin' if spin else '-nospin'}",
                        config,
                        layout=f"NCHW{block}c saved offline (ISA-specific)",
                        nchwc_nodes=nchwc,
                        nchwc_block_width=block,
                        isa_requires=nchwc_isa_requires(block),
                        # A file blocked for 8 floats is wrong on a 16-float CPU and vice versa.
                        isa_exact={"nchwc_block_width": block},
                        portable=False,
                    )
                    cand.model_path, cand.extra_files = path, list(extra)
                    cand.standard_ops = False
                    out.append(cand)
            else:
                path.unlink(missing_ok=True)
        return out
