"""`lto serve` against one hostile client, attack by attack, while a normal client keeps asking.

Starts `lto serve` on a sample model with its default limits (and `--send-timeout-s`, default
30 s here as in lto serve), then for each attack: the attacker connects from 127.0.0.2, a normal
client from 127.0.0.1 sends an infer request every 20 ms on a keep-alive connection and one on a
new connection every 0.5 s. Printed per attack: the answers the attacker got, how many of the
normal client's requests got 200, and the server's peak RSS over its idle RSS (sampled every
20 ms). Issue 26's done-when: each attack gets the answer a trusted server gives, every normal
request 200, RSS within 64 MB of idle under the header and body floods.

    python -m benchmarks.serve_attacks                      # every attack, ~3 min
    python -m benchmarks.serve_attacks --only header_line_8mb dribble --json attacks.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
ATTACKER = "127.0.0.2"  # loopback, another address: a client of its own for the per-client caps
MIB = 1024 * 1024


@dataclass
class Normal:
    """The well-behaved client's outcomes during one attack."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)


def start_server(model: Path, extra: list[str]) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "optimize", "serve", str(model), "--port", "0", "--name", "m",
         "--host", "0.0.0.0", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(r"at http://[\d.]+:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    proc.kill()
    raise SystemExit(f"lto serve did not start: {proc.stdout.read()}")


async def read_answer(reader: asyncio.StreamReader, timeout: float) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return int(head.split()[1]), body


async def connect(port: int, attacker: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    local = (ATTACKER, 0) if attacker else None
    return await asyncio.open_connection("127.0.0.1", port, local_addr=local)


def infer_request(body: bytes) -> bytes:
    head = f"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def normal_client(port: int, request: bytes, normal: Normal, stop: asyncio.Event) -> None:
    reader, writer = await connect(port, attacker=False)
    last_fresh = 0.0
    try:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                writer.write(request)
                status, _ = await read_answer(reader, 10)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                status = -1
                writer.transport.abort()
                reader, writer = await connect(port, attacker=False)
            normal.statuses[status] += 1
            normal.latencies_ms.append((time.perf_counter() - start) * 1e3)
            if time.monotonic() - last_fresh > 0.5:  # a new connection works too
                last_fresh = time.monotonic()
                try:
                    r, w = await connect(port, attacker=False)
                    w.write(request)
                    fresh, _ = await read_answer(r, 10)
                    w.transport.abort()
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    fresh = -1
                normal.statuses[fresh] += 1
            await asyncio.sleep(0.02)
    finally:
        writer.transport.abort()


async def send_then_answer(port: int, data: bytes, *, keep_sending: bool = False, timeout: float = 60) -> str:
    """Send `data` (while reading), return the answer's status (or how the connection ended)."""
    reader, writer = await connect(port)

    async def send() -> None:
        with contextlib.suppress(OSError):
            for i in range(0, len(data), 256 * 1024):
                writer.write(data[i : i + 256 * 1024])
                await writer.drain()
            while keep_sending:
                writer.write(b"x" * 65536)
                await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        status, _ = await read_answer(reader, timeout)
        return str(status)
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    except asyncio.TimeoutError:
        return "no answer"
    finally:
        sender.cancel()
        writer.transport.abort()


async def many(port: int, data: bytes, count: int, timeout: float = 60) -> str:
    """`count` connections each sending `data` and waiting: their answers, and when they came."""
    start = time.monotonic()
    conns = [await connect(port) for _ in range(count)]
    for _, writer in conns:
        writer.write(data)

    async def answer(reader: asyncio.StreamReader) -> tuple[str, float]:
        try:
            status, _ = await read_answer(reader, timeout)
            return str(status), time.monotonic() - start
        except (asyncio.IncompleteReadError, ConnectionError):
            return "closed", time.monotonic() - start
        except asyncio.TimeoutError:
            return "no answer", time.monotonic() - start

    results = await asyncio.gather(*(answer(r) for r, _ in conns))
    for _, writer in conns:
        writer.transport.abort()
    counts = Counter(s for s, _ in results)
    latest = max(t for _, t in results)
    return ", ".join(f"{n}x {s}" for s, n in counts.most_common()) + f" (all by {latest:.1f} s)"


def attacker_connections(pid: int) -> int:
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.ip == ATTACKER and c.status == psutil.CONN_ESTABLISHED
    )


async def unread_pipeline(port: int, pid: int) -> str:
    _, writer = await connect(port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n" * 1000)
    start = time.monotonic()
    while not attacker_connections(pid) and time.monotonic() - start < 5:
        await asyncio.sleep(0.05)  # until the server lists it
    while attacker_connections(pid) and time.monotonic() - start < 120:
        await asyncio.sleep(0.1)
    gone = time.monotonic() - start
    writer.transport.abort()
    return f"dropped after {gone:.1f} s" if gone < 120 else "still open after 120 s"


async def silent(port: int, pid: int, count: int) -> str:
    conns = [await connect(port) for _ in range(count)]
    start = time.monotonic()
    while not attacker_connections(pid) and time.monotonic() - start < 5:
        await asyncio.sleep(0.05)
    while attacker_connections(pid) and time.monotonic() - start < 120:
        await asyncio.sleep(0.1)
    for _, writer in conns:
        writer.transport.abort()
    return f"{count} closed by {time.monotonic() - start:.1f} s"


async def dribble(port: int) -> str:
    reader, writer = await connect(port)
    writer.write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            writer.write(b"{")  # 1 byte a second
            with contextlib.suppress(asyncio.TimeoutError):
                status, _ = await read_answer(reader, 1.0)
                return f"{status} after {time.monotonic() - start:.1f} s"
    except (OSError, asyncio.IncompleteReadError):
        return "closed"
    finally:
        writer.transport.abort()
    return "no answer in 60 s"


async def flood_connections(port: int, count: int) -> str:
    conns, refused = [], Counter()
    for _ in range(count):
        try:
            conns.append(await connect(port))
        except OSError as exc:
            refused[type(exc).__name__] += 1
    await asyncio.sleep(0.5)
    answers: Counter[str] = Counter()
    for reader, _ in conns:
        try:
            status, _ = await read_answer(reader, 0.01)
            answers[str(status)] += 1
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError):
            answers["open"] += 1
    for _, writer in conns:
        writer.transport.abort()
    return ", ".join(f"{n}x {s}" for s, n in answers.most_common())


def binary_infer(payload: int) -> bytes:
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, payload // 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": payload}}]}).encode()  # fmt: skip
    head = (
        f"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(header) + payload}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + header + b"\0" * payload


def attacks(pid: int) -> dict[str, tuple[str, Callable[[int], Awaitable[str]]]]:
    """name -> (what a trusted server answers, the attack)."""
    chunked = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    headers_20000 = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(20_000)
    ) + b"\r\n"  # fmt: skip
    return {
        "header_line_8mb": ("431", lambda p: send_then_answer(
            p, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (8 * MIB))),
        "headers_20000": ("431", lambda p: send_then_answer(p, headers_20000)),
        "request_line_16mb": ("414", lambda p: send_then_answer(p, b"GET /" + b"a" * (16 * MIB))),
        "declared_no_body_x20": ("408 (min body rate)", lambda p: many(
            p, b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 60000000\r\n"
            b"Inference-Header-Content-Length: 100\r\n\r\n", 20)),
        "chunked_idle_x3": ("408 (min body rate)", lambda p: many(p, chunked, 3)),
        "header_only_x256": ("408 (min body rate)", lambda p: many(
            p, b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n", 256)),
        "pipelined_unread_1000": ("dropped at the send timeout", lambda p: unread_pipeline(p, pid)),
        "body_to_health_3x40mb": ("405 on the head", lambda p: many(
            p, b"POST /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 40000000\r\n\r\n"
            + b"z" * (40 * MIB), 3)),
        "json_64mb": ("413 on the head", lambda p: send_then_answer(
            p, infer_request(b"[" * (64 * MIB - 1) + b"]"), keep_sending=False)),
        "connections_1100": ("503 above --max-client-conns", lambda p: flood_connections(p, 1100)),
        "silent_x100": ("closed at --header-timeout-s", lambda p: silent(p, pid, 100)),
        "dribble_1_byte_per_s": ("408 (min body rate)", dribble),
        "chunk_extension_flood": ("413", lambda p: send_then_answer(
            p, chunked + b"1;" + b"e" * (70 * MIB), keep_sending=False)),
        "absolute_form_no_path": ("404 (not 500)", lambda p: send_then_answer(
            p, b"GET http://t HTTP/1.1\r\nHost: t\r\n\r\n")),
        "real_bodies_10x50mb": ("200/400 within --max-client-mb, 503 beyond", lambda p: many(
            p, binary_infer(50 * MIB), 10)),
    }  # fmt: skip


async def run_attack(
    port: int, pid: int, attack: Callable[[int], Awaitable[str]], request: bytes, idle_rss: int
) -> dict[str, Any]:
    normal, stop = Normal(), asyncio.Event()
    client = asyncio.ensure_future(normal_client(port, request, normal, stop))
    peak = idle_rss

    async def sample() -> None:
        nonlocal peak
        proc = psutil.Process(pid)
        while True:
            peak = max(peak, proc.memory_info().rss)
            await asyncio.sleep(0.02)

    start_rss = psutil.Process(pid).memory_info().rss
    sampler = asyncio.ensure_future(sample())
    start = time.monotonic()
    try:
        got = await attack(port)
    finally:
        await asyncio.sleep(0.3)
        stop.set()
        await client
        sampler.cancel()
    lat = sorted(normal.latencies_ms)
    return {
        "got": got,
        "seconds": round(time.monotonic() - start, 1),
        "normal": dict(normal.statuses),
        "normal_p99_ms": round(lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
        "rss_over_idle_mb": round((peak - idle_rss) / MIB, 1),
        "rss_rise_mb": round((peak - start_rss) / MIB, 1),  # over the RSS when this attack began
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    proc, port = start_server(ROOT / "sample_models" / "mlp_small.onnx", args.serve_args)
    try:
        pid = proc.pid
        reader, writer = await connect(port, attacker=False)
        writer.write(b"GET /v2/models/m HTTP/1.1\r\nHost: t\r\n\r\n")
        _, meta = await read_answer(reader, 10)
        writer.transport.abort()
        spec = json.loads(meta)["inputs"][0]
        shape = [d if d > 0 else 1 for d in spec["shape"]]
        count = 1
        for d in shape:
            count *= d
        tensor = {"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": [0] * count}
        request = infer_request(json.dumps({"inputs": [tensor]}).encode())
        # Warm up with normal traffic, then read the idle RSS.
        normal, stop = Normal(), asyncio.Event()
        warm = asyncio.ensure_future(normal_client(port, request, normal, stop))
        await asyncio.sleep(2.0)
        stop.set()
        await warm
        idle_rss = psutil.Process(pid).memory_info().rss
        results: dict[str, Any] = {"idle_rss_mb": round(idle_rss / MIB, 1), "attacks": {}}
        print(f"lto serve (pid {pid}) idle RSS {idle_rss / MIB:.1f} MB; normal requests: {shape}")
        print(f"{'attack':<24} {'expected':<28} {'got':<34} {'normal':<14} {'p99 ms':>7} {'RSS +MB':>8}")
        print("(RSS +MB: the peak during the attack over the RSS when it began)")
        for name, (expected, attack) in attacks(pid).items():
            if args.only and name not in args.only:
                continue
            row = await run_attack(port, pid, attack, request, idle_rss)
            row["expected"] = expected
            results["attacks"][name] = row
            ok = row["normal"].get(200, 0)
            total = sum(row["normal"].values())
            normal_text = f"{ok}/{total} 200"
            print(
                f"{name:<24} {expected[:28]:<28} {row['got'][:34]:<34} {normal_text:<14} "
                f"{row['normal_p99_ms'] or 0:>7.2f} {row['rss_rise_mb']:>8.1f}",
                flush=True,
            )
            await asyncio.sleep(1.0)
        return results
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", help="attack names to run (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("serve_args", nargs="*", help="extra `lto serve` flags, after --")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
