"""One inference-log record, as JSON: what a model was asked and what it answered.

The gateway writes records (``services/gateway/inference_log/``); ``switchyard replay`` and the activation's replay
check read them back. A record is one request and its answer (or its failure)::

    {"format": 1, "id": "9f2c...", "trace_id": "4bf9...", "time": "2026-12-05T06:01:02.123456Z",
     "model": "mlp", "version": 2, "route": "stable", "protocol": "http",
     "latency_ms": 1.84, "status": 200, "error": null, "truncated": false, "redacted": [],
     "request": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}],
                 "outputs": ["OUTPUT0"], "parameters": {"timeout": 50000},
                 "output_parameters": {"OUTPUT0": {"classification": 2}}},
     "response": {"outputs": [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 2], "data": ["0.7:0", "0.3:1"]}]}}

``request.parameters`` (the v2 request parameters that change the answer or its status: ``timeout`` in microseconds,
``priority`` when not the gateway's default, the custom ones) and ``request.output_parameters`` (per requested
output, e.g. ``classification``) are there only when the request asked for them; a record without them (written
before they existed, too) asked for none, and a replay sends the request back with exactly these.

A tensor's ``data`` is its values flattened in row-major order, as KServe v2 JSON writes them, with two exceptions
JSON forces: a float that is not finite is the string ``"nan"``, ``"inf"`` or ``"-inf"``, and a BYTES tensor with an
element that is not UTF-8 text carries ``"encoding": "base64"`` and every element in base64. A tensor whose values
did not fit the record's size cap has no ``data`` and ``"truncated": true`` (the record too); a redacted one has no
``data`` but ``"redacted": "hash"`` and ``"sha256"`` of its bytes; a dropped one is absent and named in the record's
``redacted`` list. A BF16 tensor's values are written and read as the floats they are (numpy has no bfloat16:
``ml_dtypes``' is the one the gateway and tritonclient use).

Imports numpy and ml_dtypes only: the ops CLI reads records without the server."""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

FORMAT = 1
"""The record format this module writes and reads; a record of another format is refused, not guessed at."""
ROUTES = ("stable", "canary", "pinned", "shadow")
"""How the request reached its version: the routing's stable or canary choice, a version the client named, or a
shadow copy of a stable request."""

BF16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": BF16,
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_FLOATS = frozenset({"FP16", "BF16", "FP32", "FP64"})
"""bfloat16's numpy ``kind`` is ``"V"``, not ``"f"``: the float datatypes are named, never told by their kind."""
_NOT_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class RecordError(ValueError):
    """A record (or one of its tensors) that cannot be read back: what is wrong and what was expected."""


def encode_tensor(name: str, datatype: str, array: npt.NDArray[Any]) -> dict[str, Any]:
    """A tensor's JSON form (``data`` included)."""
    tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    flat = array.reshape(-1)
    if datatype == "BYTES":
        items = [item if isinstance(item, bytes) else str(item).encode() for item in flat.tolist()]
        try:
            tensor["data"] = [item.decode("utf-8") for item in items]
        except UnicodeDecodeError:
            tensor["encoding"] = "base64"
            tensor["data"] = [base64.b64encode(item).decode("ascii") for item in items]
    elif datatype in _FLOATS and not bool(np.isfinite(flat).all()):
        tensor["data"] = [value if math.isfinite(value) else _spelled(value) for value in flat.tolist()]
    else:
        tensor["data"] = flat.tolist()
    return tensor


def tensor_bytes(array: npt.NDArray[Any]) -> bytes:
    """The bytes a redacting hash covers: the values as the model saw them (BYTES: each element with its length)."""
    if array.dtype == np.object_:
        parts = [item if isinstance(item, bytes) else str(item).encode() for item in array.reshape(-1).tolist()]
        return b"".join(len(part).to_bytes(4, "little") + part for part in parts)
    return np.ascontiguousarray(array).tobytes()


