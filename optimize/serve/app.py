"""What `lto serve` and `lto load` do, behind their argument parsing."""

from __future__ import annotations

import asyncio
import errno
import shlex
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from optimize.backend import TensorSpec
from optimize.data import InputSpec, load_samples, resolve_inputs
from optimize.errors import LtoError, UsageError, message_line
from optimize.model.runtime_model import RuntimeModel
from optimize.report import new_report
from optimize.serve import mlperf, polling
from optimize.serve.batcher import Batcher
from optimize.serve.batching.config import BatcherConfig
from optimize.serve.config_search import search_config, write_serving
from optimize.serve.floor import FloorEndpoint, throughput_alone
from optimize.serve.loadgen import (
    Endpoint,
    HttpEndpoint,
    InProcessEndpoint,
    LoadResult,
    LoadSettings,
    MaxQpsSearch,
    find_max_qps,
    load_report,
    run_load,
)
from optimize.serve.loading import (
    calibration_row,
    input_limits,
    open_instances,
    platform_of,
    resolve_served,
)
from optimize.serve.polling import PollingSelector
from optimize.serve.protocol import V2_TO_NUMPY
from optimize.serve.server import RunningServer, ServerConfig, serve_until_signal
from optimize.system.env import environment
from optimize.units import percentile_label

# `lto load` exit codes: 0 the SLO verdict passed, 1 it did not, 2 bad usage, 3 no server.
EXIT_SLO_MISSED = 1
EXIT_UNREACHABLE = 3


class ServerUnreachable(LtoError):
    """`lto load URL` found nothing answering there: not the same as a server that is too slow."""

    exit_code = EXIT_UNREACHABLE


class Console(Protocol):
    """Where progress lines go: the CLI's terminal console (lines may carry its [style] markup)."""

    def print(self, *objects: Any, **kwargs: Any) -> None: ...


@dataclass
class LoadOptions:
    """Everything `lto load` (and `lto serve --validate`) needs beyond the target."""

    settings: LoadSettings
    find_max_qps: bool = False
    report: Path | None = None
    # "loadgen": MLPerf LoadGen schedules and judges where it has the scenario; "lto": lto's loop.
    scheduler: str = "loadgen"
    offline: bool = False  # LoadGen's Offline scenario (in-process targets only)
    loadgen_log: Path | None = None  # keep LoadGen's own logs here
    # The floor: the model in this process behind one greedy worker, run at the same load after the
    # target (optimize/serve/floor.py). An in-process target's own model by default; for a server,
    # the model or artifact named here.
    floor: bool = True
    floor_model: Path | None = None
    # Search the artifact's serving configuration under the SLO and store it beside the artifact
    # (optimize/serve/config_search.py).
    search_config: bool = False

    def cli_args(self) -> list[str]:
        """The same options as `lto load` flags, for the child process of `serve --validate`."""
        s = self.settings
        args = ["--percentile", percentile_label(s.percentile), "--max-error-rate", f"{s.max_error_rate:g}"]
        args += ["--warmup", str(s.warmup), "--seed", str(s.seed)]
        if s.qps is not None:
            args += ["--qps", f"{s.qps:g}"]
        else:
            args += ["--concurrency", str(s.concurrency)]
        if s.requests is not None:
            args += ["--requests", str(s.requests)]
        elif s.duration_s is not None:
            args += ["--duration", f"{s.duration_s:g}s"]
        if s.min_queries is not None:
            args += ["--min-queries", str(s.min_queries)]
        if s.slo_ms is not None:
            args += ["--slo-ms", f"{s.slo_ms:g}"]
        if self.find_max_qps:
            args.append("--find-max-qps")
        if self.report is not None:
            args += ["--output", str(self.report)]
        if self.scheduler != "loadgen":
            args += ["--scheduler", self.scheduler]
        if self.loadgen_log is not None:
            args += ["--loadgen-log", str(self.loadgen_log)]
        if not self.floor:
            args.append("--no-floor")
        elif self.floor_model is not None:
            args += ["--floor", str(self.floor_model)]
        return args

    def runner(
        self, progress: Callable[[str], None] | None = None
    ) -> Callable[[Endpoint, LoadSettings], Awaitable[LoadResult]]:
        """How one load runs: LoadGen in its scenario for these settings, else lto's own loop."""
        scenario = mlperf.scenario_for(self.settings, self.offline)
        use_loadgen = self.scheduler == "loadgen" and scenario is not None
        if use_loadgen and not mlperf.available():
            raise UsageError(
                "MLPerf LoadGen is not installed",
                "pip install mlcommons-loadgen, or --scheduler lto for lto's own load loop",
            )
        if self.scheduler == "loadgen" and scenario is None and progress is not None:
            progress(
                f"LoadGen has no scenario that keeps {self.settings.concurrency} queries in flight: "
                "lto's own closed loop runs"
            )

        async def run(target: Endpoint, settings: LoadSettings) -> LoadResult:
            if use_loadgen:
                step = mlperf.scenario_for(settings, self.offline)
                assert step is not None
                return await mlperf.run_loadgen(target, settings, step, log_dir=self.loadgen_log)
            return await run_load(target, settings)

        return run


