"""The order stages run in: the likeliest winner per second of search first.

What wins is predictable per model kind and CPU (docs/search-order.md): OpenVINO bf16 where the CPU
has native bf16, int8 for transformers, OpenVINO for convolution nets. Each stage gets odds from
a prior kept in the recipes (`recipes/priors/search-order.toml`: on the corpus, how often the
stage's candidate was the artifact, by how much it beat ONNX Runtime defaults then, and how long
the stage ran), refined by this machine's history (`history.jsonl` in lto's cache: every finished
run adds what each stage did).

Stages run by expected gain per second over the best so far, chosen again after every stage: a
stage's gain when it wins is taken as log-normal around its corpus figure (GAIN_SPREAD), so its
expected gain is P(win) x E[max(0, ln(G / best))], the expected improvement of Bayesian
optimisation, divided by the seconds it takes. The recipe's order breaks ties. Under the default
time budget a stage whose expected gain over the best so far is under MIN_EXPECTED_GAIN is not run
(nothing like the best so far came of it on the corpus); an explicit --time-budget runs stages in
this order until it is spent, and --time-budget none runs them all.

Pure decisions and plain files: nothing here measures. The loop asks for the plan and, at the end
of a run, records what happened.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import NormalDist
from typing import Any

from optimize.errors import UsageError
from optimize.files import cache_root
from optimize.pipeline.record import RunRecord
from optimize.recipes import StageSpec, recipes_dir
from optimize.stage import Status

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PRIORS_FILE = "priors/search-order.toml"
# $LTO_SEARCH_PRIOR: another prior file (benchmarks/first_minute.py orders each model's run by the
# other models' results).
PRIOR_ENV = "LTO_SEARCH_PRIOR"
# $LTO_HISTORY: the history file, or "off" for none (the tests' default: their runs must not order
# each other's stages).
HISTORY_ENV = "LTO_HISTORY"
# What a stage with no record at all is assumed to offer: even odds of a small win, at a cost
# that puts it after every stage known to win here.
UNKNOWN_GAIN = 1.1
UNKNOWN_COST_S = 60.0
# A stage never seen to win may still: its gain when it does is taken as this.
NEVER_WON_GAIN = 1.1
# How far one model's gain from a stage may lie from the stage's corpus figure (the sd of ln G):
# the corpus winners' speedups for one stage spread about this much between models.
GAIN_SPREAD = 0.35
# Under the default time budget, a stage whose expected gain over the best so far is below this
# (1% as a log-ratio) is not run.
MIN_EXPECTED_GAIN = math.log(1.01)
ORDERS = ("gain", "recipe")
# A class with no rows of its own is ordered by the nearest class that has some, nearest first:
# what the two share decides which candidates lead (native bf16 of either kind, int8 dot products).
# Such odds only order the search: a stage never run here is still run (not_worth_reason).
NEAREST_CLASSES = {
    "bf16": ("amx", "vnni"),
    "amx": ("bf16", "vnni"),
    "vnni": ("bf16", "avx2"),
    "avx2": ("vnni",),
    "other": (),
}
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Odds:
    """What a stage is expected to bring, and from how much evidence."""

    stage: str
    tried: float  # runs in which it ran
    won: float  # runs in which its candidate was the artifact
    gain: float  # the artifact's speedup over ONNX Runtime defaults when it won (geometric mean)
    cost_s: float  # seconds it ran (median)
    source: str  # "corpus", "corpus + 3 runs here", "no record"
    runs_here: int = 0  # runs on this machine, for this kind of model, in which the stage ran

    @property
    def p_win(self) -> float:
        """Chance of winning, with half a win and half a loss added (no record: even odds)."""
        return (self.won + 0.5) / (self.tried + 1.0)

    def expected_gain(self, best: float = 1.0) -> float:
        """P(win) x E[max(0, ln(G / best))] for ln G ~ N(ln gain, GAIN_SPREAD^2): the expected
        log-improvement over the best so far (`best`: its speedup over ONNX Runtime defaults)."""
        margin = math.log(max(self.gain, 1e-9)) - math.log(max(best, 1e-9))
        d = margin / GAIN_SPREAD
        improvement = GAIN_SPREAD * _NORMAL.pdf(d) + margin * _NORMAL.cdf(d)
        return self.p_win * max(improvement, 0.0)

    def value_per_s(self, best: float = 1.0) -> float:
        """Expected gain over the best so far per second of search."""
        return self.expected_gain(best) / max(self.cost_s, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "value_per_s": round(self.value_per_s(), 6),
            "p_win": round(self.p_win, 3),
            "gain": round(self.gain, 3),
            "cost_s": round(self.cost_s, 1),
            "tried": self.tried,
            "won": self.won,
            "source": self.source,
        }


@dataclass(frozen=True)
class StageRun:
    """What one stage did in one finished run (a line of the history)."""

    kind: str
    cpu: str
    stage: str
    ran_s: float
    won: bool
    gain: float | None  # the artifact's speedup when this stage won
    # Every candidate it measured: its speedup over ONNX Runtime defaults and its verdict (kept,
    # slower, inaccurate, unverified, failed). A history that kept wins only forgot that a stage's
    # candidate was the fastest of the run but could not be verified on the rows given.
    measured: tuple[tuple[str, float | None, str], ...] = ()
    # The speedup of its fastest unverified candidate when that beat what shipped: a win the data
    # could not confirm, which must not count against the stage.
    unverified_gain: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "cpu": self.cpu, "stage": self.stage, "ran_s": round(self.ran_s, 1),
                "won": self.won, "gain": self.gain,
                "measured": [{"label": label, "speedup": None if speedup is None else round(speedup, 4),
                              "verdict": verdict} for label, speedup, verdict in self.measured],
                "unverified_gain": self.unverified_gain}  # fmt: skip


def stage_runs(record: RunRecord, cpu: str, winner: str | None, shipped_speedup: float) -> list[StageRun]:
    """What each stage that measured or failed did in a finished run, for the history: whether it
    won (`winner`: the stage whose candidate ships, None when the original does) and every
    candidate it measured with its speedup and verdict."""
    ran = {r.stage for r in record.records if r.status not in (Status.SKIPPED, Status.BASELINE)}
    runs = []
    for name, seconds in record.stage_seconds.items():
        if name not in ran:
            continue
        rows = [r for r in record.records if r.stage == name and r.status != Status.SKIPPED]
        measured = tuple((r.label, r.speedup, r.outcome().value) for r in rows)
        unverified = [r.speedup for r in rows if r.status == Status.UNVERIFIED and r.speedup]
        fastest = max(unverified, default=None)
        won = name == winner
        runs.append(
            StageRun(
                kind=record.model_kind,
                cpu=cpu,
                stage=name,
                ran_s=seconds,
                won=won,
                gain=shipped_speedup if won else None,
                measured=measured,
                unverified_gain=fastest if fastest is not None and fastest > shipped_speedup else None,
            )
        )
    return runs


def load_priors(path: Path | None = None) -> list[dict[str, Any]]:
    """The corpus prior's rows ([[stage]] tables: kind, cpu, stage, tried, won, gain, cost_s)."""
    configured = os.environ.get(PRIOR_ENV)
    source = path or (Path(configured) if configured else recipes_dir() / PRIORS_FILE)
    if not source.is_file():
        return []
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{source}: the search prior cannot be read: {exc}") from None
    rows = data.get("stage", [])
    for i, row in enumerate(rows):
        missing = {"kind", "cpu", "stage", "tried", "won", "gain", "cost_s"} - set(row)
        if missing:
            raise UsageError(f"{source}: stage[{i}] lacks {', '.join(sorted(missing))}")
    return list(rows)


