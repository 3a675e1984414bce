"""`lto serve` and `lto load`: a dynamic-batching KServe v2 server, and load on MLPerf LoadGen with
the floor and a serving-configuration search beside it.

batcher.py   deadline-aware dynamic batching over backend instances (one thread each); its parts in batching/
clock.py     the batcher's time source, one Clock a test can step by hand
protocol.py  the Open Inference Protocol codec (JSON and binary tensors)
server.py    the KServe v2 endpoints, admission, metrics, Server-Timing, drain on SIGTERM
http_layer/  the HTTP/1.1 layer under it (asyncio Protocol + httptools' parser), cut by role, and its limits
polling.py   --busy-poll-us: poll before the idle loop sleeps
loadgen.py   endpoints (HTTP, in-process), lto's own open/closed loop, latency breakdown, SLO
             verdict, max-QPS search
mlperf.py    MLPerf LoadGen's Server, SingleStream and Offline scenarios, its verdict and trace
floor.py     the floor: the artifact in-process behind one greedy-batching worker, no HTTP
config_search.py  the serving configuration that carries the most load within an SLO (serving.json)
loading.py   artifact or ONNX file -> backend instances
app.py       what the two commands do, behind their flags
"""
