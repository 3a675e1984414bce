"""`lto serve` and `lto load`: a dynamic-batching KServe v2 server and a LoadGen-style load generator.

batcher.py   deadline-aware dynamic batching over backend instances (one thread each)
protocol.py  the Open Inference Protocol codec (JSON and binary tensors)
server.py    the HTTP server (aiohttp), metrics, Server-Timing, drain on SIGTERM
loadgen.py   open/closed-loop load, latency breakdown, SLO verdict, max-QPS search
loading.py   artifact or ONNX file -> backend instances
app.py       what the two commands do, behind their flags
"""
