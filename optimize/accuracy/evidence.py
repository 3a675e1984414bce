"""Can the rows at hand tell a right candidate from a wrong one? Tested per output, before any
candidate is judged, on the original model's own outputs.

A metric that cannot fail proves nothing. On trained models (docs/accuracy-evidence.md): a
detector fed images with nothing in them detects nothing, and then agrees with an int8 candidate
whose class scores are all zero on photos; a classifier fed noise gives near-ties, which any
rounding flips, so right bf16 candidates were rejected; an output that is the same on every row
does not depend on the rows at all. `assess` runs one test per output and says whether its metric
can tell, with the figure it found and the rows that would let it tell.

The numerics of a candidate say how far from the original it may be: `exact` (fp32, the same
graph and kernels: outputs bit for bit the same), `reassociated` (fp32 fusions or other kernels:
the same maths in another order), `reduced` (bf16, fp16) and `quantized` (int8). A reduced or
quantized candidate ships only on evidence that can tell (`Evidence.can_tell`): the user's own
rows, at least MIN_ROWS of them, and every output's test passed. pipeline/judge.py decides with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimize.accuracy.task_metrics import (
    CTC_BLANK,
    DETECTION_MARGIN,
    MetricChoice,
    batch_first,
    detections,
    distribution_kind,
    greedy_decode,
)
from optimize.accuracy.thresholds import Thresholds

Outputs = Mapping[str, np.ndarray]

NUMERICS = ("exact", "reassociated", "reduced", "quantized", "mixed")
LOSSY_NUMERICS = ("reduced", "quantized", "mixed")

MIN_ROWS = 8  # samples a lossy candidate must be judged on: fewer, and one lucky row decides
# A top-1 (or per-frame) probability margin below this is a near-tie: bf16 or int8 rounding moves
# probabilities by about this much, so agreement on such rows is chance, not evidence.
NEAR_TIE_MARGIN = 0.05
NEAR_TIE_SHARE = 0.5  # near-ties on more than this share of rows: the metric cannot tell
MIN_DETECTIONS = 4  # firm detections (above the score threshold by the margin) over all rows
CONSTANT_REL = 1e-5  # rows that differ by less than this share of the output's scale are the same
FIRES_AT = 0.5  # a score or probability output that never reaches this on any row never fires
MIN_MASK_ROWS = 4  # rows on which a probability map has regions, for its IoU to tell anything
NO_SIGNAL_SHARE = 0.01  # a row whose largest |value| is below this share of the output's: ~0


@dataclass(frozen=True)
class OutputTest:
    """Whether one output's metric can tell on the rows, and what was found."""

    name: str
    metric: str
    can_tell: bool
    finding: str  # what the test found, with its figure
    needs: str = ""  # the rows that would let it tell ("" when it can)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"metric": self.metric, "can_tell": self.can_tell, "finding": self.finding}
        if self.needs:
            out["needs"] = self.needs
        return out


@dataclass(frozen=True)
class Evidence:
    """What the judging rows can prove: where they came from, how many, and each output's test."""

    source: str  # the rows in words: "--eval-data eval.npz (16 samples)"
    real: bool  # rows the user gave (files or --data), not generated ones
    rows: int
    outputs: tuple[OutputTest, ...] = ()

    @property
    def can_tell(self) -> bool:
        """Whether a reduced or quantized candidate judged on these rows may ship."""
        return self.real and self.rows >= MIN_ROWS and all(o.can_tell for o in self.outputs)

    def why_not(self) -> str:
        """Why these rows cannot verify a lossy candidate ("" when they can)."""
        if not self.real:
            return f"accuracy was judged on {self.source} inputs, not on the model's own data"
        if self.rows < MIN_ROWS:
            return (
                f"only {self.rows} real sample(s) to judge on ({self.source}); at least {MIN_ROWS} are needed"
            )
        return "; ".join(f"output {o.name!r}: {o.finding}" for o in self.outputs if not o.can_tell)

    def needs(self) -> str:
        """The data that would let lto tell, in words ("" when it can already)."""
        parts: list[str] = []
        if not self.real or self.rows < MIN_ROWS:
            parts.append(
                f"at least {MIN_ROWS} real samples: --eval-data, or --calib-data / --data with at least "
                f"{2 * MIN_ROWS} (lto calibrates on half and judges on the other half)"
            )
        parts += [o.needs for o in self.outputs if not o.can_tell and o.needs]
        return "; ".join(dict.fromkeys(parts))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "real": self.real,
            "rows": self.rows,
            "min_rows": MIN_ROWS,
            "can_tell": self.can_tell,
            "why_not": self.why_not(),
            "needs": self.needs(),
            "outputs": {o.name: o.to_json() for o in self.outputs},
        }


