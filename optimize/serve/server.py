"""The KServe v2 / Open Inference Protocol over HTTP, in front of the dynamic batcher.

Speaks the protocol Triton, KServe and MLServer speak, so existing clients (tritonclient,
KServe SDKs, curl) work unmodified. Every infer response carries a `Server-Timing` header
with the server's own phases, so a client can attribute the rest of its latency to the
network and HTTP handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from optimize import __version__
from optimize.errors import InputError, first_line
from optimize.serve.batcher import Batcher, BatchStats, DeadlineExceeded, ModelFailure, Overloaded
from optimize.serve.polling import PollingSelector
from optimize.serve.protocol import (
    HEADER_LENGTH,
    InferRequest,
    check_requested_outputs,
    decode_request,
    encode_response,
    v2_datatype,
    v2_shape,
)

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OUTCOMES = (
    "ok",
    "bad_request",
    "too_large",
    "not_found",
    "overloaded",
    "timeout",
    "read_timeout",
    "disconnected",
    "error",
)
# Bodies above this are decoded on a worker thread: a 3 MB JSON tensor takes tens of ms to
# parse, which on the event loop would stall every other request for as long.
DECODE_OFF_LOOP_BYTES = 64 * 1024

log = logging.getLogger("lto.serve")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "model"
    model_version: str = "1"
    max_body_bytes: int = 64 * 1024 * 1024
    platform: str = "onnxruntime_onnx"
    # Admission control, checked before a body is read: requests and body bytes in flight
    # (admitted and not yet answered). Beyond either, 503 with Retry-After at once.
    max_inflight: int = 256
    max_inflight_bytes: int = 256 * 1024 * 1024
    # A client that has not sent its whole body after this long is answered 408 and closed.
    read_timeout_s: float = 30.0
    # Poll this long before the idle loop sleeps (optimize/serve/polling.py); 0: never.
    busy_poll_us: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Metrics:
    """Prometheus metrics in a registry of their own (several servers may live in one process)."""

    def __init__(self, batcher: Batcher) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "lto_requests", "Inference requests by outcome.", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # export zeros so dashboards see every series
        self.latency = Histogram(
            "lto_request_latency_seconds",
            "Server time of successful inference requests, body read to response built.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "lto_batch_size_rows", "Rows in each model call.", buckets=_BATCH_BUCKETS, registry=self.registry
        )
        self.model_time = Histogram(
            "lto_model_seconds",
            "Duration of each model call.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "lto_queue_wait_seconds", "Time requests waited for a batch.", buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        depth = Gauge("lto_queue_depth_rows", "Rows waiting in the queue.", registry=self.registry)
        depth.set_function(lambda: batcher.queued_rows)
        inflight = Gauge("lto_batches_in_flight", "Model calls running now.", registry=self.registry)
        inflight.set_function(lambda: batcher.inflight_batches)

    def on_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.rows)
        if stats.ok:
            self.model_time.observe(stats.model_ms / 1e3)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _shed(message: str, retry_after_s: int) -> web.Response:
    """503 before the body is read. The connection stays open: aiohttp then reads the body
    in chunks and drops them (nothing is kept), which costs less than the client opening a
    new connection for every retry, and a client still sending sees the 503 at once."""
    return _error(503, message, {"Retry-After": str(retry_after_s)})


def _loop_has_nothing_else() -> bool:
    """Whether the event loop has no other callback ready (a handler about to start) and no
    socket readable (a request not yet read). Counting requests in flight is not enough: under a
    burst the next ones are still in the sockets, and a model run that blocked the loop would
    keep them there, serving one at a time, never shedding. Reads asyncio's private `_ready` and
    `_selector`; where they are missing (another loop), the answer is no, which is always safe."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    selector = getattr(loop, "_selector", None)
    if ready is None or selector is None:
        return False
    # Level-triggered epoll: polling does not consume the events the loop will see next.
    return not ready and not selector.select(0)


def _server_timing(phases: dict[str, float], batch_rows: int) -> str:
    parts = [f"{name};dur={ms:.3f}" for name, ms in phases.items()]
    parts.append(f'rows;desc="{batch_rows}"')
    return ", ".join(parts)


