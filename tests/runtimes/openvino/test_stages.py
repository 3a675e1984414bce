"""The OpenVINO stages: what they propose, where they start from, and the int8 back-off."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from optimize.accuracy import AccuracyResult
from optimize.runtimes.backends import open_backend, open_model
from optimize.runtimes.stages import load_stage
from optimize.stage import LIFT_REFERENCE_KEY, Candidate, StageSkipped
from tests.runtimes.openvino.helpers import SAMPLES, context, make_mlp

pytest.importorskip("openvino", reason="the openvino extra is not installed")
pytest.importorskip("nncf", reason="the openvino extra is not installed")

from optimize.runtimes.openvino.backend import has_bf16


def _x(width: int = 64, rows: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)}


def test_convert_proposes_f32_and_bf16_where_the_cpu_has_it(tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    ctx = context(tmp_path, model, _x())
    cands = load_stage("openvino-convert").run(Candidate("baseline", model), ctx)
    hints = [c.runtime_config["INFERENCE_PRECISION_HINT"] for c in cands]
    assert hints == (["bf16", "f32"] if has_bf16() else ["f32"])  # the likelier winner first
    f32 = cands[-1]
    assert f32.backend == "openvino" and f32.precision == "fp32" and not f32.standard_ops
    assert f32.model_path.name == "model.xml" and f32.extra_files == [f32.model_path.with_suffix(".bin")]
    assert f32.details["precision_hint"] == "f32" and f32.details["cpu_isa_any"] == []
    if has_bf16():
        assert cands[0].precision == "bf16"
        assert cands[0].details["cpu_isa_any"][0]["any_of"] == ["avx512_bf16", "amx_bf16"]
    # The IR runs and gives the ONNX model's outputs, under the ONNX names.
    with open_backend("onnxruntime", model) as ort, open_model(f32) as ov:
        ref, got = ort.run(_x(rows=3)), ov.run(_x(rows=3))
    assert list(got) == ["r3"]
    np.testing.assert_allclose(got["r3"], ref["r3"], rtol=1e-5, atol=1e-5)


def test_convert_without_bf16_option_or_cpu_proposes_f32_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    stage = load_stage("openvino-convert")
    cands = stage.run(Candidate("baseline", model), context(tmp_path, model, _x(), bf16=False))
    assert [c.precision for c in cands] == ["fp32"]
    from optimize.system import env

    monkeypatch.setattr(env, "cpu_isa_flags", lambda: {"avx2", "avx512f"})
    cands = stage.run(Candidate("baseline", model), context(tmp_path, model, _x()))
    assert [c.precision for c in cands] == ["fp32"]


def test_stages_never_start_from_an_ort_fused_graph(tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    ctx = context(tmp_path, model, _x())
    fused = Candidate("graph-fusion", tmp_path / "fused.onnx", standard_ops=False)
    # best_standard is what the pipeline hands over; a fused best candidate is ignored.
    cands = load_stage("openvino-convert").run(fused, ctx)
    assert cands[0].details["source"] == "the original model"
    ctx.best_standard = Candidate("memory-layout:threads2", model.with_name("copy.onnx"))
    model.with_name("copy.onnx").write_bytes(model.read_bytes())
    cands = load_stage("openvino-convert").run(fused, ctx)
    assert "memory-layout:threads2" in cands[0].details["source"]


def test_int8_passes_the_gate_first_time(tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    calib = [_x(seed=s) for s in range(8)]
    ctx = context(tmp_path, model, _x(), calib_data=calib)
    cands = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    int8 = cands[0]
    assert int8.precision == "int8" and int8.details["accuracy_gate"] == "passed"
    assert int8.details["quantized_nodes"] == 4 and int8.details["excluded_nodes"] == []
    assert int8.details["calibration"] == {"source": "list", "samples": 8}
    assert int8.details["model_type"] == "default" and int8.details["preset"] == "performance"
    # Nothing lifted: no unlifted twin to time.
    assert [c.precision for c in cands] == (["int8", "int8+bf16"] if has_bf16() else ["int8"])
    with open_backend("onnxruntime", model) as ort, open_model(int8) as ov:
        ref, got = ort.run(_x(seed=99)), ov.run(_x(seed=99))
    cos = float(
        np.dot(ref["r3"].ravel(), got["r3"].ravel()) / np.linalg.norm(ref["r3"]) / np.linalg.norm(got["r3"])
    )
    assert cos > 0.98  # int8 of a small random MLP: close, not equal
    assert not np.array_equal(ref["r3"], got["r3"])


def test_int8_backs_off_on_the_most_sensitive_nodes_until_the_gate_passes(tmp_path: Path) -> None:
    """A gate that passes only once the node NNCF hurts most is kept in float: the ranking must name it."""
    model = make_mlp(tmp_path / "mlp.onnx", layers=6)
    seen: list[list[str]] = []
    labels: list[str] = []
    ranked_first: list[str] = []

    def gate(cand: Candidate) -> AccuracyResult:
        excluded = list(cand.details["excluded_nodes"])
        seen.append(excluded)
        labels.append(cand.label)
        ok = bool(excluded) and excluded[0] == ranked_first[0]
        return AccuracyResult(ok, "" if ok else "cosine 0.9 < 0.99 (test gate)", {})

    from optimize.runtimes.openvino import sensitivity

    real_rank = sensitivity.rank_sensitive_nodes

    def spy(*args: object) -> list[tuple[str, float]]:
        ranking = real_rank(*args)  # type: ignore[arg-type]
        ranked_first.append(ranking[0][0])
        return ranking

    import optimize.runtimes.openvino.quantize as quantize_module

    ctx = context(tmp_path, model, _x(), check=gate, bf16=False)
    original = quantize_module.rank_sensitive_nodes
    quantize_module.rank_sensitive_nodes = spy  # type: ignore[assignment]
    try:
        cands = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    finally:
        quantize_module.rank_sensitive_nodes = original  # type: ignore[assignment]
    int8 = cands[0]
    # The first try, the same IR without fused subgraphs, then one lift that passed.
    assert labels == ["openvino-quantize:int8", "openvino-quantize:int8-nosnippets", "openvino-quantize:int8"]
    assert seen[:2] == [[], []]
    assert int8.details["accuracy_gate"] == "passed" and int8.precision == "int8+fp32"
    assert int8.details["excluded_nodes"] == [ranked_first[0]]
    lifted = int8.details["lifted"][0]
    assert lifted["node"] == ranked_first[0] and lifted["precision"] == "fp32"
    assert lifted["added_rel_error"] > 0
    assert int8.details["quantized_nodes"] == 5  # one of the six MatMuls stays in float
    steps = [(a["step"], a["accuracy_ok"]) for a in int8.details["attempts"]]
    assert steps == [("defaults", False), ("fused subgraphs off", False), ("lift top 1", True)]
    ranking = int8.details["sensitivity"]
    assert len(ranking) == 6 and {r["node"] for r in ranking} == {f"layer{i}" for i in range(6)}
    errors = [r["added_rel_error"] for r in ranking]
    assert errors == sorted(errors, reverse=True) and errors[0] > 0
    logs = ctx.logs  # type: ignore[attr-defined]
    assert any("int8 lift top 1 (1 node(s) out of int8, float parts at f32): pass" in line for line in logs)
    # Then the same int8 with nothing lifted, for the pipeline to time though it failed: the price
    # of the lift. Its IR is the first try's; its settings the mixed candidate's.
    assert [c.label for c in cands] == ["openvino-quantize:int8", "openvino-quantize:int8-unlifted"]
    plain = cands[1]
    assert plain.details[LIFT_REFERENCE_KEY] == "openvino-quantize:int8"
    assert plain.precision == "int8" and plain.details["excluded_nodes"] == []
    assert plain.details["quantized_nodes"] == 6 and plain.model_path != int8.model_path
    assert plain.extra_files == [plain.model_path.with_suffix(".bin")]
    assert plain.runtime_config == int8.runtime_config
    assert not {"lifted", "attempts", "sensitivity", "accuracy_gate"} & set(plain.details)


def _ranking_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sensitivity ranking the stage computes, recorded as it is returned."""
    import optimize.runtimes.openvino.quantize as quantize_module

    ranked: list[str] = []
    real_rank = quantize_module.rank_sensitive_nodes

    def spy(*args: object) -> list[tuple[str, float]]:
        ranking = real_rank(*args)  # type: ignore[arg-type]
        ranked[:] = [name for name, _ in ranking]
        return ranking

    monkeypatch.setattr(quantize_module, "rank_sensitive_nodes", spy)
    return ranked


