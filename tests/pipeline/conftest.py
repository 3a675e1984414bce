"""What every pipeline test shares."""

from __future__ import annotations

import pytest

from optimize.render import plots

# A PNG's signature: enough for code that stores or embeds the bytes.
_PNG_STANDIN = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _plots_built_but_not_rasterized(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run writes an artifact whose pages hold its plots; drawing them into PNG bytes was a
    third of a pipeline test's time. These tests read the report, so the plots are built (their
    data and captions) but not rasterized; tests/render draws real images and checks them."""
    monkeypatch.setattr(plots, "_png", lambda fig: _PNG_STANDIN)
