"""The `lto serve` configuration that carries the most load within an SLO, searched on this machine.

As Triton's Model Analyzer does for Triton, each configuration is served for real (`lto serve` in its
own process, over HTTP) and its highest Poisson rate whose latency percentile meets the SLO with a
VALID MLPerf LoadGen result is searched (`find_max_qps` with LoadGen's Server scenario). The
dimensions are searched one at a time from today's defaults (Model Analyzer's quick search): the
most rows in a batch, how long a request waits for company, instances x threads, busy polling.
A value is tried from the best rate so far raised by MIN_GAIN (it is not searched below: it could
not replace the best), and one that holds more is served again beside the best in a rematch and
kept only when it wins that too: on a 2-vCPU VM two searches of one configuration can differ by
more than any setting's effect (docs/serving.md). The chosen configuration is written
beside the artifact (`serving.json`, with the machine it was measured on and every curve), and
`lto serve --artifact` uses it for every flag not given (optimize/cli/serve_cmd.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimize.errors import LtoError, UsageError
from optimize.files import write_json_atomic
from optimize.serve.loadgen import HttpEndpoint, LoadResult, LoadSettings, MaxQpsSearch, find_max_qps
from optimize.system.env import physical_cores

SERVING_FILE = "serving.json"
SCHEMA = 1
# A value must raise the highest rate within the SLO by more than this to replace the current one:
# two searches of one configuration differ by about this much on a 2-vCPU VM.
MIN_GAIN = 0.10


@dataclass(frozen=True)
class ServeConfig:
    """The batching and instance settings of `lto serve` that the search varies."""

    max_batch: int = 32
    max_wait_ms: float = 1.0
    instances: int = 1
    threads: int | None = None  # per instance; None: the cores split between instances
    busy_poll_us: float = 300.0

    def flags(self) -> list[str]:
        out = ["--max-batch", str(self.max_batch), "--max-wait-ms", f"{self.max_wait_ms:g}",
               "--instances", str(self.instances), "--busy-poll-us", f"{self.busy_poll_us:g}"]  # fmt: skip
        return out + (["--threads", str(self.threads)] if self.threads is not None else [])

    def label(self) -> str:
        threads = f"x{self.threads}t" if self.threads is not None else ""
        return (f"batch {self.max_batch}, wait {self.max_wait_ms:g} ms, {self.instances} inst{threads}, "
                f"poll {self.busy_poll_us:g} us")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def dimensions(cores: int) -> list[tuple[str, list[Any]]]:
    """The values tried for each setting, in the order they are searched."""
    instances = [1] + ([2] if cores >= 2 else [])
    # One thread fewer than the cores leaves one to the event loop (and a client on the same host):
    # on 2 vCPUs a model run whose second thread is preempted waits for it (docs/serving.md).
    threads = [None] + ([cores - 1] if cores >= 2 else [])
    return [
        ("max_batch", [1, 8, 32]),
        ("max_wait_ms", [0.0, 1.0, 4.0]),
        ("threads", threads),
        ("instances", instances),
        ("busy_poll_us", [0.0, 300.0]),
    ]


@dataclass
class Tried:
    config: ServeConfig
    search: MaxQpsSearch
    role: str = "search"  # "search": the first time served; "rematch": served again beside the best

    @property
    def max_qps(self) -> float:
        return self.search.max_qps or 0.0

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "label": self.config.label(), "role": self.role,
                **self.search.to_json()}  # fmt: skip


@dataclass
class ConfigSearch:
    best: ServeConfig
    tried: list[Tried]
    settings: LoadSettings

    def best_qps(self) -> float | None:
        """The chosen configuration's rate, from the last time it was served."""
        return next((t.search.max_qps for t in reversed(self.tried) if t.config == self.best), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "slo_ms": self.settings.slo_ms,
            "percentile": self.settings.percentile,
            "config": self.best.to_json(),
            "max_qps": self.best_qps(),
            "tried": [t.to_json() for t in self.tried],
        }


ServerStarter = Callable[[Path, list[str]], tuple[subprocess.Popen[str], str]]


def start_server(artifact: Path, flags: list[str]) -> tuple[subprocess.Popen[str], str]:
    """`lto serve --artifact` in its own process on a free port; its URL once it listens."""
    command = [sys.executable, "-m", "optimize", "serve", "--artifact", str(artifact), "--name", "m",
               "--port", "0", *flags]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if " at http://" in line:
            return proc, "http://" + line.split(" at http://", 1)[1].split()[0].rstrip("/.,")
    proc.wait()
    raise LtoError(f"lto serve {' '.join(flags)} did not start: {lines[-1] if lines else 'no output'}")


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# Serves one configuration and searches its highest rate: (config, first rate, lowest rate worth
# trying or None, role) -> what was tried.
Measure = Callable[[ServeConfig, "float | None", "float | None", str], Awaitable[Tried]]


