"""One real report of each kind, made once by the real commands, for the renderers' tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optimize.gate import EXIT_CODES
from tests.cli_helpers import run_cli
from tests.conftest import sample_path

KINDS = ("bench", "compare", "optimize", "load", "gate")


@pytest.fixture(scope="session")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One real report of each kind on the smallest sample model, made once for the session."""
    model = sample_path("mlp_small.onnx")
    out = tmp_path_factory.mktemp("reports")
    paths = {kind: out / f"{kind}.json" for kind in KINDS}
    paths["optimize"] = out / "optimized" / "report.json"
    commands: dict[str, list[Any]] = {
        "bench": ["bench", model, "--time", "0.3"],
        "compare": ["bench", model, "--compare", model, "--time", "0.3"],
        # 700 queries: enough for LoadGen's SingleStream early stopping to call a p99 run VALID.
        "load": ["load", model, "--requests", "700", "--slo-ms", "10000"],
        "gate": ["gate", "--rerun", "--baseline", model, "--candidate", model, "--time", "1"],
        "optimize": ["optimize", model, "--target-ms", "100", "--stop-at-target"],
    }
    for kind, args in commands.items():
        # `lto optimize -o` names the artifact folder, which holds report.json
        proc = run_cli(*args, "-o", paths[kind].parent if kind == "optimize" else paths[kind])
        # the gate exits with its verdict's code; the rest succeed
        ok = proc.returncode in EXIT_CODES.values() if kind == "gate" else proc.returncode == 0
        assert ok and paths[kind].is_file(), (kind, proc.returncode, proc.stderr[-2000:])
    return paths


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The session's real reports take ~15 s to make: tests that read them are slow ones.
    for item in items:
        if "reports" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
