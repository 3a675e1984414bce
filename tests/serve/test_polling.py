"""`lto serve --busy-poll-us`: the loop polls before it sleeps, only while nothing is in flight,
never past the caller's timeout, and a polling server answers like any other."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from optimize.runtimes.backends import open_backend
from optimize.serve.polling import PollingSelector
from tests.conftest import make_matmul_model
from tests.serve.test_server import _start_serve, infer_json


@pytest.mark.timing
def test_polling_catches_an_event_within_the_window_and_is_bounded_otherwise() -> None:
    reader, writer = socket.socketpair()
    selector = PollingSelector(poll_s=0.5)
    selector.register(reader, 1)  # EVENT_READ
    try:
        selector.may_poll = lambda: True
        threading.Timer(0.02, writer.send, args=(b"x",)).start()
        ready = selector.select(timeout=None)
        assert [key.fileobj for key, _ in ready] == [reader]
        reader.recv(1)

        # Nothing arrives: polling stops at the window and the rest is slept, within the timeout.
        selector.poll_s = 0.05
        cpu0, t0 = time.process_time(), time.monotonic()
        assert selector.select(timeout=0.3) == []
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        assert 0.3 <= wall < 2.0 and cpu < 0.2

        # Not allowed to poll (a model thread may want the GIL): it sleeps at once.
        selector.may_poll = lambda: False
        cpu0 = time.process_time()
        assert selector.select(timeout=0.3) == []
        assert time.process_time() - cpu0 < 0.1
    finally:
        selector.close()
        reader.close()
        writer.close()


@pytest.mark.timing
def test_polling_stops_while_it_does_not_pay_and_resumes_when_events_come_quickly() -> None:
    reader, writer = socket.socketpair()
    selector = PollingSelector(poll_s=0.02)
    selector.register(reader, 1)  # EVENT_READ
    selector.may_poll = lambda: True
    try:
        # Each event comes 60 ms after the loop went idle: every 20 ms poll is wasted.
        for _ in range(6):
            threading.Timer(0.06, writer.send, args=(b"x",)).start()
            assert selector.select(timeout=None)
            reader.recv(1)
        assert selector.hit_rate < 0.5
        cpu0 = time.process_time()
        threading.Timer(0.06, writer.send, args=(b"x",)).start()
        assert selector.select(timeout=None)
        reader.recv(1)
        assert time.process_time() - cpu0 < 0.01  # slept: polling would have burnt 20 ms

        # Events come at once again (sleeping, it still sees how soon): it polls again.
        for _ in range(6):
            writer.send(b"x")
            assert selector.select(timeout=None)
            reader.recv(1)
        assert selector.hit_rate >= 0.5
    finally:
        selector.close()
        reader.close()
        writer.close()


def test_a_polling_server_answers_correctly_and_drains_on_sigterm(tmp_path: Path) -> None:
    path = make_matmul_model(tmp_path / "tiny.onnx", features=16, out=4)
    proc, url = _start_serve(str(path), "--name", "tiny", "--busy-poll-us", "300")
    reference = open_backend("onnxruntime", path)
    try:
        for i in range(20):
            x = np.full((1, 16), i, np.float32)
            body = json.dumps(infer_json({"x": x})).encode()
            req = urllib.request.Request(f"{url}/v2/models/tiny/infer", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=60) as resp:
                got = np.asarray(json.loads(resp.read())["outputs"][0]["data"], np.float32)
            np.testing.assert_allclose(got, reference.run({"x": x})["y"].ravel(), rtol=1e-6)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "drained: 20 requests answered" in out
