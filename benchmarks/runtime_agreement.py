"""Does lto's side-by-side figure agree with each side timed alone in a process of its own?

For each corpus model (corpus) and each pair kind, side A is the original on ONNX
Runtime defaults and side B is:

    ort-int8   the model quantized by hand (static QDQ, as benchmarks/corpus_speedups.py does)
    ov-f32     OpenVINO, INFERENCE_PRECISION_HINT=f32
    ov-bf16    OpenVINO, bf16 (only where the CPU has native bf16)
    ov-int8    OpenVINO, the model quantized by NNCF on the same calibration rows
    no-spin    ONNX Runtime with intra-op spinning off

and three figures of B's speedup over A are printed:

    lto        optimize.bench.compare with each side in its own worker (what `lto optimize`, `lto bench
               --compare` and `lto gate --rerun` run), with its 95% CI;
    one-proc   the same engine with both sides in this process (the method before, for the record);
    alone      each side measured alone in a fresh process, the two taking turns `--alternations`
               times (order swapped each time): the median of the per-alternation p50 ratios.

    nice -n 5 .venv/bin/python -m benchmarks.runtime_agreement [NAMES...] [--pairs ov-f32,...]

With `--artifacts`, the check is on what users get instead: `lto optimize MODEL --calib-data ROWS`
(as `make demo` runs it, with lto's default --time-budget unless one is given), then the
artifact's headline speedup, `lto bench --artifact ART --compare MODEL`, and the two timed alone by
`lto bench` in fresh processes, alternated 5 times (median over median, as
benchmarks/corpus_speedups.py does). The table says whether the three agree within ±10%, or
names the modes (a side at two speeds) that keep them apart, and lto optimize's wall time
against its budget. `--budget-only` times lto optimize alone (e.g. with --time-budget 60s).

Prints a Markdown table and writes it, with the rows as JSON, to reports/runtime-agreement.{md,json}
(reports/artifact-agreement.{md,json} with --artifacts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corpus import ENTRIES, CorpusError
from corpus.data import Feed, read_calib_npz, write_calib_npz

ROOT = Path(__file__).resolve().parent.parent

PAIRS = ("ort-int8", "ov-f32", "ov-bf16", "ov-int8", "no-spin")
AGREE = 0.10  # the bound: lto's figure within ±10% of the alone figure


@dataclass
class Row:
    model: str
    pair: str
    lto: float | None = None
    lto_ci95: tuple[float, float] | None = None
    one_process: float | None = None
    alone: float | None = None
    alone_ratios: list[float] = field(default_factory=list)
    # p50s in ms, A then B: in lto's comparison, and alone (one pair per alternation)
    lto_p50_ms: tuple[float, float] | None = None
    alone_p50_ms: list[tuple[float, float]] = field(default_factory=list)
    isolation: dict[str, Any] | None = None
    error: str = ""

    def off(self, figure: float | None) -> float | None:
        return _off(figure, self.alone)


def side_b(pair: str, model: Path, calib: list[Feed], work: Path) -> tuple[str, Path, dict[str, Any]]:
    """(runtime, model file, runtime settings) of side B."""
    if pair == "ort-int8":
        from benchmarks.corpus_speedups import quantize_by_hand

        out = work / "int8.onnx"
        quantize_by_hand(model, calib, out)
        return "onnxruntime", out, {}
    if pair == "no-spin":
        return "onnxruntime", model, {"allow_spinning": False}
    if pair == "ov-f32":
        return "openvino", model, {"INFERENCE_PRECISION_HINT": "f32"}
    if pair == "ov-bf16":
        from optimize.runtimes.openvino.backend import has_bf16

        if not has_bf16():
            raise RuntimeError("no native bf16 on this CPU")
        return "openvino", model, {"INFERENCE_PRECISION_HINT": "bf16"}
    if pair == "ov-int8":
        import nncf
        import openvino as ov

        quantized = nncf.quantize(
            ov.Core().read_model(str(model)), nncf.Dataset(calib), subset_size=len(calib)
        )
        out = work / "ov-int8.xml"
        ov.save_model(quantized, str(out))
        return "openvino", out, {"INFERENCE_PRECISION_HINT": "f32"}
    raise ValueError(f"unknown pair {pair!r}")


def alone_p50(kind: str, path: Path, config: dict[str, Any], feed_file: Path, seconds: float) -> float:
    """p50 of one side measured by lto's engine in a fresh process where nothing else runs."""
    spec = json.dumps(
        {"kind": kind, "path": str(path), "config": config, "feeds": str(feed_file), "s": seconds}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.runtime_agreement", "--alone", spec],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["alone run failed"])[-1])
    return float(proc.stdout.strip().splitlines()[-1])


def _alone_child(spec_json: str) -> None:
    from optimize.bench import BenchSettings, measure
    from optimize.runtimes.backends import open_backend

    spec = json.loads(spec_json)
    # np.asarray: a 0-d input (silero's sample rate) reads back as a numpy scalar
    feeds = {name: np.asarray(v) for name, v in read_calib_npz(Path(spec["feeds"]))[0].items()}
    backend = open_backend(spec["kind"], spec["path"], spec["config"])
    try:
        settings = BenchSettings(warmup=10, min_runs=30, max_time_s=float(spec["s"]), target_ci_rel=0.01)
        print(measure(backend, feeds, settings).latency["p50"])
    finally:
        backend.close()


def measure_pair(row: Row, model: Path, feed: Feed, calib: list[Feed], args: argparse.Namespace) -> None:
    from optimize.bench import BenchSettings, compare
    from optimize.runtimes.backends import open_backend, open_in_worker

    with tempfile.TemporaryDirectory(prefix="lto-agree-") as tmp:
        work = Path(tmp)
        kind, path_b, config_b = side_b(row.pair, model, calib, work)
        feed_file = write_calib_npz([feed], work / "feed.npz")
        settings = BenchSettings(warmup=10, min_runs=30, max_runs=100_000, max_time_s=args.time)
        a, b = open_in_worker("onnxruntime", model, {}), open_in_worker(kind, path_b, config_b)
        try:
            result = compare(a, b, feed, feed, settings, ("A", "B"))
        finally:
            a.close()
            b.close()
        lo, hi = result.ratio_ci95
        row.lto, row.lto_ci95, row.isolation = 1.0 / result.ratio, (1.0 / hi, 1.0 / lo), result.isolation
        row.lto_p50_ms = (result.a.latency["p50"], result.b.latency["p50"])
        a, b = open_backend("onnxruntime", model, {}), open_backend(kind, path_b, config_b)
        try:
            row.one_process = 1.0 / compare(a, b, feed, feed, settings, ("A", "B")).ratio
        finally:
            a.close()
            b.close()
        for k in range(args.alternations):
            sides = [("onnxruntime", model, {}), (kind, path_b, config_b)]
            p50 = {}
            for index in (0, 1) if k % 2 == 0 else (1, 0):
                p50[index] = alone_p50(*sides[index], feed_file, args.alone_time)
            row.alone_ratios.append(p50[0] / p50[1])
            row.alone_p50_ms.append((p50[0], p50[1]))
        row.alone = float(np.median(row.alone_ratios))


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.1%}" if pct else f"{x:.2f}x"


