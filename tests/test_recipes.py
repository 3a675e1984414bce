"""Recipes: the shipped ones load, bad ones fail naming the key, the default follows the model kind."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from optimize.errors import UsageError
from optimize.recipes import (
    Thresholds,
    detect_model_kind,
    list_recipes,
    load_recipe,
    parse_recipe,
    recipe_for_kind,
)
from optimize.runtimes.registry import stage_infos
from tests.conftest import SAMPLES, make_matmul_model

MINIMAL = 'order = ["graph-fusion", "quantize"]\n'


def write(tmp_path: Path, text: str, name: str = "r.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as info:
        load_recipe(str(write(tmp_path, text)))
    return info.value.one_line()


def test_shipped_recipes_load_and_keep_places_for_tvm_and_tensorrt() -> None:
    names = list_recipes()
    assert {"default", "transformer", "cnn", "strict"} <= set(names)
    for name in names:
        recipe = load_recipe(name)
        order = [s.name for s in recipe.stages]
        assert order == list(stage_infos()), name  # every stage has its place, in pipeline order
        # TVM tuning is slow and TensorRT needs a GPU: both are off unless asked for.
        assert not recipe.stage("tvm-tune").enabled
        assert not recipe.stage("tensorrt-build").enabled
        assert 0 < recipe.accuracy.min_cosine <= 1


def test_recipes_differ_where_they_should() -> None:
    # Quantization is a search in every recipe: the model's weights decide where it starts.
    for name in ("cnn", "transformer", "default"):
        options = load_recipe(name).stage("quantize").options
        assert options["mode"] == "auto" and "calibration" not in options, name
    assert not load_recipe("cnn").stage("graph-fusion").enabled
    strict = load_recipe("strict")
    assert not strict.stage("quantize").enabled
    assert strict.accuracy.min_cosine > load_recipe("default").accuracy.min_cosine
    assert strict.accuracy.top1_tolerance == 0.0
    assert load_recipe("default").stage("quantize").run_when == "above-target"


def test_accuracy_defaults_are_what_users_accept_and_strict_stays_strict() -> None:
    for name in ("default", "cnn", "transformer"):
        acc = load_recipe(name).accuracy
        # Worst-sample, worst-slice cosine 0.99 for embeddings and plain float outputs (0.995 for
        # transformers, whose embeddings feed retrieval); classifiers and CTC outputs by their task
        # (top-1 / decode equal on 99%); 32 generated samples when the user gives no rows.
        cosine = 0.995 if name == "transformer" else 0.99
        assert (acc.min_cosine, acc.min_top1, acc.min_ctc, acc.samples) == (cosine, 0.99, 0.99, 32), name
        assert acc.min_task_cosine < acc.min_cosine and acc.max_rel is None, name
        # The recipes spell out the built-in defaults (the transformer's cosine aside).
        assert acc == Thresholds(min_cosine=cosine), name
    strict = load_recipe("strict").accuracy
    assert strict.min_cosine >= 0.999 and strict.min_task_cosine >= 0.999
    assert strict.min_top1 == strict.min_ctc == strict.min_detection == 1.0
    assert strict.samples >= 32 and strict.max_rel is not None


def test_task_metric_overrides_in_a_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(str(write(tmp_path, MINIMAL + '[accuracy.task_metrics]\noutput0 = "detection"\n')))
    assert recipe.accuracy.task_metrics == {"output0": "detection"}
    assert recipe.to_json()["accuracy"]["task_metrics"] == {"output0": "detection"}


def test_recipe_by_path_and_minimal(tmp_path: Path) -> None:
    recipe = load_recipe(str(write(tmp_path, MINIMAL + "[decision]\nmin_improvement = 0.05\n")))
    assert [s.name for s in recipe.stages] == ["graph-fusion", "quantize"]
    assert recipe.min_improvement == 0.05
    assert recipe.name == "r"  # from the file name when not given


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (MINIMAL + '[stages.quantize]\nmode = "int4"\n', "stages.quantize.mode: expected one of 'auto'"),
        (MINIMAL + "[stages.quantize]\nmodee = 1\n", "stages.quantize.modee: unknown key"),
        (MINIMAL + '[stages.quantize]\nenabled = "yes"\n', "stages.quantize.enabled: expected a boolean"),
        (
            MINIMAL + "[stages.quantize]\ncalib_samples = 2.5\n",
            "stages.quantize.calib_samples: expected an integer",
        ),
        (
            MINIMAL + "[stages.quantize]\ncalib_samples = -3\n",
            "stages.quantize.calib_samples: must not be negative",
        ),
        (
            MINIMAL + '[stages.quantize]\nrun_when = "sometimes"\n',
            "stages.quantize.run_when: expected one of",
        ),
        (
            MINIMAL + "[stages.memory-layout]\nthreads = 2\n",
            "stages.memory-layout: options for a stage that is not",
        ),
        ('order = ["graph-fusion", "warp-drive"]\n', "order[1]: unknown stage 'warp-drive'"),
        (
            'order = ["operator-fusion"]\n[stages.operator-fusion]\nlevels = ["extended", "turbo"]\n',
            "stages.operator-fusion.levels[1]: expected one of 'basic'",
        ),
        ('order = ["quantize", "quantize"]\n', "order[1]: stage 'quantize' listed twice"),
        ('order = "quantize"\n', "order: expected a list"),
        (MINIMAL + "colour = 'red'\n", "colour: unknown key"),
        (MINIMAL + "[accuracy]\nmin_cosine = 'high'\n", "accuracy.min_cosine: expected a number"),
        (MINIMAL + "[accuracy]\nmin_cosine = 1.5\n", "accuracy.min_cosine: must be at most 1.0"),
        (MINIMAL + "[accuracy]\nmax_abs = -1\n", "accuracy.max_abs: must not be negative"),
        (MINIMAL + "[accuracy]\nmin_ctc = 2\n", "accuracy.min_ctc: must be at most 1.0"),
        (MINIMAL + "[accuracy]\nsamples = 0\n", "accuracy.samples: must be at least 1"),
        (MINIMAL + "[accuracy]\ntask_metrics = 3\n", "accuracy.task_metrics: expected a table"),
        (
            MINIMAL + '[accuracy.task_metrics]\ny = "bleu"\n',
            "accuracy.task_metrics.y: expected one of 'classifier'",
        ),
        (MINIMAL + "[bench]\nmax_runs = true\n", "bench.max_runs: expected an integer"),
        (MINIMAL + "[bench]\nwarmups = 3\n", "bench.warmups: unknown key"),
        (MINIMAL + "[decision]\nmin_improvement = 1.5\n", "decision.min_improvement"),
        (MINIMAL + "[stages]\nquantize = 3\n", "stages.quantize: expected a table"),
        ("order = [\n", "not valid TOML"),
    ],
)
def test_bad_recipe_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith("recipe r.toml: "), message
    assert needle in message, message


def test_unknown_recipe_name_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as info:
        load_recipe("nonexistent-recipe")
    assert "unknown recipe 'nonexistent-recipe'" in info.value.one_line()
    assert "cnn" in info.value.one_line()
    with pytest.raises(UsageError, match="does not exist"):
        load_recipe("missing/recipe.toml")


def test_known_stages_can_be_extended_for_custom_registries() -> None:
    recipe = parse_recipe({"order": ["fake-stage"]}, source="x.toml", known_stages=["fake-stage"])
    assert recipe.stages[0].name == "fake-stage"
    with pytest.raises(UsageError, match="unknown stage"):
        parse_recipe({"order": ["fake-stage"]}, source="x.toml")


def _attention_model(path: Path) -> Path:
    """int64 token ids -> Gather embedding -> Q·Kᵀ MatMul -> Softmax -> MatMul V."""
    emb = helper.make_tensor("E", TensorProto.FLOAT, [10, 4], [0.1] * 40)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])],
        [emb],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_model_kind_detection(tmp_path: Path) -> None:
    assert detect_model_kind(onnx.load(str(_attention_model(tmp_path / "a.onnx")))) == "transformer"
    assert detect_model_kind(onnx.load(str(make_matmul_model(tmp_path / "m.onnx")))) == "default"
    for name, kind in (
        ("resnet_tiny.onnx", "cnn"),
        ("bert_tiny.onnx", "transformer"),
        ("mlp_small.onnx", "default"),
    ):
        path = SAMPLES / name
        if path.exists():
            assert detect_model_kind(onnx.load(str(path), load_external_data=False)) == kind, name
    assert recipe_for_kind("transformer") == "transformer"
    assert recipe_for_kind("cnn") == "cnn"
    assert recipe_for_kind("default") == "default"


def test_a_recipe_without_an_order_runs_every_stage_in_the_registrys_order() -> None:
    from optimize.recipes import parse_recipe
    from optimize.runtimes.registry import stage_infos

    recipe = parse_recipe({"name": "x", "stages": {"quantize": {"enabled": False}}}, "x.toml")
    assert [s.name for s in recipe.stages] == list(stage_infos())
    assert not next(s for s in recipe.stages if s.name == "quantize").enabled
    # The shipped recipes write no order of their own: one list, the registry's.
    for path in sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.toml")):
        assert "\norder = " not in path.read_text(encoding="utf-8"), path.name
