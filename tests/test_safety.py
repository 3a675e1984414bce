"""The user's files, through `lto`'s main() in-process, and signals, through the real `lto`
entry point in a subprocess.

- `-o` (and every other output path) replaces only what is empty or what lto wrote itself, and
  refuses anything else before any work starts;
- Ctrl-C and SIGTERM end every command the same way: exit 130/143, one line saying what was
  stopped, previous results intact, no work folder left, child processes ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.cli_helpers import ROOT, assert_clean_error, run_cli
from tests.conftest import sample_path

MLP = "mlp_small.onnx"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _no_work_left(parent: Path) -> None:
    left = [*parent.glob(".lto-work-*"), *parent.glob(".*.staging"), *parent.glob(".*.old-*")]
    assert not left, left


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real artifact of mlp_small, written once for the module."""
    out = tmp_path_factory.mktemp("art") / "mlp-artifact"
    proc = run_cli("optimize", sample_path(MLP), "--target-ms", "100", "--stop-at-target", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def _optimize_into(out: Path, *extra: str, model: Path | None = None) -> subprocess.CompletedProcess:
    model = model or sample_path(MLP)
    return run_cli("optimize", model, "--target-ms", "100", "--stop-at-target", "-o", out, *extra)


# -- 1. -o never deletes what lto did not write ------------------------------------------------


def test_the_folder_holding_the_model_and_notes_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    for name in ("mlp_small.onnx", "resnet_tiny.onnx"):
        shutil.copy(sample_path(name), folder / name)
    (folder / "notes.txt").write_text("notes\n")
    before = _tree(folder)
    proc = _optimize_into(folder, model=folder / MLP)
    assert_clean_error(proc, 2, "holds the input", "choose another -o")
    assert _tree(folder) == before
    # Refused before any work: no work folder, no partial report beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("kind", ["folder-of-files", "file", "symlink", "cwd"])
def test_what_lto_did_not_write_is_refused_even_with_force(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "folder-of-files":
        target.mkdir()
        (target / "thesis.tex").write_text("years of work\n")
        needle = "1 entry that lto did not write"
    elif kind == "file":
        target.write_text("a file\n")
        needle = "is a file"
    elif kind == "symlink":
        (tmp_path / "real").mkdir()
        target.symlink_to(tmp_path / "real")
        needle = "is a symlink"
    else:
        target = Path(".")  # run_cli runs in the repository root: refusing it is the whole point
        needle = "working folder"
    before = _tree(tmp_path)
    for extra in ((), ("--force",)):
        proc = _optimize_into(target, *extra)
        assert_clean_error(proc, 2, needle)
    assert _tree(tmp_path) == before
    assert not list(ROOT.glob(".lto-work-*"))


@pytest.mark.slow
def test_an_artifact_like_folder_needs_force(tmp_path: Path) -> None:
    target = tmp_path / "old"
    target.mkdir()
    (target / "manifest.json").write_text('{"written_by": "someone else"}\n')
    (target / "model.onnx").write_bytes(b"old")
    assert_clean_error(_optimize_into(target), 2, "looks like an artifact", "--force")
    assert (target / "model.onnx").read_bytes() == b"old"
    proc = _optimize_into(target, "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((target / "manifest.json").read_text())["lto_version"]


@pytest.mark.slow
def test_an_lto_artifact_and_an_empty_folder_are_replaced_with_the_users_umask(
    tmp_path: Path, artifact: Path
) -> None:
    target = tmp_path / "again"
    shutil.copytree(artifact, target)
    old_created = json.loads((target / "manifest.json").read_text())["created_at"]
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (target, empty):
        # Needs a process: the umask is the process's, set by the shell that starts lto.
        proc = subprocess.run(
            ["sh", "-c", 'umask 027 && exec "$0" -m optimize optimize "$1" --target-ms 100 '
             '--stop-at-target -o "$2"', sys.executable, str(sample_path(MLP)), str(out)],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o750
        for name in ("manifest.json", "report.json", "report.md", "model.onnx"):
            assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name
    assert json.loads((target / "manifest.json").read_text())["created_at"] >= old_created
    _no_work_left(tmp_path)


@pytest.mark.slow
def test_report_outputs_follow_the_same_rule(tmp_path: Path) -> None:
    user_file = tmp_path / "notes.md"
    user_file.write_text("my notes\n")
    model = sample_path(MLP)
    cases = [
        ("bench", model, "--time", "0.2", "-o", user_file),
        ("bench", model, "--time", "0.2", "--markdown", user_file),
        ("load", model, "--requests", "5", "-o", user_file),
        (
            "gate",
            "--rerun",
            "--baseline",
            model,
            "--candidate",
            model,
            "--time",
            "0.2",
            "--markdown",
            user_file,
        ),
        ("serve", model, "--validate", "--requests", "5", "-o", user_file),
    ]
    for args in cases:
        proc = run_cli(*args)
        assert_clean_error(proc, 2, str(user_file), "lto did not write")
        assert user_file.read_text() == "my notes\n", args
    # A report lto wrote is replaced, and created with the user's umask (not mkstemp's 0600).
    report, summary = tmp_path / "bench.json", tmp_path / "bench.md"
    for _ in range(2):
        proc = run_cli("bench", model, "--time", "0.2", "-o", report, "--markdown", summary)
        assert proc.returncode == 0, proc.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(report.stat().st_mode) == 0o666 & ~umask
    # `lto report` never renders a report over itself.
    assert_clean_error(run_cli("report", report, "-o", report), 2, "also an input")
    assert json.loads(report.read_text())["kind"] == "bench"
    proc = run_cli("report", report, "-o", summary)
    assert proc.returncode == 0, proc.stderr


# -- 2. Ctrl-C and SIGTERM end every command the same way ---------------------------------------


def _start(args: list[str], cwd: Path = ROOT, ignore_sigint: bool = False, **env: str) -> subprocess.Popen:
    """`lto ARGS` in a process of its own. Needs a process: the tests signal it, and check the
    exit status and the child processes it leaves."""

    def preexec() -> None:
        if ignore_sigint:  # what `cmd &` in a script does
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "optimize", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **env},
    )


def _signal_until_it_ends(proc: subprocess.Popen, signum: int, first_after_s: float) -> tuple[str, str]:
    """Send `signum` once lto has started; again only if it was not yet listening (a signal that
    lands before the handlers are installed is ignored or kills the interpreter outright)."""
    time.sleep(first_after_s)
    for _ in range(10):
        proc.send_signal(signum)
        try:
            return proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    raise AssertionError("lto did not stop on " + signal.Signals(signum).name)


def _signal_once_it_prints(proc: subprocess.Popen, signum: int, marker: str, within_s: float = 180) -> str:
    """Send `signum` as soon as lto's stderr shows `marker` (not after a fixed time, which a slow or
    busy machine may not have reached); its whole stderr once it ends."""
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not seen.wait(within_s):
        proc.kill()
        raise AssertionError(f"lto never printed {marker!r}: {''.join(lines)[-2000:]}")
    proc.send_signal(signum)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("lto did not stop on " + signal.Signals(signum).name) from None
    reader.join(10)
    return "".join(lines)


def _last_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_bench_says_what_was_interrupted_even_with_sigint_ignored(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", str(sample_path(MLP)), "--time", "60", "--runs", "100000000", "--ci-target", "0"]
    proc = _start([*args, "-o", str(out)], ignore_sigint=True)
    _, stderr = _signal_until_it_ends(proc, signum, 3.0)
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    word = "interrupted by Ctrl-C" if signum == signal.SIGINT else "terminated by SIGTERM"
    assert word in _last_line(stderr) and "previous results were left intact" in _last_line(stderr)
    assert not out.exists()


@pytest.mark.slow
def test_sigterm_during_optimize_keeps_the_previous_artifact(tmp_path: Path, artifact: Path) -> None:
    target = tmp_path / "art"
    shutil.copytree(artifact, target)
    before = _tree(target)
    args = ["optimize", str(sample_path("bert_tiny.onnx")), "--shape", "sequence=32", "-o", str(target)]
    proc = _start(args)
    # Once the baseline is measured the run has a best so far to report.
    stderr = _signal_once_it_prints(proc, signal.SIGTERM, "baseline p50")
    assert proc.returncode == 143, stderr
    assert "terminated by SIGTERM" in _last_line(stderr)
    assert _tree(target) == before
    partial = json.loads((tmp_path / "art.partial-report.json").read_text())["optimize"]
    assert partial["partial"] is True and partial["stopped_by"] == "terminated by SIGTERM"
    assert partial["best_so_far"]["summary"]
    assert not list(tmp_path.glob(".lto-work-*")) and not list(tmp_path.glob(".art.*"))


def _is_tuner(child: psutil.Process) -> bool:
    """lto's child process running the tvm-tune stage (optimize.system.child names what a child is on
    its command line), not a worker hosting a model. A child that ends while it is looked at (a
    zombie, or gone) is not the tuner."""
    try:
        cmdline = " ".join(child.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return "optimize.system.child" in cmdline and "the tvm-tune process" in cmdline


@pytest.mark.slow
def test_ctrl_c_during_tvm_tuning_reaches_lto_and_ends_the_tuner(tmp_path: Path, artifact: Path) -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.tune_stage import compiler_available

    if not compiler_available():
        pytest.skip("TVM needs a C compiler")
    target = tmp_path / "art"
    shutil.copytree(artifact, target)
    before = _tree(target)
    args = ["optimize", str(sample_path(MLP)), "--tvm", "--tvm-trials", "64", "-o", str(target)]
    # A cache of its own, so that tuning really runs (and the shared cache is not touched).
    proc = _start(args, LTO_CACHE_DIR=str(tmp_path / "cache"))
    lto = psutil.Process(proc.pid)
    deadline = time.monotonic() + 240
    tuner = None
    while tuner is None and time.monotonic() < deadline and proc.poll() is None:
        tuner = next((c for c in lto.children() if _is_tuner(c)), None)
        time.sleep(0.5)
    assert tuner is not None, "the tvm-tune stage never started its process"
    group = os.getpgid(tuner.pid)
    assert group != os.getpgid(proc.pid)  # its own group: the terminal's Ctrl-C reaches lto only
    _, stderr = _signal_until_it_ends(proc, signal.SIGINT, 8.0)
    assert proc.returncode == 130, stderr
    assert "interrupted by Ctrl-C" in _last_line(stderr)
    assert _tree(target) == before
    partial = json.loads((tmp_path / "art.partial-report.json").read_text())["optimize"]
    assert partial["stopped_by"].startswith("interrupted")
    assert not list(tmp_path.glob(".lto-work-*"))
    # The tuner and its builder/runner workers are gone.
    time.sleep(1.0)
    left = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == group and _running(p)]
    assert not left, left


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a killed worker whose new parent has not reaped it yet)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
