"""Recipes: which stages `lto optimize` runs, in what order, with which options and thresholds.

A recipe is a TOML file (see `recipes/*.toml`). It is validated strictly: an unknown key, a
value of the wrong type or an unknown stage is a UsageError that names the key path, so a
typo never silently falls back to a default.

Layout of a recipe:

    name = "cnn"
    description = "..."
    order = ["graph-fusion", "operator-fusion", "memory-layout", "quantize", "tvm-tune", "tensorrt-build"]

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimize.env import check_thread_count
from optimize.errors import UsageError
from optimize.runtimes.tvm.tune_stage import OPTION_TYPES as TVM_TUNE_OPTIONS
from optimize.thresholds import Thresholds

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

# Option schemas. A value is a type (or tuple of types) or a tuple of allowed strings.
# `int` also accepts nothing but ints (bool is rejected), `float` accepts ints and floats.
_Choice = tuple[str, ...]
_COMMON_STAGE_OPTIONS: dict[str, Any] = {
    "enabled": bool,
    "budget_s": float,  # wall-clock budget handed to the stage as ctx.deadline
    "run_when": RUN_WHEN,
}
STAGE_OPTIONS: dict[str, dict[str, Any]] = {
    "graph-fusion": {
        # Detected from the graph when absent; set them only to override the detection.
        "model_type": ("bert", "bart", "gpt2", "t5", "vit", "clip", "unet", "vae", "swin", "phi", "sam2"),
        "num_heads": int,
        "hidden_size": int,
        "gelu_approximation": bool,
        "embed_layer_norm": bool,
    },
    "operator-fusion": {
        "levels": list,  # ORT levels to save offline / apply at load: "extended", "layout"
    },
    "memory-layout": {
        "layout": bool,  # try ORT's NCHWc/NHWC layout transformers on conv nets
        "search_threads": bool,
        "search_spinning": bool,
        "threads": int,  # intra-op threads; default: the physical cores
    },
    "quantize": {
        "mode": ("auto", "dynamic", "static"),
        "calibration": ("minmax", "entropy", "percentile"),
        "calib_data": str,  # .npz path; --calib-data sets it
        "calib_samples": int,
        "per_channel": bool,
        "points": list,  # search exactly these points, in order (labels like "dynamic-pc-matmul")
        "max_points": int,
        "max_backoff_rounds": int,
        "exclude_nodes": list,
        "fp16": bool,
        "fused_variant": bool,
    },
    "openvino-convert": {
        "bf16": bool,  # also propose bf16 where the CPU has native bf16 (avx512_bf16 / amx_bf16)
        "search_threads": bool,  # physical cores vs all logical CPUs, on a CPU with SMT
        "search_pinning": bool,  # CPU pinning on vs off, measured
        "threads": int,
    },
    "openvino-quantize": {
        "calib_data": str,  # .npz path; --calib-data sets it
        "calib_samples": int,
        "preset": ("auto", "performance", "mixed"),
        "smooth_quant": ("auto", "on", "off"),
        "max_backoff_rounds": int,
        "exclude_nodes": list,  # OpenVINO node names kept in float
        "bf16": bool,  # also propose the int8 IR with its float parts at bf16
        "threads": int,
    },
    # The stage declares its own options (it validates them again when it runs).
    "tvm-tune": dict(TVM_TUNE_OPTIONS),
    "tensorrt-build": {
        "runtime": str,
        "precisions": list,
        "shapes": list,
        "workspace_mb": int,
        "builder_optimization_level": int,
        "hardware_compatibility": str,
        "timing_cache": bool,
        "cuda_graph": bool,
        "cache_dir": str,
    },
}

# Allowed items of list-valued options.
_LIST_ITEMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("operator-fusion", "levels"): ("basic", "extended", "layout", "all"),
    ("tensorrt-build", "precisions"): ("fp32", "fp16"),
}

_ACCURACY_KEYS: dict[str, Any] = {
    "min_cosine": float,  # embeddings and outputs with no task metric: worst sample, worst slice
    "min_task_cosine": float,  # outputs a task metric judges: a floor under it, whole and per slice
    "max_abs": float,
    "max_rel": float,  # whole output and worst slice
    "min_top1": float,
    "top1_tolerance": float,  # near-ties within this fraction of a row's logit range do not count
    "min_ctc": float,  # sequences whose greedy CTC decode is unchanged
    "min_detection": float,  # detection candidate-set agreement
    "detection_score": float,  # score above which a detection candidate counts
    "detection_iou": float,  # IoU at which two candidates are the same detection
    "samples": int,  # accuracy samples, each checked; the worst case decides
    "task_metrics": dict,  # output name -> classifier | embedding | ctc | detection | none
}
# Thresholds that may be switched off (None) from the command line (`--accuracy rel=off`).
OPTIONAL_THRESHOLDS = ("max_abs", "max_rel", "min_top1", "min_ctc", "min_detection")
_BENCH_KEYS: dict[str, Any] = {
    "warmup": int,
    "min_runs": int,
    "max_runs": int,
    "max_time_s": float,
    "target_ci_rel": float,
    "chunk_s": float,
    "settle_s": float,
    "block_s": float,
    "settle_max_s": float,
}
_DECISION_KEYS: dict[str, Any] = {"min_improvement": float}
# Stage options that are thread counts (memory-layout, tvm-tune): bounded like --threads.
_THREAD_OPTIONS = ("threads", "num_threads")
_TOP_KEYS = {"name", "description", "order", "stages", "accuracy", "bench", "decision"}


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


def _recipes_dir() -> Path:
    env = os.environ.get("LTO_RECIPES_DIR")
    if env:
        return Path(env)
    return (
        RECIPES_DIR if RECIPES_DIR.is_dir() or not INSTALLED_RECIPES_DIR.is_dir() else INSTALLED_RECIPES_DIR
    )


def list_recipes() -> list[str]:
    return sorted(p.stem for p in _recipes_dir().glob("*.toml"))


def resolve_recipe_path(name_or_path: str) -> Path:
    """A recipe name ("cnn") from recipes/, or a path to a .toml file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or os.sep in name_or_path or candidate.exists():
        if not candidate.is_file():
            raise UsageError(f"recipe file {name_or_path} does not exist")
        return candidate
    path = _recipes_dir() / f"{name_or_path}.toml"
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


