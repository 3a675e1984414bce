"""`lto optimize`: baseline, stages in recipe order, a measured keep/reject after each, an artifact.

The pipeline is the one place that measures and decides (STYLE.md): a stage only proposes
candidates. After every candidate:

1. it is loaded as its own backend from its files with its runtime configuration;
2. its outputs on every accuracy sample are checked against the baseline's (`optimize.accuracy`);
3. it is benchmarked side by side with the best so far and the baseline, each in a worker process
   of its own (`optimize.bench.apart`), and kept only when the ratio candidate/best at the target
   percentile is below 1 - min_improvement AND the upper end of its 95% CI is below 1 (faster with
   confidence), twice, the second time on fresh processes.

A stage that raises is recorded as failed (unless the error is a programming error raised in
lto's own code: that is a bug, and it stops the run with a partial report) and one that cannot
handle the model as skipped; the run goes on with the best so far, and always ends with the best
accurate candidate (the original model, on ONNX Runtime defaults, when nothing won).

Every speedup in the per-stage table is measured: the candidate against the baseline in the same
comparison as its ratio to the best, never a product of ratios. The headline is the artifact's
own row's confirmed figure (docs/measurement.md).

The package, by role:
    request.py    what the user asked for, checked before any work; the recipe with the CLI's overrides
    baseline.py   the inputs, judging rows and reference outputs every candidate is judged against
    evaluate.py   load, check and time candidates (through optimize.bench only); owns every worker;
                  holds the best so far (BestSoFar: its row, its worker, its measurement alone)
    loop.py       the run: stages in order, each candidate evaluated, the search's stopping rules
    stage_run.py  one stage loaded, opened and run: its stream of candidates, and how it ended
    budget.py     the --time-budget: what is left for the search, a stage's share, the final timing
    final.py      the end: the artifact against the baseline once more, the verdict, the write
    order.py      the order stages run in: expected gain per second (the corpus prior, this machine)
    judge.py      every keep/reject decision (a Decision value), the target verdict and the exit codes
    record.py     the run's record: rows (their Status, an enum of optimize.stage), warnings, logs, results
    summary.py    the report built from the record, the partial report of a stopped run
    isolation.py  running a stage in a child process group

Exit codes: 0 target met (or no target), 3 the best artifact misses the target (TARGET_MISSED),
1 failure, 2 usage errors.
"""

from optimize.pipeline.judge import EXIT_FAILURE, EXIT_TARGET_MET, EXIT_TARGET_MISSED, EXIT_USAGE
from optimize.pipeline.loop import Pipeline, optimize
from optimize.pipeline.record import Progress, RunRecord, StageRecord
from optimize.pipeline.request import OptimizeRequest, partial_report_path
from optimize.pipeline.summary import PipelineResult
from optimize.stage import Status
from optimize.units import parse_duration

__all__ = [
    "EXIT_FAILURE",
    "EXIT_TARGET_MET",
    "EXIT_TARGET_MISSED",
    "EXIT_USAGE",
    "OptimizeRequest",
    "Pipeline",
    "PipelineResult",
    "Progress",
    "RunRecord",
    "StageRecord",
    "Status",
    "optimize",
    "parse_duration",
    "partial_report_path",
]
