"""This machine's arithmetic rates, measured once and cached by machine fingerprint: what places the
machine in the search prior's classes (optimize/pipeline/order.py, docs/search-order.md).

ISA flags alone lump unlike machines together: an Intel Xeon with AMX and an AMD Zen 4 both report
bf16, yet AMX's bf16 is a matrix engine several times its fp32 rate while Zen 4's is a vector dot
product at about twice fp32 and half its int8 rate, and different candidates win on each. So the
rates the candidates will run at are measured: a square matrix product in fp32 and int8 through
ONNX Runtime (MatMul, MatMulInteger) and in bf16 through OpenVINO (where it is installed and the CPU
has native bf16), on the physical cores, in a child process of its own (one runtime's thread pool
never times the other's), three of them in turn, about seven seconds on first use.

$LTO_PEAKS=off skips the measurement (the class then comes from the ISA flags alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from optimize.files import cache_root, write_json_atomic
from optimize.system.env import cpu_class, cpu_isa_flags, has_bf16_isa, machine_fingerprint, physical_cores

PEAKS_ENV = "LTO_PEAKS"
CACHE_NAME = "machine-peaks.json"
SIZE = 512  # M = N = K: 268 M multiply-adds x 2, about 1.4 ms at fp32 on 2 Zen 4 threads
RUN_S = 0.6  # timed per precision, after a warm-up, in ROUNDS windows taken in turn
ROUNDS = 6
PROCESSES = 3  # child processes measured in turn; each rate is the best of them
CHILD_TIMEOUT_S = 90.0
# bf16 over fp32 at or above this is a matrix engine (AMX); between the two, vector bf16 (measured
# here 2026-12-06 on a Zen 4, 2 threads: fp32 ~205, int8 ~790, bf16 ~340 G ops/s; bf16/fp32 1.65).
MATRIX_BF16_RATIO = 3.0
VECTOR_BF16_RATIO = 1.3
# int8 over fp32 at or above this is a dot-product unit (VNNI: 3.9 on that Zen 4); AVX2's 16-bit
# multiply-adds give about 2.
DOT_INT8_RATIO = 3.0


@dataclass(frozen=True)
class Peaks:
    """Measured rates in G operations per second (a multiply-add counts 2); None: not measured."""

    fp32: float
    int8: float | None
    bf16: float | None
    threads: int
    measured_at: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rates(runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """G ops/s of each run (one SIZE^3 product): the best of ROUNDS short windows, the precisions
    taken in turn within each round. These VMs run at about half speed for seconds at a time; one
    precision timed whole inside such a phase would skew the ratios that place the machine (a
    fresh CI clone read fp32 at 102 G ops/s against 212 here, and bf16/fp32 3.1, the AMX class)."""
    for run in runs.values():
        for _ in range(3):
            run()
    best = dict.fromkeys(runs, 0.0)
    for _ in range(ROUNDS):
        for name, run in runs.items():
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < RUN_S / ROUNDS:
                run()
                count += 1
            best[name] = max(best[name], count * 2 * SIZE**3 / elapsed / 1e9)
    return best


def _ort_run(threads: int, integer: bool) -> Callable[[], object]:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    kind = TensorProto.UINT8 if integer else TensorProto.FLOAT
    weight = TensorProto.INT8 if integer else TensorProto.FLOAT
    out = TensorProto.INT32 if integer else TensorProto.FLOAT
    node = helper.make_node("MatMulInteger" if integer else "MatMul", ["a", "b"], ["c"])
    graph = helper.make_graph(
        [node],
        "peak",
        [
            helper.make_tensor_value_info("a", kind, [SIZE, SIZE]),
            helper.make_tensor_value_info("b", weight, [SIZE, SIZE]),
        ],
        [helper.make_tensor_value_info("c", out, [SIZE, SIZE])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # No spinning after a run: it would take the cores from the next precision's window.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    if integer:
        feeds = {
            "a": rng.integers(0, 255, (SIZE, SIZE), dtype=np.uint8),
            "b": rng.integers(-127, 127, (SIZE, SIZE), dtype=np.int8),
        }
    else:
        feeds = {n: rng.standard_normal((SIZE, SIZE)).astype(np.float32) for n in ("a", "b")}
    return lambda: session.run(None, feeds)


def _openvino_bf16_run(threads: int) -> Callable[[], object] | None:
    try:
        import numpy as np
        import openvino as ov
        import openvino.opset13 as ops
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    a = ops.parameter([SIZE, SIZE], np.float32, name="a")
    b = ops.constant(rng.standard_normal((SIZE, SIZE)).astype(np.float32))
    model = ov.Model([ops.matmul(a, b, False, False)], [a], "peak")
    config = {
        "INFERENCE_PRECISION_HINT": "bf16",
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    }
    request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
    feed = {"a": rng.standard_normal((SIZE, SIZE)).astype(np.float32)}
    return lambda: request.infer(feed)


def measure_here(threads: int) -> Peaks:
    """The rates, measured in this process (the child's job: see measure)."""
    runs = {"fp32": _ort_run(threads, integer=False), "int8": _ort_run(threads, integer=True)}
    bf16_run = _openvino_bf16_run(threads) if has_bf16_isa(cpu_isa_flags()) else None
    if bf16_run is not None:
        runs["bf16"] = bf16_run
    rates = _rates(runs)
    fp32, int8, bf16 = rates["fp32"], rates["int8"], rates.get("bf16")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Peaks(round(fp32, 1), round(int8, 1), None if bf16 is None else round(bf16, 1), threads, stamp)


def measure(threads: int | None = None) -> Peaks | None:
    """The rates, each the best of PROCESSES child processes; None when none succeeds (the ISA class
    then stands). OpenVINO's bf16 rate here swings by up to 1.5x from one process to the next
    (bf16/fp32 1.08 to 1.70 on one Zen 4, 2026-12-06), enough to drop a vector-bf16 machine under
    VECTOR_BF16_RATIO; a process's slow rate is its own, not the machine's."""
    threads = threads or physical_cores()
    found = [p for p in (_measure_once(threads) for _ in range(PROCESSES)) if p is not None]
    if not found:
        return None

    def best(rates: list[float | None]) -> float | None:
        known = [r for r in rates if r is not None]
        return max(known) if known else None

    fp32 = max(p.fp32 for p in found)
    int8, bf16 = best([p.int8 for p in found]), best([p.bf16 for p in found])
    return Peaks(fp32, int8, bf16, threads, found[-1].measured_at)


def _measure_once(threads: int) -> Peaks | None:
    """The rates, measured in one child process; None when that fails."""
    root = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); "
        f"from optimize.bench.peaks import _child; _child({threads})"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return Peaks(**data) if isinstance(data, dict) else None


