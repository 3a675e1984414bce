"""`lto optimize --runtime-option RUNTIME.NAME=VALUE`: the options each runtime's spec declares,
checked against its stage's schema; the command itself names no runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optimize.cli import optimize_cmd
from optimize.errors import UsageError
from optimize.runtimes.registry import RUNTIMES, parse_runtime_options, runtime_options, stage_infos
from tests.cli_helpers import assert_clean_error, run_cli
from tests.conftest import make_matmul_model


def test_each_declared_option_is_an_option_of_a_stage_of_its_own_runtime() -> None:
    for spec in RUNTIMES:
        own_stages = {stage.name for stage in spec.stages}
        for option in spec.options:
            assert option.stage in own_stages, (spec.name, option.name)
            assert option.stage_key in stage_infos()[option.stage].options, (spec.name, option.name)
    assert {"tvm.trials", "tvm.target", "tvm.rpc_tracker", "tvm.rpc_key"} <= set(runtime_options())


def test_values_are_typed_by_the_stages_schema() -> None:
    parsed = parse_runtime_options(["tvm.trials=200", "tvm.target=x86-64-v3", "tvm.rpc_key=cpu"])
    assert parsed == {"tvm-tune": {"trials": 200, "target": "x86-64-v3", "rpc_key": "cpu"}}
    assert parse_runtime_options([]) == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tvm.trails=200", "names no runtime option"),
        ("tvm.trials", "is not RUNTIME.NAME=VALUE"),
        ("tvm.trials=many", "expected an integer, got 'many'"),
        ("tvm.trials=-1", "must not be negative"),
        ("openvino.trials=3", "names no runtime option"),
    ],
)
def test_a_wrong_runtime_option_is_one_error_that_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words) as caught:
        parse_runtime_options([text])
    if "names no" in words:
        assert "tvm.trials" in str(caught.value.hint)  # the known names are listed


def _request_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> Any:
    """The OptimizeRequest `lto optimize MODEL FLAGS` builds (nothing is run)."""
    seen: list[Any] = []

    def capture(request: Any, progress: Any = None) -> Any:
        seen.append(request)
        raise UsageError("captured")

    monkeypatch.setattr(optimize_cmd, "optimize", capture)
    model = make_matmul_model(tmp_path / "m.onnx")
    proc = run_cli("optimize", model, *flags, "-o", tmp_path / "out")
    assert_clean_error(proc, 2, "captured")
    return seen[0]


def test_the_older_tvm_flags_are_runtime_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = _request_of(monkeypatch, tmp_path, "--tvm", "--tvm-trials", "64", "--rpc-key", "cpu")
    new = _request_of(
        monkeypatch,
        tmp_path,
        "--enable",
        "tvm-tune",
        "-R",
        "tvm.trials=64",
        "--runtime-option",
        "tvm.rpc_key=cpu",
    )
    assert old.stage_options == new.stage_options == {"tvm-tune": {"trials": 64, "rpc_key": "cpu"}}
    assert "tvm-tune" in old.enable and "tvm-tune" in new.enable


def test_an_unknown_runtime_option_is_one_line(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "m.onnx")
    proc = run_cli("optimize", model, "-R", "tvm.trails=3", "-o", tmp_path / "out")
    assert_clean_error(proc, 2, "tvm.trails", "names no runtime option")


def test_help_names_the_runtime_options_and_hides_the_older_flags() -> None:
    proc = run_cli("optimize", "--help", env={"COLUMNS": "200"})
    assert "--runtime-option" in proc.stdout and "tvm.trials" in proc.stdout
    assert "--tvm-trials" not in proc.stdout and "--rpc-tracker" not in proc.stdout