def test_back_off_bisects_to_the_fewest_nodes_that_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lifts grow 1, 2, 4 of ten nodes; 4 passes, and the bisection finds that 3 do too."""
    model = make_mlp(tmp_path / "mlp.onnx", layers=10)
    ranked = _ranking_spy(monkeypatch)

    def gate(cand: Candidate) -> AccuracyResult:
        ok = bool(ranked) and set(ranked[:3]) <= set(cand.details["excluded_nodes"])
        return AccuracyResult(ok, "" if ok else "test gate", {})

    ctx = context(tmp_path, model, _x(), check=gate, bf16=False)
    int8 = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)[0]
    steps = [(a["step"], a["accuracy_ok"]) for a in int8.details["attempts"]]
    lifts = [("lift top 1", False), ("lift top 2", False), ("lift top 4", True), ("lift top 3", True)]
    assert steps[2:] == lifts
    assert int8.details["excluded_nodes"] == ranked[:3] and int8.details["accuracy_gate"] == "passed"
    assert [entry["node"] for entry in int8.details["lifted"]] == ranked[:3]


def test_bf16_variant_is_judged_at_bf16_and_lifts_more_where_bf16_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """f32 float parts pass with one node out of int8; at bf16 the gate wants two: the bf16 variant
    goes on from where the f32 back-off stopped, and its lifted nodes run at bf16."""
    import optimize.runtimes.openvino.quantize as quantize_module

    monkeypatch.setattr(quantize_module, "precision_hints", lambda options: ["bf16", "f32"])
    model = make_mlp(tmp_path / "mlp.onnx", layers=6)
    ranked = _ranking_spy(monkeypatch)
    judged: list[tuple[str, int]] = []

    def gate(cand: Candidate) -> AccuracyResult:
        hint = cand.details["precision_hint"]
        excluded = set(cand.details["excluded_nodes"])
        judged.append((hint, len(excluded)))
        ok = bool(ranked) and set(ranked[: 2 if hint == "bf16" else 1]) <= excluded
        return AccuracyResult(ok, "" if ok else f"test gate at {hint}", {})

    ctx = context(tmp_path, model, _x(), check=gate)
    f32, bf16, *unlifted = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    # Each mixed candidate is followed by its int8 with nothing lifted, at its own float precision.
    assert [(c.label, c.precision, c.details[LIFT_REFERENCE_KEY]) for c in unlifted] == [
        ("openvino-quantize:int8-unlifted", "int8", f32.label),
        ("openvino-quantize:int8-bf16-unlifted", "int8+bf16", bf16.label),
    ]
    assert unlifted[1].details["precision_hint"] == "bf16" and unlifted[1].details["excluded_nodes"] == []
    assert f32.precision == "int8+fp32" and f32.details["excluded_nodes"] == ranked[:1]
    assert bf16.precision == "int8+bf16" and bf16.details["precision_hint"] == "bf16"
    assert bf16.details["excluded_nodes"] == ranked[:2] and bf16.details["accuracy_gate"] == "passed"
    assert {entry["precision"] for entry in bf16.details["lifted"]} == {"bf16"}
    # f32: defaults, fused subgraphs off, lift 1 (pass); bf16: the same, with fused subgraphs off,
    # then on from one node: lift 2 (pass).
    assert judged == [("f32", 0), ("f32", 0), ("f32", 1), ("bf16", 1), ("bf16", 1), ("bf16", 2)]
    steps = [(a["step"], a["float_parts"], a["accuracy_ok"]) for a in bf16.details["attempts"]][-3:]
    assert steps == [
        ("float parts at bf16", "bf16", False),
        ("float parts at bf16", "bf16", False),
        ("lift top 2", "bf16", True),
    ]


def test_int8_that_never_passes_is_proposed_as_failed(tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    ctx = context(tmp_path, model, _x(), check=lambda c: AccuracyResult(False, "never", {}), bf16=False,
                  max_backoff_rounds=2)  # fmt: skip
    cands = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    assert cands[0].details["accuracy_gate"] == "failed"
    steps = [a["step"] for a in cands[0].details["attempts"]]
    assert steps == ["defaults", "fused subgraphs off", "lift top 1", "lift top 2"]
    assert any("warning: calibrating NNCF int8 on" in line for line in ctx.logs)  # type: ignore[attr-defined]


def test_transformer_is_quantized_as_one(tmp_path: Path) -> None:
    model = SAMPLES / "bert_tiny.onnx"
    feeds = {
        "input_ids": np.ones((1, 8), np.int64),
        "attention_mask": np.ones((1, 8), np.int64),
        "token_type_ids": np.zeros((1, 8), np.int64),
    }
    ctx = context(tmp_path, model, feeds, bf16=False, calib_samples=4)
    cands = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    assert cands[0].details["model_type"] == "transformer"
    assert cands[0].details["smooth_quant"] == "on" and cands[0].details["preset"] == "mixed"


@pytest.mark.slow
def test_transformer_ladder_tries_smooth_quant_and_attention_in_float_before_back_off(tmp_path: Path) -> None:
    model = SAMPLES / "bert_tiny.onnx"
    feeds = {
        "input_ids": np.ones((1, 8), np.int64),
        "attention_mask": np.ones((1, 8), np.int64),
        "token_type_ids": np.zeros((1, 8), np.int64),
    }
    seen: list[tuple[str, list[str]]] = []

    def gate(cand: Candidate) -> AccuracyResult:
        seen.append((cand.details["smooth_quant"], list(cand.details["excluded_nodes"])))
        ok = len(cand.details["excluded_nodes"]) == 4  # attention's four activation MatMuls in float
        return AccuracyResult(ok, "" if ok else "test gate", {})

    ctx = context(tmp_path, model, feeds, check=gate, bf16=False, calib_samples=4)
    int8 = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)[0]
    steps = [a["step"] for a in int8.details["attempts"]]
    assert steps == ["defaults", "smooth_quant off", "attention MatMuls in float"]
    assert [s for s, _ in seen] == ["on", "off", "on"]  # equal gate figures: the first stays the base
    assert sorted(int8.details["excluded_nodes"]) == sorted(seen[-1][1])
    assert all("MatMul" in name for name in seen[-1][1])


def test_quantize_skips_an_already_quantized_model(tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    model = make_mlp(tmp_path / "mlp.onnx")
    quantize_dynamic(str(model), str(tmp_path / "q.onnx"))
    ctx = context(tmp_path, tmp_path / "q.onnx", _x())
    assert load_stage("openvino-quantize").skip_reason(Candidate("b", tmp_path / "q.onnx"), ctx) == (
        "the model is already quantized"
    )


def test_stages_are_skipped_with_the_reason_without_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [m for m in sys.modules if m.startswith("optimize.runtimes.openvino.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ModuleNotFoundError
    for name in ("openvino-convert", "openvino-quantize"):
        with pytest.raises(StageSkipped, match="needs the Python package 'openvino', which is not installed"):
            load_stage(name)


def test_fused_subgraphs_go_off_when_that_makes_a_candidate_accurate(tmp_path: Path) -> None:
    """OpenVINO 2026.4's fused attention broke a MiniLM at bf16 and int8 on an AMX Xeon; the stages
    then propose the candidate with SNIPPETS_MODE=DISABLE, before any node goes back to float."""
    model = make_mlp(tmp_path / "mlp.onnx")
    labels: list[str] = []

    def gate(cand: Candidate) -> AccuracyResult:
        labels.append(cand.label)
        ok = cand.runtime_config.get("SNIPPETS_MODE") == "DISABLE"
        return AccuracyResult(ok, "" if ok else "broken by fused subgraphs (test gate)", {})

    ctx = context(tmp_path, model, _x(), check=gate)
    cands = load_stage("openvino-quantize").run(Candidate("baseline", model), ctx)
    assert cands[0].label == "openvino-quantize:int8-nosnippets"
    assert cands[0].details["accuracy_gate"] == "passed" and cands[0].details["excluded_nodes"] == []
    assert "broken by fused subgraphs" in cands[0].details["snippets"]
    assert all(c.runtime_config["SNIPPETS_MODE"] == "DISABLE" for c in cands)
    # No back-off; the bf16 variant, judged at bf16 too, goes straight to fused subgraphs off.
    assert labels[:2] == ["openvino-quantize:int8", "openvino-quantize:int8-nosnippets"]
    assert labels[2:] == (["openvino-quantize:int8-bf16-nosnippets"] if has_bf16() else [])
    with open_model(cands[0]) as ov:  # the setting reaches the compiled model
        assert ov.describe()["config"]["SNIPPETS_MODE"] == "DISABLE"
    converted = load_stage("openvino-convert").run(
        Candidate("baseline", model), context(tmp_path, model, _x(), check=gate)
    )
    assert [c.label.endswith("-nosnippets") for c in converted] == [True] * len(converted)


def test_bf16_that_fails_is_tried_with_attention_at_f32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one bf16 -> f32 lift per node OpenVINO's CPU plugin honours: attention's activation x
    activation MatMuls, marked in the IR itself so that any OpenVINO host keeps them at f32."""
    import openvino as ov

    import optimize.runtimes.openvino.convert as convert_module

    monkeypatch.setattr(convert_module, "precision_hints", lambda options: ["bf16", "f32"])
    model = SAMPLES / "bert_tiny.onnx"
    feeds = {
        "input_ids": np.ones((1, 8), np.int64),
        "attention_mask": np.ones((1, 8), np.int64),
        "token_type_ids": np.zeros((1, 8), np.int64),
    }

    def gate(cand: Candidate) -> AccuracyResult:
        ok = cand.details["precision_hint"] == "f32" or "lifted" in cand.details
        return AccuracyResult(ok, "" if ok else "bf16 attention (test gate)", {})

    ctx = context(tmp_path, model, feeds, check=gate, search_threads=False)
    cands = load_stage("openvino-convert").run(Candidate("baseline", model), ctx)
    labels = [c.label for c in cands]
    assert labels == [
        "openvino-convert:bf16",  # refused by the gate, with fused subgraphs off too: rejected
        "openvino-convert:bf16-attention-f32",
        "openvino-convert:f32",
    ]
    lifted = cands[1]
    assert lifted.precision == "bf16+fp32" and lifted.details["precision_hint"] == "bf16"
    names = {entry["node"] for entry in lifted.details["lifted"]}
    assert len(names) == 4 and all(entry["precision"] == "fp32" for entry in lifted.details["lifted"])
    assert lifted.model_path.with_suffix(".bin") in lifted.extra_files
    # The attribute survives OpenVINO's IR reader, on exactly those layers.
    marked = {
        op.get_friendly_name()
        for op in ov.Core().read_model(str(lifted.model_path)).get_ordered_ops()
        if any(key.startswith("DisablePrecisionConversion") for key in op.get_rt_info())
    }
    assert marked == names
    if has_bf16():  # and the CPU plugin runs them at f32 under the bf16 hint
        with open_model(lifted) as compiled:
            assert compiled.run(feeds)
        core = ov.Core()
        runtime = core.compile_model(str(lifted.model_path), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
        precisions = {
            str(op.get_rt_info()["runtimePrecision"].astype(str))
            for op in runtime.get_runtime_model().get_ordered_ops()
            if names & set(op.get_rt_info()["originalLayersNames"].astype(str).split(","))
        }
        assert precisions == {"f32"}
