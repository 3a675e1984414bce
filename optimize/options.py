"""Option tables declared as JSON Schema and checked with jsonschema, one error naming the key.

Every table of settings lto reads from a file (a recipe's stages, accuracy, bench and decision
tables) and every stage's options (declared beside the stage, in its runtime's spec) is a JSON
Schema object built with the helpers below and checked by the same reference validator the
report schema uses. A failure is one UsageError that names the key path and says what was
expected, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from optimize.errors import UsageError

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

Schema = dict[str, Any]


@cache
def _validator_class() -> Any:
    """jsonschema's Draft 2020-12 validator, with TOML's numbers: `2.0` is a float, so a count
    must be written as a whole number, and `true` is not 1. Imported on first use: the runtime
    specs declare schemas in every process, worker processes included, and only a few check one."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    types = Draft202012Validator.TYPE_CHECKER.redefine_many(
        {
            "integer": lambda _, value: isinstance(value, int) and not isinstance(value, bool),
            "number": lambda _, value: isinstance(value, (int, float)) and not isinstance(value, bool),
        }
    )
    return extend(Draft202012Validator, type_checker=types)


_TYPE_WORDS = {
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "a table",
}


def boolean() -> Schema:
    return {"type": "boolean"}


def integer(minimum: int = 0) -> Schema:
    return {"type": "integer", "minimum": minimum}


def number(minimum: float = 0.0, maximum: float | None = None) -> Schema:
    schema: Schema = {"type": "number", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def string() -> Schema:
    return {"type": "string"}


def choice(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def string_list(*allowed: str) -> Schema:
    """A list of strings; of `allowed` ones only, when given."""
    return {"type": "array", "items": choice(*allowed) if allowed else string()}


def table() -> Schema:
    return {"type": "object"}


def threads() -> Schema:
    """A thread count (0: the runtime's default); its upper bound depends on this machine and is
    checked by optimize.system.env.check_thread_count where the option is used."""
    return {"type": "integer", "minimum": 0, "x-threads": True}


def object_schema(properties: Mapping[str, Schema]) -> Schema:
    return {"type": "object", "properties": dict(properties), "additionalProperties": False}


def _key_path(prefix: str, path: Any) -> str:
    out = prefix
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: ValidationError, where: str, prefix: str, properties: Mapping[str, Any]) -> UsageError:
    head = f"{where}{_key_path(prefix, error.absolute_path)}"
    value = error.instance
    kind = error.validator
    if kind == "additionalProperties":
        known = ", ".join(properties)
        unknown = sorted(set(value) - set(properties))
        key = _key_path(prefix, [*error.absolute_path, unknown[0]])
        under = f" under {prefix}" if prefix else ""
        return UsageError(f"{where}{key}: unknown key", f"known keys{under}: {known}")
    if kind == "enum":
        allowed = ", ".join(repr(v) for v in error.validator_value)
        return UsageError(f"{head}: expected one of {allowed}, got {value!r}")
    if kind == "type":
        return UsageError(f"{head}: expected {_TYPE_WORDS[error.validator_value]}, got {value!r}")
    if kind == "minimum":
        bound = error.validator_value
        wrong = "must not be negative" if bound == 0 else f"must be at least {bound}"
        return UsageError(f"{head}: {wrong}, got {value}")
    if kind == "maximum":
        return UsageError(f"{head}: must be at most {float(error.validator_value)}, got {value}")
    return UsageError(f"{head}: {error.message}")


def check_table(where: str, prefix: str, values: Any, properties: Mapping[str, Schema]) -> dict[str, Any]:
    """`values` checked against `properties` (no other keys), with numbers given as integers
    turned into floats where a number is declared. `where` starts every message (e.g. "recipe
    r.toml: "); `prefix` is the table's key path ("stages.quantize")."""
    schema = object_schema(properties)
    if not isinstance(values, dict):
        label = prefix or "the table"
        raise UsageError(f"{where}{label}: expected a table, got {values!r}")
    errors = sorted(
        _validator_class()(schema).iter_errors(values),
        key=lambda e: (list(values).index(e.path[0]) if e.path and e.path[0] in values else -1, list(e.path)),
    )
    if errors:
        raise _message(errors[0], where, prefix, properties)
    out = dict(values)
    for key, value in out.items():
        if properties[key].get("type") == "number":
            out[key] = float(value)
    return out


def thread_options(properties: Mapping[str, Schema]) -> list[str]:
    """The keys declared as thread counts (threads())."""
    return [key for key, schema in properties.items() if schema.get("x-threads")]


__all__ = [
    "Schema",
    "boolean",
    "check_table",
    "choice",
    "integer",
    "number",
    "object_schema",
    "string",
    "string_list",
    "table",
    "thread_options",
    "threads",
]
