"""`lto serve --validate`: the `lto load` it runs is the one it prints, and can be pasted."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from optimize.serve.app import LoadOptions, _validate_child
from optimize.serve.loadgen import LoadSettings
from tests.cli_helpers import run_cli


def test_validate_echoes_the_complete_load_command(monkeypatch: pytest.MonkeyPatch) -> None:
    printed: list[str] = []
    launched: list[list[str]] = []

    class Printer:
        def print(self, *objects: Any, **kwargs: Any) -> None:
            printed.append(" ".join(map(str, objects)))

    class Proc:
        async def wait(self) -> int:
            return 0

    async def fake_exec(*argv: str) -> Proc:
        launched.append(list(argv))
        return Proc()

    monkeypatch.setattr(asyncio, "create_subprocess_exec", fake_exec)
    options = LoadOptions(LoadSettings(requests=100, slo_ms=5.0, duration_s=None))
    running = SimpleNamespace(url="http://127.0.0.1:1")  # nothing listens on port 1
    assert asyncio.run(_validate_child(running, "mlp_small", options, Printer())) == 0

    (line,) = printed
    echoed = line.removeprefix("[dim]validating: ").removesuffix("[/]")
    assert "--model mlp_small" in echoed
    words = shlex.split(echoed)
    assert words[:5] == ["lto", "load", "http://127.0.0.1:1", "--model", "mlp_small"]
    # the child runs exactly what was echoed
    (argv,) = launched
    assert argv[1:3] == ["-m", "optimize"] and argv[3:] == words[1:]
    # and the echoed flags are ones `lto load` accepts: it gets as far as dialling the server
    proc = run_cli(*words[1:], timeout=60)
    # exit code 3, "unreachable", not 1, "SLO missed"
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "cannot reach" in proc.stderr and "Traceback" not in proc.stderr


def test_a_busy_port_is_one_line_and_nothing_after_it() -> None:
    """The error used to be followed by "Task was destroyed but it is pending!" and a task dump:
    the batcher's dispatcher was left running when the bind failed."""
    import socket

    from tests.cli_helpers import assert_clean_error, run_lto

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_lto("serve", "sample_models/mlp_small.onnx", "--port", str(port), timeout=120)
    assert_clean_error(proc, 1, f"cannot listen on 127.0.0.1:{port}: another process is using the port")
    assert "Task was destroyed" not in proc.stderr and "pending" not in proc.stderr


def test_load_replays_every_row_of_its_input_data(tmp_path: Path) -> None:
    """`lto load --input-data` refused a file of many rows; it now sends them in turn."""
    import json

    import numpy as np

    from tests.cli_helpers import run_cli
    from tests.conftest import make_matmul_model

    model = make_matmul_model(tmp_path / "m.onnx", features=16, out=4)
    rows = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)  # 5 rows, batch axis
    np.savez(tmp_path / "rows.npz", x=rows)
    proc = run_cli("load", model, "--input-data", tmp_path / "rows.npz", "--requests", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["load"]["target"]["rows"] == 5
    assert report["load"]["runs"][0]["completed_ok"] == 20


def test_an_http_client_sends_its_rows_in_turn() -> None:
    import asyncio

    import numpy as np

    from optimize.serve.http_client import HttpClientError
    from optimize.serve.loadgen import HttpEndpoint

    rows = [{"x": np.full((1, 4), float(i), dtype=np.float32)} for i in range(3)]
    endpoint = HttpEndpoint("http://127.0.0.1:1", "m", rows)
    sent: list[bytes] = []

    async def send(request: bytes) -> object:
        sent.append(request)
        raise HttpClientError("no server")

    endpoint.client.send = send  # type: ignore[method-assign]
    for _ in range(4):
        assert asyncio.run(endpoint.infer()).kind == "connection"
    assert endpoint.rows == 3 and sent[0] != sent[1] != sent[2] and sent[3] == sent[0]