def _open(
    served: RuntimeModel,
    config: BatcherConfig,
    shapes: dict[str, tuple[int, ...]],
    console: Console,
    threads: int | None = None,
) -> tuple[Batcher, dict[str, np.ndarray] | None]:
    for warning in served.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    backends = open_instances(served, config.instances, threads)
    batcher = Batcher(backends, config)
    limits = input_limits(served)
    batcher.value_limits = limits.value_limits
    batcher.max_sequence = limits.max_sequence
    row, why = calibration_row(served, backends[0], shapes)
    if why:
        console.print(f"[yellow]note:[/] {why}")
    for note in batcher.signature.notes:
        console.print(f"[dim]{note}[/]")
    return batcher, row


def run_serve(
    model: Path | None,
    artifact: Path | None,
    batcher_config: BatcherConfig,
    server_config: ServerConfig,
    *,
    shapes: dict[str, tuple[int, ...]],
    validate: LoadOptions | None,
    console: Console,
    threads: int | None = None,
) -> int:
    """Serve until SIGTERM; with `validate`, run `lto load` against ourselves and return its verdict."""
    served = resolve_served(model, artifact, server_config.model_name or None)
    if validate is not None and validate.floor and validate.floor_model is None:
        # The load's floor is what this server serves, run in the load's own process.
        validate.floor_model = served.artifact_dir or served.model_path
    server_config.model_name = served.label
    server_config.platform = platform_of(served)
    batcher, row = _open(served, batcher_config, shapes, console, threads)

    def announce(running: RunningServer) -> Awaitable[int] | None:
        lat = batcher.latency
        console.print(
            f"serving [bold]{served.label}[/] ({served.backend}, {len(batcher.backends)} instance(s), "
            f"max batch {batcher.max_rows}) at {running.url}",
            highlight=False,
            soft_wrap=True,
        )
        if lat.n:
            console.print(
                f"[dim]calibrated: {lat.intercept:.3f} ms + {lat.slope:.4f} ms/row; "
                f"target latency {batcher_config.target_latency_ms:g} ms[/]"
            )
        sys.stdout.flush()
        if validate is None:
            return None
        return _validate_child(running, served.label, validate, console, served_shapes(served, shapes))

    async def main(poller: PollingSelector | None) -> int | None:
        try:
            return await serve_until_signal(
                batcher, server_config, row or None, on_ready=announce, poller=poller
            )
        except OSError as exc:
            where = f"{server_config.host}:{server_config.port}"
            cause = "another process is using the port" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise LtoError(f"cannot listen on {where}: {cause or exc}", "choose another --port") from None

    code = polling.run(main, server_config.busy_poll_us)
    console.print(f"drained: {batcher.requests_answered} requests answered in {batcher.batches_run} batches")
    return 0 if code is None else code


def validate_command(
    url: str, name: str, options: LoadOptions, shapes: dict[str, tuple[int, ...]] | None = None
) -> list[str]:
    """The `lto load` arguments `serve --validate` runs, echoed whole so the line can be pasted:
    with the shapes the server was given or the artifact was optimized for (a client cannot read
    pinned dims from the server's metadata, which keeps them dynamic)."""
    pins = [
        arg for n, shape in (shapes or {}).items() for arg in ("--shape", f"{n}={'x'.join(map(str, shape))}")
    ]
    return ["load", url, "--model", name, *pins, *options.cli_args()]


