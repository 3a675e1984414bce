"""The layers hold: import-linter's contracts ([tool.importlinter] in pyproject.toml) are kept, and
a file's first lines say what it depends on (no function-level import of lto's own modules)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "optimize"
# The package's API loads on first use (PEP 562 __getattr__), so that a worker process importing
# one of lto's modules does not load all of them.
ALLOWED_LAZY = {("optimize/__init__.py", "optimize")}


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.ImportFrom) and child.level == 0:
                if (child.module or "").split(".")[0] == "optimize":
                    found.append((child.lineno, child.module or ""))
            elif in_function and isinstance(child, ast.Import):
                found.extend(
                    (child.lineno, a.name) for a in child.names if a.name.split(".")[0] == "optimize"
                )
            elif in_function and isinstance(child, ast.ImportFrom) and child.level > 0:
                found.append((child.lineno, "." * child.level + (child.module or "")))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_no_function_level_import_of_ltos_own_modules() -> None:
    offenders = [
        f"{rel}:{line} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for rel in [path.relative_to(ROOT).as_posix()]
        for line, module in _function_level_imports(path)
        if (rel, module) not in ALLOWED_LAZY
    ]
    assert not offenders, "import lto's own modules at the top of the file:\n" + "\n".join(offenders)


def test_the_finder_sees_a_function_level_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n\ndef f():\n    from optimize.errors import UsageError\n    return UsageError\n"
    )
    assert _function_level_imports(probe) == [(4, "optimize.errors")]


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    lint = Path(sys.executable).parent / "lint-imports"
    command = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    proc = subprocess.run(
        [*command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # optimize: layers, no cycles, corpus/harness/benchmarks apart, runtimes apart; corpus: layers,
    # no cycles; harness and benchmarks: no cycles.
    assert "8 kept, 0 broken" in proc.stdout


# Packages the rest of lto enters through their __init__ only (their one door).
ONE_DOOR = ("optimize.data", "optimize.accuracy")


def _module_name(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")


def _imports_past_a_door(path: Path, rel: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            for door in ONE_DOOR:
                inside = rel == door or rel.startswith(door + ".")
                if module.startswith(door + ".") and not inside:
                    found.append((node.lineno, module))
    return found


def test_data_and_accuracy_are_entered_through_their_door() -> None:
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module in _imports_past_a_door(path, _module_name(path))
    ]
    assert not offenders, "import these from the package itself:\n" + "\n".join(offenders)


def test_the_door_check_sees_an_import_past_the_door(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from optimize.data.npz import read_npz\nfrom optimize.data import read_npz as r\n")
    assert _imports_past_a_door(probe, "optimize.pipeline.probe") == [(1, "optimize.data.npz")]
    assert _imports_past_a_door(probe, "optimize.data.rows") == []
