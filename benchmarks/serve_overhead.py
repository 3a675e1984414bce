"""What `lto serve` costs and what its batching buys, measured side by side in one run.

1. Overhead at low load: one request at a time over HTTP (and in-process, no HTTP), interleaved
   in rounds with direct `backend.run` calls on the same model and runtime settings; overhead =
   p50(request) - p50(model alone at batch 1).
2. Max QPS within an SLO: one ladder of Poisson rates against two `lto serve` processes on the
   same model, taking turns at each rate: one with dynamic batching and a baseline that runs one
   request per model call (`--max-batch 1`, same HTTP stack, so only batching differs).

The load generator runs in this process, the servers in their own; on a small machine they
share cores, so read the ratio more than the absolute rates.

    python -m benchmarks.serve_overhead                                   # sample_models/mlp_small.onnx
    python -m benchmarks.serve_overhead --model wide-mlp --slo-ms 50             # gains from batching
    python -m benchmarks.serve_overhead --model sample_models/resnet_tiny.onnx --slo-ms 150
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.raw_load import binary_infer_request, http_request
from optimize.data import parse_shape_args, resolve_inputs
from optimize.runtimes.backends import open_backend
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.loadgen import (
    Endpoint,
    HttpEndpoint,
    InProcessEndpoint,
    LoadSettings,
    run_load,
)

ROOT = Path(__file__).resolve().parent.parent

# The runtime settings `lto serve MODEL.onnx` uses, so the model-alone figure is the same model.
SERVE_CONFIG = {"allow_spinning": False}


def build_wide_mlp(path: Path, width: int = 1024, layers: int = 6) -> Path:
    """x[batch, 1024] -> 6 x (MatMul 1024x1024, Relu): 24 MB of weights, so batch 1 is bound by
    reading them (a matrix-vector product) and a batch reuses each weight for every row: the
    kind of model dynamic batching exists for."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"W{i}"))
        nodes += [
            helper.make_node("MatMul", [cur, f"W{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
        ]
        cur = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "wide_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def start_server(model: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimize", "serve", str(model), "--port", "0", "--name", "m", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise SystemExit(f"lto serve did not start: {proc.stdout.read()}")


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def model_alone_ms(
    backend: Any, feeds: dict[str, np.ndarray], runs: int, pause_s: float = 0.0
) -> list[float]:
    """Each run's time; with `pause_s`, the thread sleeps that long before each run, as a server's
    does between requests that come one at a time (a core that halted runs the model slower)."""
    out = []
    for _ in range(runs):
        if pause_s:
            time.sleep(pause_s)
        t0 = time.perf_counter()
        backend.run(feeds)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


class RawHttpClient:
    """One keep-alive HTTP/1.1 connection on a blocking socket, each request's bytes built once:
    about the least a client can add (a C client such as perf_analyzer costs as little), so that
    p50(request) - p50(model alone) is the server's overhead, not the Python client's."""

    def __init__(self, url: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:

        host, port, self.request = http_request(url, path, body, headers)
        self.address = (host, port)
        self._connect()
        self.last_head = ""  # the last response's status line and headers

    def _connect(self) -> None:
        import socket

        self.sock = socket.create_connection(self.address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def roundtrip_ms(self) -> float:
        """Send the request, read the whole response; its time in ms (a non-200 is an error).
        A connection the server closed while idle (its keep-alive or first-request timeout;
        uvicorn's is 5 s) is opened again, untimed."""
        try:
            return self._roundtrip_ms()
        except ConnectionError:
            if self._buffer:
                raise  # closed mid-answer: an error, not an idle close
            self.sock.close()
            self._connect()
            return self._roundtrip_ms()

    def _roundtrip_ms(self) -> float:
        t0 = time.perf_counter()
        self.sock.sendall(self.request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._recv()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        self.last_head = head.decode("latin-1")
        lines = self.last_head.split("\r\n")
        length = next(
            int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
        )
        while len(rest) < length:
            rest += self._recv()
        self._buffer = rest[length:]
        elapsed = (time.perf_counter() - t0) * 1e3
        if lines[0].split()[1] != "200":
            raise RuntimeError(f"{lines[0]}: {rest[:length][:200]!r}")
        return elapsed

    def server_model_ms(self) -> float:
        """The model's time in the last answer's `Server-Timing` (the server's own clock)."""
        match = re.search(r"model;dur=([0-9.]+)", self.last_head)
        if match is None:
            raise RuntimeError("the server sent no Server-Timing model phase")
        return float(match.group(1))

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def raw_infer_client(url: str, model: str, feeds: dict[str, np.ndarray]) -> RawHttpClient:
    body, headers = binary_infer_request(feeds)
    return RawHttpClient(url, f"/v2/models/{model}/infer", body, headers)


def raw_overhead(
    model: Path,
    feeds: dict[str, np.ndarray],
    urls: dict[str, str],
    rounds: int,
    per_round: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """p50 overhead of each server over the model alone, with the raw client, one request at a
    time; rounds interleave the model alone and every server, so drift hits all alike."""
    backend = open_backend("onnxruntime", model, config or SERVE_CONFIG)
    clients = {name: raw_infer_client(url, "m", feeds) for name, url in urls.items()}
    floors = {name: RawHttpClient(url, "/v2/health/live") for name, url in urls.items()}
    alone: list[float] = []
    paced: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in urls}
    # Each request's time less the model's time inside that server's process, as it reports it.
    beside_model: dict[str, list[float]] = {name: [] for name in urls}
    floor: dict[str, list[float]] = {name: [] for name in urls}
    model_alone_ms(backend, feeds, 50)
    for client in clients.values():
        for _ in range(20):
            client.roundtrip_ms()  # warm-up
    try:
        for _ in range(rounds):
            alone += model_alone_ms(backend, feeds, per_round)
            paced += model_alone_ms(backend, feeds, per_round, pause_s=0.0005)
            for name, client in clients.items():
                for _ in range(per_round):
                    times[name].append(client.roundtrip_ms())
                    beside_model[name].append(times[name][-1] - client.server_model_ms())
                floor[name] += [floors[name].roundtrip_ms() for _ in range(per_round)]
    finally:
        for c in [*clients.values(), *floors.values()]:
            c.close()
    model_p50 = float(np.percentile(alone, 50))
    paced_p50 = float(np.percentile(paced, 50))
    return {
        "model_alone_p50_ms": model_p50,
        # The model called after a 0.5 ms pause each time: what intermittent calls cost anyone,
        # server or not. Overhead against it is what the server itself adds.
        "model_alone_paced_p50_ms": paced_p50,
        "overhead_vs_paced_p50_ms": {n: float(np.percentile(v, 50)) - paced_p50 for n, v in times.items()},
        # The model runs at a speed of its own in each process (2% apart measured on the
        # encoder): for a 6 ms model that alone moves "over the model alone" by 0.1-0.2 ms.
        "overhead_vs_model_in_server_p50_ms": {
            n: float(np.percentile(v, 50)) for n, v in beside_model.items()
        },
        "request_p50_ms": {n: float(np.percentile(v, 50)) for n, v in times.items()},
        "overhead_p50_ms": {n: float(np.percentile(v, 50)) - model_p50 for n, v in times.items()},
        "get_live_p50_ms": {n: float(np.percentile(v, 50)) for n, v in floor.items()},
        "samples_each": len(alone),
    }


async def low_load(
    model: Path,
    feeds: dict[str, np.ndarray],
    url: str,
    rounds: int,
    per_round: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Interleave rounds of: model alone, one-at-a-time HTTP requests, one-at-a-time in-process.
    `config`: the runtime settings the server runs the model with (the same model alone).
    `raw_overhead` measures the same with the raw-socket client, against several servers."""
    config = config or SERVE_CONFIG
    backend = open_backend("onnxruntime", model, config)
    batcher = Batcher([open_backend("onnxruntime", model, config)], BatcherConfig())
    await batcher.start(feeds)
    http = HttpEndpoint(url, "m", feeds)
    await http.open()
    inproc = InProcessEndpoint(batcher, feeds)
    alone: list[float] = []
    http_floor: list[float] = []
    over_http: list[float] = []
    in_process: list[float] = []
    phases: dict[str, list[float]] = {}
    model_alone_ms(backend, feeds, 50)  # warm-up
    for _ in range(rounds):
        alone += model_alone_ms(backend, feeds, per_round)
        # The HTTP stack alone (client + server + loopback): a GET that does no work.
        for _ in range(per_round):
            t0 = time.perf_counter()
            await http.get("/v2/health/live")
            http_floor.append((time.perf_counter() - t0) * 1e3)
        res = await run_load(http, LoadSettings(concurrency=1, requests=per_round, warmup=5))
        over_http += res.samples_ms
        for name, values in res.phases.items():
            phases.setdefault(name, []).extend(values)
        res = await run_load(inproc, LoadSettings(concurrency=1, requests=per_round, warmup=5))
        in_process += res.samples_ms
    await http.close()
    await batcher.drain()
    p50 = {
        k: float(np.percentile(v, 50))
        for k, v in (("model", alone), ("http", over_http), ("inproc", in_process))
    }
    return {
        "model_alone_p50_ms": p50["model"],
        "http_request_p50_ms": p50["http"],
        "in_process_request_p50_ms": p50["inproc"],
        "http_overhead_p50_ms": p50["http"] - p50["model"],
        "in_process_overhead_p50_ms": p50["inproc"] - p50["model"],
        "http_breakdown_p50_ms": {k: float(np.percentile(v, 50)) for k, v in phases.items()},
        "http_get_live_p50_ms": float(np.percentile(http_floor, 50)),
        "samples_each": len(alone),
    }


def _point(res: Any, percentile: float) -> dict[str, Any]:
    verdict = res.verdict()
    rows = res.batch_rows
    n = sum(rows.values())
    return {
        "offered_qps": res.settings.qps,
        "throughput_per_s": res.throughput,
        "p50_ms": res.latency_at(50),
        f"p{percentile:g}_ms": verdict["value_ms"],
        "error_rate": res.error_rate,
        "mean_batch_rows": sum(k * v for k, v in rows.items()) / n if n else None,
        "passed": verdict["passed"],
    }


async def interleaved_max_qps(
    targets: dict[str, Endpoint], slo_ms: float, percentile: float, step_s: float
) -> dict[str, Any]:
    """Climb one ladder of Poisson rates (x1.26 a step) for all servers, taking turns at each
    rate, so that all meet the same machine conditions; a server leaves the ladder after two
    failed rates in a row. Max QPS = the highest rate that met the SLO."""
    for target in targets.values():
        await target.open()
    try:
        serial = []
        for target in targets.values():
            probe = await run_load(target, LoadSettings(concurrency=1, requests=50, warmup=10))
            serial.append(1e3 / (probe.latency_at(50) or 1.0))
        qps = 0.2 * min(serial)  # well inside what both sustain, then climb
        curves: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        best: dict[str, float | None] = dict.fromkeys(targets)
        fails = dict.fromkeys(targets, 0)
        order = list(targets)
        while any(fails[name] < 2 for name in order):
            for name in order:
                if fails[name] >= 2:
                    continue
                settings = LoadSettings(
                    qps=qps,
                    duration_s=step_s,
                    min_queries=200,
                    warmup=10,
                    slo_ms=slo_ms,
                    percentile=percentile,
                )
                res = await run_load(targets[name], settings)
                point = _point(res, percentile)
                curves[name].append(point)
                if point["passed"]:
                    best[name], fails[name] = qps, 0
                else:
                    fails[name] += 1
                tail = point[f"p{percentile:g}_ms"]
                tail_ms = tail if tail is not None else float("nan")
                print(
                    f"    {name:>8} {qps:8.1f} qps: p{percentile:g} {tail_ms:7.2f} ms,"
                    f" {res.throughput:7.1f}/s, errors {res.error_rate:5.1%}, mean batch "
                    f"{point['mean_batch_rows'] or 0:4.1f} -> {'pass' if point['passed'] else 'fail'}"
                )
                await asyncio.sleep(0.3)  # let the queue empty
            qps *= 1.26
            order.reverse()
        return {"max_qps": best, "curves": curves}
    finally:
        for target in targets.values():
            await target.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        default=str(ROOT / "sample_models" / "mlp_small.onnx"),
        help="An ONNX file, or 'wide-mlp' for a built-in model that gains from batching.",
    )
    parser.add_argument("--shape", action="append", default=[], help="Pin dynamic dims, as in lto bench.")
    parser.add_argument("--slo-ms", type=float, default=10.0)
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--step-seconds", type=float, default=2.0, help="Length of each rate tried.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()
    if args.model == "wide-mlp":
        import tempfile

        args.model = build_wide_mlp(Path(tempfile.mkdtemp(prefix="lto-bench-")) / "wide_mlp.onnx")
    args.model = Path(args.model)

    _, feeds = resolve_inputs(args.model, parse_shape_args(args.shape), None, batch=1)
    target_ms = str(args.slo_ms)
    lto_proc, lto_url = start_server(
        args.model, "--max-batch", str(args.max_batch), "--target-latency-ms", target_ms
    )
    base_proc, base_url = start_server(args.model, "--max-batch", "1", "--target-latency-ms", target_ms)
    try:
        print(f"model {args.model.name}; lto serve at {lto_url}, baseline (--max-batch 1) at {base_url}")
        print("1. overhead at low load (one request at a time, interleaved with the model alone)")
        low = asyncio.run(low_load(args.model, feeds, lto_url, args.rounds, args.per_round))
        print(
            f"   model alone p50 {low['model_alone_p50_ms']:.3f} ms"
            f" | over HTTP p50 {low['http_request_p50_ms']:.3f} ms"
            f" -> overhead {low['http_overhead_p50_ms']:.3f} ms"
            f" | in-process p50 {low['in_process_request_p50_ms']:.3f} ms"
            f" -> overhead {low['in_process_overhead_p50_ms']:.3f} ms"
        )
        print(f"   HTTP stack floor (GET /v2/health/live) p50 {low['http_get_live_p50_ms']:.3f} ms")
        print(
            "   HTTP breakdown p50 ms: "
            + ", ".join(f"{k} {v:.3f}" for k, v in low["http_breakdown_p50_ms"].items())
        )
        print(
            f"2. max QPS with p{args.percentile:g} <= {args.slo_ms:g} ms (one ladder of rates, taking turns)"
        )
        search = asyncio.run(
            interleaved_max_qps(
                {"lto": HttpEndpoint(lto_url, "m", feeds), "baseline": HttpEndpoint(base_url, "m", feeds)},
                args.slo_ms,
                args.percentile,
                args.step_seconds,
            )
        )
    finally:
        stop_server(lto_proc)
        stop_server(base_proc)
    b, u = search["max_qps"]["lto"], search["max_qps"]["baseline"]
    ratio = (b / u) if b and u else None
    print(
        f"   max QPS: lto {b or 0:.1f} vs baseline {u or 0:.1f}"
        + (f" -> {ratio:.2f}x" if ratio else " (one side never met the SLO)")
    )
    print(f"   load average during the run: {os.getloadavg()[1]:.1f} (1-min {os.getloadavg()[0]:.1f})")
    figures = {
        "model": str(args.model),
        "slo": {"ms": args.slo_ms, "percentile": args.percentile},
        "low_load": low,
        "max_qps": {**search, "ratio": ratio},
        "load_average_5min": os.getloadavg()[1],
    }
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures: {args.out}")


if __name__ == "__main__":
    main()
