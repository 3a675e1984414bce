"""The dynamic batcher's parts, one role each; `optimize.serve.batcher.Batcher` puts them together.

outcomes.py    what a request or a batch ends with: outputs and timings, or a ServeError
config.py      BatcherConfig, the batcher's flags
signature.py   how a model's requests combine (ModelSignature), row and shape helpers, a batch's
               work (WorkMeasure); the batch shapes warmed at start are optimize/runtimes/warmup.py's
estimators.py  what the batcher learns while it runs: batch latency (LatencyModel), arrival and
               hand-off gaps, the delivered rate (LoadEstimates)
queue.py       the bounded queue: requests by batch key, in arrival order, and their deadlines
admission.py   what a request must pass to be queued: input checks, the fail-fast overload answer
policy.py      when a batch leaves and how big it is: pure functions of the state and a time
dispatch.py    acting on the policy: launching batches on instances, answering their requests
instances.py   the model instances, one thread each: warm-up and calibration, assembling, running
               and splitting a batch
lifecycle.py   accepting and draining, idle tracking, the dispatcher task and its timer
metrics.py     batches run, requests answered, the per-batch hook the server's metrics read
"""