def is_lossy(precision: str) -> bool:
    """Whether a candidate of this precision changes numerics beyond fp32 reassociation."""
    return numerics_of_precision(precision) in LOSSY_NUMERICS


def numerics_of_precision(precision: str) -> str:
    """mixed, quantized, reduced, or "" for an fp32 candidate (exact or reassociated: see numerics).

    A precision of two parts joined by "+" ("int8+bf16": int8 where quantized, bf16 elsewhere;
    "int8+fp32") is mixed: some layers were lifted above the rest."""
    p = precision.lower()
    if "+" in p:
        return "mixed"
    if any(q in p for q in ("int8", "int4", "fp8", "int16")):
        return "quantized"
    if any(r in p for r in ("bf16", "fp16", "f16", "tf32")):
        return "reduced"
    return ""


def numerics(precision: str, same_graph: bool, identical_outputs: bool) -> str:
    """The numerics of a candidate: from its precision, and for fp32 whether it runs the original
    graph and kernels (same_graph) and gave bit-identical outputs on every judging row."""
    lossy = numerics_of_precision(precision)
    if lossy:
        return lossy
    return "exact" if same_graph and identical_outputs else "reassociated"


# --- the tests ----------------------------------------------------------------------------------


def _stacked(refs: Sequence[np.ndarray], axis: int | None) -> np.ndarray:
    """Every row of every sample along a new first axis (float64, non-finite values zeroed)."""
    rows = np.concatenate([batch_first(np.asarray(r), axis) for r in refs]).astype(np.float64)
    return np.nan_to_num(rows, nan=0.0, posinf=0.0, neginf=0.0)


def _constant(rows: np.ndarray) -> str:
    """Why the rows are all the same ("" when they differ)."""
    if len(rows) < 2:
        return "one row only: nothing shows that it changes with the input"
    spread = float(np.max(np.abs(rows - rows[:1])))
    scale = float(np.max(np.abs(rows)))
    if spread <= CONSTANT_REL * scale or scale == 0.0:
        return f"the same on all {len(rows)} rows (they differ by {spread:.2g}): it does not depend on them"
    return ""


