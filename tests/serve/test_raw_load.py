"""The raw-socket load generator the serve benchmarks measure overload with: every request it
sends is counted once, by the status the server gave, and agrees with the server's own count."""

from __future__ import annotations

from typing import Any

from harness.raw_load import infer_load
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.server import InferenceServer, ServerConfig
from tests.serve.helpers import SleepBackend
from tests.serve.test_under_load import LONG, metric, serve, x


def test_open_and_closed_loops_count_every_answer_by_status_as_the_server_does() -> None:
    backend = SleepBackend(base_ms=5)

    async def body(client: Any, batcher: Batcher, server: InferenceServer) -> dict[str, Any]:
        url = f"http://127.0.0.1:{client.port}"
        closed = infer_load(url, "m", x(1), timeout_s=10)
        steady = await closed.closed_loop(2, 0.3)
        closed.close()
        load = infer_load(url, "m", x(1), timeout_s=10)
        # ~5x what one 5 ms instance can do, with 2 requests in flight allowed: most are shed.
        burst = await load.open_loop(1000, 0.5)
        load.close()
        return {
            "steady": steady,
            "burst": burst,
            "ok": await metric(client, "ok"),
            "shed": await metric(client, "overloaded"),
        }

    got = serve(
        [backend],
        body,
        BatcherConfig(max_batch=1, max_wait_ms=0, target_latency_ms=LONG),
        ServerConfig(model_name="m", max_inflight=2),
    )
    steady, burst = got["steady"], got["burst"]
    assert steady.issued == steady.answered == steady.by_status["200"] > 0
    assert len(steady.ok_ms) == steady.issued
    assert burst.issued == burst.answered > 100
    assert set(burst.by_status) <= {"200", "503"} and burst.by_status["503"] > 0
    assert got["ok"] == steady.by_status["200"] + burst.by_status["200"]
    assert got["shed"] == burst.by_status["503"]
    summary = burst.to_json()
    assert summary["ok_per_s"] > 0 and summary["offered_per_s"] > summary["ok_per_s"]
