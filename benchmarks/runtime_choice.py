"""ONNX Runtime against OpenVINO on the real-model corpus, and whether lto picks the faster one.

For each corpus entry (corpus), on one draw of realistic samples split into disjoint sets
(the bench input, the user's 32 rows, fresh rows for the task metric), as in
benchmarks/corpus_speedups.py:

1. `lto optimize MODEL --calib-data ROWS.npz --runtime R` three times, through the real CLI, the way
   users run it (no --eval-data: lto splits the rows; `--with-eval` adds a separate evaluation set):
   R = onnxruntime (ORT-best), openvino (OpenVINO-best) and auto (lto's choice between them);
2. in this process, with lto's own engine (optimize.bench.compare), each artifact interleaved with
   the original on ONNX Runtime defaults: speedup with its 95% CI;
3. lto's choice interleaved directly with the faster of ORT-best and OpenVINO-best: the ratio
   says whether the choice is slower than the better runtime by more than the noise;
4. each artifact's task metric against the original, on the fresh samples;
5. every side once more *alone*: `lto bench` in a process of its own, the sides taking turns for
   `--alone-rounds` rounds (order rotated), speedup = median p50 of ORT defaults / median p50 of the
   artifact. Interleaving two runtimes in one process is not neutral: a thread pool that spins after
   its chunk (ONNX Runtime's by default, OpenVINO's TBB workers) takes the cores from the other
   side's next runs, so the alone figures are the check on every cross-runtime ratio.

    nice -n 5 .venv/bin/python -m benchmarks.runtime_choice [NAMES...] [--time 3]

Prints a Markdown table and writes it, with the rows as JSON, to reports/runtime-choice.{md,json};
lto's output per run goes to reports/runtime-choice/<name>-<runtime>.log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.corpus_speedups import alone_speedups, lto_command, one_line_error
from corpus import ENTRIES, CorpusError, Entry
from corpus.data import Feed, write_calib_npz, write_input_npz

ROOT = Path(__file__).resolve().parent.parent

RUNTIMES = ("onnxruntime", "openvino", "auto")
COLUMNS = {"onnxruntime": "ORT-best", "openvino": "OpenVINO-best", "auto": "lto's choice"}


@dataclass
class Result:
    """One artifact of one model: what lto picked and what it gives."""

    runtime: str
    pick: str = ""
    backend: str = ""
    precision: str = ""
    precision_hint: str = ""
    speedup: float | None = None
    speedup_ci95: tuple[float, float] | None = None
    alone_p50_ms: list[float] = field(default_factory=list)
    alone_speedup: float | None = None
    metric_score: float | None = None
    metric_passed: bool | None = None
    optimize_s: float | None = None
    error: str = ""


@dataclass
class Row:
    model: str
    metric_name: str = ""
    ort_default_p50_ms: float | None = None
    ort_default_alone_p50_ms: list[float] = field(default_factory=list)
    results: dict[str, Result] = field(default_factory=dict)
    # lto's choice / the faster single-runtime artifact, interleaved: > 1 means the choice is slower.
    choice_vs_better: float | None = None
    choice_vs_better_ci95: tuple[float, float] | None = None
    better: str = ""
    error: str = ""


def optimize(
    entry: Entry, model: Path, data: dict[str, Path], runtime: str, art: Path, log: Path, budget: str | None
) -> tuple[dict[str, Any] | None, str]:
    cmd = [*lto_command(), "optimize", str(model), *entry.lto_args(), "--runtime", runtime]
    for flag, path in data.items():
        cmd += [flag, str(path)]
    cmd += ["-o", str(art), "--force", "--json"]
    if budget:
        cmd += ["--time-budget", budget]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    with log.open("w") as fh:
        fh.write(f"$ {' '.join(cmd)}\n# exit {proc.returncode}\n\n{proc.stderr}\n{proc.stdout}\n")
    if proc.returncode not in (0, 3, 4):  # 3: target missed, 4: faster candidates unverified
        return None, one_line_error(proc.stderr, proc.returncode)
    try:
        return json.loads(proc.stdout), ""
    except json.JSONDecodeError:
        return None, "lto optimize --json printed no JSON report"


def _settings(max_time_s: float) -> Any:
    from optimize.bench import BenchSettings

    return BenchSettings(warmup=10, min_runs=50, max_runs=100_000, max_time_s=max_time_s, target_ci_rel=0.01)


def measure(entry: Entry, model: Path, arts: dict[str, Path], bench: Feed, fresh: list[Feed], row: Row,
            max_time_s: float) -> None:  # fmt: skip
    from optimize.artifact import resolve_model
    from optimize.bench import compare
    from optimize.runtimes.backends import open_backend, open_model

    settings = _settings(max_time_s)
    base = open_backend("onnxruntime", model, {})
    try:
        reference = [base.run(s) for s in fresh]
        for runtime, art in arts.items():
            result = row.results[runtime]
            backend = open_model(resolve_model(art))
            try:
                comparison = compare(base, backend, bench, bench, settings, labels=("ort-default", runtime))
                candidate = [backend.run(s) for s in fresh]
            finally:
                backend.close()
            lo, hi = comparison.ratio_ci95
            result.speedup, result.speedup_ci95 = 1.0 / comparison.ratio, (1.0 / hi, 1.0 / lo)
            row.ort_default_p50_ms = row.ort_default_p50_ms or comparison.a.latency["p50"]
            score, passed, _ = entry.metric(reference, candidate, fresh)
            result.metric_score, result.metric_passed = score, passed
    finally:
        base.close()
    singles = [r for r in ("onnxruntime", "openvino") if row.results[r].speedup is not None]
    if "auto" not in arts or not singles:
        return
    row.better = max(singles, key=lambda r: row.results[r].speedup or 0.0)
    better = open_model(resolve_model(arts[row.better]))
    choice = open_model(resolve_model(arts["auto"]))
    try:
        comparison = compare(better, choice, bench, bench, settings, labels=(row.better, "auto"))
    finally:
        better.close()
        choice.close()
    row.choice_vs_better, row.choice_vs_better_ci95 = comparison.ratio, tuple(comparison.ratio_ci95)


def measure_alone(
    model: Path, arts: dict[str, Path], inputs: Path, row: Row, rounds: int, seconds: float
) -> None:
    row.ort_default_alone_p50_ms, sides = alone_speedups(model, arts, inputs, rounds, seconds)
    for runtime, (p50s, speedup) in sides.items():
        row.results[runtime].alone_p50_ms, row.results[runtime].alone_speedup = p50s, speedup


def run_entry(entry: Entry, work: Path, logs: Path, args: argparse.Namespace) -> Row:
    row = Row(entry.name, metric_name=entry.metric_name)
    try:
        model = entry.model_path()
        c, e = args.calib_samples, args.lto_eval_samples
        samples = entry.make_inputs(1 + c + e + args.eval_samples, args.seed)
    except (CorpusError, ImportError, OSError) as exc:
        row.error = f"corpus: {exc}"
        return row
    bench, calib, lto_eval, fresh = (
        samples[0],
        samples[1 : 1 + c],
        samples[1 + c : 1 + c + e],
        samples[1 + c + e :],
    )
    # The user's path: calibration rows only, which lto splits into calibration and judging rows;
    # --with-eval gives it a separate evaluation set as well.
    data = {"--calib-data": write_calib_npz(calib, work / f"{entry.name}.calib.npz")}
    if args.with_eval:
        data["--eval-data"] = write_calib_npz(lto_eval, work / f"{entry.name}.eval.npz")
    write_input_npz(bench, work / f"{entry.name}.input.npz")
    arts: dict[str, Path] = {}
    for runtime in RUNTIMES:
        result = row.results[runtime] = Result(runtime)
        art = work / f"{entry.name}-{runtime}"
        print(f"[{entry.name}] lto optimize --runtime {runtime} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        report, error = optimize(entry, model, data, runtime, art, logs / f"{entry.name}-{runtime}.log",
                                 args.time_budget)  # fmt: skip
        result.optimize_s = round(time.monotonic() - t0, 1)
        if report is None:
            result.error = error
            continue
        best = report["optimize"]["best"]
        result.pick, result.backend, result.precision = best["label"], best["backend"], best["precision"]
        result.precision_hint = str(best.get("runtime_config", {}).get("INFERENCE_PRECISION_HINT", ""))
        arts[runtime] = art
    print(f"[{entry.name}] measuring side by side ...", file=sys.stderr, flush=True)
    try:
        measure(entry, model, arts, bench, fresh, row, args.time)
        if args.alone_rounds:
            print(f"[{entry.name}] measuring each alone ...", file=sys.stderr, flush=True)
            measure_alone(model, arts, work / f"{entry.name}.input.npz", row, args.alone_rounds, args.time)
    except Exception as exc:  # one model's failure is a row, not the end of the run
        row.error = f"measuring: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def _cell(result: Result | None, metric: str) -> str:
    if result is None:
        return "-"
    if result.error:
        return f"error: {result.error}"
    what = result.pick if result.backend != "openvino" else f"{result.pick}"
    if result.speedup is None or result.speedup_ci95 is None:
        return what
    lo, hi = result.speedup_ci95
    verdict = "pass" if result.metric_passed else "FAIL"
    score = "-" if result.metric_score is None else f"{result.metric_score:.4g}"
    if result.alone_speedup is not None:
        verdict += f"; alone {result.alone_speedup:.2f}x"
    return (
        f"**{result.speedup:.2f}x** ({lo:.2f}-{hi:.2f}) {what} [{result.backend}], {metric} {score} {verdict}"
    )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | ORT defaults p50 | ORT-best | OpenVINO-best | lto's choice | choice / better (95% CI) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error and not r.results:
            lines.append(f"| {r.model} | error: {r.error} | - | - | - | - |")
            continue
        base = "-" if r.ort_default_p50_ms is None else f"{r.ort_default_p50_ms:.3g} ms"
        if r.ort_default_alone_p50_ms:
            base += f" (alone {float(np.median(r.ort_default_alone_p50_ms)):.3g} ms)"
        cells = [_cell(r.results.get(rt), r.metric_name) for rt in RUNTIMES]
        if r.choice_vs_better is not None and r.choice_vs_better_ci95 is not None:
            lo, hi = r.choice_vs_better_ci95
            verdict = "slower" if lo > 1.0 else "faster" if hi < 1.0 else "within noise"
            versus = f"{r.choice_vs_better:.3f} ({lo:.3f}-{hi:.3f}) vs {COLUMNS[r.better]}: {verdict}"
        else:
            versus = f"error: {r.error}" if r.error else "-"
        lines.append("| " + " | ".join([r.model, base, *cells, versus]) + " |")
    lines += [
        "",
        "Each cell: speedup vs ONNX Runtime defaults interleaved in one process (95% CI), the artifact's "
        "pick [its runtime], the task metric on fresh samples, and the speedup with each side "
        "benchmarked alone in its own process (median p50 over the rounds).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"corpus entries (default: all of {', '.join(ENTRIES)})")
    parser.add_argument("--time", type=float, default=3.0, help="seconds per interleaved measurement")
    parser.add_argument("--calib-samples", type=int, default=32, help="samples in --calib-data")
    parser.add_argument(
        "--lto-eval-samples", type=int, default=16, help="samples in --eval-data (--with-eval)"
    )
    parser.add_argument("--with-eval", action="store_true", help="also give lto a separate --eval-data")
    parser.add_argument("--eval-samples", type=int, default=32, help="fresh samples for the task metric")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--alone-rounds", type=int, default=3, help="rounds of each side benchmarked alone (0: skip)"
    )
    parser.add_argument("--time-budget", default=None, help="passed to lto optimize --time-budget (e.g. 10m)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports" / "runtime-choice", help="report path stem"
    )
    parser.add_argument("--keep", action="store_true", help="keep the npz files and artifacts under OUT/work")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown entries {unknown}; known: {', '.join(ENTRIES)}")
    entries = [ENTRIES[n] for n in args.names] if args.names else list(ENTRIES.values())
    logs = args.out
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lto-runtime-choice-") as tmp:
        work = logs / "work" if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            rows.append(run_entry(entry, work, logs, args))
            print(markdown(rows[-1:]).splitlines()[2], file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    command = " ".join([".venv/bin/python -m benchmarks.runtime_choice", *(argv or sys.argv[1:])])
    md, js = args.out.with_suffix(".md"), args.out.with_suffix(".json")
    md.write_text(f"# ONNX Runtime vs OpenVINO, and lto's choice\n\n`{command}`\n\n{table}")
    js.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                              "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    print(f"wrote {md} and {js.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
