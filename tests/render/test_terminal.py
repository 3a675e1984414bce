"""Terminal rendering: rich tables on known data, and library modules that never import rich."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
from rich.console import Console

from optimize.gate import Side, decide
from optimize.render.terminal import render_gate
from tests.cli_helpers import ROOT


def _gate_text(data: dict[str, Any]) -> str:
    console = Console(record=True, width=200, color_system=None)
    render_gate(data, console)
    return console.export_text()


def test_gate_table_shows_a_p_value_of_zero_as_tiny_not_as_one() -> None:
    rng = np.random.default_rng(0)
    base = Side("base.json", "m", rng.normal(1.0, 0.01, 200), fingerprint="f")
    cand = Side("cand.json", "m", rng.normal(0.5, 0.01, 200), fingerprint="f")
    data = decide(base, cand).to_json()
    data["mann_whitney"] = {"p_slower": 1.0, "p_faster": 0.0}
    text = _gate_text(data)
    assert "slower 1 / faster <1e-4" in text
    assert "faster 1 " not in text
    assert "lto gate: improved (exit 10)" in text and data["reason"][:40] in text


def test_library_modules_do_not_import_rich() -> None:
    # Rendering for terminals lives in optimize.render.terminal; the library returns data.
    modules = ["optimize.report", "optimize.gate", "optimize.inspection", "optimize.bench",
               "optimize.bench.command", "optimize.serve.app", "optimize.serve.loadgen",
               "optimize.serve.server", "optimize.render.markdown"]  # fmt: skip
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "[]"
