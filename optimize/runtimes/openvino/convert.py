"""`openvino-convert`: the model as an OpenVINO IR, run at fp32 and, where the CPU has native bf16,
at bf16, each a candidate the pipeline checks and measures against the best so far.

No precision wins everywhere (docs/openvino.md): bf16 is often the biggest single step on
CPUs that have it and costs accuracy on some models, so both are proposed and the accuracy gate
and the bench engine decide. Runtime settings are proposed as separate candidates only where they
can matter: thread count on a CPU with SMT (physical cores vs all logical ones), and CPU pinning
when the recipe asks (`search_pinning`, off by default: on a machine shared with other jobs a
pinned thread waits for its core).

Each candidate is checked against the pipeline's accuracy gate before it is proposed; one that fails
is proposed with the CPU plugin's fused subgraphs off instead when that passes (backend.py says why).
A bf16 candidate that still fails, in a model with attention, is tried once more with attention's
activation x activation MatMuls kept at f32 (`bf16+fp32`), the one bf16 -> f32 lift per node that
the CPU plugin honours (docs/mixed-precision.md).

Options: bf16 (true), search_threads (true), search_pinning (false), threads.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, ClassVar

import openvino as ov  # a missing package skips the stage with its name (runtimes.load_stage)

from optimize.runtimes.openvino.ir import (
    candidate,
    gated,
    keep_at_f32,
    precision_hints,
    runtime_config,
    source_model,
    write_ir,
)
from optimize.runtimes.openvino.sensitivity import attention_matmuls
from optimize.stage import Candidate, Stage, StageContext
from optimize.system.env import physical_cores


def thread_choices(options: dict[str, Any]) -> list[int]:
    """Thread counts worth measuring: the physical cores, and all logical CPUs when SMT adds some."""

    cores = physical_cores()
    if options.get("threads"):
        return [max(1, min(int(options["threads"]), cores))]
    choices = [cores]
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if options.get("search_threads", True) and logical > cores:
        choices.append(logical)
    return choices


class OpenVinoConvertStage(Stage):
    name: ClassVar[str] = "openvino-convert"
    description: ClassVar[str] = "OpenVINO IR at fp32 and (on CPUs with native bf16) bf16 precision"

    def run(self, candidate_in: Candidate, ctx: StageContext) -> list[Candidate]:
        source, why = source_model(candidate_in, ctx)
        ctx.log(f"converting {why} to OpenVINO IR")
        model = ov.Core().read_model(str(source))
        ir = write_ir(model, ctx.workdir / "ir", source)
        out: list[Candidate] = []
        pinnings: list[bool | None] = [None, False] if ctx.options.get("search_pinning") else [None]
        for hint in precision_hints(ctx.options):
            for threads in thread_choices(ctx.options):
                for pinning in pinnings:
                    suffix = "" if threads == thread_choices(ctx.options)[0] else f"-threads{threads}"
                    suffix += "" if pinning is None else "-nopin"
                    cand = candidate(
                        f"{self.name}:{hint}{suffix}",
                        ir,
                        precision="fp32" if hint == "f32" else "bf16",
                        precision_hint=hint,
                        config=runtime_config(hint, threads, pinning),
                        details={"source": why, "threads": threads},
                    )
                    chosen, result = gated(cand, ctx)
                    out.append(chosen)
                    if hint == "bf16" and not result.ok:
                        lifted = self._attention_at_f32(chosen, model, ir, ctx, suffix)
                        if lifted is not None:
                            out.append(lifted)
        return out

    def _attention_at_f32(
        self, failed: Candidate, model: Any, ir: Any, ctx: StageContext, suffix: str
    ) -> Candidate | None:
        """`failed` (a bf16 candidate the gate refused) with attention's MatMuls at f32, when the
        model has attention and that passes the gate; else None."""
        names = attention_matmuls(model)
        if not names:
            return None
        marked = keep_at_f32(ir, names, ctx.workdir / f"ir-attention-f32{suffix}")
        lifted = [{"node": name, "precision": "fp32"} for name in names]
        cand = replace(
            failed,
            label=failed.label.replace(":bf16", ":bf16-attention-f32", 1),
            model_path=marked,
            precision="bf16+fp32",
            details={**failed.details, "lifted": lifted},
            extra_files=[marked.with_suffix(".bin")],
        )
        result = ctx.check_accuracy(cand)
        verdict = "passes" if result.ok else f"fails too ({result.reason})"
        ctx.log(f"{failed.label}: with attention's {len(names)} MatMuls at f32 it {verdict}")
        return cand if result.ok else None
