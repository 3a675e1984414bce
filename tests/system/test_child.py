"""Child processes (optimize/system/child.py): errors cross as lto's own classes, deaths are told,
groups end whole.

What the children run is in tests/child_targets.py (light imports: each child starts in ~0.1 s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from optimize import errors
from optimize.errors import InputError, LtoError
from optimize.system.child import ChildFailed, ErrorRecord, start_child
from tests import child_targets as targets

LTO_ERRORS = ("LtoError", "UsageError", "InputError", "ModelError", "BackendUnavailable")


def _gone(pid: int) -> bool:
    """No longer running: reaped, or a zombie (this test process is a subreaper: orphaned
    grandchildren end up its children, to be reaped here)."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    with contextlib.suppress(ChildProcessError):  # not ours to reap: gone all the same
        os.waitpid(pid, 0)
    return True


def _eventually_gone(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return all(_gone(pid) for pid in pids)


# -- errors ---------------------------------------------------------------------------------------


def _result(target: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """What `target` returns in a child process (its error rebuilt here); the child ends with it."""
    options.setdefault("what", "the test child")
    known = options.pop("known", ())
    with start_child(target, *args, **options) as child:
        return child.result(known=known)


@pytest.mark.parametrize("class_name", LTO_ERRORS)
def test_each_lto_error_crosses_as_its_class_with_message_hint_and_place(class_name: str) -> None:
    with pytest.raises(LtoError) as caught:
        _result(targets.raise_lto_error, class_name, "it went wrong", "do this instead")
    error = caught.value
    assert type(error) is getattr(errors, class_name)
    assert error.message == "it went wrong" and error.hint == "do this instead"
    assert error.where.startswith("child_targets.py:")  # type: ignore[attr-defined]


def test_an_lto_error_from_elsewhere_crosses_as_the_optimize_errors_class_it_derives_from() -> None:
    with pytest.raises(InputError) as caught:
        _result(targets.raise_not_in_errors)
    assert type(caught.value) is InputError and caught.value.exit_code == 2
    assert caught.value.one_line() == "bad input (pin it with --shape)"


def test_any_other_exception_crosses_as_child_failed_naming_its_type() -> None:
    with pytest.raises(ChildFailed) as caught:
        _result(targets.raise_foreign)
    error = caught.value
    assert error.message == "the test child failed: ValueError: a bad value"  # one line crosses
    assert error.type_name == "ValueError" and error.where.startswith("child_targets.py:")
    assert error.hint is None and isinstance(error, LtoError)


def test_a_callers_own_exception_type_is_rebuilt_by_name_when_known() -> None:
    with pytest.raises(targets.Declined, match=r"^does not apply$"):
        _result(targets.raise_declined, known=(targets.Declined,))


def test_a_callers_failure_class_carries_the_foreign_errors_and_deaths() -> None:
    class StageFailed(ChildFailed):
        pass

    with pytest.raises(StageFailed, match=r"^the stage failed: ValueError: a bad value$"):
        _result(targets.raise_foreign, what="the stage", failure=StageFailed)
    with pytest.raises(StageFailed, match=r"^the stage died \(signal 15\), killed by SIGTERM$"):
        _result(targets.kill_self, signal.SIGTERM, what="the stage", failure=StageFailed)


def test_a_result_that_does_not_pickle_comes_back_as_that_error() -> None:
    with pytest.raises(ChildFailed) as caught:
        _result(targets.return_unpicklable)
    assert "pickle" in caught.value.message.lower()


def test_an_error_record_rebuilds_in_process_too() -> None:
    try:
        raise InputError("no such input 'x'", "the model's inputs are: ids")
    except InputError as exc:
        record = ErrorRecord.of(exc)
    assert record.type_name == "InputError" and record.lto_class == "InputError"
    assert record.where.startswith("test_child.py:")
    rebuilt = record.rebuild()
    assert (
        type(rebuilt) is InputError
        and rebuilt.one_line() == "no such input 'x' (the model's inputs are: ids)"
    )
    assert str(ErrorRecord.of(RuntimeError()).rebuild("x")) == "x failed: RuntimeError"


# -- deaths ---------------------------------------------------------------------------------------


def test_a_child_killed_by_a_signal_is_reported_with_the_signals_name() -> None:
    with pytest.raises(ChildFailed, match=r"^the test child died \(signal 9\), killed by SIGKILL$"):
        _result(targets.kill_self, signal.SIGKILL)


def test_a_child_that_exits_is_reported_with_its_exit_code_and_last_stderr_line() -> None:
    with pytest.raises(ChildFailed, match=r"^the test child died \(exit code 3\): the last words$"):
        _result(targets.exit_with_last_words, 3, capture_output=True, stderr_noise=("Scope Loaded",))


def test_a_death_is_noticed_while_a_grandchild_holds_the_channel_open() -> None:
    with start_child(targets.die_with_channel_held_open, what="the test child", own_group=True) as child:
        _, grandchild = child.receive()  # type: ignore[misc]
        started = time.monotonic()
        with pytest.raises(ChildFailed, match=r"died \(exit code 7\)"):
            child.result()
        assert time.monotonic() - started < 3.0  # by polling, not by end-of-file
    assert _eventually_gone([grandchild])  # closing the child ended its group


# -- talk, signals, groups ------------------------------------------------------------------------


def test_progress_log_and_status_reach_the_parent_in_order_before_the_result() -> None:
    heard: list[tuple[str, object]] = []
    with start_child(targets.talk_then_answer, 21, what="the test child") as child:
        assert child.result(lambda kind, value: heard.append((kind, value))) == 42
    assert heard == [("progress", ("warming up", 1, 0.5)), ("log", "a log line"), ("status", "a status line")]


def test_the_child_ignores_sigint_the_parent_owns_it() -> None:
    assert _result(targets.survive_sigint) == "still here"


def test_own_group_gives_the_child_a_session_of_its_own() -> None:
    with start_child(targets.process_ids, what="the test child", own_group=True) as child:
        pid, group, session = child.result()
    assert pid == child.pid and group == pid and session == pid
    with start_child(targets.process_ids, what="the test child") as child:
        pid, group, session = child.result()
    assert group == os.getpgid(0) and session == os.getsid(0)


def test_a_silent_child_times_out_and_close_ends_it() -> None:
    with start_child(targets.sleep, 60.0, what="the test child") as child:
        assert child.receive(timeout_s=0.3) is None
    assert child.process.returncode == -signal.SIGTERM


def test_ending_a_group_leaves_no_process_behind() -> None:
    with start_child(targets.start_stubborn_workers, 2, what="the test child", own_group=True) as child:
        kind, workers = child.receive()  # type: ignore[misc]
        assert kind == "progress" and len(workers) == 2
        pids = [child.pid, *workers]
        assert all(not _gone(pid) for pid in pids)
        started = time.monotonic()
        child.end(grace_s=0.5)  # all ignore SIGTERM: the SIGKILL after the grace ends them
        assert time.monotonic() - started < 5.0
    assert child.process.returncode == -signal.SIGKILL
    assert _eventually_gone(pids)
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid in pids and not _gone(p.pid)]
