"""Gating saved reports: which measurement to use, baselines kept per machine, the gate report."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimize.errors import UsageError
from optimize.files import check_output_file
from optimize.gate.decision import (
    IMPROVED,
    INCONCLUSIVE,
    GateResult,
    GateSettings,
    Side,
    decide,
)
from optimize.report import load_report, new_report, write_report


def pick_measurement(report: Mapping[str, Any], label: str | None = None, *, name: str = "report") -> dict:
    """The measurement to gate on.

    --label if given; else, in an `optimize` report, the shipped artifact's measurement (from
    the final side-by-side comparison when there was one); else the one labelled "final";
    else the last. `bench` and `load` reports usually hold one measurement.
    """
    results = [r for r in report.get("results") or [] if isinstance(r, Mapping)]
    if not results:
        raise UsageError(f"{name} has no measurements (results is empty)")
    labels = [str(r.get("label", "")) for r in results]

    def last_with(wanted: str) -> dict | None:
        for r in reversed(results):
            if r.get("label") == wanted:
                return dict(r)
        return None

    if label is not None:
        found = last_with(label)
        if found is None:
            raise UsageError(
                f"{name} has no measurement labelled {label!r}", f"its labels: {', '.join(labels)}"
            )
        return found
    section = report.get("optimize")
    best = section.get("best") if isinstance(section, Mapping) else None
    if isinstance(best, Mapping) and best.get("label"):
        for wanted in (f"{best['label']} (final comparison)", str(best["label"])):
            found = last_with(wanted)
            if found is not None:
                return found
    return last_with("final") or dict(results[-1])


def side_from_report(report: Mapping[str, Any], label: str | None, name: str) -> Side:
    measurement = pick_measurement(report, label, name=name)
    env = report.get("environment") or {}
    return Side.from_measurement(
        measurement,
        name=name,
        fingerprint=env.get("fingerprint") if isinstance(env, Mapping) else None,
        input_spec=report.get("input_spec"),
    )


def _read_report(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"report not found: {path}")

    return load_report(path)


_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def baseline_name(report: Mapping[str, Any], name: str | None = None) -> str:
    """The key a baseline is stored under: --name, else the model file's stem."""
    if name is None:
        model = report.get("model") or {}
        path = model.get("path") if isinstance(model, Mapping) else None
        if not path:
            raise UsageError("the candidate report names no model", "give the baseline a name with --name")
        name = Path(str(path)).stem
        if name == "model":  # artifacts keep their model as model.onnx: use the folder name
            name = Path(str(path)).parent.name or name
    if not _NAME_OK.match(name):
        raise UsageError(f"bad baseline name {name!r}", "use letters, digits, '.', '_' and '-' only")
    return name


