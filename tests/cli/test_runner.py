"""The in-process runner the CLI tests use (tests/cli_helpers.run_cli): it prints what the real
process prints, and gives the test process back its handlers, environment and streams."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from optimize.system import interrupts
from tests.cli_helpers import ROOT, run_cli, run_lto

MLP = ROOT / "sample_models" / "mlp_small.onnx"


@pytest.mark.slow
def test_in_process_runs_print_what_the_real_process_prints() -> None:
    # Needs a process: the real `python -m optimize` is what run_cli stands in for.
    cases = [
        ["--version"],
        ["inspect", str(MLP), "--shape", "batch=1"],  # a rich table, 200 columns wide
        ["inspect", "--help"],  # click names the program "python -m optimize"
        ["bench"],  # lto's one-line usage error
        ["bench", "--no-such-flag"],  # click's usage error
    ]
    for args in cases:
        inside, outside = run_cli(*args), run_lto(*args)
        assert (inside.returncode, inside.stdout, inside.stderr) == (
            outside.returncode,
            outside.stdout,
            outside.stderr,
        ), args


def _process_state() -> dict[str, Any]:
    return {
        "handlers": [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)],
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "argv": sys.argv[:],
        "main": sys.modules["__main__"],
        "streams": (sys.stdout, sys.stderr),
        "log_handlers": logging.getLogger().handlers[:],
        "warning_filters": warnings.filters[:],
        "interrupts": (interrupts.activity(), interrupts.received()),
    }


def test_a_run_sees_a_fresh_process_and_gives_the_test_its_state_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LTO_DEBUG", "1")
    seen: dict[str, Any] = {}

    def command(args: list[str], standalone_mode: bool) -> int:
        seen.update(
            environ={k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "LTO_DEBUG", "EXTRA")},
            cwd=os.getcwd(),
            argv=sys.argv[:],
            sigint=signal.getsignal(signal.SIGINT),
        )
        os.environ["SET_BY_THE_COMMAND"] = "1"
        interrupts.set_activity("measuring")
        print("printed")
        os.write(2, b"written by native code\n")
        logging.getLogger("lto.test").warning("logged")
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
        return 7

    monkeypatch.setattr("optimize.cli.app", command)
    before = _process_state()
    proc = run_cli("anything", env={"EXTRA": "x"})
    assert _process_state() == before and "SET_BY_THE_COMMAND" not in os.environ

    assert seen["environ"] == {"COLUMNS": "200", "NO_COLOR": "1", "LTO_DEBUG": None, "EXTRA": "x"}
    assert seen["cwd"] == str(ROOT) and seen["argv"][1:] == ["anything"]
    assert seen["argv"][0].endswith(os.path.join("optimize", "__main__.py"))
    assert seen["sigint"] is not before["handlers"][0]  # lto's own, for the run only
    assert proc.returncode == 7 and proc.stdout == "printed\n"
    assert "written by native code" in proc.stderr and "logged" in proc.stderr
    assert "UserWarning: a library's warning" in proc.stderr


def test_errors_end_as_in_a_process_and_an_escaping_exception_fails_the_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def internal_error(args: list[str], standalone_mode: bool) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr("optimize.cli.app", internal_error)
    proc = run_cli("anything")
    assert proc.returncode == 1
    assert proc.stderr.startswith("internal error: RuntimeError: boom (set LTO_DEBUG=1 for the traceback")

    class Escapes(BaseException):
        """Not caught by main(): a user would see its traceback."""

    def escapes(args: list[str], standalone_mode: bool) -> int:
        raise Escapes

    monkeypatch.setattr("optimize.cli.app", escapes)
    before = _process_state()
    with pytest.raises(Escapes):
        run_cli("anything")
    assert _process_state() == before


def test_a_run_past_its_timeout_is_stopped_like_ctrl_c_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def hangs(args: list[str], standalone_mode: bool) -> int:
        time.sleep(60)
        return 0

    monkeypatch.setattr("optimize.cli.app", hangs)
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"still ran after 0.5 s; stderr:\ninterrupted by Ctrl-C"):
        run_cli("anything", timeout=0.5)
    assert time.monotonic() - started < 30
    assert interrupts.received() is None


def test_a_signal_during_a_run_reaches_the_handler_the_test_process_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def terminated(args: list[str], standalone_mode: bool) -> int:
        signal.raise_signal(signal.SIGTERM)
        return 0

    received: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    monkeypatch.setattr("optimize.cli.app", terminated)
    previous = signal.signal(signal.SIGTERM, record)
    try:
        proc = run_cli("anything")
        assert signal.getsignal(signal.SIGTERM) is record
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert proc.returncode == 143 and "terminated by SIGTERM" in proc.stderr
    assert received == [signal.SIGTERM]  # handed on once lto had stopped, as pytest's Ctrl-C is


def test_consoles_follow_each_runs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from optimize.cli.common import console

    def styled(args: list[str], standalone_mode: bool) -> int:
        console.print(f"[bold]{console.width}[/]", highlight=False)
        return 0

    monkeypatch.setattr("optimize.cli.app", styled)
    coloured = run_cli("x", env={"COLUMNS": "50", "FORCE_COLOR": "1", "NO_COLOR": ""})
    assert coloured.stdout == "\x1b[1m50\x1b[0m\n"
    assert run_cli("x").stdout == "200\n"
