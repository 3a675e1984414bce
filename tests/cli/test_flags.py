"""Flags mean one thing everywhere: short letters, output paths, percentiles and durations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from optimize.cli import app
from tests.cli_helpers import assert_clean_error, run_cli
from tests.conftest import make_matmul_model


def _short_flags() -> Iterator[tuple[str, str, str]]:
    """(command, short flag, its long name) for every short flag of every command."""
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            names = [*param.opts, *param.secondary_opts]
            long_name = next((o for o in names if o.startswith("--")), str(param.name))
            for opt in names:
                if not opt.startswith("--") and opt.startswith("-"):
                    yield name, opt, long_name


def test_a_short_flag_means_one_thing_in_every_command() -> None:
    meanings: dict[str, set[str]] = {}
    for _, short, long_name in _short_flags():
        meanings.setdefault(short, set()).add(long_name)
    assert {short: longs for short, longs in meanings.items() if len(longs) > 1} == {}
    assert meanings["-o"] == {"--output"} and meanings["-b"] == {"--batch"}
    writers = {command for command, short, _ in _short_flags() if short == "-o"}
    assert writers == {"bench", "optimize", "gate", "serve", "load", "report"}


@pytest.mark.slow
def test_load_percentile_duration_and_output_spellings(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    out = tmp_path / "load.json"
    # lto's own loop: 20 queries are far too few for LoadGen to call a p99.9 run valid.
    proc = run_cli("load", model, "--requests", "20", "--percentile", "p99.9", "--duration", "1.5s",
                   "--slo-ms", "60000", "--scheduler", "lto", "-o", out)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["percentile"] == 99.9 and report["settings"]["duration_s"] == 1.5
    # The old spellings still work: a bare number, and --report (hidden, with a warning).
    old = tmp_path / "old.json"
    proc = run_cli("load", model, "--requests", "20", "--percentile", "99", "--report", old)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--report is deprecated, use --output" in proc.stderr
    assert json.loads(old.read_text())["settings"]["percentile"] == 99.0


def test_bad_units_and_removed_short_flags_are_usage_errors(tmp_path: Path) -> None:
    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    assert_clean_error(run_cli("load", model, "--percentile", "p100"), 2, "--percentile", "p99")
    assert_clean_error(run_cli("bench", model, "--time", "1h30x"), 2, "bad duration '1h30x' for --time")
    # `lto gate` spells --baseline and --candidate out: -b is --batch and -c --concurrency elsewhere.
    proc = run_cli("gate", "-b", model, "-c", model, "--rerun")
    assert proc.returncode == 2 and "No such option" in proc.stderr


def test_optimize_passes_fail_on_unverified_and_its_start_to_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from optimize.cli import optimize_cmd

    model = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    seen: list[object] = []

    def fake_optimize(request: object, **_: object) -> None:
        seen.append(request)
        raise typer.Exit(7)

    monkeypatch.setattr(optimize_cmd, "optimize", fake_optimize)
    before = time.monotonic()
    assert run_cli("optimize", model, "--fail-on-unverified", "-o", tmp_path / "a").returncode == 7
    assert run_cli("optimize", model, "-o", tmp_path / "b").returncode == 7
    asked, default = seen
    assert asked.fail_on_unverified is True and default.fail_on_unverified is False  # type: ignore[attr-defined]
    assert asked.started is not None and before - 10.0 <= asked.started <= time.monotonic()  # type: ignore[attr-defined]


def test_a_command_counts_from_its_process_start_when_the_process_started_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from optimize.cli import common

    # A fresh `lto` process: its interpreter start and imports count against a --time-budget.
    monkeypatch.setattr(common, "process_age_s", lambda: 1.5)
    common.mark_command_start()
    assert time.monotonic() - common.command_started() == pytest.approx(1.5, abs=0.2)
    # A program that calls main() long after it started (a test): the command starts at the call.
    monkeypatch.setattr(common, "process_age_s", lambda: 500.0)
    common.mark_command_start()
    assert time.monotonic() - common.command_started() < 0.2


def test_the_budget_countdown_is_read_at_each_refresh_and_says_when_it_runs_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from optimize.cli import optimize_cmd

    monkeypatch.setattr(optimize_cmd, "command_started", lambda: time.monotonic() - 50.0)
    progress = optimize_cmd._RichProgress(show_rows=False, budget_s=60.0)
    assert progress.budget_left().endswith("of the 1m00s budget left")
    progress.budget_s = 45.0
    # No status arrived in between (the final comparison sends none for seconds): still current.
    assert progress.budget_left().startswith("5s over the 45s budget")


def test_load_given_host_port_without_a_scheme_suggests_the_url() -> None:
    proc = run_cli("load", "localhost:18081", "--requests", "5")
    assert_clean_error(proc, 2, "localhost:18081 is not a file; it looks like a server address")
    assert "http://localhost:18081" in proc.stderr
    from optimize.cli.load_cmd import looks_like_host_port

    assert looks_like_host_port("10.0.0.5:8000") and looks_like_host_port("[::1]:8000")
    assert not looks_like_host_port("model.onnx") and not looks_like_host_port("http://h:1")


def test_a_run_that_fails_on_its_inputs_leaves_no_folders_behind(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "artifact"
    proc = run_cli("optimize", "sample_models/bert_tiny.onnx", "--shape", "nonexist=1x2", "-o", out)
    assert_clean_error(proc, 2, "--shape names 'nonexist'")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("where", "cause"),
    [("afile/out", "is a file, not a folder"), ("/proc/lto-out", "cannot write in /proc")],
)
def test_an_output_lto_cannot_write_is_refused_before_any_work(
    tmp_path: Path, where: str, cause: str
) -> None:
    (tmp_path / "afile").write_text("not a folder")
    target = where if where.startswith("/") else str(tmp_path / where)
    for command in (["optimize", "sample_models/mlp_small.onnx"], ["bench", "sample_models/mlp_small.onnx"]):
        path = target if command[0] == "optimize" else target + ".json"
        proc = run_cli(*command, "-o", path)
        assert_clean_error(proc, 2, f"-o {path}", cause)
        assert "measuring" not in proc.stderr and "baseline" not in proc.stderr  # refused first


@pytest.mark.slow
def test_every_command_that_reads_an_artifact_takes_the_folder_the_same_way(tmp_path: Path) -> None:
    """The folder `lto optimize -o` wrote, given positionally to each command (serve used to say
    "model not found", inspect and report refused folders, export took no --artifact)."""
    art = tmp_path / "art"
    made = run_cli("optimize", "sample_models/mlp_small.onnx", "--time-budget", "5s", "-o", art)
    assert made.returncode == 0, made.stderr
    commands = {
        "bench": ["bench", art, "--time", "0.3"],
        "inspect": ["inspect", art],
        "report": ["report", art],
        "export": ["export", art, "--triton", tmp_path / "repo"],
        "load": ["load", art, "--requests", "5"],
        "serve": ["serve", art, "--port", "0", "--validate", "--requests", "5"],
    }
    for name, args in commands.items():
        proc = run_cli(*args, timeout=180)
        assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-2000:])
    # --artifact DIR, where a command has it, reads the same folder.
    assert run_cli("export", "--artifact", art, "--triton", tmp_path / "repo2").returncode == 0
    assert run_cli("bench", "--artifact", art, "--time", "0.3").returncode == 0


def test_optimize_help_shows_the_common_flags_first_in_one_screen() -> None:
    proc = run_cli("optimize", "--help", env={"COLUMNS": "80"})
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    first_screen = "\n".join(lines[:40])
    for flag in ("--target-ms", "--data", "--preprocess", "--calib-data", "--output", "--time-budget"):
        assert flag in first_screen, flag
    text = proc.stdout
    assert (
        text.index("Common")
        < text.index("The search")
        < text.index("Inputs and accuracy")
        < text.index("Runtime options")
    )
    assert max(len(line) for line in lines) <= 80


def test_a_percentile_outside_the_one_set_is_echoed_as_written() -> None:
    proc = run_cli("optimize", "sample_models/mlp_small.onnx", "--target-percentile", "99.5")
    assert_clean_error(proc, 2, "--target-percentile p99.5 is not one lto reports", "p99.9")
    assert "p995" not in proc.stderr and "'p999'" not in proc.stderr
    from optimize.units import parse_percentile_key

    assert parse_percentile_key("p99.9", "--x") == "p999"  # the report key; people read p99.9


@pytest.mark.slow
def test_each_warning_is_printed_once(tmp_path: Path) -> None:
    proc = run_cli("optimize", "sample_models/mlp_small.onnx", "--time-budget", "5s", "-o", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: no reduced or quantized candidate can ship") == 1
