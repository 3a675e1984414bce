"""Recipes: which stages `lto optimize` runs, in what order, with which options and thresholds.

A recipe is a TOML file (see `recipes/*.toml`). It is validated strictly: an unknown key, a
value of the wrong type or an unknown stage is a UsageError that names the key path, so a
typo never silently falls back to a default.

Layout of a recipe:

    name = "cnn"
    description = "..."
    order = ["operator-fusion", "quantize"]   # optional: the stages to run, in order (default:
                                              # every stage lto has, in the registry's order)

    [stages.quantize]         # options of one stage; every stage has `enabled`, `budget_s`, `run_when`
    enabled = true
    run_when = "above-target" # "always" | "above-target" (only while the best latency misses --target-ms)
    mode = "auto"

    [accuracy]                # thresholds every candidate must meet against the baseline's outputs
    min_cosine = 0.999
    [bench]                   # optimize.bench.BenchSettings for every comparison
    [decision]                # when a faster candidate is kept
    min_improvement = 0.05     # and the ratio's 95% CI upper end below 1, on two measurements
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.accuracy import METRICS, Thresholds
from optimize.errors import UsageError
from optimize.options import (
    Schema,
    boolean,
    check_table,
    choice,
    integer,
    number,
    string,
    table,
    thread_options,
)
from optimize.runtimes.registry import stage_infos
from optimize.system.env import check_thread_count

if TYPE_CHECKING:
    import onnx

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# Where named recipes live: $LTO_RECIPES_DIR, the repository's recipes/ folder (a checkout or an
# editable install), or <prefix>/share/lto/recipes (a wheel install, see pyproject data-files).
RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
INSTALLED_RECIPES_DIR = Path(sys.prefix) / "share" / "lto" / "recipes"

RUN_WHEN = ("always", "above-target")

# The tables every recipe may have besides its stages' (optimize.options schemas).
_COMMON_STAGE_OPTIONS: dict[str, Schema] = {
    "enabled": boolean(),
    "budget_s": number(),  # wall-clock budget handed to the stage as ctx.deadline
    "run_when": choice(*RUN_WHEN),
}
_ACCURACY_KEYS: dict[str, Schema] = {
    # embeddings and outputs with no task metric: worst sample, worst slice
    "min_cosine": number(maximum=1.0),
    # outputs a task metric judges: a floor under it, whole and per slice
    "min_task_cosine": number(maximum=1.0),
    "max_abs": number(),
    "max_rel": number(),  # whole output and worst slice
    "min_top1": number(maximum=1.0),
    # near-ties within this fraction of a row's logit range do not count
    "top1_tolerance": number(maximum=1.0),
    "min_ctc": number(maximum=1.0),  # sequences whose greedy CTC decode is unchanged
    "min_detection": number(maximum=1.0),  # detection candidate-set agreement
    "detection_score": number(maximum=1.0),  # score above which a detection candidate counts
    "detection_iou": number(maximum=1.0),  # IoU at which two candidates are the same detection
    "min_mask_iou": number(maximum=1.0),  # probability maps and masks: IoU of the regions
    "mask_thresholds": {"type": "array", "items": number(maximum=1.0)},
    "samples": integer(minimum=1),  # accuracy samples, each checked; the worst case decides
    "task_metrics": {  # output name -> classifier | embedding | ctc | detection | none
        "type": "object",
        "additionalProperties": choice(*METRICS),
    },
}
# Thresholds that may be switched off (None) from the command line (`--accuracy rel=off`).
OPTIONAL_THRESHOLDS = ("max_abs", "max_rel", "min_top1", "min_ctc", "min_detection", "min_mask_iou")
_BENCH_KEYS: dict[str, Schema] = {
    "warmup": integer(),
    "min_runs": integer(),
    "max_runs": integer(),
    "max_time_s": number(),
    "target_ci_rel": number(),
    "chunk_s": number(),
    "settle_s": number(),
    "block_s": number(),
    "settle_max_s": number(),
}
_DECISION_KEYS: dict[str, Schema] = {"min_improvement": number(maximum=0.999999)}
_TOP_KEYS = {"name", "description", "order", "stages", "accuracy", "bench", "decision"}


def stage_options(name: str) -> dict[str, Schema]:
    """The options a recipe may give stage `name`: every stage's, then those it declares."""
    info = stage_infos().get(name)
    return {**_COMMON_STAGE_OPTIONS, **(info.options if info else {})}