def history_path() -> Path | None:
    """Where this machine's history lives (None: $LTO_HISTORY=off)."""
    configured = os.environ.get(HISTORY_ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("off", "none", "") else Path(configured)
    return cache_root() / "history.jsonl"


def read_history(path: Path | None, fingerprint: str) -> list[dict[str, Any]]:
    """This machine's lines of the history (a damaged line is skipped: it is a cache). A line with
    no `measured` list was written by an lto that recorded wins only: its loss may have been a
    fastest candidate the rows could not verify, so it is not evidence against the stage (such
    lines made a demo skip the int8 stage that ships on this machine)."""
    if path is None or not path.is_file():
        return []
    rows: list[dict[str, Any]] = []
    with contextlib.suppress(OSError), path.open(encoding="utf-8") as fh:
        for line in fh:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict) and row.get("fingerprint") == fingerprint and "measured" in row:
                    rows.append(row)
    return rows


def append_history(path: Path | None, fingerprint: str, runs: Iterable[StageRun]) -> None:
    """Add a finished run's outcomes, one line each, in one write (lines from concurrent runs
    do not interleave: O_APPEND writes of a few hundred bytes land whole)."""
    if path is None:
        return
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = "".join(
        json.dumps({"at": stamp, "fingerprint": fingerprint, **run.to_json()}) + "\n" for run in runs
    )
    if not text:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(text)


