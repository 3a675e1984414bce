"""A small HTTP/1.1 server on asyncio's Protocol and httptools' parser (llhttp, as uvicorn uses).

`lto serve` answers requests that take about a millisecond, so the HTTP layer's own cost is
most of its overhead: a framework's request and response objects, middleware, router and stream
reader cost about 0.1 ms a request over a plain Protocol on our machines. This layer does what
the server needs and no more:

- the application sees a request twice: `admit` when its head arrives (so it can refuse before
  the body is read), and `handle` once its body is whole;
- responses go out in the order requests arrived (pipelining), refusals as soon as their turn
  comes while the body is still arriving and then dropped;
- `Expect: 100-continue` is answered when the request's turn comes, HEAD is GET without a body,
  and malformed HTTP gets 400.

What one client may cost is bounded (`HttpLimits`, docs/serving-limits.md has each limit's
reference in nginx, h11, Node and Kestrel and the attack it stops):

- the parser is fed one message at a time, in slices, so every wire byte is counted against the
  message it belongs to: a head (request line and fields) over its budget gets 414 or 431 before
  more of it is read; a body over its limit 413; chunk framing, extensions and trailers count too;
- body bytes in flight are charged as they arrive (server-wide and per client address), never
  reserved from a declared length, and a body arriving slower than the minimum rate gets 408;
- a client that stops reading its answers stops being read (and parsed) once `max_pipelined`
  answers are owed, and a connection whose owed bytes do not move for `send_timeout_s` is
  aborted; connections are capped (503), and one that sends no whole request head within
  `first_request_timeout_s` of accept, or idles past `keepalive_s`, is closed;
- an answer that closes the connection before the client finished sending (413, 408, 400, 431)
  closes it lingering: the write side is shut and what still arrives is read and dropped for a
  while, so the client reads its answer instead of a reset.

The parts, by role:

limits.py        HttpLimits: every limit (sizes, timeouts, counts) in one object
messages.py      HttpRequest, HttpResponse, the HttpApplication interface, a response's bytes
framing.py       where a head and a chunked body end on the wire (one message per parser feed)
connection.py    the protocol: one connection's transport events, pausing, answers and closing
reader.py        bytes into requests: the parser fed one message part at a time, the read timeout
cycle.py         one request's exchange, from its head to its end (admission, body, charge, answer),
                 and the answers owed, written in the order the requests arrived
flow_control.py  when a connection's reading pauses, and whether its owed bytes move
server.py        HttpServer: listening, per-server and per-client accounting, the limits' sweep
"""

from optimize.serve.http_layer.connection import HttpConnection
from optimize.serve.http_layer.limits import KIB, MIB, HttpLimits
from optimize.serve.http_layer.messages import HttpApplication, HttpRequest, HttpResponse
from optimize.serve.http_layer.server import HttpServer

__all__ = [
    "KIB",
    "MIB",
    "HttpApplication",
    "HttpConnection",
    "HttpLimits",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
]