@dataclass
class StageSpec:
    name: str
    enabled: bool = True
    budget_s: float | None = None
    run_when: str = "always"
    options: dict[str, Any] = field(default_factory=dict)  # stage-specific options only


@dataclass
class Recipe:
    name: str
    source: str  # the file it came from
    description: str
    stages: list[StageSpec]
    accuracy: Thresholds
    bench: dict[str, Any]  # BenchSettings keyword arguments
    min_improvement: float = 0.05

    def stage(self, name: str) -> StageSpec | None:
        return next((s for s in self.stages if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "description": self.description,
            "stages": [
                {
                    "name": s.name,
                    "enabled": s.enabled,
                    "budget_s": s.budget_s,
                    "run_when": s.run_when,
                    "options": s.options,
                }
                for s in self.stages
            ],
            "accuracy": self.accuracy.to_json(),
            "bench": self.bench,
            "min_improvement": self.min_improvement,
        }


def recipes_dir() -> Path:
    env = os.environ.get("LTO_RECIPES_DIR")
    if env:
        return Path(env)
    return (
        RECIPES_DIR if RECIPES_DIR.is_dir() or not INSTALLED_RECIPES_DIR.is_dir() else INSTALLED_RECIPES_DIR
    )


def list_recipes() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.toml"))


def resolve_recipe_path(name_or_path: str) -> Path:
    """A recipe name ("cnn") from recipes/, or a path to a .toml file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or os.sep in name_or_path or candidate.exists():
        if not candidate.is_file():
            raise UsageError(f"recipe file {name_or_path} does not exist")
        return candidate
    path = recipes_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(list_recipes()) or "none found"
        raise UsageError(
            f"unknown recipe {name_or_path!r}", f"choose one of: {known}, or give a path to a .toml file"
        )
    return path


def load_recipe(name_or_path: str, known_stages: Sequence[str] | None = None) -> Recipe:
    path = resolve_recipe_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"recipe {path.name}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        # TOML is UTF-8 by definition; a latin-1 file saved by an editor must not be a crash.
        raise UsageError(
            f"recipe {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
            "save the recipe as UTF-8",
        ) from None
    except OSError as exc:
        raise UsageError(f"recipe {path}: cannot read: {exc.strerror}") from None
    return parse_recipe(data, source=str(path), known_stages=known_stages)


def parse_thresholds(values: Mapping[str, Any], where: str, base: Thresholds | None = None) -> Thresholds:
    """Thresholds from checked accuracy values (a recipe table or the command line) over `base`.

    `where` prefixes every error, e.g. "recipe r.toml: accuracy." or "--accuracy ".
    """
    values = dict(values)
    for key, value in values.items():
        if key in ("task_metrics", "mask_thresholds") or value is None:
            continue
        if value < 0:
            raise UsageError(f"{where}{key}: must not be negative, got {value}")
        if key in ("min_cosine", "min_task_cosine", "min_top1", "min_ctc", "min_detection", "min_mask_iou",
                   "top1_tolerance", "detection_score", "detection_iou") and value > 1.0:  # fmt: skip
            raise UsageError(f"{where}{key}: must be at most 1.0, got {value}")
    if values.get("samples", 1) < 1:
        raise UsageError(f"{where}samples: must be at least 1")
    if "mask_thresholds" in values:
        levels = values["mask_thresholds"]
        if not levels or any(not 0.0 < float(t) < 1.0 for t in levels):
            raise UsageError(f"{where}mask_thresholds: each must be between 0 and 1, got {levels}")
        values["mask_thresholds"] = tuple(float(t) for t in levels)
    task_metrics = values.get("task_metrics")
    if task_metrics is not None:
        for output, metric in task_metrics.items():
            if metric not in METRICS:
                raise UsageError(
                    f"{where}task_metrics.{output}: expected one of {', '.join(repr(m) for m in METRICS)}, "
                    f"got {metric!r}"
                )
        values["task_metrics"] = {**(base.task_metrics if base else {}), **task_metrics}
    return replace(base, **values) if base is not None else Thresholds(**values)


def parse_recipe(data: Mapping[str, Any], source: str, known_stages: Sequence[str] | None = None) -> Recipe:
    """Validate parsed TOML and build a Recipe. `known_stages` defaults to the stage registry;
    each stage's options are checked against the schema its runtime spec declares."""
    where = Path(source).name
    stage_names = list(known_stages) if known_stages is not None else list(stage_infos())
    top = check_table(
        f"recipe {where}: ",
        "",
        data,
        {"name": string(), "description": string(), "order": {"type": "array"}}
        | {key: table() for key in ("stages", "accuracy", "bench", "decision")},
    )
    name = top.get("name", Path(source).stem)
    description = top.get("description", "")

    # No `order`: every stage lto has, in the registry's order (the tie-break of the search order).
    order = top.get("order", stage_names)
    seen: set[str] = set()
    for i, stage_name in enumerate(order):
        if not isinstance(stage_name, str):
            raise UsageError(f"recipe {where}: order[{i}]: expected a stage name, got {stage_name!r}")
        if stage_name not in stage_names:
            raise UsageError(
                f"recipe {where}: order[{i}]: unknown stage {stage_name!r}",
                f"known stages: {', '.join(stage_names)}",
            )
        if stage_name in seen:
            raise UsageError(f"recipe {where}: order[{i}]: stage {stage_name!r} listed twice")
        seen.add(stage_name)

    stage_tables = top.get("stages", {})
    for stage_name in stage_tables:
        if stage_name not in seen:
            raise UsageError(
                f"recipe {where}: stages.{stage_name}: options for a stage that is not in `order`",
                "add it to `order` or remove the table",
            )
    specs: list[StageSpec] = []
    for stage_name in order:
        schema = stage_options(stage_name)
        prefix = f"stages.{stage_name}"
        options = check_table(f"recipe {where}: ", prefix, stage_tables.get(stage_name, {}), schema)
        for key in thread_options(schema):
            if key in options:
                check_thread_count(options[key], f"recipe {where}: {prefix}.{key}")
        specs.append(
            StageSpec(
                name=stage_name,
                enabled=options.pop("enabled", True),
                budget_s=options.pop("budget_s", None),
                run_when=options.pop("run_when", "always"),
                options=options,
            )
        )

    acc = check_table(f"recipe {where}: ", "accuracy", top.get("accuracy", {}), _ACCURACY_KEYS)
    thresholds = parse_thresholds(acc, f"recipe {where}: accuracy.")

    bench = check_table(f"recipe {where}: ", "bench", top.get("bench", {}), _BENCH_KEYS)
    if bench.get("min_runs", 1) < 1 or bench.get("max_runs", 1) < bench.get("min_runs", 1):
        raise UsageError(
            f"recipe {where}: bench.max_runs: must be at least bench.min_runs (and min_runs >= 1)"
        )

    decision = check_table(f"recipe {where}: ", "decision", top.get("decision", {}), _DECISION_KEYS)
    return Recipe(
        name=name,
        source=source,
        description=description,
        stages=specs,
        accuracy=thresholds,
        bench=bench,
        min_improvement=float(decision.get("min_improvement", 0.05)),
    )


# --- model kind -----------------------------------------------------------------------------

_ATTENTION_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "QAttention"}
_CONV_OPS = {"Conv", "ConvTranspose", "QLinearConv", "ConvInteger", "FusedConv", "NhwcConv"}
_MATMUL_OPS = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "DynamicQuantizeMatMul"}


