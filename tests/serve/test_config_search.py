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
from optimize.serve.loadgen import LoadSettings, run_load
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
    assert labels == [ServeConfig(), ServeConfig(max_batch=1)]  # max_batch 32 is the default: served once
    assert len(started) == 2 and all("--max-batch" in flags for flags in started)
    assert all(t.search.max_qps and t.search.max_qps > 0 for t in found.tried)
    best = max(found.tried, key=lambda t: t.max_qps)
    assert found.best in {t.config for t in found.tried}
    # A value replaces the default only when it carries MIN_GAIN more.
    default_qps = found.tried[0].max_qps
    assert (found.best != ServeConfig()) == (best.max_qps > default_qps * (1 + config_search.MIN_GAIN))

    path = config_search.write_serving(art, found, {"fingerprint": machine_fingerprint()})
    data = json.loads(path.read_text())
    assert data["config"] == found.best.to_json() and len(data["tried"]) == 2 and data["slo_ms"] == 10_000.0


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
