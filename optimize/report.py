"""One versioned report schema for every command that measures, and its Markdown rendering."""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from optimize import __version__
from optimize.errors import UsageError
from optimize.files import sha256_file, write_json_atomic

SCHEMA_VERSION = "1.0"
KINDS = ("bench", "compare", "optimize", "load", "gate")

# Kind-specific Markdown sections, rendered by the module that owns the data ("module:function"
# taking the section dict and returning Markdown). Imported only when a report needs it.
SECTION_RENDERERS: dict[str, str] = {
    "optimize": "optimize.render.optimize_section:render_markdown_section",
    "load": "optimize.serve.report:render_markdown_section",
    "gate": "optimize.gate:render_markdown_section",
}


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    path = Path(__file__).parent / "schemas" / "report.schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


def model_block(model_path: str | Path) -> dict[str, Any]:
    path = Path(model_path)
    return {"path": str(path), "sha256": sha256_file(path), "size_bytes": path.stat().st_size}


def new_report(
    kind: str,
    *,
    model_path: str | Path | None = None,
    input_spec: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A report skeleton with the environment filled in; callers append to `results`."""
    from optimize.env import environment

    if kind not in KINDS:
        raise ValueError(f"unknown report kind {kind!r}")
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "tool": {"name": "lto", "version": __version__, "command": " ".join(["lto", *sys.argv[1:]])},
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "model": model_block(model_path) if model_path is not None else None,
        "input_spec": input_spec,
        "settings": settings or {},
        "results": [],
    }


def validate_report(report: Any, source: str = "report") -> None:
    """Raise LtoError naming the first schema violation and where it is."""
    import jsonschema

    if isinstance(report, dict) and report.get("schema_version") not in (None, SCHEMA_VERSION):
        raise UsageError(
            f"{source}: schema_version {report.get('schema_version')!r} is not supported "
            f"(this lto reads {SCHEMA_VERSION})",
            "re-create the report with this version of lto",
        )
    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(report))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise UsageError(f"{source} is not a valid lto report: at {where}: {error.message[:200]}")


def write_report(path: str | Path, report: dict[str, Any]) -> Path:
    """Validate, then write atomically: a reader never sees half a report."""
    validate_report(report, source=str(path))
    return write_json_atomic(path, report)


def load_report(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if not source.is_file():
        raise UsageError(f"report not found: {source}", "pass the JSON file a command wrote")
    try:
        report = json.loads(source.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source} is not JSON: {exc}") from exc
    validate_report(report, source=str(source))
    return report


def _ms(value: float) -> str:
    return f"{value:.3f}"


def measurement_rows(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| label | backend | batch | p50 ms | p90 ms | p99 ms | p99.9 ms | mean ms | median 95% CI | CV | "
        "throughput/s | runs | stable |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for m in results:
        lat = m["latency_ms"]
        lo, hi = lat["median_ci95"]
        stability = m["stability"]
        stable = "yes" if stability["stable"] else "no: " + "; ".join(stability["reasons"])
        lines.append(
            f"| {m['label']} | {m['backend']} | {m['batch_size']} | {_ms(lat['p50'])} | {_ms(lat['p90'])} | "
            f"{_ms(lat['p99'])} | {_ms(lat['p999'])} | {_ms(lat['mean'])} | {_ms(lo)}–{_ms(hi)} | "
            f"{lat['cv']:.1%} | {m['throughput_per_s']:.1f} | {m['runs']} | {stable} |"
        )
    return lines


def _section(kind: str, data: dict[str, Any]) -> str:
    target = SECTION_RENDERERS.get(kind)
    if target:
        module_name, func_name = target.split(":")
        try:
            render = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError):
            render = None
        if render is not None:
            return str(render(data))
    return f"```json\n{json.dumps(data, indent=2)[:20000]}\n```"


def render_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    cpu = env["cpu"]
    lines = [f"# lto {report['kind']} report", ""]
    lines.append(f"- created: {report['created_at']} by lto {report['tool']['version']}")
    if report["tool"].get("command"):
        lines.append(f"- command: `{report['tool']['command']}`")
    if report.get("model"):
        model = report["model"]
        lines.append(
            f"- model: `{model['path']}` ({model['size_bytes']:,} bytes, sha256 {model['sha256'][:12]}…)"
        )
    lines.append(
        f"- machine: {cpu['model']} ({cpu['arch']}, {cpu['logical_cores']} logical cores; "
        f"ISA {', '.join(cpu['isa']) or 'n/a'}); {env['os']}; Python {env['python']}; "
        f"fingerprint `{env['fingerprint']}`"
    )
    if env.get("packages"):
        lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in sorted(env["packages"].items())))
    if env.get("gpu"):
        lines.append(f"- GPU: {env['gpu']}")
    spec = report.get("input_spec")
    if spec:
        desc = ", ".join(f"{t['name']} {t['dtype']}[{'x'.join(map(str, t['shape']))}] ({t['source']})"
                         for t in spec["inputs"])  # fmt: skip
        lines.append(f"- inputs: {desc}")
    if report["results"]:
        lines += ["", "## Latency", "", *measurement_rows(report["results"])]
        lines += [
            "",
            "Latency in milliseconds per batch. The median CI is a bootstrap 95% interval; "
            "a run is marked unstable when its variation is high or other processes used the CPU.",
        ]
    comparison = report.get("comparison")
    if comparison:
        a, b = comparison["labels"]
        lo, hi = comparison["ratio_ci95"]
        lines += [
            "",
            "## Comparison (interleaved)",
            "",
            f"{comparison['metric']}({b}) / {comparison['metric']}({a}) = **{comparison['ratio']:.3f}** "
            f"(95% CI {lo:.3f}–{hi:.3f}) over {comparison['chunks']} interleaved chunks: "
            + _verdict_words(lo, hi, a, b),
        ]
    if report.get("warnings"):
        lines += ["", "## Warnings", "", *[f"- {w}" for w in report["warnings"]]]
    for kind in ("optimize", "load", "gate"):
        if report.get(kind):
            lines += ["", _section(kind, report[kind])]
    return "\n".join(lines) + "\n"


def _verdict_words(lo: float, hi: float, a: str, b: str) -> str:
    if hi < 1.0:
        return f"{b} is faster than {a} with 95% confidence."
    if lo > 1.0:
        return f"{b} is slower than {a} with 95% confidence."
    return "no difference can be claimed at 95% confidence."
