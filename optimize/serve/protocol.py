"""The KServe v2 / Open Inference Protocol codec: JSON tensors and the binary tensor data extension.

Pure functions from bytes to numpy arrays and back, so both the server and the load
generator use one implementation and it is testable without a socket. Nothing in a
request is ever evaluated or imported: tensors are parsed as numbers only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from optimize.backend import TensorSpec
from optimize.errors import InputError

# Protocol datatype <-> numpy dtype name. BYTES (strings) is not supported: lto serves numeric models.
V2_TO_NUMPY = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
NUMPY_TO_V2 = {v: k for k, v in V2_TO_NUMPY.items()}
# By dtype object: str(dtype) costs more than the rest of a small response's header.
_V2_OF_DTYPE = {np.dtype(v): k for k, v in V2_TO_NUMPY.items()}

HEADER_LENGTH = "Inference-Header-Content-Length"


def v2_datatype(dtype: str) -> str:
    return NUMPY_TO_V2.get(dtype, dtype.upper())


def _datatype_of(array: np.ndarray) -> str:
    return _V2_OF_DTYPE.get(array.dtype) or v2_datatype(str(array.dtype))


def v2_shape(shape: Sequence[int | str | None]) -> list[int]:
    """Dynamic dims are -1 in the protocol's metadata."""
    return [d if isinstance(d, int) else -1 for d in shape]


@dataclass
class InferRequest:
    feeds: dict[str, np.ndarray]
    request_id: str | None
    # Output name -> send as binary; None means all outputs with `binary_default`.
    outputs: dict[str, bool] | None
    binary_default: bool
    deadline_ms: float | None


def _json_header(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(body)
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InputError(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes",
                "the JSON header cannot be longer than the body",
            )
        head, rest = view[:header_length], view[header_length:]
    else:
        head, rest = view, view[len(body) :]
    try:
        # orjson: strict JSON (no NaN/Infinity), a nesting limit instead of a RecursionError.
        obj = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON in the request: {exc}", "send a KServe v2 inference request"
        ) from None
    if not isinstance(obj, dict):
        raise InputError("the request body must be a JSON object with an 'inputs' list")
    return obj, rest


def decode_request(body: bytes, header_length: int | None, inputs: Sequence[TensorSpec]) -> InferRequest:
    """Parse an infer request into numpy feeds, naming the input and expectation on any mismatch."""
    obj, binary = _json_header(body, header_length)
    specs = {s.name: s for s in inputs}
    raw_inputs = obj.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InputError("the request has no 'inputs' list", f"the model's inputs are: {', '.join(specs)}")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InputError("every entry of 'inputs' needs a 'name', 'shape', 'datatype' and data")
        name = item["name"]
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"unknown input {name!r}", f"the model's inputs are: {', '.join(specs)}")
        if name in feeds:
            raise InputError(f"input {name!r} is given twice")
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise InputError(f"input {name!r} needs a 'shape' list of non-negative integers, got {shape!r}")
        datatype = item.get("datatype")
        want = v2_datatype(spec.dtype)
        if datatype != want:
            raise InputError(f"input {name!r} has datatype {datatype!r}, the model expects {want!r}")
        if len(shape) != len(spec.shape):
            raise InputError(
                f"input {name!r} has shape {shape}, the model expects rank {len(spec.shape)} "
                f"(shape {v2_shape(spec.shape)})"
            )
        for axis, (got, exp) in enumerate(zip(shape, spec.shape, strict=True)):
            if isinstance(exp, int) and got != exp:
                raise InputError(
                    f"input {name!r} has shape {shape}, the model expects {exp} on axis {axis} "
                    f"(shape {v2_shape(spec.shape)})"
                )
        dtype = np.dtype(spec.dtype)
        count = math.prod(shape)
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InputError(f"input {name!r}: binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InputError(
                    f"input {name!r} declares {size} binary bytes "
                    f"but only {len(binary) - offset} remain in the body"
                )
            if size != count * dtype.itemsize:
                raise InputError(
                    f"input {name!r} has {size} bytes of data, shape {shape} of {datatype} needs "
                    f"{count * dtype.itemsize} ({count} elements)"
                )
            array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            if "data" not in item:
                raise InputError(f"input {name!r} has neither 'data' nor binary_data_size")
            array = _json_tensor(name, item["data"], dtype, shape, count)
        feeds[name] = array
    if offset != len(binary):
        raise InputError(
            f"{len(binary) - offset} bytes of binary data follow the inputs that no input claims"
        )
    missing = [s for s in specs if s not in feeds]
    if missing:
        raise InputError(f"input {missing[0]!r} is missing", f"the model's inputs are: {', '.join(specs)}")

    params = obj.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError("'parameters' must be an object")
    binary_default = _flag(params, "binary_data_output", False, "'parameters'")
    outputs: dict[str, bool] | None = None
    if obj.get("outputs"):
        if not isinstance(obj["outputs"], list):
            raise InputError("'outputs' must be a list")
        outputs = {}
        for out in obj["outputs"]:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InputError("every entry of 'outputs' needs a 'name'")
            out_params = out.get("parameters") or {}
            if not isinstance(out_params, dict):
                raise InputError(f"output {out['name']!r}: 'parameters' must be an object")
            outputs[out["name"]] = _flag(out_params, "binary_data", binary_default, f"output {out['name']!r}")
    deadline = _deadline_ms(params)
    request_id = obj.get("id")
    return InferRequest(
        feeds, str(request_id) if request_id is not None else None, outputs, binary_default, deadline
    )


