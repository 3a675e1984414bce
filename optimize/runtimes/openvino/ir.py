"""What both OpenVINO stages share: the model they start from, the IR they write, the candidates
they propose and the settings those candidates run with.

Stages read ONNX with OpenVINO's own frontend, so they start from a graph of standard ONNX ops
only: the best standard-op candidate so far when it is still a float ONNX Runtime graph, else the
user's model. ONNX Runtime's fused graphs (com.microsoft ops) are not readable by OpenVINO, and
its int8 graphs would be quantized twice.
"""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimize.accuracy import AccuracyResult
from optimize.data import model_input_specs
from optimize.runtimes.openvino.backend import (
    BF16_FLAGS,
    DEFAULT_CONFIG,
    DIM_NAMES_KEY,
    OUTPUT_NAMES_KEY,
    has_bf16,
    onnx_output_names,
)
from optimize.stage import Candidate, StageContext
from optimize.system.env import VNNI_FLAGS, cpu_isa_flags, has_vnni

BACKEND = "openvino"
IR_NAME = "model.xml"  # the artifact copies it as model.xml, its weights as model.bin beside it


def source_model(candidate: Candidate, ctx: StageContext) -> tuple[Path, str]:
    """(the ONNX file to start from, why that one)."""
    best = ctx.best_standard
    if (
        best.backend == "onnxruntime"
        and best.standard_ops
        and best.precision == "fp32"
        and best.model_path.suffix == ".onnx"
        and best.model_path != ctx.original_model
    ):
        return best.model_path, f"the best standard-op ONNX graph so far ({best.label})"
    return ctx.original_model, "the original model"


def onnx_dim_names(path: Path) -> dict[str, list[str | None]]:

    return {s.name: [d if isinstance(d, str) else None for d in s.shape] for s in model_input_specs(path)}


def write_ir(model: Any, folder: Path, source: Path) -> Path:
    """Save `model` as folder/model.xml + model.bin, weights kept at their precision.

    compress_to_fp16=False: save_model's default stores float weights as fp16, which would change
    an "fp32" model's numbers. The ONNX dim names and output names ride along in rt_info (OpenVINO
    keeps no dim names), so that a loaded artifact still says which axis is the batch and names its
    outputs as the ONNX model did.
    """
    import openvino as ov

    folder.mkdir(parents=True, exist_ok=True)
    model.set_rt_info(json.dumps(onnx_dim_names(source)), DIM_NAMES_KEY)
    model.set_rt_info(json.dumps(onnx_output_names(source)), OUTPUT_NAMES_KEY)
    path = folder / IR_NAME
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


# The runtime attribute OpenVINO's CPU plugin reads to keep a node at its original precision under a
# reduced-precision hint (docs/mixed-precision.md says which nodes it survives to).
KEEP_PRECISION_ATTRIBUTE = {"name": "DisablePrecisionConversion", "version": "0", "value": "dynamic:f16"}


def keep_at_f32(ir: Path, names: list[str], folder: Path) -> Path:
    """A copy of `ir` (its .xml rewritten, its .bin linked or copied) in which the named layers carry
    the attribute that keeps them at f32 under a bf16 hint. The attribute lives in the IR, so any
    OpenVINO host (Triton's openvino backend too) honours it; Python's runtime-info API cannot write
    it (it would store a plain string, which the plugin ignores)."""
    tree = ET.parse(ir)
    wanted = set(names)
    for layer in tree.getroot().iter("layer"):
        if layer.get("name") not in wanted:
            continue
        rt_info = layer.find("rt_info")
        if rt_info is None:
            rt_info = ET.Element("rt_info")
            layer.insert(0, rt_info)
        ET.SubElement(rt_info, "attribute", KEEP_PRECISION_ATTRIBUTE)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / IR_NAME
    tree.write(out, encoding="utf-8", xml_declaration=True)
    weights = out.with_suffix(".bin")
    try:
        os.link(ir.with_suffix(".bin"), weights)
    except OSError:
        shutil.copyfile(ir.with_suffix(".bin"), weights)
    return out