async def choose_config(measure: Measure, dims: Sequence[tuple[str, Sequence[Any]]]) -> ServeConfig:
    """The coordinate search with its rematches (module docstring), over a `measure` that serves."""
    best = ServeConfig()
    best_qps = (await measure(best, None, None, "search")).max_qps
    seen = {best}
    for name, values in dims:
        for value in values:
            candidate = dataclasses.replace(best, **{name: value})
            if candidate in seen:
                continue
            seen.add(candidate)
            bar = best_qps * (1 + MIN_GAIN) if best_qps else None
            first = await measure(candidate, bar, bar, "search")
            if not first.max_qps or first.max_qps <= (bar or 0.0):
                continue
            again_best = (await measure(best, best_qps, None, "rematch")).max_qps
            again = (await measure(candidate, first.max_qps, None, "rematch")).max_qps
            if again > again_best * (1 + MIN_GAIN):
                best, best_qps = candidate, again
            else:
                best_qps = again_best
    return best


async def search_config(
    artifact: Path,
    rows: Sequence[dict[str, np.ndarray]],
    settings: LoadSettings,
    run: Callable[[Any, LoadSettings], Awaitable[LoadResult]],
    progress: Callable[[str], None] | None = None,
    starter: ServerStarter = start_server,
    cores: int | None = None,
) -> ConfigSearch:
    """Search the configuration (module docstring); `run` runs one load (LoadGen's Server)."""
    if settings.slo_ms is None:
        raise UsageError("--search-config needs --slo-ms", "e.g. --slo-ms 15 --percentile p99")
    tried: list[Tried] = []

    async def measure(config: ServeConfig, start: float | None, lowest: float | None, role: str) -> Tried:
        if progress is not None:
            again = " (again, beside the best)" if role == "rematch" else ""
            progress(f"configuration: {config.label()}{again}")
        try:
            proc, url = starter(artifact, config.flags())
        except LtoError as exc:  # a setting this artifact's runtime does not take (--threads, say)
            if progress is not None:
                progress(f"  not served: {exc}")
            tried.append(Tried(config, MaxQpsSearch(None, []), role))
            return tried[-1]
        endpoint = HttpEndpoint(url, "m", list(rows))
        try:
            await endpoint.open()
            step = (lambda line: progress(f"  {line}")) if progress is not None else None
            first = start if start is not None else settings.qps
            found = await find_max_qps(
                endpoint, settings, start_qps=first, progress=step, run=run, min_qps=lowest
            )
        finally:
            await endpoint.close()
            stop_server(proc)
        await asyncio.sleep(0.5)  # the stopped server's threads leave the cores before the next one starts
        tried.append(Tried(config, found, role))
        return tried[-1]

    best = await choose_config(measure, dimensions(cores or physical_cores()))
    return ConfigSearch(best, tried, settings)


def write_serving(artifact: Path, found: ConfigSearch, machine: dict[str, Any]) -> Path:
    """`serving.json` beside the artifact: the chosen configuration, where and how it was chosen."""
    path = artifact / SERVING_FILE
    write_json_atomic(path, {**found.to_json(), "machine": machine})
    return path


def read_serving(artifact: Path, fingerprint: str) -> tuple[dict[str, Any] | None, str | None]:
    """The searched configuration for this machine, or None with why not (no file, another machine)."""
    path = artifact / SERVING_FILE
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text())
        config = ServeConfig(**data["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{path} is not a serving configuration lto wrote ({exc.__class__.__name__}): ignored"
    measured_on = (data.get("machine") or {}).get("fingerprint")
    if measured_on != fingerprint:
        return None, f"{path} was searched on another machine ({measured_on}): ignored"
    return {"config": config, "slo_ms": data.get("slo_ms"), "max_qps": data.get("max_qps")}, None


def searched_defaults(
    artifact: Path | None, given: set[str], fingerprint: str
) -> tuple[dict[str, Any], list[str]]:
    """The searched settings `lto serve --artifact` takes for the flags not given (by field name),
    and the lines that say so."""
    if artifact is None:
        return {}, []
    found, why = read_serving(Path(artifact), fingerprint)
    if found is None:
        return {}, [why] if why else []
    config: ServeConfig = found["config"]
    taken = {k: v for k, v in config.to_json().items() if k not in given}
    if not taken:
        return {}, []
    rate = f", {found['max_qps']:.0f}/s within p99 {found['slo_ms']:g} ms" if found.get("max_qps") else ""
    names = ", ".join(f"{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"{k.replace('_', '-')} {v}"
                      for k, v in taken.items() if v is not None)  # fmt: skip
    return taken, [
        f"using the serving configuration searched on this machine ({SERVING_FILE}{rate}): {names}"
    ]