class InferenceServer:
    """The aiohttp application around one model's batcher."""

    def __init__(self, batcher: Batcher, config: ServerConfig) -> None:
        self.batcher = batcher
        self.config = config
        self.metrics = Metrics(batcher)
        batcher.on_batch = self.metrics.on_batch
        self.ready = False
        self.inflight = 0
        self.inflight_bytes = 0
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lto-decode")

    def close(self) -> None:
        self._decoder.shutdown(wait=False)

    @web.middleware
    async def _errors_as_json(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every answer is a JSON body, as tritonclient expects; no exception reaches aiohttp
        (which would log a traceback and answer text): it becomes a counted, logged 500."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status == 404:
                self._count("not_found")
            message = f"{exc.reason}: {request.method} {request.path}"
            return _error(exc.status, message, {k: v for k, v in exc.headers.items() if k == "Allow"})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._count("error")
            log.error("internal error on %s %s: %s", request.method, request.path, first_line(exc))
            return _error(500, f"internal error: {first_line(exc)}")

    def app(self) -> web.Application:
        # client_max_size makes aiohttp refuse larger bodies while reading them (413).
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._errors_as_json])
        model = "/v2/models/{model}"
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.server_ready)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get(model, self.model_metadata)
        app.router.add_get(model + "/versions/{version}", self.model_metadata)
        app.router.add_get(model + "/ready", self.model_ready)
        app.router.add_get(model + "/versions/{version}/ready", self.model_ready)
        app.router.add_post(model + "/infer", self.infer)
        app.router.add_post(model + "/versions/{version}/infer", self.infer)
        app.router.add_get("/metrics", self.metrics_handler)
        return app

    def _is_ready(self) -> bool:
        return self.ready and self.batcher.accepting

    def _model_error(self, request: web.Request) -> web.Response | None:
        name = request.match_info["model"]
        version = request.match_info.get("version")
        if name != self.config.model_name or (version is not None and version != self.config.model_version):
            label = name if version is None else f"{name} version {version}"
            return _error(404, f"unknown model {label!r}; this server serves {self.config.model_name!r}")
        return None

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def server_ready(self, request: web.Request) -> web.Response:
        ready = self._is_ready()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "lto",
                "version": __version__,
                "extensions": ["binary_tensor_data"],
                # Not in the protocol (it has no model listing); lets `lto load URL` find the model.
                "lto_models": [self.config.model_name],
            }
        )

    async def model_metadata(self, request: web.Request) -> web.Response:
        if (err := self._model_error(request)) is not None:
            return err
        sig = self.batcher.signature
        return web.json_response(
            {
                "name": self.config.model_name,
                "versions": [self.config.model_version],
                "platform": self.config.platform,
                "inputs": [
                    {
                        "name": s.name,
                        "datatype": v2_datatype(s.dtype),
                        "shape": v2_shape(s.shape),
                        # Not in the protocol: dim names, so `lto load --shape sequence=128` works.
                        "lto_dim_names": [d if isinstance(d, str) else None for d in s.shape],
                    }
                    for s in sig.inputs
                ],
                "outputs": [
                    {"name": s.name, "datatype": v2_datatype(s.dtype), "shape": v2_shape(s.shape)}
                    for s in sig.outputs
                ],
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        if (err := self._model_error(request)) is not None:
            return err
        ready = self._is_ready()
        return web.json_response(
            {"name": self.config.model_name, "ready": ready}, status=200 if ready else 503
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _count(self, outcome: str) -> None:
        self.metrics.requests.labels(outcome).inc()

    def _admit(self, request: web.Request) -> web.Response | None:
        """Admission control before the body is read: bounded requests and bytes in flight."""
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            self._count("too_large")
            response = _error(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
            response.force_close()
            return response
        if not self.batcher.accepting:
            self._count("overloaded")
            return _shed("the server is shutting down", 1)
        # A chunked body of unknown length may grow to the body limit: reserve that much.
        size = length if length is not None else limit
        if self.inflight >= self.config.max_inflight:
            self._count("overloaded")
            return _shed(
                f"overloaded: {self.inflight} requests in flight (limit {self.config.max_inflight})",
                self.batcher.retry_after_s(),
            )
        if self.inflight and self.inflight_bytes + size > self.config.max_inflight_bytes:
            self._count("overloaded")
            return _shed(
                f"overloaded: {self.inflight_bytes} body bytes in flight "
                f"(limit {self.config.max_inflight_bytes})",
                self.batcher.retry_after_s(),
            )
        return None

    async def infer(self, request: web.Request) -> web.StreamResponse:
        if (err := self._model_error(request)) is not None:
            self._count("not_found")
            return err
        if (refused := self._admit(request)) is not None:
            return refused
        size = request.content_length if request.content_length is not None else self.config.max_body_bytes
        self.inflight += 1
        self.inflight_bytes += size
        try:
            return await self._infer(request)
        except asyncio.CancelledError:
            # The client hung up (aiohttp cancels its handler): nobody to answer; a queued
            # request leaves the batcher's queue. A count, not a traceback.
            self._count("disconnected")
            raise
        finally:
            self.inflight -= 1
            self.inflight_bytes -= size

    async def _read_body(self, request: web.Request) -> bytes | web.StreamResponse:
        limit = self.config.max_body_bytes
        try:
            if request.content.is_eof():  # the whole body has arrived: no timer to arm
                return await request.read()
            return await asyncio.wait_for(request.read(), self.config.read_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            self._count("too_large")
            response = _error(413, f"request body exceeds the limit of {limit} bytes")
            response.force_close()
            return response
        except (TimeoutError, asyncio.TimeoutError):  # one class from 3.11, two before
            self._count("read_timeout")
            response = _error(408, f"the request body did not arrive within {self.config.read_timeout_s:g} s")
            response.force_close()
            # Send it and close now: aiohttp would otherwise linger, waiting for the rest.
            await response.prepare(request)
            await response.write_eof()
            if request.transport is not None:
                request.transport.close()
            return response
        except (ConnectionError, aiohttp.ClientPayloadError, HttpProcessingError) as exc:
            # The client went away mid-body: nobody to answer, nothing to log but a count.
            self._count("disconnected")
            log.debug("client disconnected while sending the body: %s", first_line(exc))
            response = web.Response(status=499)
            response.force_close()
            return response

    def _decode(self, body: bytes, header_length: int | None) -> InferRequest:
        sig = self.batcher.signature
        parsed = decode_request(body, header_length, sig.inputs)
        check_requested_outputs(parsed, sig.outputs)
        self.batcher.check_request(parsed.feeds, full=False)
        return parsed

    @staticmethod
    def _json_elements(parsed: InferRequest, outputs: dict[str, Any]) -> int:
        """Numbers the response carries as JSON text (binary outputs cost no encoding)."""
        if parsed.outputs is None:
            return 0 if parsed.binary_default else sum(int(v.size) for v in outputs.values())
        return sum(int(outputs[name].size) for name, binary in parsed.outputs.items() if not binary)

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        body = await self._read_body(request)
        if not isinstance(body, bytes):
            return body
        t_read = time.monotonic()
        try:
            header = request.headers.get(HEADER_LENGTH)
            try:
                header_length = int(header) if header is not None else None
            except ValueError:
                raise InputError(f"{HEADER_LENGTH} must be an integer, got {header!r}") from None
            json_bytes = len(body) if header_length is None else header_length
            if json_bytes > DECODE_OFF_LOOP_BYTES:
                # Large JSON: parse on a worker so the loop keeps serving binary requests.
                loop = asyncio.get_running_loop()
                parsed = await loop.run_in_executor(self._decoder, self._decode, body, header_length)
            else:
                parsed = self._decode(body, header_length)
        except InputError as exc:
            self._count("bad_request")
            return _error(400, exc.one_line())
        del body
        t_decoded = time.monotonic()
        # A deadline counts from here, decoded and queued (Triton's rule), not from arrival.
        try:
            # The only request in the server may run on the loop: no hand-off to a thread and back.
            alone = self.inflight == 1 and _loop_has_nothing_else()
            result = await self.batcher.submit(
                parsed.feeds, parsed.deadline_ms, arrived=t_decoded, alone=alone
            )
        except Overloaded as exc:
            self._count("overloaded")
            return _error(503, exc.message, {"Retry-After": str(exc.retry_after_s)})
        except DeadlineExceeded as exc:
            self._count("timeout")
            return _error(
                504,
                f"deadline of {parsed.deadline_ms or self.batcher.config.queue_timeout_ms:g} ms missed: "
                f"read {(t_read - t0) * 1e3:.1f} ms, decode {(t_decoded - t_read) * 1e3:.1f} ms, "
                f"queue {exc.queue_ms:.1f} ms, and the model needs {exc.needs_ms:.1f} ms",
            )
        except ModelFailure as exc:
            self._count("error")
            return _error(500, exc.message)
        t_result = time.monotonic()
        encode_args = (
            self.config.model_name,
            self.config.model_version,
            parsed,
            result.outputs,
            self.batcher.signature.outputs,
        )
        if self._json_elements(parsed, result.outputs) * 20 > DECODE_OFF_LOOP_BYTES:
            # Large JSON outputs (~20 bytes a number) are written on the worker too.
            loop = asyncio.get_running_loop()
            payload, head_len = await loop.run_in_executor(self._decoder, encode_response, *encode_args)
        else:
            payload, head_len = encode_response(*encode_args)
        t_done = time.monotonic()
        phases = {
            "read": (t_read - t0) * 1e3,
            "decode": (t_decoded - t_read) * 1e3,
            "queue": result.queue_ms,
            "batch": result.batch_ms,
            "model": result.model_ms,
            "encode": (t_done - t_result) * 1e3,
            "total": (t_done - t0) * 1e3,
        }
        headers = {"Server-Timing": _server_timing(phases, result.batch_rows)}
        if head_len is not None:
            headers[HEADER_LENGTH] = str(head_len)
            content_type = "application/octet-stream"
        else:
            content_type = "application/json"
        self._count("ok")
        self.metrics.latency.observe(t_done - t0)
        self.metrics.queue_wait.observe(result.queue_ms / 1e3)
        return web.Response(body=payload, headers=headers, content_type=content_type)


@dataclass
class RunningServer:
    server: InferenceServer
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        """Drain: refuse new work (503), answer everything accepted, then close the socket."""
        self.server.ready = False
        await self.server.batcher.drain()
        await self.runner.cleanup()
        self.server.close()


async def start_server(
    batcher: Batcher,
    config: ServerConfig,
    sample_row: dict[str, Any] | None = None,
    poller: PollingSelector | None = None,
) -> RunningServer:
    """Calibrate the batcher, bind the socket, and return once the server answers requests.
    `poller`: the loop's polling selector, told to poll only while nothing is in flight."""
    await batcher.start(sample_row or None)
    server = InferenceServer(batcher, config)
    if poller is not None:
        poller.may_poll = lambda: server.inflight == 0 and batcher.inflight_batches == 0
    # handler_cancellation: a client that hangs up takes its request out of the queue.
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=30.0, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    addresses = runner.addresses  # the real port when port 0 was asked for
    port = addresses[0][1] if addresses else config.port
    server.ready = True
    return RunningServer(server, runner, f"http://{config.host}:{port}")


async def serve_until_signal(
    batcher: Batcher,
    config: ServerConfig,
    sample_row: dict[str, Any] | None = None,
    on_ready: Callable[[RunningServer], Awaitable[int | None] | None] | None = None,
    poller: PollingSelector | None = None,
) -> int | None:
    """Serve until SIGTERM/SIGINT (or until `on_ready`'s coroutine returns), then drain and exit."""
    running = await start_server(batcher, config, sample_row, poller)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    result: int | None = None
    try:
        outcome = on_ready(running) if on_ready is not None else None
        if outcome is not None:
            # A validation run: serve until it finishes (its result is the exit code) or a signal.
            task = asyncio.ensure_future(outcome)
            waiter = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task in done:
                result = task.result()
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if result is None:
            await stop.wait()
    finally:
        await running.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return result
