"""One spelling for percentiles and durations (optimize/units.py)."""

from __future__ import annotations

import pytest

from optimize.errors import UsageError
from optimize.units import parse_duration, parse_percentile, parse_percentile_key, percentile_label


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 90), ("90s", 90), ("1.5s", 1.5), ("500ms", 0.5), ("10m", 600), ("1h30m", 5400),
     ("1h 30m", 5400), (" 2M ", 120), (".5s", 0.5), (7, 7), (2.5, 2.5)],
)  # fmt: skip
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["ten minutes", "10x", "-5", "1h30", "s", "", "5s10"])
def test_bad_durations_name_the_flag_and_the_spelling(text: str) -> None:
    with pytest.raises(UsageError, match="bad duration") as err:
        parse_duration(text, "--time")
    assert "--time" in err.value.message and "1h30m" in (err.value.hint or "")


def test_duration_minimum() -> None:
    assert parse_duration("0.5s", "--time", minimum=0.01) == 0.5
    with pytest.raises(UsageError, match=r"--duration must be at least 0\.01s"):
        parse_duration("0", "--duration", minimum=0.01)


@pytest.mark.parametrize(
    "text,q",
    [("p50", 50), ("p90", 90), ("P99", 99), ("p99.9", 99.9), ("p999", 99.9), ("p9999", 99.99),
     ("p995", 99.5), ("99", 99), ("99.0", 99), ("99.9", 99.9), (95.0, 95)],
)  # fmt: skip
def test_percentiles(text: str | float, q: float) -> None:
    assert parse_percentile(text) == pytest.approx(q)


@pytest.mark.parametrize("text", ["p100", "p0", "100", "0", "q99", "p", "99%", "p-5", "median"])
def test_bad_percentiles(text: str) -> None:
    with pytest.raises(UsageError, match="--percentile") as err:
        parse_percentile(text)
    assert "p99" in (err.value.hint or "")


def test_percentile_keys_match_the_reports() -> None:
    assert [parse_percentile_key(t, "--metric") for t in ("p50", "99", "p99.9", "p999")] == [
        "p50",
        "p99",
        "p999",
        "p999",
    ]
    assert percentile_label(99.9) == "p99.9" and percentile_label(99.0) == "p99"
    with pytest.raises(UsageError, match="is not supported") as err:
        parse_percentile_key("p99.9", "--target-percentile", choices=("p50", "p99"))
    assert err.value.hint == "choose one of: p50, p99"