def baseline_path(baseline_dir: Path, fingerprint: str, name: str) -> Path:
    """DIR/<fingerprint>/<name>.json: one baseline per machine, never compared across machines."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", fingerprint):
        raise UsageError(f"bad environment fingerprint {fingerprint!r} in the candidate report")
    return baseline_dir / fingerprint / f"{name}.json"


def store_baseline(path: Path, report: Mapping[str, Any]) -> Path:

    check_output_file(path, flag="--baseline-dir")
    write_report(path, dict(report))  # validates, then writes atomically
    return path


def gate_reports(
    candidate_path: Path,
    *,
    baseline_file: Path | None = None,
    baseline_dir: Path | None = None,
    name: str | None = None,
    label: str | None = None,
    baseline_label: str | None = None,
    settings: GateSettings | None = None,
    update_baseline: bool = False,
    force_update_baseline: bool = False,
) -> GateResult:
    """Gate a candidate report against a baseline report, or against the stored baseline for this machine.

    With `update_baseline` the candidate becomes the stored baseline when none exists for its
    machine yet or when it improved; a "pass" does not move the baseline, so a string of small
    slowdowns that each pass still adds up against the same reference. `force_update_baseline`
    stores it whatever the verdict (to accept a known slowdown on purpose).
    """
    settings = settings or GateSettings()
    if (baseline_file is None) == (baseline_dir is None):
        raise UsageError("give exactly one of --baseline FILE and --baseline-dir DIR")
    if (update_baseline or force_update_baseline) and baseline_dir is None:
        raise UsageError(
            "--update-baseline needs --baseline-dir", "baselines are stored per machine under it"
        )
    candidate_report = _read_report(candidate_path)
    candidate = side_from_report(candidate_report, label, str(candidate_path))

    stored: Path | None = None
    if baseline_dir is not None:
        if not candidate.fingerprint:
            raise UsageError(
                f"{candidate_path} records no environment fingerprint, so no baseline can be found"
            )
        stored = baseline_path(baseline_dir, candidate.fingerprint, baseline_name(candidate_report, name))
        if not stored.is_file():
            result = GateResult(
                INCONCLUSIVE,
                f"no baseline stored for this machine ({stored})",
                settings,
                candidate=candidate,
                baseline_file=str(stored),
            )
            if update_baseline or force_update_baseline:
                refusal = baseline_refusal(candidate, settings)
                if refusal:
                    result.reason += f"; the candidate was not stored as the baseline: {refusal}"
                else:
                    result.baseline_written = str(store_baseline(stored, candidate_report))
                    result.reason += "; stored the candidate as the baseline"
            return result
        baseline_file = stored
    assert baseline_file is not None
    baseline_report = _read_report(baseline_file)
    baseline = side_from_report(baseline_report, baseline_label or label, str(baseline_file))
    result = decide(baseline, candidate, settings)
    result.baseline_file = str(baseline_file)
    if stored is not None and (force_update_baseline or (update_baseline and result.verdict == IMPROVED)):
        refusal = baseline_refusal(candidate, settings)
        if refusal:
            result.reason += f"; the candidate was not stored as the baseline: {refusal}"
        else:
            result.baseline_written = str(store_baseline(stored, candidate_report))
    return result


def baseline_refusal(candidate: Side, settings: GateSettings) -> str | None:
    """Why a report must not become a stored baseline, or None. Every later comparison is made
    against a baseline, so one with too few repetitions or an unstable one is never stored,
    even with --force-update-baseline (which accepts a slowdown, not a bad measurement)."""
    if candidate.repetition_count < settings.min_repetitions:
        return (
            f"it holds {candidate.repetition_count} repetition(s), a baseline needs at least "
            f"{settings.min_repetitions} (lto bench --repeat {settings.min_repetitions})"
        )
    stability = candidate.stability or {}
    if not stability.get("stable", True):
        return "it is unstable (" + ("; ".join(stability.get("reasons") or []) or "flagged") + ")"
    return None


# ---------------------------------------------------------------------------------------------
# --rerun: measure both sides interleaved on this machine


def gate_report(result: GateResult, source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A report of kind "gate": the compared measurements in `results`, the decision under "gate"."""

    if source is not None:
        report = new_report(
            "gate", input_spec=source.get("input_spec"), settings=dict(source.get("settings") or {})
        )
        report["model"] = source.get("model")
        report["results"] = list(source.get("results") or [])
        if source.get("comparison"):
            report["comparison"] = source["comparison"]
    else:
        # Saved reports: the two measurements compared, renamed by their side, so that the gate
        # report carries its evidence (the samples and repetitions) for people and plots.
        report = new_report("gate")
        for side_name, side in (("baseline", result.baseline), ("candidate", result.candidate)):
            if side is not None and side.measurement is not None:
                report["results"].append({**side.measurement, "label": f"{side_name}: {side.label}"})
        if result.candidate is not None and isinstance(result.candidate.input_spec, Mapping):
            report["input_spec"] = dict(result.candidate.input_spec)
    report["gate"] = result.to_json()
    return report