def _off(figure: float | None, reference: float | None) -> float | None:
    """How far `figure` is from `reference`, as a fraction (None when either is missing)."""
    return None if figure is None or not reference else figure / reference - 1.0


def _with_ci(x: float | None, ci: tuple[float, float] | None) -> str:
    return f"{_fmt(x)} ({ci[0]:.2f}–{ci[1]:.2f})" if x is not None and ci else _fmt(x)


def table(rows: list[Row]) -> str:
    lines = [
        "| model | B | lto (95% CI) | one process | alone (median of alternations) | lto vs alone "
        "| one process vs alone | ORT's CPU after its block, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.model} | {r.pair} | {r.error} | | | | | |")
            continue
        spread = f" ({min(r.alone_ratios):.2f}–{max(r.alone_ratios):.2f})" if r.alone_ratios else ""
        spill = ((r.isolation or {}).get("cpu_after_own_block_ms") or {}).get("A") or {}
        spill_cell = f"{spill['median']:.0f} (max {spill['max']:.0f})" if spill else "–"
        lines.append(
            f"| {r.model} | {r.pair} | {_with_ci(r.lto, r.lto_ci95)} | {_fmt(r.one_process)} "
            f"| {_fmt(r.alone)}{spread} "
            f"| {_fmt(r.off(r.lto), True)} | {_fmt(r.off(r.one_process), True)} | {spill_cell} |"
        )
    within = [abs(r.off(r.lto) or 0.0) <= AGREE for r in rows if not r.error and r.alone]
    lines.append("")
    lines.append(f"lto within ±{AGREE:.0%} of alone: {sum(within)} of {len(within)} pairs")
    return "\n".join(lines)


