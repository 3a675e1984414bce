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
import re
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from optimize.errors import InputError, first_line
from optimize.serve.batcher import Batcher
from optimize.serve.batching.outcomes import BatchStats, DeadlineExceeded, ModelFailure, Overloaded
from optimize.serve.http_layer import HttpApplication, HttpLimits, HttpRequest, HttpResponse, HttpServer
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
from optimize.version import __version__

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
    "send_timeout",
    "error",
)
# Bodies above this are decoded on a worker thread: a 3 MB JSON tensor takes tens of ms to
# parse, which on the event loop would stall every other request for as long.
DECODE_OFF_LOOP_BYTES = 64 * 1024

log = logging.getLogger("lto.serve")


_HTTP_DEFAULTS = HttpLimits()


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "model"
    model_version: str = "1"
    platform: str = "onnxruntime_onnx"
    # Admission control: whole requests in flight (body read, not yet answered). Beyond it, 503
    # with Retry-After, on the head when the server is already full, else once the body is read.
    max_inflight: int = 256
    # A JSON request (or the JSON part of a binary one) larger than this: 413 on the head.
    # Decoding JSON tensors peaks at ~17x the text; binary tensors cost their size.
    max_json_bytes: int = 8 * 1024 * 1024
    # Poll this long before the idle loop sleeps, while that catches requests
    # (optimize/serve/polling.py); 0: never.
    busy_poll_us: float = 300.0
    # What one connection or client may cost (optimize/serve/http_layer.py, HttpLimits).
    max_body_bytes: int = _HTTP_DEFAULTS.max_body_bytes
    max_inflight_bytes: int = _HTTP_DEFAULTS.max_inflight_body_bytes
    max_client_bytes: int = _HTTP_DEFAULTS.max_client_body_bytes
    read_timeout_s: float = _HTTP_DEFAULTS.read_timeout_s
    min_body_rate: float = _HTTP_DEFAULTS.min_body_rate
    max_head_bytes: int = _HTTP_DEFAULTS.max_head_bytes
    max_header_fields: int = _HTTP_DEFAULTS.max_header_fields
    max_chunk_ext_bytes: int = _HTTP_DEFAULTS.max_chunk_ext_bytes
    send_timeout_s: float = _HTTP_DEFAULTS.send_timeout_s
    max_connections: int = _HTTP_DEFAULTS.max_connections
    max_client_connections: int = _HTTP_DEFAULTS.max_client_connections
    first_request_timeout_s: float = _HTTP_DEFAULTS.first_request_timeout_s
    keepalive_s: float = _HTTP_DEFAULTS.keepalive_s

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            max_head_bytes=self.max_head_bytes,
            max_header_fields=self.max_header_fields,
            max_chunk_ext_bytes=self.max_chunk_ext_bytes,
            max_body_bytes=self.max_body_bytes,
            read_timeout_s=self.read_timeout_s,
            min_body_rate=self.min_body_rate,
            max_inflight_body_bytes=self.max_inflight_bytes,
            max_client_body_bytes=min(self.max_client_bytes, self.max_inflight_bytes),
            send_timeout_s=self.send_timeout_s,
            max_connections=self.max_connections,
            max_client_connections=min(self.max_client_connections, self.max_connections),
            first_request_timeout_s=self.first_request_timeout_s,
            keepalive_s=self.keepalive_s,
        )

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


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(obj), "application/json", headers)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> HttpResponse:
    return _json({"error": message}, status, headers)


def _shed(message: str, retry_after_s: int) -> HttpResponse:
    """503 before the body is read. The connection stays open and the body is dropped as it
    arrives (nothing is kept), which costs less than the client opening a new connection for
    every retry, and a client still sending sees the 503 at once."""
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


# Routes: (pattern, method, handler name), tried in order: infer, the hot one, first. GET
# routes answer HEAD too.
_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_ROUTES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), method, handler)
    for pattern, method, handler in (
        (_MODEL + "/infer", "POST", "infer"),
        (r"/v2/health/live", "GET", "live"),
        (r"/v2/health/ready", "GET", "server_ready"),
        (r"/v2", "GET", "server_metadata"),
        (_MODEL, "GET", "model_metadata"),
        (_MODEL + "/ready", "GET", "model_ready"),
        (r"/metrics", "GET", "metrics_handler"),
    )
)


@dataclass(slots=True)
class _Route:
    handler: str
    params: dict[str, str]