def _type_name(expected: Any) -> str:
    if isinstance(expected, tuple):
        return "one of " + ", ".join(repr(c) for c in expected)
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }[expected]


def _check_value(where: str, key_path: str, value: Any, expected: Any) -> Any:
    ok: bool
    if isinstance(expected, tuple):
        ok = isinstance(value, str) and value in expected
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise UsageError(f"recipe {where}: {key_path}: expected {_type_name(expected)}, got {value!r}")
    return value


def _check_table(where: str, prefix: str, table: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise UsageError(f"recipe {where}: {prefix}: expected a table, got {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in schema:
            raise UsageError(
                f"recipe {where}: {prefix}.{key}: unknown key",
                f"known keys under {prefix}: {', '.join(schema)}",
            )
        out[key] = _check_value(where, f"{prefix}.{key}", value, schema[key])
    return out


def _non_negative(where: str, key_path: str, value: float | int | None) -> None:
    if value is not None and value < 0:
        raise UsageError(f"recipe {where}: {key_path}: must not be negative, got {value}")


def parse_thresholds(values: Mapping[str, Any], where: str, base: Thresholds | None = None) -> Thresholds:
    """Thresholds from checked accuracy values (a recipe table or the command line) over `base`.

    `where` prefixes every error, e.g. "recipe r.toml: accuracy." or "--accuracy ".
    """
    from dataclasses import replace

    from optimize.task_metrics import METRICS

    values = dict(values)
    for key, value in values.items():
        if key == "task_metrics" or value is None:
            continue
        if value < 0:
            raise UsageError(f"{where}{key}: must not be negative, got {value}")
        if key in ("min_cosine", "min_task_cosine", "min_top1", "min_ctc", "min_detection",
                   "top1_tolerance", "detection_score", "detection_iou") and value > 1.0:  # fmt: skip
            raise UsageError(f"{where}{key}: must be at most 1.0, got {value}")
    if values.get("samples", 1) < 1:
        raise UsageError(f"{where}samples: must be at least 1")
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
    """Validate parsed TOML and build a Recipe. `known_stages` defaults to the stage registry."""
    from optimize.runtimes import STAGES

    where = Path(source).name
    stage_names = list(known_stages) if known_stages is not None else list(STAGES)
    for key in data:
        if key not in _TOP_KEYS:
            raise UsageError(
                f"recipe {where}: {key}: unknown key", f"known keys: {', '.join(sorted(_TOP_KEYS))}"
            )

    name = _check_value(where, "name", data.get("name", Path(source).stem), str)
    description = _check_value(where, "description", data.get("description", ""), str)

    if "order" not in data:
        raise UsageError(f"recipe {where}: order: missing", "list the stages in the order they run")
    order = _check_value(where, "order", data["order"], list)
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

    stage_tables = data.get("stages", {})
    if not isinstance(stage_tables, dict):
        raise UsageError(f"recipe {where}: stages: expected a table of per-stage options")
    specs: list[StageSpec] = []
    for stage_name in stage_tables:
        if stage_name not in seen:
            raise UsageError(
                f"recipe {where}: stages.{stage_name}: options for a stage that is not in `order`",
                "add it to `order` or remove the table",
            )
    for stage_name in order:
        schema = {**_COMMON_STAGE_OPTIONS, **STAGE_OPTIONS.get(stage_name, {})}
        table = _check_table(where, f"stages.{stage_name}", stage_tables.get(stage_name, {}), schema)
        budget = table.pop("budget_s", None)
        _non_negative(where, f"stages.{stage_name}.budget_s", budget)
        for key, value in table.items():
            if isinstance(value, int) and not isinstance(value, bool):
                _non_negative(where, f"stages.{stage_name}.{key}", value)
            if key in _THREAD_OPTIONS:
                check_thread_count(value, f"recipe {where}: stages.{stage_name}.{key}")
            allowed = _LIST_ITEMS.get((stage_name, key))
            if allowed is not None:
                for j, item in enumerate(value):
                    if item not in allowed:
                        raise UsageError(
                            f"recipe {where}: stages.{stage_name}.{key}[{j}]: expected one of "
                            f"{', '.join(repr(a) for a in allowed)}, got {item!r}"
                        )
        specs.append(
            StageSpec(
                name=stage_name,
                enabled=table.pop("enabled", True),
                budget_s=budget,
                run_when=table.pop("run_when", "always"),
                options=table,
            )
        )

    acc = _check_table(where, "accuracy", data.get("accuracy", {}), _ACCURACY_KEYS)
    thresholds = parse_thresholds(acc, f"recipe {where}: accuracy.")

    bench = _check_table(where, "bench", data.get("bench", {}), _BENCH_KEYS)
    for key, value in bench.items():
        _non_negative(where, f"bench.{key}", value)
    if bench.get("min_runs", 1) < 1 or bench.get("max_runs", 1) < bench.get("min_runs", 1):
        raise UsageError(
            f"recipe {where}: bench.max_runs: must be at least bench.min_runs (and min_runs >= 1)"
        )

    decision = _check_table(where, "decision", data.get("decision", {}), _DECISION_KEYS)
    min_improvement = decision.get("min_improvement", 0.05)
    if not 0.0 <= min_improvement < 1.0:
        raise UsageError(
            f"recipe {where}: decision.min_improvement: expected 0 <= x < 1, got {min_improvement}"
        )

    return Recipe(
        name=name,
        source=source,
        description=description,
        stages=specs,
        accuracy=thresholds,
        bench=bench,
        min_improvement=float(min_improvement),
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
    "STAGE_OPTIONS",
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
]
