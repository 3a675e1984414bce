"""Does a candidate still give the reference's answers, and can the rows tell? The rest of lto comes
in through this module only.

- `thresholds`: what accuracy a candidate must keep;
- `task_metrics`: the task metric each output is judged by (classifier, embedding, CTC, detection,
  mask), chosen from its shape and values, and the metric's own arithmetic;
- `evidence`: whether the judging rows can tell a right reduced candidate from a wrong one;
- `result`: an accuracy check's result, its summary and JSON;
- `user_metric`: the user's own metric (`--metric FILE.py:FUNCTION`);
- `compare`: per-output figures of a candidate against the reference (whole output, worst slice,
  task metric, padded positions left out);
- `verdict`: the verdict on those figures (`check`), with its reasons in words.

The modules depend on each other in that order (a module imports only those above it); nothing
here imports the data package.
"""

from optimize.accuracy.compare import choose_metrics
from optimize.accuracy.evidence import MIN_ROWS, Evidence, assess, is_lossy, numerics
from optimize.accuracy.result import FEW_SAMPLES, AccuracyResult, MetricError, accuracy_json
from optimize.accuracy.task_metrics import METRICS, MetricChoice
from optimize.accuracy.thresholds import Thresholds
from optimize.accuracy.user_metric import UserMetric, load_user_metric
from optimize.accuracy.verdict import check

__all__ = [
    "FEW_SAMPLES",
    "METRICS",
    "MIN_ROWS",
    "AccuracyResult",
    "Evidence",
    "MetricChoice",
    "MetricError",
    "Thresholds",
    "UserMetric",
    "accuracy_json",
    "assess",
    "check",
    "choose_metrics",
    "is_lossy",
    "load_user_metric",
    "numerics",
]
