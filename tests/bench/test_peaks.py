"""The machine's measured arithmetic rates and the prior class they place it in (optimize.bench.peaks)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from optimize.bench import peaks
from optimize.bench.peaks import Peaks, machine_class
from optimize.pipeline import order
from optimize.system.env import MACHINE_CLASSES, cpu_class, cpu_isa_flags, has_bf16_isa


def _peaks(fp32: float, int8: float | None, bf16: float | None) -> Peaks:
    return Peaks(fp32, int8, bf16, 2, "2026-12-06T00:00:00Z")


def test_measured_rates_tell_a_matrix_engine_from_vector_bf16_and_dot_products() -> None:
    avx512 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
    # An AMX Xeon and a Zen 4 report the same bf16 flag (a Xeon has amx_bf16 too); their rates differ.
    assert machine_class(avx512 | {"amx_bf16"}, _peaks(100.0, 700.0, 900.0)) == "amx"
    assert machine_class(avx512, _peaks(190.0, 810.0, 390.0)) == "bf16"  # Zen 4, 2 threads
    # A Zen 4 whose fp32 was timed in a half-speed phase (a CI clone, 2026-12-06): bf16 read 3.1x
    # fp32, but without AMX in its flags it is no matrix engine.
    assert machine_class(avx512, _peaks(102.4, 409.7, 316.9)) == "bf16"
    assert machine_class({"avx2", "avx512_vnni"}, _peaks(100.0, 420.0, None)) == "vnni"
    assert machine_class({"avx2"}, _peaks(150.0, 290.0, None)) == "avx2"  # Zen 3: no dot products
    assert machine_class({"asimd"}, _peaks(50.0, 60.0, None)) == "other"
    rates = [(i8, b) for i8 in (100.0, 400.0) for b in (None, 150.0, 400.0)]
    every = [machine_class(avx512, _peaks(100.0, i8, b)) for i8, b in rates]
    assert set(every) <= set(MACHINE_CLASSES)
    # bf16 flags whose bf16 runs no faster than fp32 are not placed with the bf16 machines.
    assert machine_class(avx512, _peaks(190.0, 810.0, 200.0)) == "vnni"
    # Not measured: the ISA flags decide, and they tell AMX from vector bf16 too.
    assert machine_class(avx512 | {"amx_bf16"}, None) == cpu_class(avx512 | {"amx_bf16"}) == "amx"
    assert machine_class(avx512, None) == "bf16"


@pytest.mark.slow
def test_rates_are_measured_once_per_machine_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LTO_PEAKS", "on")
    assert not peaks.cached()
    first = peaks.machine_peaks()
    assert first is not None and first.fp32 > 1.0 and first.int8 is not None and first.int8 > 1.0
    if not has_bf16_isa(cpu_isa_flags()):
        assert first.bf16 is None  # no native bf16: nothing to measure
    elif importlib.util.find_spec("openvino") is not None:
        assert first.bf16 is not None and first.bf16 > 1.0
    assert peaks.cached() and (tmp_path / peaks.CACHE_NAME).is_file()

    def no_measuring(*args: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(peaks, "measure", no_measuring)
    assert peaks.machine_peaks() == first
    monkeypatch.setenv("LTO_PEAKS", "off")
    assert peaks.machine_peaks() is None and peaks.cached()


def test_every_prior_row_names_the_machine_that_measured_it() -> None:
    rows = order.load_priors()
    assert rows
    for row in rows:
        assert row.get("machine"), row
        # The AMX Xeon's rows are filed under amx, not with vector-bf16 machines.
        assert ("AMX" in row["machine"]) == (row["cpu"] == "amx"), row


def test_efficiency_is_the_model_rate_beside_the_rate_of_its_main_precision() -> None:
    zen4 = _peaks(200.0, 800.0, 340.0)
    eff = peaks.efficiency(2_000_000_000, 5.0, "int8+bf16", zen4)  # 2 GFLOP in 5 ms: 400 G ops/s
    assert eff["achieved_gops"] == 400.0 and eff["peak_precision"] == "int8" and eff["peak_gops"] == 800.0
    assert eff["share_of_peak"] == 0.5
    assert peaks.efficiency(2_000_000_000, 5.0, "fp32", zen4)["share_of_peak"] == 2.0
    assert peaks.efficiency(2_000_000_000, 5.0, "bf16", _peaks(200.0, 800.0, None))["share_of_peak"] is None


def test_a_run_reports_the_artifacts_rate_against_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimize.render.optimize_section import render_markdown_section
    from tests.pipeline.test_pipeline import FakeStage, model_candidate, run_fake

    monkeypatch.setattr(peaks, "machine_peaks", lambda **_: _peaks(100.0, 300.0, None))
    result, _ = run_fake(tmp_path, {"fake-fast": FakeStage(model_candidate("fake-fast"))}, {"fake-fast": 0.5})
    section = result.report["optimize"]
    eff = section["efficiency"]
    assert section["search"]["machine_rates_gops"]["fp32"] == 100.0
    assert eff["peak_precision"] == "fp32" and eff["peak_gops"] == 100.0 and eff["model_flops"] > 0
    assert eff["latency_ms"] == section["target"]["best_ms"]  # the artifact's own figure
    rate = eff["model_flops"] / eff["latency_ms"] / 1e6
    assert eff["achieved_gops"] == pytest.approx(rate, abs=0.06) and eff["share_of_peak"] == pytest.approx(
        rate / 100.0, abs=1e-3
    )
    assert "- efficiency: " in render_markdown_section(section)


def test_each_rate_is_the_best_of_its_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # One Zen 4's processes, 2026-12-06: OpenVINO's bf16 alone read 260.6 in one (bf16/fp32 1.25,
    # the vnni class) and over 330 in the others. A process that fails adds nothing.
    readings = iter([_peaks(207.6, 719.2, 260.6), None, _peaks(199.5, 676.6, 338.7)])
    monkeypatch.setattr(peaks, "_measure_once", lambda threads: next(readings))
    best = peaks.measure(2)
    assert best is not None and (best.fp32, best.int8, best.bf16) == (207.6, 719.2, 338.7)
    assert machine_class({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, best) == "bf16"
    monkeypatch.setattr(peaks, "_measure_once", lambda threads: None)
    assert peaks.measure(2) is None
