"""README and docs/ cannot rot: every `lto` command they show parses with today's flags, and the
quick start runs as written on a pretrained model and a folder of its real data."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer import Exit

try:  # typer 0.2x ships its own click
    from typer._click.core import Context
    from typer._click.exceptions import ClickException
except ImportError:  # an older typer on click itself
    from click import Context  # type: ignore[assignment]
    from click.exceptions import ClickException  # type: ignore[assignment]

from optimize.cli import app
from optimize.errors import LtoError
from tests.cli_helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def _blocks(path: Path) -> Iterator[str]:
    for match in _FENCE.finditer(path.read_text(encoding="utf-8")):
        yield match.group(1)


def _commands(block: str) -> Iterator[str]:
    """The `lto ...` command lines of a block (a transcript's `$ lto`, or a script's `lto`), with
    backslash continuations joined and what the shell adds after them (redirects, `||`, `&`) cut."""
    joined = re.sub(r"\\\n\s*", " ", block)
    for raw in joined.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line.startswith("validating: lto "):  # the load `lto serve --validate` echoes
            line = line.removeprefix("validating: ")
        if not line.startswith("lto ") and "&& lto " not in line:
            continue
        line = line[line.index("lto ") :]
        for cut in (" || ", " && ", " | ", " > ", " 2>", " ; ", " &", "  #", " #"):
            if cut in line:
                line = line[: line.index(cut)]
        if "$(" in line or "…" in line or "..." in line or "$" in line or " and lto " in line:
            continue  # shell variables, elisions and prose: not a literal command
        words = line.split()
        if len(words) < 2 or not re.fullmatch(r"[a-z]+", words[1]):
            continue  # a table's title ("lto bench: latency in ms"), not a command
        yield line.strip()


def _all_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for block in _blocks(path):
            for command in _commands(block):
                found.append((path.relative_to(ROOT).as_posix(), command))
    return found


COMMANDS = _all_commands()


def test_the_docs_show_commands_to_check() -> None:
    assert len(COMMANDS) >= 30
    assert {path for path, _ in COMMANDS} >= {"README.md", "docs/usage.md"}


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_parses_with_todays_flags(where: str, command: str) -> None:
    """Click parses the line as `lto` would (its options, arguments and value parsers), without
    running it: an unknown flag, a removed argument or a bad value fails here."""
    name, *words = shlex.split(command)[1:]
    group = typer.main.get_command(app)
    sub = group.commands.get(name)  # type: ignore[attr-defined]
    assert sub is not None, f"{where}: `{command}`: lto has no command {name!r}"
    try:
        with Context(group, info_name="lto") as parent:
            sub.make_context(name, list(words), parent=parent)
    except Exit:
        pass  # --help and the like
    except (ClickException, LtoError) as exc:
        pytest.fail(f"{where}: `{command}` no longer parses: {exc}")


def _quick_start() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1]
    return next(_blocks_of(section))


def _blocks_of(text: str) -> Iterator[str]:
    for match in _FENCE.finditer(text):
        yield match.group(1)


def test_the_quick_start_is_short_and_starts_from_a_fresh_clone() -> None:
    lines = [line for line in _quick_start().splitlines() if line.strip()]
    assert len(lines) <= 15
    assert lines[0].startswith("make install") and any(line.startswith("make example") for line in lines)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "example: install\n\t$(BIN)/python -m corpus.example example\n" in makefile


@pytest.mark.network
@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    """README's quick start, line by line, in a fresh folder: `make install` is the environment
    this test runs in, `make example` what its Makefile target runs; every `lto` line as written.
    It must leave an artifact, its report, and a served endpoint that answered."""
    script = ["set -euo pipefail"]
    for line in _quick_start().splitlines():
        command = line.split("  #", 1)[0].strip()
        if not command or command.startswith("make install"):
            continue
        if command == "make example":
            command = f"{shlex.quote(sys.executable)} -m corpus.example example"
        script.append(command)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "COLUMNS": "100"}  # fmt: skip
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    art = tmp_path / "example" / "out"
    assert (art / "manifest.json").is_file() and (art / "report.md").is_file()
    assert "serving out" in proc.stdout and "requests answered" in proc.stdout
    assert "200/200 ok" in proc.stdout


@pytest.mark.parametrize(
    "command",
    [
        "lto load http://127.0.0.1:8000 mlp_small",  # the README transcript that had rotted
        "lto optimize model.onnx --no-such-flag",
        "lto bench model.onnx --time 1h30x",
        "lto gate --baseline a.json --candidate b.json --percentile p75",
    ],
)
def test_the_check_catches_a_command_that_no_longer_parses(command: str) -> None:
    with pytest.raises(pytest.fail.Exception, match="no longer parses"):
        test_every_documented_command_parses_with_todays_flags("example", command)