def _flag(params: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """A boolean parameter, strictly: the string "false" is not true, 1 is not a boolean."""
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} must be true or false (JSON booleans), got {value!r}")
    return value


def _deadline_ms(params: Mapping[str, Any]) -> float | None:
    """Per-request deadline: `deadline_ms`, or Triton's `timeout` in microseconds."""
    if "deadline_ms" in params:
        value, scale, label = params["deadline_ms"], 1.0, "deadline_ms"
    elif "timeout" in params:
        value, scale, label = params["timeout"], 1e-3, "timeout"
    else:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise InputError(f"parameter {label!r} must be a positive finite number, got {value!r}")
    return float(value) * scale


# JSON value types each tensor kind accepts: numpy would turn null into NaN, "1.5" into 1.5 and
# true into 1, silently; the protocol's JSON tensors are numbers (booleans for BOOL) only.
_JSON_TYPES: dict[str, tuple[type, ...]] = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}


def _strict_kind(name: str, data: list[Any], dtype: np.dtype[Any], depth: int) -> None:
    """Raise unless `data` is a list nested at most `depth` deep of the JSON type `dtype` takes."""
    allowed = set(_JSON_TYPES.get(dtype.kind, (int, float)))
    stack: list[tuple[list[Any], int]] = [(data, 1)]
    while stack:
        values, level = stack.pop()
        kinds = set(map(type, values))  # one C-speed pass per innermost list
        if list in kinds:
            if level >= max(depth, 1):
                raise InputError(f"input {name!r}: data is nested deeper than its shape")
            stack.extend((v, level + 1) for v in values if isinstance(v, list))
            kinds.discard(list)
        if kinds - allowed:
            bad = next(v for v in values if type(v) not in allowed and not isinstance(v, list))
            want = "true/false" if dtype.kind == "b" else "integers" if dtype.kind in "iu" else "numbers"
            raise InputError(f"input {name!r}: data holds {json.dumps(bad)[:40]}, {dtype.name} needs {want}")


def _json_tensor(name: str, data: Any, dtype: np.dtype[Any], shape: list[int], count: int) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]
    _strict_kind(name, data, dtype, len(shape))
    try:
        array = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise InputError(
            f"input {name!r}: data is not a (nested) list of {dtype.name} numbers of equal lengths"
        ) from None
    if array.size != count:
        raise InputError(f"input {name!r} has {array.size} elements, shape {shape} needs {count}")
    return array.reshape(shape)


def encode_request(
    feeds: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    binary_outputs: bool = True,
    deadline_ms: float | None = None,
) -> tuple[bytes, int | None]:
    """Body (and header length when binary) for an infer request; used by the load generator."""
    entries = []
    chunks = []
    for name, array in feeds.items():
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(array.shape),
            "datatype": _datatype_of(array),
        }
        if binary:
            raw = np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    params: dict[str, Any] = {"binary_data_output": binary_outputs}
    if deadline_ms is not None:
        params["deadline_ms"] = deadline_ms
    head = json.dumps({"inputs": entries, "parameters": params}).encode()
    if not binary:
        return head, None
    return head + b"".join(chunks), len(head)


def encode_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    outputs: Mapping[str, np.ndarray],
    output_specs: Sequence[TensorSpec],
) -> tuple[bytes, int | None]:
    """Response body; with any binary output it is JSON + raw bytes and the header length is returned."""
    wanted = request.outputs
    if wanted is None:
        wanted = {s.name: request.binary_default for s in output_specs}
    entries = []
    chunks = []
    for name, as_binary in wanted.items():
        array = outputs[name]
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(array.shape),
            "datatype": _datatype_of(array),
        }
        if as_binary:
            # A view, not a copy: the one copy is the join below.
            raw = memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B")
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(array)
        entries.append(entry)
    obj: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request.request_id is not None:
        obj["id"] = request.request_id
    # orjson: 5-10x faster than json on large tensors; non-finite values are strings by now.
    head = orjson.dumps(obj)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _json_data(array: np.ndarray) -> list[Any]:
    """A tensor as a flat JSON list. Non-finite floats become the strings "NaN", "Infinity" and
    "-Infinity" (bare NaN is not JSON; numpy and tritonclient read these strings back)."""
    flat = array.reshape(-1)
    if flat.dtype.kind != "f":
        return flat.tolist()
    values = flat.astype(np.float32).tolist() if flat.dtype == np.float16 else flat.tolist()
    if np.isfinite(flat).all():
        return values
    return [v if math.isfinite(v) else _NON_FINITE[str(v)] for v in values]


def check_requested_outputs(request: InferRequest, output_specs: Sequence[TensorSpec]) -> None:
    if request.outputs is None:
        return
    names = [s.name for s in output_specs]
    for name in request.outputs:
        if name not in names:
            raise InputError(f"unknown output {name!r}", f"the model's outputs are: {', '.join(names)}")


def decode_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Outputs of an infer response (JSON or binary), for the load generator and tests."""
    obj, binary = _json_header(body, header_length)
    result: dict[str, np.ndarray] = {}
    offset = 0
    for out in obj.get("outputs", []):
        dtype = np.dtype(V2_TO_NUMPY[out["datatype"]])
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            result[out["name"]] = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(
                out["shape"]
            )
            offset += size
        else:
            result[out["name"]] = np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
    return result