@dataclass
class ArtifactRow:
    model: str
    pick: str = ""
    headline: float | None = None
    headline_ci95: tuple[float, float] | None = None
    headline_modes: str = ""  # what lto optimize said of a side at two speeds ("" for none)
    bench_compare: float | None = None
    bench_compare_ci95: tuple[float, float] | None = None
    bench_modes: str = ""
    alone: float | None = None
    alone_p50_ms: dict[str, list[float]] = field(default_factory=dict)
    alone_modes: str = ""  # a side whose alone p50s fell in two groups across the alternations
    budget_s: float | None = None  # the --time-budget (None: the default)
    wall_s: float | None = None  # lto optimize's wall time, process start to exit
    over_budget: dict[str, Any] | None = None  # the report's own account of an overrun
    exit_code: int | None = None
    error: str = ""

    def spread(self) -> float | None:
        """max / min of the three figures: 1.0 when they agree exactly."""
        figures = [f for f in (self.headline, self.bench_compare, self.alone) if f]
        return max(figures) / min(figures) if len(figures) == 3 else None

    def agreement(self) -> str:
        spread = self.spread()
        if spread is None:
            return ""
        if spread <= 1.0 + AGREE:
            return "agree"
        named = [m for m in (self.headline_modes, self.bench_modes, self.alone_modes) if m]
        return "modes named" if named else "DISAGREE"


