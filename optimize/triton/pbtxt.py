"""Protocol-buffer text format, written from plain data (what Triton's config.pbtxt is).

lto writes the text itself so that `lto export` needs no protobuf schema at run time; the tests
parse every file it writes with Triton's own `ModelConfig` schema (tritonclient.grpc.model_config_pb2)
through google.protobuf.text_format, and `lto export` does the same when that module is installed.

Data model: a dict is a message; a list of dicts is a repeated message field; a list of scalars is a
repeated scalar field; `Enum("TYPE_FP32")` is an enum value (written bare); a `Map` is a protobuf map
field (written as repeated key/value entries). Keys keep their insertion order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Enum:
    """An enum value, written without quotes (TYPE_FP32, KIND_CPU)."""

    name: str


class Map(dict[str, Any]):
    """A protobuf map<string, message> field, e.g. ModelConfig.parameters."""


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if any(ord(c) < 0x20 for c in value):
            raise ValueError(f"control character in {value!r}")
        # Without control characters, a JSON string literal is a text-format one (escapes \" and \\).
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} in protobuf text format")


def _message(fields: Mapping[str, Any], indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, Map):
            for map_key, entry in value.items():
                lines.append(f"{pad}{key} {{")
                lines.append(f"{pad}  key: {_scalar(map_key)}")
                lines.extend(_field("value", entry, indent + 1))
                lines.append(f"{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            lines.append(f"{pad}{key} [")
            for i, item in enumerate(value):
                lines.append(f"{pad}  {{")
                lines.extend(_message(item, indent + 2))
                lines.append(f"{pad}  }}" + ("," if i < len(value) - 1 else ""))
            lines.append(f"{pad}]")
        else:
            lines.extend(_field(key, value, indent))
    return lines


def _field(key: str, value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    if isinstance(value, Mapping):
        return [f"{pad}{key} {{", *_message(value, indent + 1), f"{pad}}}"]
    if isinstance(value, list):
        return [f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]"]
    return [f"{pad}{key}: {_scalar(value)}"]


def to_text(message: Mapping[str, Any]) -> str:
    """`message` in protobuf text format, one field per line."""
    return "\n".join(_message(message, 0)) + "\n"


def to_plain(message: Any) -> Any:
    """The same data as JSON (enums as their names), for --json output."""
    if isinstance(message, Enum):
        return message.name
    if isinstance(message, Mapping):
        return {k: to_plain(v) for k, v in message.items() if v is not None}
    if isinstance(message, list):
        return [to_plain(v) for v in message]
    return message


__all__ = ["Enum", "Map", "to_plain", "to_text"]