def detect_model_kind(model: onnx.ModelProto) -> str:
    """The model kind ("transformer", "cnn" or "default") from the op mix and the input types.

    transformer: attention (a fused Attention op, or Softmax next to >= 2 MatMuls) fed by integer
    token inputs; cnn: convolutions outnumber matrix multiplies; default: anything else.
    """
    from onnx import TensorProto

    ops: Counter[str] = Counter(node.op_type for node in model.graph.node)
    initializers = {init.name for init in model.graph.initializer}
    int_inputs = [
        i
        for i in model.graph.input
        if i.name not in initializers
        and i.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.INT32)
    ]
    matmuls = sum(ops[o] for o in _MATMUL_OPS)
    convs = sum(ops[o] for o in _CONV_OPS)
    attention = any(ops[o] for o in _ATTENTION_OPS) or (ops["Softmax"] > 0 and matmuls >= 2)
    if attention and int_inputs:
        return "transformer"
    if convs and convs >= matmuls:
        return "cnn"
    return "default"


def recipe_for_kind(kind: str) -> str:
    return kind if kind in ("transformer", "cnn") else "default"


__all__ = [
    "RUN_WHEN",
    "Recipe",
    "StageSpec",
    "Thresholds",
    "detect_model_kind",
    "list_recipes",
    "load_recipe",
    "parse_recipe",
    "parse_thresholds",
    "recipe_for_kind",
    "resolve_recipe_path",
    "stage_options",
]
