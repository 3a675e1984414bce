"""One spelling for percentiles and durations on every command and in the Python API.

Percentiles: p50, p90, p99, p99.9 (or p999, as report keys spell it). A bare number such as 99
is still accepted, for scripts written when `lto load --percentile` took a float.
Durations: 90 (seconds), 90s, 1.5s, 500ms, 10m, 1h30m.

Kept free of heavy imports: the CLI builds its options from these parsers at import time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence

from optimize.errors import UsageError

# The one set of percentiles every command takes and reports, as people write them.
PERCENTILE_LABELS = ("p50", "p90", "p95", "p99", "p99.9")
PERCENTILE_HINT = "write one of p50, p90, p95, p99, p99.9"
DURATION_HINT = "write e.g. 90s, 1.5s, 10m or 1h30m; a bare number is seconds"

_NUMBER = r"(?:\d+(?:\.\d+)?|\.\d+)"
_DURATION_PART = re.compile(rf"({_NUMBER})(ms|h|m|s)")  # "ms" before "m": 10ms is not 10 minutes
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PERCENTILE = re.compile(rf"(p?)({_NUMBER})")


def parse_duration(text: str | float, option: str | None = None, *, minimum: float | None = None) -> float:
    """Seconds from '90', '90s', '1.5s', '500ms', '10m' or '1h30m' (a number passes through).

    >>> parse_duration("1h30m"), parse_duration("1.5s"), parse_duration(90)
    (5400.0, 1.5, 90.0)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        value = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(_NUMBER, value):
            seconds = float(value)
        else:
            parts = _DURATION_PART.findall(value)
            if not parts or "".join(n + u for n, u in parts) != value:
                where = f" for {option}" if option else ""
                raise UsageError(f"bad duration {text!r}{where}", DURATION_HINT)
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if minimum is not None and not seconds >= minimum:
        raise UsageError(f"{option or 'the duration'} must be at least {minimum:g}s, not {text!r}")
    return seconds


def parse_percentile(text: str | float, option: str = "--percentile") -> float:
    """The percentile as a number: 'p99' -> 99.0, 'p99.9' or 'p999' -> 99.9, '99' -> 99.0.

    >>> parse_percentile("p99"), parse_percentile("p99.9"), parse_percentile("p999")
    (99.0, 99.9, 99.9)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        q = float(text)
    else:
        match = _PERCENTILE.fullmatch(str(text).strip().lower())
        if not match:
            raise UsageError(f"bad {option} {text!r}", PERCENTILE_HINT)
        prefix, digits = match.groups()
        # report keys drop the point: p999 = p99.9, p9999 = p99.99
        if prefix and digits.isdigit() and len(digits) > 2 and digits.startswith("99"):
            digits = f"99.{digits[2:]}"
        q = float(digits)
    if not 0 < q < 100:
        raise UsageError(f"{option} must lie between p0 and p100, not {text!r}", PERCENTILE_HINT)
    return q


def parse_standard_percentile(text: str | float, option: str) -> float:
    """parse_percentile, limited to the one set every command takes (PERCENTILE_LABELS)."""
    q = parse_percentile(text, option)
    if percentile_label(q) not in PERCENTILE_LABELS:
        raise UsageError(f"{option} {percentile_label(q)} is not one lto reports", PERCENTILE_HINT)
    return q


def percentile_label(q: float) -> str:
    """How people read it: 99.0 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{q:g}"


def percentile_key(q: float) -> str:
    """How reports and stats key it: 99.0 -> 'p99', 99.9 -> 'p999' (optimize.stats.PERCENTILES)."""
    label = percentile_label(q)
    return "p99" + label[4:] if label.startswith("p99.") else label


def parse_percentile_key(text: str | float, option: str, choices: Iterable[str] | None = None) -> str:
    """A report key ('p50', 'p99', 'p999') from any accepted spelling; checked against `choices`."""
    q = parse_standard_percentile(text, option)
    key = percentile_key(q)
    allowed = list(choices) if choices is not None else None
    if allowed is not None and key not in allowed:
        names = ", ".join(percentile_label(parse_percentile(c)) for c in allowed)
        raise UsageError(f"{option} {percentile_label(q)} is not supported", f"choose one of: {names}")
    return key


def clock_text(seconds: float) -> str:
    """A duration as people read it on a progress line: 45s, 2m05s."""
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def duration_parser(option: str, minimum: float | None = None) -> Callable[[str | float], float]:
    """A typer `parser=` for a duration flag."""
    return lambda text: parse_duration(text, option, minimum=minimum)


NO_LIMIT_WORDS = ("none", "off", "unlimited")


def limit_parser(option: str, minimum: float | None = None) -> Callable[[str | float], float]:
    """A typer `parser=` for a duration flag that may also say there is no limit ("none"): that
    parses as infinity, so that a flag not given (None) stays apart from one given as none."""

    def parse(text: str | float) -> float:
        if isinstance(text, str) and text.strip().lower() in NO_LIMIT_WORDS:
            return math.inf
        return parse_duration(text, option, minimum=minimum)

    return parse


def percentile_parser(option: str) -> Callable[[str | float], float]:
    """A typer `parser=` for a percentile flag that wants the number (99.0)."""
    return lambda text: parse_standard_percentile(text, option)


def percentile_key_parser(option: str, extra: Iterable[str] = ()) -> Callable[[str | float], str]:
    """A typer `parser=` for a flag that wants a report key ('p99'); `extra` names pass as they are."""
    names = {name.lower(): name for name in extra}

    def parse(text: str | float) -> str:
        name = names.get(str(text).strip().lower())
        if name is not None:
            return name
        try:
            return parse_percentile_key(text, option)
        except UsageError as exc:
            if not names:
                raise
            raise UsageError(exc.message, f"{exc.hint}, or {' or '.join(names.values())}") from None

    return parse


def index_ranges(indices: Sequence[int]) -> str:
    """0, 1, 2, 5, 7, 8 -> "0-2, 5, 7-8"."""
    out: list[str] = []
    items = sorted(indices)
    start = prev = None
    for i in [*items, None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    return ", ".join(out)