def _probabilities(rows: np.ndarray) -> np.ndarray:
    """Rows [n, classes] as probabilities: as they are when they already are (softmax, or
    independent scores in [0, 1]), exp of log-probabilities, else a softmax of the logits."""
    kind = distribution_kind(rows)
    if kind == "softmax" or (rows.min() >= 0.0 and rows.max() <= 1.0):
        return rows
    if kind == "log-softmax":
        return np.exp(rows)
    shifted = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def _margins(probs: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 probability of every row (1.0 for a single class)."""
    if probs.shape[-1] < 2:
        return np.ones(probs.shape[0])
    top2 = np.partition(probs, -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]  # type: ignore[no-any-return]


def _classifier(rows: np.ndarray) -> tuple[bool, str, str]:
    flat = rows.reshape(len(rows), -1)
    margins = _margins(_probabilities(flat))
    near = int(np.count_nonzero(margins < NEAR_TIE_MARGIN))
    if near > NEAR_TIE_SHARE * len(flat):
        return (
            False,
            f"top-1 is a near-tie (probability margin < {NEAR_TIE_MARGIN}) on {near} of {len(flat)} rows: "
            "any rounding flips it",
            "rows the model classifies with confidence (real inputs of its task)",
        )
    classes = np.unique(np.argmax(flat, axis=1))
    if len(classes) == 1:
        return (
            False,
            f"the original picks class {int(classes[0])} on all {len(flat)} rows: a candidate stuck on "
            "one class would pass",
            "rows of more than one class",
        )
    return True, f"top-1 decided on {len(flat) - near} of {len(flat)} rows, {len(classes)} classes", ""


def _embedding(rows: np.ndarray) -> tuple[bool, str, str]:
    flat = rows.reshape(len(rows), -1)
    norms = np.linalg.norm(flat, axis=1) * np.linalg.norm(flat[0])
    cos = np.where(norms > 0, flat @ flat[0] / np.where(norms > 0, norms, 1.0), 1.0)
    if len(flat) >= 2 and float(np.min(cos)) > 1.0 - CONSTANT_REL:
        return (
            False,
            f"nearly the same vector on all {len(flat)} rows (cosine to the first >= "
            f"{float(np.min(cos)):.6f}): the rows do not exercise it",
            "rows with different content",
        )
    return (
        True,
        f"vectors differ across {len(flat)} rows (lowest cosine to the first {float(np.min(cos)):.3f})",
        "",
    )


def _ctc(rows: np.ndarray) -> tuple[bool, str, str]:
    seqs = rows.reshape(len(rows), -1, rows.shape[-1])
    decoded = [tuple(greedy_decode(np.argmax(s, axis=-1), CTC_BLANK)) for s in seqs]
    empty = sum(1 for d in decoded if not d)
    if empty > NEAR_TIE_SHARE * len(decoded):
        return (
            False,
            f"the original decodes nothing on {empty} of {len(decoded)} sequences",
            "rows with text (or speech) in them",
        )
    if len(set(decoded)) == 1 and len(decoded) >= 2:
        return (
            False,
            f"the original decodes the same sequence on all {len(decoded)} rows: a candidate stuck on it "
            "would pass",
            "rows with different content",
        )
    frames = seqs.reshape(-1, seqs.shape[-1])
    near = int(np.count_nonzero(_margins(_probabilities(frames)) < NEAR_TIE_MARGIN))
    if near > NEAR_TIE_SHARE * len(frames):
        return (
            False,
            f"the per-frame argmax is a near-tie on {near} of {len(frames)} frames",
            "rows the model reads with confidence (real inputs of its task)",
        )
    return True, f"{len(set(decoded))} different decodes over {len(decoded)} sequences, {empty} empty", ""


def _firm_score(th: Thresholds | None) -> float:
    """The score at which a detection counts firmly: the threshold plus the borderline margin."""
    return (th.detection_score if th is not None else 0.25) + DETECTION_MARGIN


def _detection(rows: np.ndarray, choice: MetricChoice, th: Thresholds | None) -> tuple[bool, str, str]:
    firm_score = _firm_score(th)
    firm, images = 0, 0
    for image in rows:
        candidates = image if choice.fields_last else image.T
        _, _, scores = detections(candidates, choice.objectness)
        found = int(np.count_nonzero(scores >= firm_score))
        firm += found
        images += found > 0
    if firm < MIN_DETECTIONS:
        return (
            False,
            f"the original detects {firm} object(s) above score {firm_score:g} on {len(rows)} "
            f"rows: too few to tell whether a candidate keeps them",
            f"rows in which the original detects objects (at least {MIN_DETECTIONS} in all)",
        )
    return True, f"the original detects {firm} objects in {images} of {len(rows)} rows", ""


def _score_fields(rows: np.ndarray, th: Thresholds | None) -> tuple[bool, str, str] | None:
    """A head laid out as 4 box fields (offsets: not all in [0, 1]) then score fields in [0, 1] on its
    last axis (a raw YOLOX/YOLOv5 head: box, objectness, class scores) must find something: at
    least MIN_DETECTIONS candidates whose score (objectness x best class, or the one score) is
    above the detection threshold on the rows. A detector that finds nothing agrees with any
    candidate. None when the output has no such mix."""
    fields = rows.shape[-1] if rows.ndim >= 3 else 0
    if not 2 <= fields <= 256:
        return None
    flat = rows.reshape(-1, fields)
    is_score = (flat.min(axis=0) >= 0.0) & (flat.max(axis=0) <= 1.0)
    # The layout exactly: 4 box fields, not all of them scores, then nothing but scores.
    if fields < 5 or is_score[:4].all() or not is_score[4:].all():
        return None
    scores = flat[:, 4:]
    score = scores[:, 0] * scores[:, 1:].max(axis=1) if scores.shape[1] > 1 else scores[:, 0]
    threshold = _firm_score(th)
    firm = int(np.count_nonzero(score >= threshold))
    if firm >= MIN_DETECTIONS:
        return None
    return (
        False,
        f"a detection-style head (4 box fields, {fields - 4} score fields) with {firm} candidate(s) scoring "
        f"{threshold:g} or more on {len(rows)} rows (highest {float(score.max()):.3g}): it finds nothing "
        "on them",
        f"rows in which the original detects objects (at least {MIN_DETECTIONS} in all)",
    )


def _quiet_rows(rows: np.ndarray) -> list[int]:
    """The rows on which the output is ~0 everywhere (largest |value| under NO_SIGNAL_SHARE of the
    output's over all rows): they cannot tell a right candidate from a wrong one there."""
    peaks = np.abs(rows.reshape(len(rows), -1)).max(axis=1) if rows.size else np.zeros(len(rows))
    top = float(peaks.max()) if peaks.size else 0.0
    return [int(i) for i in np.flatnonzero(peaks < NO_SIGNAL_SHARE * top)] if top > 0 else []


def _row_list(rows: list[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:8])
    return shown + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")


def _mask(rows: np.ndarray, th: Thresholds | None) -> tuple[bool, str, str]:
    level = min(th.mask_thresholds) if th is not None else 0.3
    maps = rows.reshape(len(rows), -1)
    highest = maps.max(axis=1)
    empty = [int(i) for i in np.flatnonzero(highest <= level)]
    live = len(rows) - len(empty)
    needs = (
        f"at least {MIN_MASK_ROWS} rows on which the map finds regions (for a text detector, pages "
        "with text; for a segmenter, images with what it segments)"
    )
    if not empty:
        return True, f"regions above {level:g} on all {len(rows)} rows", ""
    quiet = (
        f"on {len(empty)} of {len(rows)} rows (samples {_row_list(empty)}) the map has no region above "
        f"{level:g} (highest {float(highest[empty].max()):.3g}): these rows cannot tell whether a "
        "candidate keeps its regions; rows on which it finds regions would (for a text detector, "
        "pages with text)"
    )
    if live < MIN_MASK_ROWS:
        return False, quiet, needs
    return True, f"regions above {level:g} on {live} of {len(rows)} rows; {quiet}", ""


def _plain(rows: np.ndarray) -> tuple[bool, str, str]:
    if rows.min() >= 0.0 and rows.max() < FIRES_AT and rows.max() <= 1.0:
        return (
            False,
            f"every value is below {FIRES_AT} on all {len(rows)} rows (highest {rows.max():.3g}): a score "
            "or probability that never fires on them",
            "rows on which the output fires (some value at or above 0.5)",
        )
    quiet = _quiet_rows(rows)
    if quiet:
        return (
            True,
            f"varies across {len(rows)} rows; ~0 everywhere on {len(quiet)} of them (samples "
            f"{_row_list(quiet)}), which are judged by their error against the output's range",
            "",
        )
    return True, f"varies across {len(rows)} rows", ""


def output_evidence(
    name: str, refs: Sequence[np.ndarray], choice: MetricChoice, thresholds: Thresholds | None = None
) -> OutputTest:
    """Whether `name`'s metric can tell on the reference rows `refs` (one array per sample)."""
    first = np.asarray(refs[0])
    if choice.metric == "exact" or not np.issubdtype(first.dtype, np.floating):
        return OutputTest(name, "exact", True, f"{first.dtype} output: compared element for element")
    rows = _stacked(refs, choice.batch_axis)
    constant = _constant(rows)
    if constant:
        return OutputTest(name, choice.metric, False, constant, "rows on which the output changes")
    silent = _score_fields(rows, thresholds) if choice.metric in ("embedding", "none") else None
    if silent is not None:
        ok, finding, needs = silent
    elif choice.metric == "classifier":
        ok, finding, needs = _classifier(rows)
    elif choice.metric == "embedding":
        ok, finding, needs = _embedding(rows)
    elif choice.metric == "ctc" and rows.ndim >= 3:
        ok, finding, needs = _ctc(rows)
    elif choice.metric == "detection" and rows.ndim == 3:
        ok, finding, needs = _detection(rows, choice, thresholds)
    elif choice.metric == "mask":
        ok, finding, needs = _mask(rows, thresholds)
    else:
        ok, finding, needs = _plain(rows)
    return OutputTest(name, choice.metric, ok, finding, needs)


def assess(
    reference: Sequence[Outputs],
    choices: Mapping[str, MetricChoice],
    thresholds: Thresholds | None,
    *,
    source: str,
    real: bool,
) -> Evidence:
    """Each output's test on the original's outputs over the judging rows."""
    tests: list[OutputTest] = []
    names = list(dict.fromkeys(name for sample in reference for name in sample))
    for name in names:
        refs = [np.asarray(s[name]) for s in reference if name in s]
        choice = choices.get(name) or MetricChoice("none", "no metric chosen")
        tests.append(output_evidence(name, refs, choice, thresholds))
    return Evidence(source=source, real=real, rows=len(reference), outputs=tuple(tests))


__all__ = [
    "LOSSY_NUMERICS",
    "MIN_ROWS",
    "NUMERICS",
    "Evidence",
    "OutputTest",
    "assess",
    "is_lossy",
    "numerics",
    "numerics_of_precision",
    "output_evidence",
]
