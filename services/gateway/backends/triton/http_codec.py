"""Gateway requests and responses <-> Triton's HTTP/REST inference messages with the binary tensor data extension.

The tensors go as their bytes, straight from the arrays (views of the client's body when it sent them binary: no
copy and no per-element work); Triton's outputs come back binary and become arrays over its answer's bytes."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from services.gateway.backends.triton.codec import output_array, output_dtype
from services.gateway.errors import InferenceFailed
from services.gateway.tensors.bytes_codec import as_bytes
from services.gateway.tensors.types import InferOutput, InferRequest, InferResponse

HEAD = (
    b"POST /v2/models/%s/versions/%d/infer HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
    b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
)
STATUS_CODES = {
    400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
}
"""Triton's HTTP statuses as the gRPC code names ``TritonErrors.infer_error`` reads (anything else: INTERNAL)."""


def http_request(
    request: InferRequest, version: int, timeout_s: float | None, priority: int, host: bytes
) -> tuple[bytes, list[bytes | memoryview]]:
    """The request line and headers, and the body's parts (JSON header, then each input's bytes)."""
    inputs: list[dict[str, Any]] = []
    parts: list[bytes | memoryview] = [b""]
    for tensor in request.inputs:
        data = as_bytes(tensor.data)
        size = data.nbytes
        inputs.append(
            {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape,
             "parameters": {"binary_data_size": size}}
        )  # fmt: skip
        parts.append(data)
    parameters: dict[str, Any] = {**request.parameters, "binary_data_output": True}
    if priority:
        parameters["priority"] = priority
    if timeout_s is not None:
        parameters["timeout"] = max(1, int(timeout_s * 1e6))
    header: dict[str, Any] = {"inputs": inputs, "parameters": parameters}
    if request.id:
        header["id"] = request.id
    parts[0] = json = orjson.dumps(header)
    length = sum(len(part) if isinstance(part, bytes) else part.nbytes for part in parts)
    return HEAD % (_path_name(request.model), version, host, len(json), length), parts


def http_response(
    status: int, header_length: int | None, body: bytes, request: InferRequest, version: int
) -> InferResponse | tuple[str, str]:
    """The response, or ``(code, message)`` of Triton's error answer (for ``TritonErrors.infer_error``)."""
    if status != 200:
        return STATUS_CODES.get(status, "INTERNAL"), _error_message(status, body)
    end = len(body) if header_length is None else header_length
    if not 0 < end <= len(body):
        raise InferenceFailed(f"Triton answered model '{request.model}' with a malformed binary header length")
    try:
        header = orjson.loads(body[:end] if end != len(body) else body)
        entries = header["outputs"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise InferenceFailed(f"Triton's answer for model '{request.model}' is not a v2 response") from None
    view = memoryview(body)
    offset = end
    outputs = []
    for entry in entries:
        name, datatype, shape = entry["name"], entry["datatype"], tuple(entry["shape"])
        dtype = output_dtype(datatype, name, request.model)
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:  # Triton sent this one as JSON after all
            outputs.append(InferOutput(name, datatype, np.asarray(entry["data"], dtype=dtype).reshape(shape)))
            continue
        raw = view[offset : offset + size]
        offset += size
        outputs.append(InferOutput(name, datatype, output_array(raw, dtype, shape, request.model, name)))
    return InferResponse(model=request.model, version=version, id=request.id, outputs=outputs)


def _error_message(status: int, body: bytes) -> str:
    try:
        message = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    return str(message) if message else f"HTTP {status}"


_NAMES: dict[str, bytes] = {}


def _path_name(model: str) -> bytes:
    """The model name as a URL path segment (names come from the repository's folders: few, so kept)."""
    name = _NAMES.get(model)
    if name is None:
        name = _NAMES[model] = quote(model, safe="").encode()
    return name
