"""The serving-configuration search: each configuration served for real and searched for its highest
rate within the SLO, the best kept beside the artifact, and `lto serve --artifact` using it for the
flags not given (on this machine only)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from optimize.serve import config_search
from optimize.serve.config_search import (
    SERVING_FILE,
    ServeConfig,
    read_serving,
    search_config,
    searched_defaults,
)
from optimize.serve.loadgen import LoadSettings, find_max_qps, run_load
from optimize.system.env import machine_fingerprint
from tests.cli_helpers import run_cli
from tests.serve.helpers import write_matmul_artifact


def _write_serving(art: Path, chosen: ServeConfig, max_qps: float) -> None:
    data = {"config": chosen.to_json(), "slo_ms": 15.0, "max_qps": max_qps,
            "machine": {"fingerprint": machine_fingerprint()}}  # fmt: skip
    (art / SERVING_FILE).write_text(json.dumps(data))


@pytest.mark.slow
def test_the_search_serves_each_configuration_and_keeps_the_one_that_carries_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = write_matmul_artifact(tmp_path)
    # Two values of one setting, lto's own short open loop: what is tested is the search's bookkeeping.
    monkeypatch.setattr(config_search, "dimensions", lambda cores: [("max_batch", [1, 32])])
    started: list[list[str]] = []

    def starter(artifact: Path, flags: list[str]):  # type: ignore[no-untyped-def]
        started.append(flags)
        return config_search.start_server(artifact, flags)

    settings = LoadSettings(duration_s=0.3, min_queries=30, warmup=0, slo_ms=10_000.0, percentile=90.0)
    rows = [{"x": np.ones((1, 16), np.float32)}]
    found = asyncio.run(search_config(art, rows, settings, run_load, starter=starter, cores=2))
    labels = [t.config for t in found.tried]
    # max_batch 32 is the default: served once, unless max_batch 1 earned a rematch beside it.
    assert labels[:2] == [ServeConfig(), ServeConfig(max_batch=1)]
    assert len(started) == len(found.tried) and all("--max-batch" in flags for flags in started)
    assert found.tried[0].search.max_qps and found.tried[0].search.max_qps > 0
    assert found.best in {t.config for t in found.tried}
    rematched = [t for t in found.tried if t.role == "rematch"]
    assert len(rematched) in (0, 2)
    if found.best != ServeConfig():  # kept only after winning its rematch
        assert [t.config for t in rematched] == [ServeConfig(), ServeConfig(max_batch=1)]

    path = config_search.write_serving(art, found, {"fingerprint": machine_fingerprint()})
    data = json.loads(path.read_text())
    assert data["config"] == found.best.to_json() and len(data["tried"]) == len(found.tried)
    assert data["slo_ms"] == 10_000.0 and data["max_qps"] == found.best_qps()


def _fake_measure(rates: dict[ServeConfig, list[float | None]], log: list[tuple]):  # type: ignore[no-untyped-def]
    """A `measure` that serves nothing: each configuration's rates in the order it is served, a
    rate under the lowest one worth trying read as no answer (as find_max_qps stops there)."""

    async def measure(config: ServeConfig, start, lowest, role):  # type: ignore[no-untyped-def]
        log.append((config, start, lowest, role))
        qps = rates[config].pop(0)
        if qps is not None and lowest is not None and qps < lowest:
            qps = None
        return config_search.Tried(config, config_search.MaxQpsSearch(qps, []), role)

    return measure


def test_a_value_that_wins_once_but_loses_its_rematch_is_not_kept() -> None:
    default, small = ServeConfig(), ServeConfig(max_batch=1)
    log: list[tuple] = []
    rates = {default: [100.0, 100.0], small: [150.0, 104.0]}  # a lucky first search
    best = asyncio.run(config_search.choose_config(_fake_measure(rates, log), [("max_batch", [1, 32])]))
    assert best == default
    assert [(c, role) for c, _, _, role in log] == [
        (default, "search"),
        (small, "search"),
        (default, "rematch"),
        (small, "rematch"),
    ]


def test_a_value_that_wins_twice_is_kept_and_the_next_is_judged_against_its_rematch_rate() -> None:
    default, small = ServeConfig(), ServeConfig(max_batch=1)
    small_waits = ServeConfig(max_batch=1, max_wait_ms=4.0)
    log: list[tuple] = []
    rates = {default: [100.0, 98.0], small: [150.0, 140.0], small_waits: [150.0],
             ServeConfig(max_batch=1, max_wait_ms=0.0): [None]}  # fmt: skip
    dims = [("max_batch", [1, 32]), ("max_wait_ms", [0.0, 1.0, 4.0])]
    best = asyncio.run(config_search.choose_config(_fake_measure(rates, log), dims))
    assert best == small
    # Later values start at the winner's rematch rate raised by MIN_GAIN, and are not searched
    # below it: 150 is under 140 x 1.1 = 154, so max_wait 4 ms does not replace it.
    later = [(c, start, lowest) for c, start, lowest, role in log[4:]]
    bar = pytest.approx(140.0 * (1 + config_search.MIN_GAIN))
    assert later == [(ServeConfig(max_batch=1, max_wait_ms=0.0), bar, bar), (small_waits, bar, bar)]


class _FailingResult:
    def verdict(self) -> dict[str, bool]:
        return {"passed": False}


def test_the_rate_search_stops_at_the_lowest_rate_worth_trying() -> None:
    from_rates: list[float] = []

    class Refuses:
        pass

    async def run(target: object, step: LoadSettings):  # type: ignore[no-untyped-def]
        from_rates.append(step.qps)
        return _FailingResult()

    settings = LoadSettings(duration_s=0.1, warmup=0, slo_ms=5.0, percentile=99.0)
    found = asyncio.run(find_max_qps(Refuses(), settings, start_qps=400.0, run=run, min_qps=400.0))
    assert found.max_qps is None and from_rates == [400.0]
    from_rates.clear()
    found = asyncio.run(find_max_qps(Refuses(), settings, start_qps=400.0, run=run))
    assert found.max_qps is None and from_rates == [400.0, 200.0, 100.0, 50.0, 25.0]


def test_serve_takes_the_searched_settings_for_flags_not_given_and_only_on_this_machine(
    tmp_path: Path,
) -> None:
    art = tmp_path / "art"
    art.mkdir()
    chosen = ServeConfig(max_batch=8, max_wait_ms=0.0, instances=1, busy_poll_us=0.0)
    _write_serving(art, chosen, 812.0)
    taken, notes = searched_defaults(art, {"max_batch"}, machine_fingerprint())
    assert "max_batch" not in taken and taken["max_wait_ms"] == 0.0 and taken["busy_poll_us"] == 0.0
    assert notes and "812/s within p99 15 ms" in notes[0] and "max-wait-ms 0" in notes[0]
    other, why = read_serving(art, "another-machine")
    assert other is None and why is not None and "another machine" in why
    (art / SERVING_FILE).write_text("{not json")
    broken, why = read_serving(art, machine_fingerprint())
    assert broken is None and why is not None and "ignored" in why


@pytest.mark.slow
def test_lto_serve_says_it_uses_the_searched_configuration(tmp_path: Path) -> None:
    art = write_matmul_artifact(tmp_path)
    chosen = ServeConfig(max_batch=4, max_wait_ms=0.0)
    _write_serving(art, chosen, 500.0)
    proc = run_cli("serve", "--artifact", art, "--port", "0", "--validate", "--requests", "50", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "using the serving configuration searched on this machine" in proc.stdout
    assert "max batch 4" in proc.stdout  # the server's own line: the searched value is in force