def odds_for(
    stage: str, kind: str, cpu: str, priors: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]
) -> Odds:
    """The prior for (kind, cpu, stage), else the stage's rows on this machine class for any kind,
    else the same from the nearest class that has rows (NEAREST_CLASSES); with this machine's runs
    of the same kind and stage added."""
    rows: list[Mapping[str, Any]] = []
    where = "corpus"
    for row_cpu in (cpu, *NEAREST_CLASSES.get(cpu, ())):
        same = [r for r in priors if r["stage"] == stage and r["cpu"] == row_cpu]
        rows = [r for r in same if r["kind"] == kind] or same
        if rows:
            kinds = "" if rows[0]["kind"] == kind else ", other kinds"
            where = f"corpus{kinds}" if row_cpu == cpu else f"corpus, {row_cpu} machines{kinds}"
            break
    tried = sum(float(r["tried"]) for r in rows)
    won = sum(float(r["won"]) for r in rows)
    log_gain = sum(float(r["won"]) * math.log(max(float(r["gain"]), 1e-9)) for r in rows)
    costs = [float(r["cost_s"]) for r in rows]
    here = [h for h in history if h.get("stage") == stage and h.get("kind") == kind and h.get("cpu") == cpu]
    for h in here:
        tried += 1
        costs.append(float(h.get("ran_s") or 0.0))
        # A candidate faster than what shipped that the rows could not verify counts as the win
        # it may be: given rows that can tell, the next run should try the stage first.
        gain = h.get("gain") if h.get("won") else h.get("unverified_gain")
        if gain:
            won += 1
            log_gain += math.log(max(float(gain), 1e-9))
    if not rows and not here:
        return Odds(stage, 0.0, 0.0, UNKNOWN_GAIN, UNKNOWN_COST_S, "no record")
    gain = math.exp(log_gain / won) if won else NEVER_WON_GAIN
    source = where if rows else ""
    if here:
        source = f"{source} + {len(here)} run(s) here" if source else f"{len(here)} run(s) here"
    cost = statistics.median(costs) if costs else UNKNOWN_COST_S
    return Odds(stage, tried, won, gain, cost, source, runs_here=len(here))


def plan(
    stages: Sequence[StageSpec],
    kind: str,
    cpu: str,
    order: str = "gain",
    priors: Sequence[Mapping[str, Any]] | None = None,
    history: Sequence[Mapping[str, Any]] = (),
) -> list[tuple[StageSpec, Odds]]:
    """The recipe's stages in the order they run, each with its odds. `order` "recipe" keeps the
    recipe's order (the odds are still reported)."""
    rows = load_priors() if priors is None else priors
    scored = [(spec, odds_for(spec.name, kind, cpu, rows, history)) for spec in stages]
    if order == "recipe":
        return scored
    if order != "gain":
        raise UsageError(f"--search-order {order!r}", f"choose one of: {', '.join(ORDERS)}")
    return rank(scored, best=1.0)


def rank(planned: Sequence[tuple[StageSpec, Odds]], best: float) -> list[tuple[StageSpec, Odds]]:
    """The stages by expected gain per second over a best at `best`x, the given order breaking ties."""
    position = {spec.name: i for i, (spec, _) in enumerate(planned)}
    return sorted(planned, key=lambda item: (-item[1].value_per_s(best), position[item[0].name]))


def not_worth_reason(odds: Odds, best: float) -> str:
    """Why, under the default time budget, a stage is not run ("" when it is). A stage never run
    here on this kind of model is run: the corpus prior was measured on another machine, whose
    CPU class may hide what this one does (AMX bf16 against Zen 4's vector bf16)."""
    if odds.runs_here == 0:
        return ""
    expected = odds.expected_gain(best)
    if expected >= MIN_EXPECTED_GAIN:
        return ""
    record = f"won {odds.won:g} of {odds.tried:g} ({odds.source})" if odds.tried else odds.source
    when = f", by {odds.gain:.2f}x when it won" if odds.won else ""
    return (
        f"expected gain over the best so far ({best:.2f}x) {math.expm1(expected):.1%}, under "
        f"{math.expm1(MIN_EXPECTED_GAIN):.0%}: {record}{when}; --time-budget none runs every stage"
    )


def plan_line(planned: Sequence[tuple[StageSpec, Odds]], kind: str, cpu: str) -> str:
    """One log line: the order, with each stage's expected gain per second."""
    parts = [f"{spec.name} {odds.value_per_s() * 1000:.2f}" for spec, odds in planned if spec.enabled]
    return f"search order for a {kind} model on a {cpu} CPU (expected gain per 1000 s): " + ", ".join(parts)


__all__ = [
    "HISTORY_ENV",
    "ORDERS",
    "Odds",
    "StageRun",
    "append_history",
    "history_path",
    "load_priors",
    "not_worth_reason",
    "odds_for",
    "plan",
    "plan_line",
    "rank",
    "read_history",
    "stage_runs",
]
