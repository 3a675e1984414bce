"""TVM: kernels tuned with MetaSchedule and compiled into a shared library (apache-tvm 0.27)."""

from __future__ import annotations

from optimize.options import boolean, integer, number, string, threads
from optimize.runtimes.spec import BackendInfo, RuntimeOption, RuntimeSpec, StageInfo

_HERE = "optimize.runtimes.tvm"

TUNE_OPTIONS = {
    "trials": integer(),
    "time_budget_s": number(),
    "target": string(),
    "rpc_tracker": string(),
    "rpc_key": string(),
    "cache_dir": string(),
    "retune": boolean(),
    "trials_per_iter": integer(),
    "population_size": integer(),
    "max_chunk_tasks": integer(),
    "build_timeout_s": number(),
    "run_timeout_s": number(),
    "num_threads": threads(),
}

SPEC = RuntimeSpec(
    name="tvm",
    title="TVM",
    backends=(BackendInfo("tvm", f"{_HERE}.backend:TvmBackend", "tvm", own_worker=True),),
    stages=(StageInfo("tvm-tune", f"{_HERE}.tune_stage:TvmTuneStage", TUNE_OPTIONS),),
    options=(
        RuntimeOption("trials", "tvm-tune", "TVM tuning trials in all", "200"),
        RuntimeOption(
            "target", "tvm-tune",
            "CPU to build TVM code for: an LLVM CPU name (znver3), x86-64-v3, or a JSON target "
            "(default: this machine, validated)",
            "x86-64-v3",
        ),
        RuntimeOption(
            "rpc_tracker", "tvm-tune", "HOST:PORT of a TVM RPC tracker: measure tuning trials on its devices",
            "127.0.0.1:9190",
        ),
        RuntimeOption("rpc_key", "tvm-tune", "device key on the RPC tracker", "cpu"),
    ),
)  # fmt: skip