def runtime_config(precision_hint: str, threads: int, pinning: bool | None = None) -> dict[str, Any]:
    config = {**DEFAULT_CONFIG, "INFERENCE_PRECISION_HINT": precision_hint, "INFERENCE_NUM_THREADS": threads}
    config["ENABLE_CPU_PINNING"] = pinning
    return config


def worst_cosine(result: AccuracyResult) -> float:
    return min((float(m.get("cosine", 1.0)) for m in result.per_output.values()), default=1.0)


def without_snippets(cand: Candidate, why: str) -> Candidate:
    """The same IR and settings with the CPU plugin's fused subgraphs off (see backend.py)."""
    return replace(
        cand,
        label=f"{cand.label}-nosnippets",
        runtime_config={**cand.runtime_config, "SNIPPETS_MODE": "DISABLE"},
        details={**cand.details, "snippets": f"off: {why}"},
        extra_files=list(cand.extra_files),
    )


def gated(cand: Candidate, ctx: StageContext) -> tuple[Candidate, AccuracyResult]:
    """`cand`, or its variant without fused subgraphs when `cand` fails the pipeline's accuracy gate
    and the variant passes it (or comes closer). The pipeline checks the returned one again."""
    result = ctx.check_accuracy(cand)
    if result.ok or cand.runtime_config.get("SNIPPETS_MODE") == "DISABLE":
        return cand, result
    fallback = without_snippets(cand, f"with them on it failed the accuracy gate ({result.reason})")
    second = ctx.check_accuracy(fallback)
    verdict = "passes" if second.ok else "fails too"
    ctx.log(f"{cand.label}: inaccurate ({result.reason}); without fused subgraphs it {verdict}")
    if second.ok or worst_cosine(second) > worst_cosine(result):
        return fallback, second
    return cand, result


def precision_hints(options: Mapping[str, Any]) -> list[str]:
    """f32 always; bf16 where this CPU runs it natively (and the recipe does not turn it off).
    bf16 comes first: it is the larger step on most models, and under a short --time-budget a
    stage's first candidate is the one sure to be measured."""
    hints = ["f32"]
    if options.get("bf16", True) and has_bf16():
        hints.insert(0, "bf16")
    return hints


def isa_entries(precision_hint: str, int8: bool) -> list[dict[str, Any]]:
    """CPU requirements the artifact records (optimize.artifact reads `cpu_isa_any` from details)."""

    entries: list[dict[str, Any]] = []
    if precision_hint == "bf16":
        entries.append({"any_of": list(BF16_FLAGS), "why": "compiled for bf16, which needs native bf16"})
    if int8 and has_vnni(cpu_isa_flags()):
        entries.append({"any_of": list(VNNI_FLAGS), "why": "int8 kernels were accuracy-checked with VNNI"})
    return entries


def candidate(
    label: str,
    ir: Path,
    *,
    precision: str,
    precision_hint: str,
    config: dict[str, Any],
    details: dict[str, Any],
) -> Candidate:
    import openvino as ov

    return Candidate(
        label=label,
        model_path=ir,
        backend=BACKEND,
        runtime_config=config,
        standard_ops=False,  # an OpenVINO IR: TVM and TensorRT cannot read it
        precision=precision,
        details={
            "runtime": f"openvino {ov.__version__}",
            "precision_hint": precision_hint,
            "cpu_isa_any": isa_entries(precision_hint, precision.startswith("int8")),
            # Built from an ONNX source, not from the kept chain: the artifact's CPU requirements
            # are this candidate's own (optimize.artifact.cpu_requirements).
            "independent_of_chain": True,
            **details,
        },
        extra_files=[ir.with_suffix(".bin")],
    )


__all__ = [
    "BACKEND",
    "KEEP_PRECISION_ATTRIBUTE",
    "candidate",
    "gated",
    "keep_at_f32",
    "precision_hints",
    "runtime_config",
    "source_model",
    "without_snippets",
    "write_ir",
]