class InferenceServer(HttpApplication):
    """The KServe v2 endpoints around one model's batcher, on `optimize/serve/http_layer.py`."""

    def __init__(self, batcher: Batcher, config: ServerConfig) -> None:
        self.batcher = batcher
        self.config = config
        self.metrics = Metrics(batcher)
        batcher.on_batch = self.metrics.on_batch
        self.ready = False
        self.inflight = 0  # whole requests, body read and not yet answered
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lto-decode")

    def close(self) -> None:
        self._decoder.shutdown(wait=False)

    # ---------------------------------------------------------------- HttpApplication
    def error_response(self, status: int, message: str) -> HttpResponse:
        return _error(status, message)

    def count(self, outcome: str) -> None:
        self.metrics.requests.labels(outcome).inc()

    def admit(self, request: HttpRequest) -> HttpResponse | None:
        """On the head, before the body is read: unknown routes, bodies sent to routes that take
        none, JSON over its cap, and a server already full are refused; the body, if any, is
        then dropped as it arrives (body bytes are charged by the HTTP layer as they arrive)."""
        route = self._route(request)
        if isinstance(route, HttpResponse):
            return route  # 404 or 405: nothing of its body is kept
        if route.handler != "infer":
            if request.has_body:
                self.count("too_large")
                refusal = _error(413, f"{request.method} {request.path} takes no request body")
                refusal.close = True  # its body is not read: a lingering close
                return refusal
            return None
        if (err := self._model_error(route)) is not None:
            self.count("not_found")
            return err
        if not self.batcher.accepting:
            self.count("overloaded")
            return _shed("the server is shutting down", 1)
        if (refusal := self._json_refusal(request, request.content_length)) is not None:
            return refusal
        return self._full()

    def _full(self) -> HttpResponse | None:
        if self.inflight < self.config.max_inflight:
            return None
        self.count("overloaded")
        return _shed(
            f"overloaded: {self.inflight} requests in flight (limit {self.config.max_inflight})",
            self.batcher.retry_after_s(),
        )

    def _json_refusal(self, request: HttpRequest, body_bytes: int | None) -> HttpResponse | None:
        """413 for JSON text over `max_json_bytes`: the JSON part of a binary request (its
        declared header length), else the whole body."""
        header = request.headers.get(HEADER_LENGTH.lower())
        json_bytes: int | None = body_bytes
        if header is not None:
            try:
                json_bytes = int(header)
            except ValueError:
                return None  # the decoder answers 400, naming the header
        if json_bytes is None or json_bytes <= self.config.max_json_bytes:
            return None
        self.count("too_large")
        refusal = _error(
            413,
            f"{json_bytes} bytes of JSON exceed the limit of {self.config.max_json_bytes} "
            "(--max-json-mb); send tensors as binary data (the binary tensor data extension), "
            "which costs their size instead of ~17x the text to decode",
        )
        refusal.close = True
        return refusal

    def handle(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        route = self._route(request)
        if isinstance(route, HttpResponse):
            return route
        try:
            if route.handler == "infer":
                # A chunked body's size is known only now.
                refusal = self._json_refusal(request, len(request.body)) or self._full()
                if refusal is not None:
                    return refusal
                self.inflight += 1
                request.on_end = self._release_one
                return self._infer_answered(request)
            return getattr(self, route.handler)(route)
        except Exception as exc:
            return self._internal_error(request, exc)

    def _release_one(self) -> None:
        self.inflight -= 1

    # ---------------------------------------------------------------- routing
    def _route(self, request: HttpRequest) -> _Route | HttpResponse:
        """The request's endpoint, or its 404/405 answer; found once, on the headers."""
        if isinstance(request.context, (_Route, HttpResponse)):
            return request.context
        method = "GET" if request.method == "HEAD" else request.method
        allowed = []
        found: _Route | HttpResponse | None = None
        for pattern, route_method, handler in _ROUTES:
            match = pattern.fullmatch(request.path)
            if match is None:
                continue
            if route_method == method:
                found = _Route(handler, {k: v for k, v in match.groupdict().items() if v is not None})
                break
            allowed.append(route_method)
        if found is None and allowed:
            allow = ", ".join(sorted({*allowed, *(["HEAD"] if "GET" in allowed else [])}))
            found = _error(405, f"Method Not Allowed: {request.method} {request.path}", {"Allow": allow})
        elif found is None:
            self.count("not_found")
            found = _error(404, f"Not Found: {request.method} {request.path}")
        request.context = found
        return found

    def _internal_error(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        """No exception reaches the HTTP layer: it becomes a counted, logged, JSON 500."""
        self.count("error")
        log.error("internal error on %s %s: %s", request.method, request.path, first_line(exc))
        return _error(500, f"internal error: {first_line(exc)}")

    def _is_ready(self) -> bool:
        return self.ready and self.batcher.accepting

    def _model_error(self, route: _Route) -> HttpResponse | None:
        name = route.params["model"]
        version = route.params.get("version")
        if name != self.config.model_name or (version is not None and version != self.config.model_version):
            label = name if version is None else f"{name} version {version}"
            return _error(404, f"unknown model {label!r}; this server serves {self.config.model_name!r}")
        return None

    # ---------------------------------------------------------------- endpoints
    def live(self, route: _Route) -> HttpResponse:
        return _json({"live": True})

    def server_ready(self, route: _Route) -> HttpResponse:
        ready = self._is_ready()
        return _json({"ready": ready}, 200 if ready else 503)

    def server_metadata(self, route: _Route) -> HttpResponse:
        return _json(
            {
                "name": "lto",
                "version": __version__,
                "extensions": ["binary_tensor_data"],
                # Not in the protocol (it has no model listing); lets `lto load URL` find the model.
                "lto_models": [self.config.model_name],
            }
        )

    def model_metadata(self, route: _Route) -> HttpResponse:
        if (err := self._model_error(route)) is not None:
            return err
        sig = self.batcher.signature
        return _json(
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

    def model_ready(self, route: _Route) -> HttpResponse:
        if (err := self._model_error(route)) is not None:
            return err
        ready = self._is_ready()
        return _json({"name": self.config.model_name, "ready": ready}, 200 if ready else 503)

    def metrics_handler(self, route: _Route) -> HttpResponse:
        from prometheus_client import CONTENT_TYPE_LATEST

        return HttpResponse(200, self.metrics.render(), CONTENT_TYPE_LATEST)

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

    async def _infer_answered(self, request: HttpRequest) -> HttpResponse:
        try:
            return await self._infer(request)
        except asyncio.CancelledError:
            # The client hung up: nobody to answer; a queued request leaves the batcher's
            # queue. A count, not a traceback.
            self.count("disconnected")
            raise
        except Exception as exc:
            return self._internal_error(request, exc)

    async def _infer(self, request: HttpRequest) -> HttpResponse:
        t0 = request.arrived
        t_read = request.body_done
        body = request.body
        request.body = b""
        try:
            header = request.headers.get(HEADER_LENGTH.lower())
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
            self.count("bad_request")
            return _error(400, exc.one_line())
        del body
        t_decoded = time.monotonic()
        try:
            # The only request in the server may run on the loop: no hand-off to a thread and back.
            alone = self.inflight == 1 and _loop_has_nothing_else()
            # No `arrived`: the deadline counts from submit, decoded and queued (Triton's rule),
            # not from arrival, and on the batcher's own clock.
            result = await self.batcher.submit(parsed.feeds, parsed.deadline_ms, alone=alone)
        except Overloaded as exc:
            self.count("overloaded")
            return _error(503, exc.message, {"Retry-After": str(exc.retry_after_s)})
        except DeadlineExceeded as exc:
            self.count("timeout")
            return _error(
                504,
                f"deadline of {parsed.deadline_ms or self.batcher.config.queue_timeout_ms:g} ms missed: "
                f"read {(t_read - t0) * 1e3:.1f} ms, decode {(t_decoded - t_read) * 1e3:.1f} ms, "
                f"queue {exc.queue_ms:.1f} ms, and the model needs {exc.needs_ms:.1f} ms",
            )
        except ModelFailure as exc:
            self.count("error")
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
        self.count("ok")
        self.metrics.latency.observe(t_done - t0)
        self.metrics.queue_wait.observe(result.queue_ms / 1e3)
        return HttpResponse(200, payload, content_type, headers)


@dataclass
class RunningServer:
    server: InferenceServer
    http: HttpServer
    url: str

    async def stop(self) -> None:
        """Drain: refuse new work (503), answer everything accepted, then close the socket."""
        self.server.ready = False
        await self.server.batcher.drain()
        await self.http.stop(timeout_s=30.0)
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
    http_server = HttpServer(server, config.http_limits())
    try:
        port = await http_server.start(config.host, config.port)
    except BaseException:
        # The port is taken (or not allowed): the batcher's dispatcher is already running, and a
        # task left pending prints a dump at exit after the one-line error.
        await batcher.drain()
        server.close()
        raise
    server.ready = True
    return RunningServer(server, http_server, f"http://{config.host}:{port}")


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