def _two_groups(values: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """Two groups among a side's few alone p50s (one per fresh process): at least 2 values each,
    medians at least 15% apart, and the empty gap between them at least 30% of that distance."""
    ordered = sorted(values)
    best: tuple[float, int] | None = None
    for cut in range(2, len(ordered) - 1):
        low, high = np.log(ordered[:cut]), np.log(ordered[cut:])
        separation = float(np.median(high) - np.median(low))
        gap = float(high[0] - low[-1])
        if separation >= np.log(1.15) and gap >= 0.3 * separation and (best is None or gap > best[0]):
            best = (gap, cut)
    return None if best is None else (ordered[: best[1]], ordered[best[1] :])


def _alone_modes(p50s: dict[str, list[float]]) -> str:
    """Which side's alone p50s fell in two groups over the fresh processes, with both groups."""
    found = []
    for side, values in p50s.items():
        groups = _two_groups(values)
        if groups is not None:
            low, high = groups
            found.append(
                f"{side} alone at {np.median(low):.3g} ms in {len(low)} processes and "
                f"{np.median(high):.3g} ms in {len(high)}"
            )
    return "; ".join(found)


def _alone_spread(p50s: dict[str, list[float]]) -> tuple[float, float] | None:
    """The lowest and highest speedup over the alternations (original over artifact, each pair)."""
    base, art = p50s.get("original") or [], p50s.get("artifact") or []
    ratios = [b / a for b, a in zip(base, art, strict=False) if a > 0]
    return (min(ratios), max(ratios)) if ratios else None


def check_artifact(name: str, args: argparse.Namespace, work: Path) -> ArtifactRow:
    """lto optimize as a user runs it, then its headline against the other two figures."""
    from benchmarks.corpus_speedups import alone_speedups, lto_command, one_line_error
    from corpus.prepare import prepare
    from optimize.render.common import modes_sentence
    from optimize.units import parse_duration

    row = ArtifactRow(name)
    data = work / f"{name}-data"
    model = prepare(name, data)
    flags = (data / "args.txt").read_text().split()
    art = work / f"{name}-artifact"
    budget = ["--time-budget", args.time_budget] if args.time_budget else []
    row.budget_s = parse_duration(args.time_budget) if args.time_budget else 120.0
    cmd = [*lto_command(), "optimize", str(model), *flags, "--input-data", str(data / "input.npz"),
           "--calib-data", str(data / "calib.npz"), *budget, "-o", str(art), "--json"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    row.wall_s, row.exit_code = time.monotonic() - started, proc.returncode
    if proc.returncode not in (0, 3, 4):
        row.error = one_line_error(proc.stderr, proc.returncode)
        return row
    section = json.loads((art / "report.json").read_text())["optimize"]
    row.over_budget = section.get("over_budget")
    row.pick = f"{section['best']['label']} ({section['best']['backend']})"
    row.headline, row.headline_ci95 = float(section["speedup"]), tuple(section["speedup_ci95"])
    artifact_row = next((s for s in section["stages"] if s["label"] == section["best"]["label"]), {})
    row.headline_modes = ((artifact_row.get("modes") or {}).get("sentence")) or ""
    if args.budget_only:
        return row
    out = work / f"{name}-compare.json"
    cmd = [*lto_command(), "bench", "--artifact", str(art), "--compare", str(model),
           "--time", str(args.time), "--json", "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        row.error = one_line_error(proc.stderr, proc.returncode)
        return row
    comparison = json.loads(out.read_text())["comparison"]
    lo, hi = comparison["ratio_ci95"]
    row.bench_compare, row.bench_compare_ci95 = float(comparison["ratio"]), (lo, hi)  # B/A: the speedup
    if comparison.get("paired"):
        row.bench_modes = modes_sentence(comparison["paired"], "artifact", "original")
    if section["best"]["label"] == "baseline":
        row.alone = 1.0
        return row
    base_p50s, sides = alone_speedups(
        model, {"artifact": art}, data / "input.npz", args.alternations, args.alone_time
    )
    row.alone_p50_ms = {"original": base_p50s, "artifact": sides["artifact"][0]}
    row.alone = sides["artifact"][1]
    row.alone_modes = _alone_modes(row.alone_p50_ms)
    return row


def _with_range(x: float | None, span: tuple[float, float] | None) -> str:
    if x is None or span is None:
        return _fmt(x)
    return f"{_fmt(x)} ({span[0]:.2f}–{span[1]:.2f})"


def artifact_table(rows: list[ArtifactRow]) -> str:
    lines = [
        "| model | artifact | lto optimize headline (95% CI) | lto bench --compare (95% CI) | alone "
        "(range over processes) | max/min | agreement | optimize wall / budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for r in rows:
        wall = f"{r.wall_s:.0f} s / {r.budget_s:.0f} s" if r.wall_s is not None and r.budget_s else ""
        if r.error:
            lines.append(f"| {r.model} | {r.error} | | | | | | {wall} |")
            continue
        h, b = _with_ci(r.headline, r.headline_ci95), _with_ci(r.bench_compare, r.bench_compare_ci95)
        spread = r.spread()
        alone = _with_range(r.alone, _alone_spread(r.alone_p50_ms))
        lines.append(
            f"| {r.model} | {r.pick} | {h} | {b} | {alone} | "
            f"{'' if spread is None else f'{spread:.2f}'} | {r.agreement()} | {wall} |"
        )
        for what, text in (("headline", r.headline_modes), ("bench --compare", r.bench_modes),
                           ("alone", r.alone_modes)):  # fmt: skip
            if text:
                notes.append(f"- {r.model}, {what}: {text}")
    if notes:
        lines += ["", "Sides at two speeds:", *notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"corpus entries (default: all: {', '.join(ENTRIES)})")
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated pair kinds")
    parser.add_argument("--time", type=float, default=10.0, help="seconds per side-by-side comparison")
    parser.add_argument("--alone-time", type=float, default=1.0, help="seconds per alone measurement")
    parser.add_argument("--alternations", type=int, default=5, help="alone alternations (at least 5)")
    parser.add_argument("--artifacts", action="store_true", help="check lto optimize's artifacts instead")
    parser.add_argument(
        "--time-budget", default="", help="lto optimize --time-budget (--artifacts; default: lto's default)"
    )
    parser.add_argument(
        "--budget-only", action="store_true", help="--artifacts: time lto optimize only (its wall vs budget)"
    )
    parser.add_argument("--out", type=Path, default=None, help="report path without suffix")
    parser.add_argument("--alone", help=argparse.SUPPRESS)
    parser.add_argument(
        "--render", type=Path, default=None, help="print the --artifacts table of a saved .json again"
    )
    args = parser.parse_args(argv)
    if args.alone:
        _alone_child(args.alone)
        return 0
    if args.render is not None:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        rows = [ArtifactRow(**{**r, "alone_modes": _alone_modes(r.get("alone_p50_ms") or {})}) for r in saved]
        print(artifact_table(rows))
        return 0
    if args.alternations < 5:
        parser.error("--alternations: at least 5")
    if args.artifacts:
        return _main_artifacts(args)
    pairs = [p for p in args.pairs.split(",") if p]
    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        parser.error(f"unknown pair kind {unknown[0]!r}; kinds: {', '.join(PAIRS)}")
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # ddddocr's OCR model warns about its output shape on every run
    rows: list[Row] = []
    for name in args.names or list(ENTRIES):
        entry = ENTRIES[name]
        try:
            model = entry.fetch().model
        except CorpusError as exc:
            rows.append(Row(name, "*", error=f"not fetched: {exc}"))
            continue
        samples = entry.make_inputs(9, seed=0)
        feed, calib = samples[0], samples[1:]
        for pair in pairs:
            row = Row(name, pair)
            started = time.monotonic()
            print(f"{name} / {pair} ...", file=sys.stderr, flush=True)
            try:
                measure_pair(row, model, feed, calib, args)
            except Exception as exc:  # a pair a runtime cannot run is a row, not the end
                row.error = f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
            rows.append(row)
            print(
                f"  lto {_fmt(row.lto)}  one process {_fmt(row.one_process)}  alone {_fmt(row.alone)}  "
                f"({time.monotonic() - started:.0f} s){'  ' + row.error if row.error else ''}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    _write(table(rows), rows, args.out or ROOT / "reports" / "runtime-agreement")
    return 0


def _main_artifacts(args: argparse.Namespace) -> int:
    rows: list[ArtifactRow] = []
    with tempfile.TemporaryDirectory(prefix="lto-artifacts-") as tmp:
        for name in args.names or list(ENTRIES):
            started = time.monotonic()
            budget = args.time_budget or "(default)"
            print(f"{name}: lto optimize --time-budget {budget} ...", file=sys.stderr, flush=True)
            try:
                row = check_artifact(name, args, Path(tmp))
            except Exception as exc:  # one model's failure is a row, not the end
                first = (str(exc).splitlines() or [""])[0][:120]
                row = ArtifactRow(name, error=f"failed: {type(exc).__name__}: {first}")
            rows.append(row)
            print(
                f"  {row.pick}: headline {_fmt(row.headline)}  bench --compare {_fmt(row.bench_compare)}  "
                f"alone {_fmt(row.alone)}  optimize {row.wall_s or 0:.0f} s  "
                f"({time.monotonic() - started:.0f} s) {row.error}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    _write(artifact_table(rows), rows, args.out or ROOT / "reports" / "artifact-agreement")
    return 0


def _write(text: str, rows: Sequence[Any], out: Path) -> None:
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    payload = json.dumps([asdict(r) for r in rows], indent=1)
    out.with_suffix(".json").write_text(payload, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