def hashed_tensor(name: str, datatype: str, array: npt.NDArray[Any]) -> dict[str, Any]:
    """A redacted tensor: its name, type and shape, and a SHA-256 of its values instead of them."""
    digest = hashlib.sha256(tensor_bytes(array)).hexdigest()
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "redacted": "hash", "sha256": digest}


def decode_tensor(tensor: Mapping[str, Any]) -> npt.NDArray[Any]:
    """A tensor's values as numpy, in its datatype and shape; ``RecordError`` when it carries none (truncated,
    redacted) or they do not fit its shape."""
    name = tensor.get("name", "?")
    datatype = tensor.get("datatype")
    dtype = _DTYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise RecordError(f"tensor '{name}': datatype {datatype!r} is not one of {', '.join(_DTYPES)}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(dim, int) and dim >= 0 for dim in shape):
        raise RecordError(f"tensor '{name}': shape {shape!r} is not a list of non-negative integers")
    if "data" not in tensor:
        why = "it was redacted" if tensor.get("redacted") else "it was truncated to fit the record's size cap"
        raise RecordError(f"tensor '{name}' has no values in the log: {why}")
    data = tensor["data"]
    if not isinstance(data, list):
        raise RecordError(f"tensor '{name}': data must be a list of values, got {type(data).__name__}")
    if datatype == "BYTES":
        encoded = tensor.get("encoding")
        elements = [base64.b64decode(item) if encoded == "base64" else str(item).encode() for item in data]
        array = np.empty(len(elements), dtype=np.object_)
        array[:] = elements
    elif datatype in _FLOATS:
        array = np.array([_NOT_FINITE.get(item, item) if isinstance(item, str) else item for item in data], dtype)
    else:
        array = np.array(data, dtype=dtype)
    expected = math.prod(shape)
    if array.size != expected:
        raise RecordError(f"tensor '{name}': {array.size} values for shape {shape} (expected {expected})")
    return array.reshape(shape)


def check_record(record: object) -> dict[str, Any]:
    """``record`` if it is a record this module can read; ``RecordError`` naming what is not."""
    if not isinstance(record, dict):
        raise RecordError(f"a record is a JSON object, got {type(record).__name__}")
    if record.get("format") != FORMAT:
        raise RecordError(f"record format {record.get('format')!r} is not {FORMAT}, the format this version reads")
    for key, kind in (("model", str), ("request", dict)):
        if not isinstance(record.get(key), kind):
            raise RecordError(f"record {record.get('id', '?')!r}: '{key}' must be a {kind.__name__}")
    return record


def inputs_of(record: Mapping[str, Any]) -> list[tuple[str, str, npt.NDArray[Any]]]:
    """The logged request's inputs as ``(name, datatype, values)``; ``RecordError`` when one has no values."""
    tensors: Sequence[Mapping[str, Any]] = record["request"].get("inputs", [])
    return [(tensor["name"], tensor["datatype"], decode_tensor(tensor)) for tensor in tensors]


def parameters_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The logged request's v2 request parameters (empty when it named none); ``RecordError`` when malformed."""
    parameters = record["request"].get("parameters") or {}
    scalars = isinstance(parameters, dict) and all(isinstance(v, bool | int | float | str) for v in parameters.values())
    if not scalars:
        raise RecordError(f"record {record.get('id', '?')!r}: 'request.parameters' must map names to scalars")
    return parameters


def output_parameters_of(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The parameters of each requested output that asked for any, by output name; ``RecordError`` when malformed."""
    given = record["request"].get("output_parameters") or {}
    if not isinstance(given, dict) or not all(isinstance(value, dict) for value in given.values()):
        raise RecordError(
            f"record {record.get('id', '?')!r}: 'request.output_parameters' must map output names to objects"
        )
    return given


def outputs_of(record: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """The logged answer's outputs by name (those that carry values); empty for a failed request."""
    response = record.get("response") or {}
    return {
        tensor["name"]: decode_tensor(tensor)
        for tensor in response.get("outputs", [])
        if "data" in tensor
    }


def _spelled(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"
