"""`--runtime`, and an OpenVINO winner as an artifact that bench, serve, load and gate can run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from optimize.artifact import load_artifact
from optimize.errors import ModelError, UsageError
from optimize.pipeline import OptimizeRequest, optimize
from optimize.pipeline.request import apply_overrides, stage_disabled_reason
from optimize.recipes import load_recipe
from optimize.runtimes.backends import open_backend, open_model
from tests.cli_helpers import assert_clean_error, run_cli
from tests.pipeline.test_pipeline import FakeBench, write_recipe
from tests.runtimes.openvino.helpers import SAMPLES, make_mlp

OPENVINO_STAGES = {"openvino-convert", "openvino-quantize"}
ORT_STAGES = {"graph-fusion", "operator-fusion", "memory-layout", "quantize"}


def _enabled(runtime: str, recipe_name: str = "default", **kw: object) -> tuple[set[str], dict[str, str]]:
    recipe = load_recipe(recipe_name)
    request = OptimizeRequest(model_path=SAMPLES / "mlp_small.onnx", runtime=runtime, **kw)  # type: ignore[arg-type]
    request.validate()
    apply_overrides(recipe, request)
    on = {s.name for s in recipe.stages if s.enabled}
    reasons = {s.name: stage_disabled_reason(s, request, recipe) for s in recipe.stages if not s.enabled}
    return on, reasons


def test_runtime_flag_turns_stages_on_and_off_by_their_runtime() -> None:
    on, _ = _enabled("auto")
    assert on >= ORT_STAGES | OPENVINO_STAGES
    on, reasons = _enabled("onnxruntime")
    assert on >= ORT_STAGES and not on & OPENVINO_STAGES
    assert reasons["openvino-convert"] == "--runtime onnxruntime (this stage makes openvino candidates)"
    on, reasons = _enabled("openvino")
    assert on >= OPENVINO_STAGES and not on & ORT_STAGES
    assert reasons["quantize"] == "--runtime openvino (this stage makes onnxruntime candidates)"
    on, reasons = _enabled("auto", quantize="never")
    assert not on & {"quantize", "openvino-quantize"} and reasons["openvino-quantize"] == "--quantize never"


def test_calib_data_reaches_both_quantize_stages(tmp_path: Path) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, features=np.zeros((4, 256), np.float32))
    recipe = load_recipe("default")
    apply_overrides(recipe, OptimizeRequest(model_path=SAMPLES / "mlp_small.onnx", calib_data=calib))
    for name in ("quantize", "openvino-quantize"):
        assert recipe.stage(name).options["calib_data"] == str(calib.absolute())  # type: ignore[union-attr]


def test_runtime_conflicts_and_bad_values_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--enable openvino-quantize makes openvino candidates"):
        _enabled("onnxruntime", enable=["openvino-quantize"])
    with pytest.raises(UsageError, match="--runtime 'tensorflow'"):
        OptimizeRequest(model_path=SAMPLES / "mlp_small.onnx", runtime="tensorflow").validate()
    proc = run_cli("optimize", SAMPLES / "mlp_small.onnx", "--runtime", "tensorflow")
    assert_clean_error(proc, 2, "--runtime 'tensorflow'", "auto, onnxruntime, openvino")


pytest.importorskip("openvino", reason="the openvino extra is not installed")
from optimize.runtimes.openvino.backend import has_bf16  # noqa: E402


def _optimize_with_winner(tmp_path: Path, winner: str) -> Path:
    """A real run of the openvino-convert stage whose `winner` candidate the (fake) bench makes fastest."""
    model = make_mlp(tmp_path / "mlp.onnx", width=128)
    recipe = write_recipe(tmp_path, ["openvino-convert"])
    speeds = {"baseline": 1.0, "openvino-convert:f32": 0.9, "openvino-convert:bf16": 0.95, winner: 0.5}
    bench = FakeBench(speeds)
    out = tmp_path / "artifact"
    # Rows of the user's own: on generated ones a bf16 candidate is unverified and never ships.
    rows = tmp_path / "eval.npz"
    np.savez(rows, x=np.random.default_rng(1).standard_normal((16, 1, 128)).astype(np.float32))
    request = OptimizeRequest(model_path=model, recipe=str(recipe), out_dir=out, eval_data=rows)
    result = optimize(
        request, measure_fn=bench.measure, compare_fn=bench.compare, open_worker_fn=bench.open_worker
    )
    assert result.best.label == winner
    return out


@pytest.mark.slow
def test_openvino_artifact_round_trip(tmp_path: Path) -> None:
    out = _optimize_with_winner(tmp_path, "openvino-convert:f32")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "openvino" and manifest["model_file"] == "model.xml"
    assert manifest["side_files"] == ["model.bin"] and manifest["precision"] == "fp32"
    assert manifest["runtime_config"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert manifest["runtime_config"]["PERFORMANCE_HINT"] == "LATENCY"
    record = next(r for r in manifest["stages"] if r["label"] == "openvino-convert:f32")
    assert record["backend"] == "openvino" and record["details"]["precision_hint"] == "f32"
    loaded = load_artifact(out)
    x = {"x": np.random.default_rng(5).standard_normal((1, 128)).astype(np.float32)}
    with open_model(loaded) as ov:
        assert ov.inputs[0].shape == ("batch", 128)

        with open_backend("onnxruntime", tmp_path / "mlp.onnx") as ort:
            ov_out = ov.run(x)["r3"]
            np.testing.assert_allclose(ov_out, ort.run(x)["r3"], rtol=1e-5, atol=1e-5)
    # Served as 2 instances, they split the cores and do not pin to the same ones.
    from optimize.serve.loading import open_instances, resolve_served
    from optimize.system.env import physical_cores

    served = resolve_served(None, out)
    backends = open_instances(served, 2) if physical_cores() >= 2 else []
    for backend in backends:
        assert backend.effective["INFERENCE_NUM_THREADS"] == physical_cores() // 2
        assert backend.effective["ENABLE_CPU_PINNING"] is False
        backend.close()
    (one,) = open_instances(served, 1, threads=1)
    assert one.effective["INFERENCE_NUM_THREADS"] == 1
    np.testing.assert_allclose(one.run(x)["r3"], ov_out, rtol=1e-6, atol=1e-6)
    one.close()
    proc = run_cli("bench", "--artifact", out, "--time", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["settings"]["runtime"]["backend"] == "openvino"
    assert report["settings"]["runtime"]["compiled_properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    proc = run_cli(
        "gate", "--rerun", "--baseline", tmp_path / "mlp.onnx", "--candidate", out, "--time", "0.5s"
    )
    assert proc.returncode in (0, 10, 11, 12), proc.stderr  # a verdict, whichever: it ran both
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not has_bf16(), reason="this CPU has no native bf16: no bf16 candidate to ship")
def test_bf16_artifact_records_its_isa_and_is_refused_without_it(tmp_path: Path) -> None:
    out = _optimize_with_winner(tmp_path, "openvino-convert:bf16")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16"
    assert {"any_of": ["avx512_bf16", "amx_bf16"]}.items() <= manifest["requires"]["cpu_isa"][0].items()
    load_artifact(out)  # this CPU has it
    with pytest.raises(ModelError, match="lacks one of avx512_bf16, amx_bf16"):
        load_artifact(out, cpu_flags={"avx2", "avx512f", "avx512_vnni"})


def test_requirements_are_the_openvino_candidates_own(tmp_path: Path) -> None:
    """An OpenVINO winner after a kept ORT layout step needs nothing the ORT file needed."""
    from optimize.artifact import cpu_requirements
    from optimize.runtimes.openvino.ir import candidate, runtime_config

    ort_step = {"stage": "memory-layout:nchwc16-saved", "isa_requires": ["avx512f"],
                "isa_exact": {"nchwc_block_width": 16}}  # fmt: skip
    ir = tmp_path / "model.xml"
    f32 = candidate("openvino-convert:f32", ir, precision="fp32", precision_hint="f32",
                    config=runtime_config("f32", 2), details={})  # fmt: skip
    bf16 = candidate("openvino-convert:bf16", ir, precision="bf16", precision_hint="bf16",
                     config=runtime_config("bf16", 2), details={})  # fmt: skip
    flags = {"avx512f", "avx512_bf16"}
    assert cpu_requirements(ir, [ort_step], flags) == {
        "cpu_isa": [{"any_of": ["avx512f"], "why": "memory-layout:nchwc16-saved was built for it"}],
        "nchwc_block": 16,
    }
    assert cpu_requirements(ir, [ort_step, {"stage": f32.label, **f32.details}], flags) == {"cpu_isa": []}
    req = cpu_requirements(ir, [ort_step, {"stage": bf16.label, **bf16.details}], flags)
    assert [e["any_of"] for e in req["cpu_isa"]] == [["avx512_bf16", "amx_bf16"]] and "nchwc_block" not in req


def test_bench_runs_an_onnx_file_on_openvino() -> None:
    proc = run_cli("bench", SAMPLES / "mlp_small.onnx", "--runtime", "openvino", "--time", "0.3", "--json")
    assert proc.returncode == 0, proc.stderr
    runtime = json.loads(proc.stdout)["settings"]["runtime"]
    assert runtime["backend"] == "openvino" and runtime["config"]["INFERENCE_PRECISION_HINT"] == "f32"
