"""Run the real `lto` entry point in a subprocess: real exit codes, real stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_lto(
    *args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    full_env.pop("LTO_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=full_env,
    )


def assert_clean_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """A user error: the expected exit code, a one-line message, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
