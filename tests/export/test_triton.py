"""`lto export --triton`: config.pbtxt parses with Triton's own ModelConfig schema and says what
the artifact says; the model copied is the artifact's, byte for byte; what Triton cannot express
is named; what it cannot run is refused; nothing lto did not write is replaced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from optimize.errors import LtoError, UsageError
from optimize.export import ExportRequest, export_triton
from optimize.export.batching import BatchPoint, BatchProfile
from optimize.files import sha256_file
from tests.export.conftest import ArtifactMaker, engine_manifest


def parse_config(model_dir: Path) -> Any:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    return config


def manifest_of(artifact: Path) -> dict[str, Any]:
    return json.loads((artifact / "manifest.json").read_text())


def params(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def profile(latency_ms: dict[int, float]) -> BatchProfile:
    return BatchProfile(tuple(BatchPoint(b, (ms,) * 5) for b, ms in latency_ms.items()), "test")


def test_onnxruntime_artifact_becomes_a_triton_model_with_its_session_options(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    artifact = make_artifact(
        runtime_config={
            "graph_optimization_level": "extended",
            "intra_op_num_threads": 2,
            "execution_mode": "parallel",
            "enable_cpu_mem_arena": False,
            "config_entries": {"session.use_device_allocator_for_initializers": "1"},
        }
    )
    repo = tmp_path / "repo"
    result = export_triton(
        ExportRequest(artifact, repo, name="mlp", slo_ms=10, percentile=99, profile=profile({1: 1, 4: 2}))
    )
    model_dir = repo / "mlp"
    assert result.schema_checked
    config = parse_config(model_dir)
    assert config.name == "mlp" and config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "model.onnx"
    # The model's declared shapes, batch axis left to Triton: x[batch, 16] -> y[batch, 4].
    assert [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("x", "TYPE_FP32", [16])
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("y", [4])]
    assert params(config) == {
        "intra_op_thread_count": "2",
        "execution_mode": "1",
        "enable_mem_arena": "0",
        "session.use_device_allocator_for_initializers": "1",
    }
    assert config.optimization.graph.level == 1  # the backend's code for ORT_ENABLE_EXTENDED
    assert [
        (g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group
    ] == [(1, "KIND_CPU")]
    assert not result.warnings
    copied = model_dir / "1" / "model.onnx"
    assert sha256_file(copied) == manifest_of(artifact)["files"]["model.onnx"]["sha256"]
    service = yaml.safe_load((model_dir / "inferenceservice.yaml").read_text())
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    assert service["metadata"]["name"] == "mlp"
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "onnx"} and model["runtime"] == "kserve-tritonserver"
    assert model["storageUri"].startswith("s3://CHANGE-ME/")
    assert model["resources"]["requests"]["cpu"] == "2"  # 2 threads x 1 instance


def test_batching_follows_the_profile_and_the_slo(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact()
    # 2 x L(8) = 5.6 ms fits 6 ms, 2 x L(16) does not; 8 rows in 2.8 ms is the best rate; the SLO
    # leaves 0.4 ms after 2 x L(8).
    measured = profile({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.8, 16: 6.0})
    export_triton(
        ExportRequest(artifact, tmp_path / "repo", name="m", slo_ms=6, percentile=99, profile=measured)
    )
    config = parse_config(tmp_path / "repo" / "m")
    assert config.max_batch_size == 8
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 400


def test_the_artifacts_own_target_is_the_default_slo(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact(extra={"target": {"ms": 3.3, "percentile": "p50"}})
    result = export_triton(
        ExportRequest(artifact, tmp_path / "repo", name="m", profile=profile({1: 1.0, 2: 1.6, 4: 3.0}))
    )
    assert result.batching is not None and result.batching.max_batch_size == 2  # 2 x 1.6 <= 3.3 < 2 x 3.0
    assert any("the artifact's target" in note for note in result.notes)


def test_without_a_profile_there_is_no_dynamic_batching_and_lto_says_how_to_measure(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    artifact = make_artifact(batch=4)
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="m", slo_ms=5))
    config = parse_config(tmp_path / "repo" / "m")
    assert config.max_batch_size == 4  # the batch lto optimize measured
    assert not config.HasField("dynamic_batching")
    assert any("--measure-batches" in w and "lto bench" in w for w in result.warnings)


def test_the_serving_configuration_searched_here_sets_triton_batching(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    artifact = make_artifact(batch=4)
    serving = {"max_batch": 8, "max_wait_ms": 0.5}  # what lto load --search-config kept
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="m", serving=serving))
    config = parse_config(tmp_path / "repo" / "m")
    assert config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert any("serving.json" in note for note in result.notes)
    assert not any("--measure-batches" in w for w in result.warnings)


def test_a_fixed_batch_dim_gives_max_batch_size_0_and_full_dims(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    import onnx
    from onnx import TensorProto, helper

    path = tmp_path / "fixed.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    artifact = make_artifact(source=path)
    result = export_triton(
        ExportRequest(artifact, tmp_path / "repo", name="m", slo_ms=5, profile=profile({1: 1}))
    )
    config = parse_config(tmp_path / "repo" / "m")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [1, 16]
    assert any("fixed first dim" in note for note in result.notes)


def test_settings_triton_cannot_express_are_named(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact(
        runtime_config={
            "graph_optimization_level": "layout",
            "allow_spinning": False,
            "disabled_optimizers": ["SkipLayerNormFusion"],
            "config_entries": {"session.intra_op.allow_spinning": "0"},
        }
    )
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="m"))
    text = "\n".join(result.warnings)
    for lost in (
        "graph_optimization_level='layout'",
        "allow_spinning=False",
        "SkipLayerNormFusion",
        "config_entries",
    ):
        assert lost in text, (lost, text)
    config = parse_config(tmp_path / "repo" / "m")
    assert not config.optimization.HasField("graph")  # no graph block: the backend runs ORT_ENABLE_ALL


def test_openvino_artifact_from_a_hand_made_ir(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact(
        backend="openvino",
        precision="bf16",
        runtime_config={
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": 2,
            "NUM_STREAMS": 1,
            "INFERENCE_PRECISION_HINT": "bf16",
        },
    )
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="ov"))
    model_dir = tmp_path / "repo" / "ov"
    config = parse_config(model_dir)
    assert config.backend == "openvino" and not config.platform
    assert config.default_model_filename == "model.xml"
    assert params(config) == {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": "2",
        "NUM_STREAMS": "1",
        "HINT_BF16": "YES",
    }
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [16])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("y", [16])]  # named through the edge
    files = manifest_of(artifact)["files"]
    assert sha256_file(model_dir / "1" / "model.xml") == files["model.xml"]["sha256"]
    assert sha256_file(model_dir / "1" / "model.bin") == files["model.bin"]["sha256"]
    assert not [w for w in result.warnings if "no Triton equivalent" in w]
    service = yaml.safe_load((model_dir / "inferenceservice.yaml").read_text())
    assert service["spec"]["predictor"]["model"]["modelFormat"]["name"] == "triton"


def test_openvino_f32_is_exported_with_a_warning_that_triton_cannot_pin_it(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    artifact = make_artifact(backend="openvino", runtime_config={"INFERENCE_PRECISION_HINT": "f32"})
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="ov"))
    assert any("INFERENCE_PRECISION_HINT='f32'" in w and "bf16" in w for w in result.warnings)
    assert "HINT_BF16" not in params(parse_config(tmp_path / "repo" / "ov"))


def test_openvino_without_fused_subgraphs_warns_that_triton_runs_them(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    config = {"INFERENCE_PRECISION_HINT": "bf16", "SNIPPETS_MODE": "DISABLE"}
    artifact = make_artifact(backend="openvino", runtime_config=config)
    result = export_triton(ExportRequest(artifact, tmp_path / "repo", name="ov"))
    (warning,) = [w for w in result.warnings if w.startswith("SNIPPETS_MODE")]
    assert "wrong outputs" in warning and "check its outputs before serving" in warning
    assert "SNIPPETS_MODE" not in params(parse_config(tmp_path / "repo" / "ov"))


def test_openvino_artifact_of_an_onnx_file_keeps_it_as_model_onnx(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    from tests.conftest import make_matmul_model

    source = make_matmul_model(tmp_path / "m.onnx", features=16, out=4)
    artifact = make_artifact(
        backend="openvino", source=source, runtime_config={"INFERENCE_PRECISION_HINT": "bf16"}
    )
    export_triton(ExportRequest(artifact, tmp_path / "repo", name="ov"))
    config = parse_config(tmp_path / "repo" / "ov")
    assert config.backend == "openvino" and config.default_model_filename == "model.onnx"
    assert sha256_file(tmp_path / "repo" / "ov" / "1" / "model.onnx") == sha256_file(source)


def test_openvino_artifact_from_a_real_ir(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino", reason="OpenVINO writes the real IR (the openvino extra)")
    from tests.conftest import make_matmul_model

    onnx_path = make_matmul_model(tmp_path / "m.onnx", features=16, out=4)
    xml = tmp_path / "ir" / "model.xml"
    xml.parent.mkdir()
    ov.save_model(ov.Core().read_model(str(onnx_path)), str(xml))
    artifact = make_artifact(
        backend="openvino", source=xml, runtime_config={"INFERENCE_PRECISION_HINT": "bf16"}
    )
    export_triton(ExportRequest(artifact, tmp_path / "repo", name="ov"))
    config = parse_config(tmp_path / "repo" / "ov")
    compiled = ov.Core().read_model(str(tmp_path / "repo" / "ov" / "1" / "model.xml"))
    assert [t.name for t in config.input] == [compiled.inputs[0].any_name]
    assert [t.name for t in config.output] == [compiled.outputs[0].any_name]
    assert list(config.output[0].dims) == [4] and config.max_batch_size >= 1


def test_tensorrt_engine_is_a_tensorrt_plan_bounded_by_its_profile(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    artifact = make_artifact(backend="tensorrt", runtime_config={"cuda_graph": True})
    result = export_triton(
        ExportRequest(
            artifact, tmp_path / "repo", name="trt", slo_ms=100, profile=profile({1: 1, 16: 2, 64: 3})
        )
    )
    model_dir = tmp_path / "repo" / "trt"
    config = parse_config(model_dir)
    assert config.platform == "tensorrt_plan" and config.default_model_filename == "model.plan"
    assert config.max_batch_size == 16  # the engine's profile accepts at most 16 rows
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"
    assert config.optimization.cuda.graphs
    assert model_config_pb2.DataType.Name(config.output[0].data_type) == "TYPE_FP16"
    assert (
        sha256_file(model_dir / "1" / "model.plan")
        == manifest_of(artifact)["files"]["model.engine"]["sha256"]
    )
    assert not (model_dir / "1" / "model_fp16.engine.json").exists()
    assert any("TensorRT 10.9.0" in w for w in result.warnings)
    resources = yaml.safe_load((model_dir / "inferenceservice.yaml").read_text())["spec"]["predictor"][
        "model"
    ]
    assert resources["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize(
    ("backend", "engine", "needle"),
    [
        ("tvm", None, "Triton has no TVM backend"),
        ("tensorrt", engine_manifest(runtime="tensorrt-rtx"), "TensorRT-RTX"),
    ],
)
def test_what_triton_cannot_run_is_refused_and_nothing_is_written(
    make_artifact: ArtifactMaker, tmp_path: Path, backend: str, engine: dict[str, Any] | None, needle: str
) -> None:
    artifact = make_artifact(backend=backend, engine=engine)
    with pytest.raises(UsageError, match=needle):
        export_triton(ExportRequest(artifact, tmp_path / "repo", name="m"))
    assert not (tmp_path / "repo").exists()


def test_a_folder_lto_did_not_write_is_never_replaced(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact()
    theirs = tmp_path / "repo" / "m"
    (theirs / "1").mkdir(parents=True)
    (theirs / "config.pbtxt").write_text('name: "m"\n')
    with pytest.raises(UsageError, match="lto did not export"):
        export_triton(ExportRequest(artifact, tmp_path / "repo", name="m"))
    assert (theirs / "config.pbtxt").read_text() == 'name: "m"\n'
    assert sorted(p.name for p in theirs.iterdir()) == ["1", "config.pbtxt"]


def test_an_earlier_export_is_replaced_and_other_models_are_left_alone(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    other = repo / "other" / "config.pbtxt"
    other.parent.mkdir(parents=True)
    other.write_text('name: "other"\n')
    first, second = (
        make_artifact(runtime_config={"intra_op_num_threads": 1}),
        make_artifact(runtime_config={"intra_op_num_threads": 2}),
    )
    export_triton(ExportRequest(first, repo, name="m"))
    export_triton(ExportRequest(second, repo, name="m"))
    assert params(parse_config(repo / "m"))["intra_op_thread_count"] == "2"
    assert other.read_text() == 'name: "other"\n'
    assert sorted(p.name for p in repo.iterdir()) == ["m", "other"]  # no staging folder left behind


def test_a_changed_artifact_is_refused(make_artifact: ArtifactMaker, tmp_path: Path) -> None:
    artifact = make_artifact()
    with open(artifact / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(LtoError, match="sha256 mismatch"):
        export_triton(ExportRequest(artifact, tmp_path / "repo", name="m"))
    assert not (tmp_path / "repo").exists()


def test_the_repository_may_not_be_inside_the_artifact(make_artifact: ArtifactMaker) -> None:
    artifact = make_artifact()
    with pytest.raises(UsageError, match="overlaps the artifact"):
        export_triton(ExportRequest(artifact, artifact / "triton", name="m"))
    assert not (artifact / "triton").exists()


def test_measured_profile_from_lto_bench_drives_the_config(
    make_artifact: ArtifactMaker, tmp_path: Path
) -> None:
    """The real path end to end: lto's bench engine measures the artifact at three batch sizes, and the
    config follows the rule on those very samples."""
    from optimize.export.batching import measure_profile

    artifact = make_artifact()
    measured = measure_profile(artifact, [1, 2, 4], max_time_s=0.2)
    slo = 2 * max(p.latency_ms(99) for p in measured.points) * 1.01  # every size fits
    result = export_triton(
        ExportRequest(artifact, tmp_path / "repo", name="m", slo_ms=slo, percentile=99, profile=measured)
    )
    config = parse_config(tmp_path / "repo" / "m")
    rates = {p.batch: p.batch / p.latency_ms(99) for p in measured.points}
    best = max(rates, key=lambda b: (rates[b], -b))
    assert config.max_batch_size == best
    assert config.HasField("dynamic_batching") == (best > 1)
    if best > 1:
        assert list(config.dynamic_batching.preferred_batch_size) == [best]
    latency = result.profile["latency_ms"] if result.profile else {}
    assert set(latency) == {"1", "2", "4"} and all(np.isfinite(v) and v > 0 for v in latency.values())
