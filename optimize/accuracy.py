"""Does a candidate still give the baseline's answers? Per-output error figures and the verdict.

Every candidate runs on the same input samples as the baseline (the benchmark inputs plus a
few generated ones). For each output the worst case over all samples is reported:

- cosine: cosine similarity of the flattened outputs (1.0 = same direction);
- max_abs: largest absolute difference;
- max_rel: max_abs divided by the largest |reference| value of that output, i.e. the error
  relative to the output's scale (element-wise relative error explodes where values are ~0);
- top1_agreement: for classifier-like outputs (2-D float [batch, classes]), the fraction of
  rows, pooled over all samples, whose argmax is unchanged;
- top1_agreement_tolerant: the same, except that a changed argmax does not count when the
  reference itself scores the new class within `top1_tolerance` x (its row's max - min) of
  its own top class: a near-tie the reference does not decide. This is what the gate uses
  (strict recipes set the tolerance to 0); untrained or uncertain models are full of such ties.

Integer and boolean outputs (token ids, masks, argmax indices) must match exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from optimize.recipes import Thresholds


Outputs = Mapping[str, np.ndarray]


@dataclass
class AccuracyResult:
    ok: bool
    reason: str  # empty when ok
    per_output: dict[str, dict[str, float]]  # name -> {"cosine", "max_abs", "max_rel", "top1_agreement"?}


def _as_samples(value: Outputs | Sequence[Outputs]) -> list[Outputs]:
    if isinstance(value, Mapping):
        return [value]
    return list(value)


def is_classifier_like(array: np.ndarray) -> bool:
    return array.ndim == 2 and np.issubdtype(array.dtype, np.floating) and array.shape[1] > 1


def _cosine(ref: np.ndarray, got: np.ndarray) -> float:
    a = ref.ravel()
    b = got.ravel()
    na = float(np.linalg.norm(a))
    nb = float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def output_figures(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Error figures for one output of one sample (shapes must already match)."""
    if not np.issubdtype(ref.dtype, np.floating):
        mismatched = int(np.count_nonzero(ref != got))
        return {
            "cosine": 1.0 if mismatched == 0 else 0.0,
            "max_abs": float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
            if ref.size
            else 0.0,
            "max_rel": 0.0 if mismatched == 0 else float("inf"),
            "mismatched": float(mismatched),
        }
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    # NaN/inf where the reference has them too is the model's behaviour, not an error.
    both_nonfinite = ~np.isfinite(r) & ~np.isfinite(g) & ((r == g) | (np.isnan(r) & np.isnan(g)))
    new_nonfinite = ~np.isfinite(g) & ~both_nonfinite
    if np.any(new_nonfinite):
        return {"cosine": 0.0, "max_abs": float("inf"), "max_rel": float("inf"), "nonfinite": 1.0}
    keep = ~both_nonfinite
    r, g = r[keep], g[keep]
    if r.size == 0:
        return {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0}
    diff = np.abs(r - g)
    max_abs = float(diff.max())
    scale = float(np.abs(r).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return {"cosine": _cosine(r, g), "max_abs": max_abs, "max_rel": max_rel}


def compare_outputs(
    reference: Outputs | Sequence[Outputs], outputs: Outputs | Sequence[Outputs], top1_tolerance: float = 0.0
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Worst-case figures per output over all samples, and the structural problems found."""
    refs, gots = _as_samples(reference), _as_samples(outputs)
    problems: list[str] = []
    if len(refs) != len(gots):
        return {}, [f"{len(gots)} output samples for {len(refs)} reference samples"]
    per_output: dict[str, dict[str, float]] = {}
    top1_hits: dict[str, list[int]] = {}  # name -> [strict agreements, tolerant agreements, rows]
    for ref_sample, got_sample in zip(refs, gots, strict=True):
        for name, ref in ref_sample.items():
            if name not in got_sample:
                problems.append(f"output {name!r} is missing")
                continue
            got = np.asarray(got_sample[name])
            ref = np.asarray(ref)
            if got.shape != ref.shape:
                problems.append(
                    f"output {name!r} has shape {list(got.shape)}, the reference {list(ref.shape)}"
                )
                continue
            figures = output_figures(ref, got)
            worst = per_output.setdefault(name, {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0})
            worst["cosine"] = min(worst["cosine"], figures["cosine"])
            worst["max_abs"] = max(worst["max_abs"], figures["max_abs"])
            worst["max_rel"] = max(worst["max_rel"], figures["max_rel"])
            if "mismatched" in figures:
                worst["mismatched"] = worst.get("mismatched", 0.0) + figures["mismatched"]
            if "nonfinite" in figures:
                worst["nonfinite"] = 1.0
            if is_classifier_like(ref) and np.all(np.isfinite(got)):
                hits = top1_hits.setdefault(name, [0, 0, 0])
                rows = np.arange(ref.shape[0])
                ref_top, got_top = np.argmax(ref, axis=1), np.argmax(got, axis=1)
                same = ref_top == got_top
                # How much worse the reference rates the candidate's pick, relative to the row's spread.
                drop = ref[rows, ref_top].astype(np.float64) - ref[rows, got_top].astype(np.float64)
                spread = ref.max(axis=1).astype(np.float64) - ref.min(axis=1).astype(np.float64)
                near_tie = drop <= top1_tolerance * spread
                hits[0] += int(np.count_nonzero(same))
                hits[1] += int(np.count_nonzero(same | near_tie))
                hits[2] += ref.shape[0]
    for name, (strict, tolerant, rows) in top1_hits.items():
        if name in per_output and rows:
            per_output[name]["top1_agreement"] = strict / rows
            per_output[name]["top1_agreement_tolerant"] = tolerant / rows
    return per_output, sorted(set(problems))


def check(
    reference: Outputs | Sequence[Outputs],
    outputs: Outputs | Sequence[Outputs],
    thresholds: Thresholds,
) -> AccuracyResult:
    """Compare candidate outputs with the reference; not ok names the first violated threshold."""
    per_output, problems = compare_outputs(reference, outputs, thresholds.top1_tolerance)
    if problems:
        return AccuracyResult(ok=False, reason=problems[0], per_output=per_output)
    reasons: list[str] = []
    for name, fig in per_output.items():
        if fig.get("nonfinite"):
            reasons.append(f"output {name!r} has NaN/inf values the reference does not have")
        elif "mismatched" in fig and fig["mismatched"] > 0:
            reasons.append(f"output {name!r} differs in {int(fig['mismatched'])} integer elements")
        elif fig["cosine"] < thresholds.min_cosine:
            reasons.append(f"output {name!r}: cosine {fig['cosine']:.6f} < {thresholds.min_cosine}")
        elif thresholds.max_abs is not None and fig["max_abs"] > thresholds.max_abs:
            reasons.append(f"output {name!r}: max abs error {fig['max_abs']:.3g} > {thresholds.max_abs}")
        elif thresholds.max_rel is not None and fig["max_rel"] > thresholds.max_rel:
            reasons.append(f"output {name!r}: max rel error {fig['max_rel']:.3g} > {thresholds.max_rel}")
        elif (
            thresholds.min_top1 is not None
            and "top1_agreement_tolerant" in fig
            and fig["top1_agreement_tolerant"] < thresholds.min_top1
        ):
            what = (
                "top-1 agreement" if thresholds.top1_tolerance == 0 else "top-1 agreement outside near-ties"
            )
            reasons.append(
                f"output {name!r}: {what} {fig['top1_agreement_tolerant']:.3f} < {thresholds.min_top1}"
            )
    return AccuracyResult(ok=not reasons, reason=reasons[0] if reasons else "", per_output=per_output)


def summarize_accuracy(result: AccuracyResult) -> dict[str, Any]:
    """The worst figures over all outputs, for a one-cell summary in tables."""
    if not result.per_output:
        return {}
    figs = result.per_output.values()
    out: dict[str, Any] = {
        "cosine": min(f["cosine"] for f in figs),
        "max_abs": max(f["max_abs"] for f in figs),
        "max_rel": max(f["max_rel"] for f in figs),
    }
    for key in ("top1_agreement", "top1_agreement_tolerant"):
        values = [f[key] for f in figs if key in f]
        if values:
            out[key] = min(values)
    return out


def accuracy_json(result: AccuracyResult) -> dict[str, Any]:
    """JSON-safe form (inf becomes a string, which JSON cannot hold as a number)."""

    def clean(v: float) -> float | str:
        return v if np.isfinite(v) else ("inf" if v > 0 else "-inf") if not np.isnan(v) else "nan"

    return {
        "ok": result.ok,
        "reason": result.reason,
        "per_output": {n: {k: clean(v) for k, v in f.items()} for n, f in result.per_output.items()},
        "worst": {k: clean(v) for k, v in summarize_accuracy(result).items()},
    }
