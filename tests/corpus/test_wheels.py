"""corpus.wheels fetches, corpus.fetch_cli is its command line, and neither hides the package's
fetch(name) function (a submodule named `fetch` would, once imported)."""

from __future__ import annotations

import inspect

import pytest

import corpus
import corpus.fetch_cli
import corpus.wheels


def test_the_packages_fetch_stays_a_function_after_its_modules_are_imported() -> None:
    assert inspect.isfunction(corpus.fetch)
    assert corpus.CorpusError is corpus.wheels.CorpusError


def test_the_command_line_refuses_an_unknown_entry_before_any_download(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert corpus.fetch_cli.main(["no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