def served_shapes(served: RuntimeModel, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The inputs' shapes a client should send: the --shape pins given, else the artifact's own."""
    if shapes:
        return dict(shapes)
    spec = served.input_spec or {}
    return {
        str(t["name"]): tuple(int(d) for d in t["shape"]) for t in spec.get("inputs", []) if t.get("shape")
    }


async def _validate_child(
    running: RunningServer,
    name: str,
    options: LoadOptions,
    console: Console,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> int:
    """`lto load` in its own process, so that the generator and the server do not share a GIL."""
    args = validate_command(running.url, name, options, shapes)
    console.print(f"[dim]validating: lto {shlex.join(args)}[/]", highlight=False)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "optimize", *args)
    try:
        return await proc.wait()
    except asyncio.CancelledError:
        proc.terminate()
        await proc.wait()
        raise


async def _remote_target(
    url: str, model: str | None, shapes: dict[str, tuple[int, ...]], input_data: Path | None, seed: int
) -> tuple[HttpEndpoint, dict[str, Any]]:
    import aiohttp

    base = url.rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            if model is None:
                async with session.get(f"{base}/v2") as resp:
                    meta = await resp.json(content_type=None)
                models = meta.get("lto_models") if isinstance(meta, dict) else None
                if not models:
                    raise UsageError(f"{base} does not say which models it serves", "give --model NAME")
                model = str(models[0])
            async with session.get(f"{base}/v2/models/{model}") as resp:
                if resp.status != 200:
                    raise UsageError(f"{base} has no model {model!r} (HTTP {resp.status})", "check --model")
                meta = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ServerUnreachable(
            f"cannot reach {base}: {message_line(exc)}", "start it with `lto serve` or check the URL"
        ) from None
    specs = []
    for item in meta.get("inputs", []):
        dtype = V2_TO_NUMPY.get(item["datatype"])
        if dtype is None:
            raise UsageError(
                f"input {item['name']!r} has datatype {item['datatype']}, which lto load cannot generate"
            )
        # lto serve names dynamic dims (not in the protocol), so `--shape sequence=128` works.
        names = item.get("lto_dim_names") or [None] * len(item["shape"])
        dims = tuple(
            d if d >= 0 else (n if isinstance(n, str) else None)
            for d, n in zip(item["shape"], names, strict=False)
        )
        specs.append(TensorSpec(item["name"], dtype, dims))
    spec, rows = load_rows("remote-model", specs, shapes, input_data, seed)
    return HttpEndpoint(base, model, rows), spec.to_json()


def load_rows(
    model_path: str | Path,
    specs: list[TensorSpec],
    shapes: dict[str, tuple[int, ...]],
    input_data: Path | None,
    seed: int,
) -> tuple[InputSpec, list[dict[str, np.ndarray]]]:
    """The requests a load sends: generated inputs (one request, sent again and again), or every
    sample of --input-data (rows along the batch axis, or samples on a new first axis), sent in
    turn so that a load replays real rows."""
    spec, first = resolve_inputs(
        model_path, shapes, input_data, seed=seed, batch=1, specs=specs, first_rows=input_data is not None
    )
    if input_data is None:
        return spec, [first]
    samples = load_samples(input_data, specs, first, "--input-data").samples
    return spec, samples or [first]


async def _floor(
    source: str | Path,
    rows: list[dict[str, np.ndarray]],
    settings: LoadSettings,
    run: Callable[[Endpoint, LoadSettings], Awaitable[LoadResult]],
    progress: Callable[[str], None] | None,
    search: bool = False,
) -> dict[str, Any]:
    """The model behind one greedy worker in this process, at the same load: the reference the
    target's figures are read against, and the model's batch-1 throughput alone. With `search`,
    the highest rate within the SLO is searched on the floor as on the target."""
    served = resolve_served(source, None)
    backend = open_instances(served, 1)[0]
    try:
        if progress is not None:
            progress(f"floor: {served.label} in this process, one worker; its batch-1 throughput alone first")
        endpoint = FloorEndpoint(backend, rows)
        await endpoint.open()  # prepares the batch shapes it may form: `alone` runs prepared too
        found: MaxQpsSearch | None = None
        try:
            alone = await asyncio.get_running_loop().run_in_executor(None, throughput_alone, backend, rows)
            if search:
                found = await find_max_qps(
                    endpoint,
                    settings,
                    start_qps=settings.qps,
                    progress=_prefixed(progress, "floor: "),
                    run=run,
                )
                result = found.curve[-1]
            else:
                result = await run(endpoint, settings)
        finally:
            await endpoint.close()
    finally:
        backend.close()
    return {
        "model": str(served.model_path),
        "endpoint": endpoint.describe(),
        "throughput_alone_per_s": alone,
        "offered_share_of_alone": (settings.qps / alone) if settings.qps and alone else None,
        "run": result.summary(),
        "max_qps": found.to_json() if found is not None else None,
    }


def _prefixed(progress: Callable[[str], None] | None, prefix: str) -> Callable[[str], None] | None:
    return None if progress is None else (lambda line: progress(prefix + line))


def _search_config_command(
    target_arg: str | None,
    artifact: Path | None,
    model_name: str | None,
    shapes: dict[str, tuple[int, ...]],
    input_data: Path | None,
    options: LoadOptions,
    run: Callable[[Endpoint, LoadSettings], Awaitable[LoadResult]],
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """`lto load --artifact DIR --search-config --slo-ms N`: serve each configuration for real,
    search its highest rate within the SLO, keep the best beside the artifact."""
    if target_arg is not None and target_arg.startswith(("http://", "https://")):
        raise UsageError("--search-config serves the artifact itself", "give --artifact DIR instead of a URL")
    served = resolve_served(target_arg, artifact, model_name)
    if served.artifact_dir is None:
        raise UsageError("--search-config stores what it finds with an artifact", "give --artifact DIR")
    backend = open_instances(served, 1)[0]
    try:
        # The requests an in-process load sends: the artifact's own row, or what --shape pins and
        # --input-data holds when given.
        row, _ = calibration_row(served, backend, shapes)
        if shapes or input_data is not None or row is None:
            _, rows = load_rows(
                served.model_path, list(backend.inputs), shapes, input_data, options.settings.seed
            )
        else:
            rows = [row]
    finally:
        backend.close()
    found = asyncio.run(search_config(served.artifact_dir, rows, options.settings, run, progress))
    machine = environment()
    path = write_serving(served.artifact_dir, found, machine)
    report = new_report("load", model_path=str(served.model_path), input_spec=served.input_spec,
                        settings=options.settings.to_json())  # fmt: skip
    best = found.best_qps()
    report["load"] = {
        "target": {"name": f"lto serve --artifact {served.artifact_dir}", "transport": "http"},
        "server": None,
        "runs": [r.summary() for t in found.tried for r in t.search.curve[-1:]],
        "max_qps": None,
        "config_search": {**found.to_json(), "written_to": str(path)},
        "verdict": {
            "passed": best is not None,
            "reasons": []
            if best
            else [f"no configuration met p{options.settings.percentile:g} <= {options.settings.slo_ms:g} ms"],
        },
    }
    report["settings"]["search_config"] = True
    return report


def run_load_command(
    target_arg: str | None,
    artifact: Path | None,
    *,
    model_name: str | None,
    shapes: dict[str, tuple[int, ...]],
    input_data: Path | None,
    options: LoadOptions,
    batcher_config: BatcherConfig,
    console: Console,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the load (remote over HTTP, or in-process on a model/artifact) and return the report."""

    settings = options.settings
    settings.validate()
    remote = target_arg is not None and target_arg.startswith(("http://", "https://"))
    if options.offline and remote:
        raise UsageError("--offline drives an in-process model or artifact", "drop the URL or --offline")
    run = options.runner(progress)
    if options.search_config:
        return _search_config_command(
            target_arg, artifact, model_name, shapes, input_data, options, run, progress
        )

    async def main() -> dict[str, Any]:
        batcher: Batcher | None = None
        server_info: dict[str, Any] | None = None
        model_path: str | None = None
        target: Endpoint
        if remote:
            assert target_arg is not None
            target, spec_json = await _remote_target(
                target_arg, model_name, shapes, input_data, settings.seed
            )
            backend = "remote"
        else:
            served = resolve_served(target_arg, artifact, model_name)
            batcher, row = _open(served, batcher_config, shapes, console)
            await batcher.start(row)
            if served.input_spec and not shapes and input_data is None:
                spec_json = served.input_spec
                feeds = {k: v for k, v in (row or {}).items()}
            else:
                spec, rows = load_rows(
                    served.model_path, list(batcher.signature.inputs), shapes, input_data, settings.seed
                )
                spec_json = spec.to_json()
                feeds = rows[0]
            if not feeds:
                raise UsageError("cannot make inputs for this model", "pin dynamic dims with --shape")
            replay: list[dict[str, np.ndarray]] = [feeds] if input_data is None else rows
            target = InProcessEndpoint(batcher, replay, name=f"in-process {served.label}")
            backend = served.backend
            model_path = str(served.model_path)
            server_info = batcher.describe()
        await target.open()
        search: MaxQpsSearch | None = None
        try:
            if options.find_max_qps:
                search = await find_max_qps(
                    target, settings, start_qps=settings.qps, progress=progress, run=run
                )
                results: list[LoadResult] = list(search.curve)
            else:
                results = [await run(target, settings)]
        finally:
            await target.close()
            if batcher is not None:
                server_info = batcher.describe()
                await batcher.drain()
        floor = None
        floor_source = None if remote else (artifact or target_arg)
        floor_source = options.floor_model or floor_source
        if options.floor and floor_source is not None:
            floor = await _floor(
                floor_source, target.row_feeds, settings, run, progress, search=options.find_max_qps
            )
        report = load_report(
            results,
            target=target,
            backend=backend,
            model_path=model_path,
            input_spec=spec_json,
            settings=settings,
            search=search,
            server=server_info,
        )
        report["load"]["floor"] = floor
        return report

    report = asyncio.run(main())
    report["settings"]["find_max_qps"] = options.find_max_qps
    return report
