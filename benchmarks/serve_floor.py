"""`lto serve` against its floor, under MLPerf LoadGen's Server scenario, on real artifacts.

For each artifact: its batch-1 latency alone (`lto bench --artifact`, which gives the model's own
throughput), then `lto serve --artifact` in its own process with each configuration asked for
(`--config LABEL="serve flags"`; today's defaults first) and, with --bare, the bare reference server
(`benchmarks/bare_server.py`: what any server costs on these cores), all started at once and driven
in turn by `lto load URL --qps R --floor ART` at 25% and 50% of that throughput, and searched for
the highest rate whose p99 meets the SLO with a VALID LoadGen result (`--find-max-qps`). Each `lto
load` measures the floor in its own process right after the server, at the same load: the model
behind one greedy worker, no HTTP. With --triton, Triton (the nvidia-pytriton wheel's tritonserver,
python backend, `lto export --backend python` with its batch profile measured here) is driven the
same way after lto serve.

    python -m benchmarks.serve_floor ART [ART ...] [--slo-ms 15] [--duration 10] [--rounds 3]
        [--config 'one-at-a-time=--max-batch 1'] [--shares 0.25,0.5] [--no-search] [--bare] [--triton]

Prints a Markdown table per artifact (target p50/p99, floor p50/p99, p99 over the floor, LoadGen's
verdict, max rate within the SLO for both), one of where the time went (the model's p50 in the target
and the floor, the HTTP path's p50 and p99, each client's CPU per request), one of a lone request's
model run inside the server against the same run alone (`--lone-pairs` pairs, each measured one
right after the other), and writes them with the raw reports to --out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import tritonserver
from optimize.files import write_text_atomic

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Server:
    """A server to drive: `lto serve --artifact` with `flags`, or the bare reference server."""

    label: str
    flags: tuple[str, ...] = ()
    bare: bool = False

    def command(self, artifact: Path) -> list[str]:
        if self.bare:
            return [sys.executable, "-m", "benchmarks.bare_server", str(artifact)]
        return [sys.executable, "-m", "optimize", "serve", "--artifact", str(artifact), "--name", "m",
                *self.flags]  # fmt: skip

    def describe(self) -> str:
        if self.bare:
            return "benchmarks/bare_server.py"
        return " ".join(self.flags) or "no flags"


class LtoFailed(Exception):
    pass


def lto(*args: str | Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args), "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    if proc.returncode not in (0, 1):  # lto load exits 1 when a verdict fails; the figures stand
        raise LtoFailed(f"lto {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return dict(json.loads(proc.stdout))


def start_serve(artifact: Path, server: Server) -> tuple[subprocess.Popen[str], str]:
    command = server.command(artifact)
    proc = subprocess.Popen(
        [*command, "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "at http://127.0.0.1:" in line:
            return proc, "http://" + line.split("at http://", 1)[1].split()[0].rstrip("/.,")
    raise SystemExit(f"{server.label} ({server.describe()}) did not start (exit {proc.wait()})")


def shape_args(artifact: Path) -> list[str]:
    manifest = json.loads((artifact / "manifest.json").read_text())
    return [a for t in manifest["input_spec"]["inputs"]
            for a in ("--shape", f"{t['name']}={'x'.join(map(str, t['shape']))}")]  # fmt: skip


def drive(
    servers: dict[str, str],
    artifact: Path,
    rates: list[float],
    args: argparse.Namespace,
    keep: Callable[[dict[str, Any]], None] = lambda results: None,
) -> dict[str, Any]:
    """On every server (label -> URL, all started): a lone request at a time, then each rate in
    rounds, the servers taking turns, then the highest rate within the SLO. `keep` gets the
    results so far after each measurement, so that a later failure loses none of them."""
    shapes = shape_args(artifact)
    common = ["--model", "m", "--slo-ms", f"{args.slo_ms:g}", "--duration", f"{args.duration:g}s",
              "--floor", artifact, *shapes]  # fmt: skip
    results: dict[str, dict[str, Any]] = {
        label: {"lone": [], "points": [], "search": None} for label in servers
    }
    # A lone request at a time (LoadGen SingleStream): the model's run inside the server, from
    # the server's own Server-Timing, against the same run alone (lto bench, its own process),
    # in pairs one right after the other: the VM's phases move either figure by up to 1.5x
    # within minutes, so a ratio of two readings taken apart says more about the VM than the
    # server.
    for label, url in servers.items():
        for pair in range(args.lone_pairs):
            print(f"  {label}: a lone request, inside and alone (pair {pair + 1} of {args.lone_pairs}) ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            inside = lto("load", url, "--model", "m", "--requests", "300", "--no-floor", *shapes)
            alone = lto("bench", "--artifact", artifact, "--time", "2")
            results[label]["lone"].append(
                {"inside": inside, "alone_ms": float(alone["results"][0]["latency_ms"]["p50"])}
            )
            keep(results)
    # Rounds: the rates again, so that each rate's server/floor pairs fall in several of the VM's
    # phases (it runs at about half speed for seconds at a time); the table gives their median.
    # The servers take turns within a round (all are up, idle while another is driven), so that
    # a slow phase does not fall on one of them only.
    for round_ in range(args.rounds):
        for rate in rates:
            for label, url in servers.items():
                print(
                    f"  {label}: {rate:.0f}/s (round {round_ + 1} of {args.rounds}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                report = lto("load", url, "--qps", f"{rate:.1f}", *common)
                results[label]["points"].append({"rate": rate, "round": round_ + 1, "report": report})
                keep(results)
    if not args.no_search:
        for label, url in servers.items():
            print(f"  {label}: searching the highest rate within the SLO ...", file=sys.stderr, flush=True)
            results[label]["search"] = lto("load", url, "--find-max-qps", "--qps", f"{rates[0]:.1f}", *common)
            keep(results)
    return results


def served(
    artifact: Path,
    servers: list[Server],
    rates: list[float],
    args: argparse.Namespace,
    keep: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Start every server, drive them all, stop them."""
    procs, urls = [], {}

    def described(results: dict[str, Any]) -> dict[str, Any]:
        return {s.label: {"flags": list(s.flags), "bare": s.bare, **results[s.label]} for s in servers}

    try:
        for server in servers:
            print(f"{artifact.name}: {server.label} ({server.describe()})", file=sys.stderr, flush=True)
            proc, urls[server.label] = start_serve(artifact, server)
            procs.append(proc)
        return described(drive(urls, artifact, rates, args, lambda so_far: keep(described(so_far))))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def triton(artifact: Path, rates: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """The same loads against Triton's python backend serving the same artifact."""
    found = tritonserver.install()
    with tempfile.TemporaryDirectory(prefix="lto-serve-floor-") as tmp:
        repo = Path(tmp) / "repo"
        export = ["export", artifact, "--triton", repo, "--name", "m", "--backend", "python"]
        try:
            lto(*export, "--measure-batches", "1,2,4,8", "--slo-ms", f"{args.slo_ms:g}")
        except LtoFailed as exc:  # a model whose batch axis is fixed: Triton serves it unbatched
            print(f"  {exc}; exporting without a batch profile", file=sys.stderr, flush=True)
            lto(*export)
        server = tritonserver.start(found, repo, Path(tmp) / "triton.log", python_path=sys.path)
        try:
            label = "Triton (python backend)"
            return {
                "flags": ["tritonserver, python backend"],
                **drive({label: server.url}, artifact, rates, args)[label],
            }
        finally:
            server.stop()


def _fig(run: dict[str, Any], key: str) -> str:
    value = (run.get("latency_ms") or {}).get(key)
    return "-" if value is None else f"{value:.2f}"


def _phase(run: dict[str, Any], phase: str, key: str) -> str:
    """A phase of the run's breakdown (Server-Timing; Triton sends none)."""
    value = ((run.get("breakdown_ms") or {}).get(phase) or {}).get(key)
    return "-" if value is None else f"{value:.2f}"


def _client_cpu_ms(run: dict[str, Any]) -> str:
    """The load generator's CPU per completed request (its process's share of a core over the run)."""
    share, done = (run.get("loadgen") or {}).get("cpu_fraction_of_core"), run.get("completed_ok")
    if share is None or not done:
        return "-"
    return f"{share * run['wall_s'] * 1e3 / done:.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}/s"


def table(name: str, alone_ms: float, configs: dict[str, dict[str, Any]], slo_ms: float) -> str:
    lines = [
        f"### {name}",
        "",
        f"Model alone (lto bench, batch 1): p50 {alone_ms:.3f} ms, {1e3 / alone_ms:.0f}/s. "
        f"SLO p99 <= {slo_ms:g} ms.",
        "",
        "| configuration | rate (share of alone) | round | target p50 / p99 ms | floor p50 / p99 ms "
        "| p99 target/floor | LoadGen target, floor |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios: dict[tuple[str, float], list[float]] = {}
    where = [
        "",
        "Where the time went: the model's run inside the target and in the floor (p50), the target's "
        "HTTP path (its latency less the server's own phases), and each client's CPU per request.",
        "",
        "| configuration | rate | round | model p50 ms, target / floor | HTTP p50 / p99 ms "
        "| client CPU ms a request, target / floor |",
        "|---|---|---|---|---|---|",
    ]
    for label, result in configs.items():
        for point in result["points"]:
            load = point["report"]["load"]
            run, floor = load["runs"][-1], load["floor"]["run"]
            ratio = run["latency_ms"]["p99"] / floor["latency_ms"]["p99"]
            ratios.setdefault((label, point["rate"]), []).append(ratio)
            validity = f"{run['mlperf_loadgen']['validity']}, {floor['mlperf_loadgen']['validity']}"
            lines.append(
                f"| {label} | {point['rate']:.0f}/s ({point['rate'] * alone_ms / 1e3:.0%}) | "
                f"{point.get('round', 1)} | {_fig(run, 'p50')} / {_fig(run, 'p99')} | "
                f"{_fig(floor, 'p50')} / {_fig(floor, 'p99')} | {ratio:.2f}x | {validity} |"
            )
            where.append(
                f"| {label} | {point['rate']:.0f}/s | {point.get('round', 1)} | "
                f"{_phase(run, 'model', 'p50')} / {_phase(floor, 'model', 'p50')} | "
                f"{_phase(run, 'network_http', 'p50')} / {_phase(run, 'network_http', 'p99')} | "
                f"{_client_cpu_ms(run)} / {_client_cpu_ms(floor)} |"
            )
    lines += where
    if any(len(r) > 1 for r in ratios.values()):
        lines += ["", "| configuration | rate | p99 target/floor: median of the rounds (lowest–highest) |",
                  "|---|---|---|"]  # fmt: skip
        for (label, rate), values in ratios.items():
            lines.append(
                f"| {label} | {rate:.0f}/s | {statistics.median(values):.2f}x "
                f"({min(values):.2f}–{max(values):.2f}x, {len(values)} rounds) |"
            )
    lines += ["", "A lone request's model run inside the server (p50, from its Server-Timing) and the "
              "same run alone (`lto bench`, its own process) right after it, in pairs:", "",
              "| configuration | pair | inside, p50 | alone, p50 | inside / alone |",
              "|---|---|---|---|---|"]  # fmt: skip
    for label, result in configs.items():
        pair_ratios = []
        for pair, lone in enumerate(result["lone"], 1):
            run = lone["inside"]["load"]["runs"][-1]
            model = (run.get("breakdown_ms") or {}).get("model")
            if not model:  # Triton sends no Server-Timing: only the whole request is known
                whole = run["latency_ms"]["p50"]
                lines.append(
                    f"| {label} | {pair} | - (whole request {whole:.3f} ms) | {lone['alone_ms']:.3f} ms | - |"
                )
                continue
            pair_ratios.append(model["p50"] / lone["alone_ms"])
            lines.append(
                f"| {label} | {pair} | {model['p50']:.3f} ms | {lone['alone_ms']:.3f} ms "
                f"| {pair_ratios[-1]:.2f}x |"
            )
        if len(pair_ratios) > 1:
            lines.append(
                f"| {label} | median | | | **{statistics.median(pair_ratios):.2f}x** "
                f"({min(pair_ratios):.2f}–{max(pair_ratios):.2f}x) |"
            )
    searched = [(label, r["search"]) for label, r in configs.items() if r["search"] is not None]
    if searched:
        lines += ["", "| configuration | max rate, p99 within the SLO, VALID | floor's |", "|---|---|---|"]
        for label, search in searched:
            mine = (search["load"].get("max_qps") or {}).get("max_qps")
            its = ((search["load"].get("floor") or {}).get("max_qps") or {}).get("max_qps")
            lines.append(f"| {label} | {_rate(mine)} | {_rate(its)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--slo-ms", type=float, default=15.0)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rate (LoadGen's minimum)")
    parser.add_argument(
        "--shares", default="0.25,0.5", help="rates as shares of the model's throughput alone"
    )
    parser.add_argument("--config", action="append", default=[], help='LABEL="lto serve flags" (repeatable)')
    parser.add_argument("--no-search", action="store_true", help="skip the max-rate search")
    parser.add_argument(
        "--rounds", type=int, default=1, help="drive every rate this many times, server then floor each"
    )
    parser.add_argument(
        "--lone-pairs", type=int, default=3,
        help="times a lone request is served and then the model run alone, each right after the other",
    )  # fmt: skip
    parser.add_argument(
        "--bare", action="store_true",
        help="also the bare reference server (benchmarks/bare_server.py): what any server costs here",
    )  # fmt: skip
    parser.add_argument("--triton", action="store_true", help="Triton (python backend) at the same loads")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "serve-floor")
    args = parser.parse_args(argv)
    servers = [Server("defaults")] + [
        Server(label, tuple(shlex.split(flags)))
        for label, _, flags in (c.partition("=") for c in args.config)
    ]
    if args.bare:
        servers.append(Server("bare server", bare=True))
    shares = [float(x) for x in args.shares.split(",")]
    texts, raw = [], {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".partial.json")
    for artifact in args.artifacts:
        bench = lto("bench", "--artifact", artifact, "--time", "3")
        alone_ms = float(bench["results"][0]["latency_ms"]["p50"])
        rates = [share * 1e3 / alone_ms for share in shares]

        def keep(so_far: dict[str, Any], artifact: Path = artifact) -> None:
            # Kept as it comes: a load or a Triton run that fails later loses none of these figures.
            write_text_atomic(partial, json.dumps({str(artifact): so_far}, indent=1))

        results = served(artifact, servers, rates, args, keep)
        if args.triton:
            print(f"{artifact.name}: Triton, python backend", file=sys.stderr, flush=True)
            try:
                results["Triton (python backend)"] = triton(artifact, rates, args)
            except LtoFailed as exc:  # the other rows stand; say why this one is missing
                print(f"  Triton not measured: {exc}", file=sys.stderr, flush=True)
        texts.append(table(artifact.name, alone_ms, results, args.slo_ms))
        raw[str(artifact)] = {"alone_ms": alone_ms, "configs": results}
        print(texts[-1], flush=True)
    write_text_atomic(args.out.with_suffix(".md"), "\n".join(texts))
    write_text_atomic(args.out.with_suffix(".json"), json.dumps(raw, indent=1))
    print(f"wrote {args.out.with_suffix('.md')} and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