def _child(threads: int) -> None:
    print(json.dumps(measure_here(threads).to_json()))


def _cache_path() -> Path:
    return cache_root() / CACHE_NAME


def _off() -> bool:
    return os.environ.get(PEAKS_ENV, "").strip().lower() in ("off", "0", "none")


def _read_cache() -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(_cache_path().read_text(encoding="utf-8"))
        return cached if isinstance(cached, dict) else {}
    return {}


def cached() -> bool:
    """Whether machine_peaks() answers without measuring."""
    return _off() or isinstance(_read_cache().get(machine_fingerprint()), dict)


def machine_peaks(announce: Callable[[], None] | None = None) -> Peaks | None:
    """This machine's rates: from the cache, else measured now (`announce` is called first: it
    takes some seconds) and cached; None when $LTO_PEAKS is off or the measurement failed."""
    if _off():
        return None
    fingerprint = machine_fingerprint()
    known = _read_cache()
    entry = known.get(fingerprint)
    if isinstance(entry, dict):
        with contextlib.suppress(TypeError):
            return Peaks(**entry)
    if announce is not None:
        announce()
    peaks = measure()
    if peaks is not None:
        with contextlib.suppress(OSError):
            _cache_path().parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(_cache_path(), {**known, fingerprint: peaks.to_json()})
    return peaks


def machine_class(flags: set[str], peaks: Peaks | None) -> str:
    """The prior's class for this machine: from the measured rates where they were measured (bf16
    as a matrix engine, bf16 as a vector unit, int8 dot products), else from the ISA flags."""
    if peaks is None:
        return cpu_class(flags)
    if peaks.bf16 is not None:
        ratio = peaks.bf16 / peaks.fp32
        # A matrix engine shows in the flags too: a high ratio without them is a measurement
        # skewed by the machine's phases, not AMX.
        if ratio >= MATRIX_BF16_RATIO and cpu_class(flags) == "amx":
            return "amx"
        if ratio >= VECTOR_BF16_RATIO:
            return "bf16"
    if peaks.int8 is not None and peaks.int8 / peaks.fp32 >= DOT_INT8_RATIO:
        return "vnni"
    return "avx2" if "avx2" in flags else "other"


def efficiency(flops: int, latency_ms: float, precision: str, peaks: Peaks) -> dict[str, Any]:
    """The artifact's arithmetic rate (the model's FLOPs per run over its latency) beside this
    machine's measured rate for its main precision (int8 for int8+bf16): how much headroom the
    kernels leave. Elementwise work counts in the FLOPs, so a model far from the product-bound
    case sits well below the peak whatever its runtime."""
    main = precision.partition("+")[0]
    peak = {"fp32": peaks.fp32, "int8": peaks.int8, "bf16": peaks.bf16}.get(main)
    achieved = flops / (latency_ms / 1e3) / 1e9
    return {
        "model_flops": flops,
        "latency_ms": latency_ms,
        "achieved_gops": float(f"{achieved:.4g}"),
        "peak_precision": main,
        "peak_gops": peak,
        "share_of_peak": float(f"{achieved / peak:.4g}") if peak else None,
    }


__all__ = ["Peaks", "cached", "efficiency", "machine_class", "machine_peaks", "measure", "measure_here"]
