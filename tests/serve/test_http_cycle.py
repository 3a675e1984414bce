"""A request's cycle apart from any socket (optimize/serve/http_layer/cycle.py): what a head alone is
refused for, and the answers a connection owes, written in the order the requests arrived."""

from __future__ import annotations

import asyncio
import json

from optimize.serve.http_layer import HttpLimits, HttpRequest, HttpResponse
from optimize.serve.http_layer.cycle import AnswerQueue, Exchange, head_refusal
from tests.serve.test_http import EchoApp

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data


def post(path: str, length: int | None) -> HttpRequest:
    return HttpRequest("POST", path, "", {}, length, 0.0)


def exchange(path: str) -> Exchange:
    ex = Exchange(HttpRequest("GET", path, "", {}, None, 0.0))
    ex.complete = True
    return ex


def test_a_head_is_refused_for_its_declared_length_the_application_or_the_budget_in_that_order() -> None:
    app = EchoApp()
    limits = HttpLimits(max_body_bytes=100)
    no_budget: list[int] = []

    def budget(declared: int) -> str | None:
        no_budget.append(declared)
        return "50 body bytes in flight (limit 60)"

    too_large = head_refusal(app, limits, post("/refuse", 101), budget)
    assert too_large is not None and too_large.status == 413 and too_large.close
    assert "101 bytes exceeds the limit of 100 bytes" in json.loads(too_large.body)["error"]
    refused = head_refusal(app, limits, post("/refuse", 10), budget)
    assert refused is not None and refused.status == 503 and refused.body == b'{"error": "busy"}'
    assert no_budget == []  # the application refused first: the budget was never asked
    overloaded = head_refusal(app, limits, post("/slow", 10), budget)
    assert overloaded is not None and overloaded.status == 503 and not overloaded.close
    assert overloaded.headers is not None and "Retry-After" in overloaded.headers
    assert no_budget == [10]
    assert head_refusal(app, limits, post("/slow", None), budget) is None  # nothing declared
    assert app.counts == {"too_large": 1, "overloaded": 1}


def test_answers_go_out_in_arrival_order_and_stop_at_the_one_that_closes() -> None:
    answers, transport = AnswerQueue(), _Transport()
    first, second, third, fourth = (exchange(f"/{n}") for n in range(4))
    for ex in (first, second, third, fourth):
        answers.add(ex)
    second.response = HttpResponse(200, b"two")
    assert answers.flush(transport) is None and transport.out == b""  # the first is owed before it
    third.response = HttpResponse(200, b"three", close=True)
    fourth.response = HttpResponse(200, b"four")
    first.response = HttpResponse(200, b"one")
    assert answers.flush(transport) is third
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in transport.out.split(b"HTTP/1.1 ")[1:]]
    assert bodies == [b"one", b"two", b"three"] and b"Connection: close" in transport.out
    assert first.ended and second.ended and third.ended and not fourth.ended
    assert list(answers) == [fourth]


def test_the_next_exchange_gets_its_100_continue_when_its_turn_comes() -> None:
    answers, transport = AnswerQueue(), _Transport()
    first, waiting = exchange("/first"), Exchange(HttpRequest("POST", "/next", "", {}, 4, 0.0))
    waiting.continue_owed = True
    answers.add(first)
    answers.add(waiting)
    assert answers.flush(transport) is None and transport.out == b""  # not its turn yet
    first.response = HttpResponse(200, b"one")
    answers.flush(transport)
    assert transport.out.startswith(b"HTTP/1.1 200") and transport.out.endswith(b"one" + CONTINUE)
    assert not waiting.continue_owed and list(answers) == [waiting]
