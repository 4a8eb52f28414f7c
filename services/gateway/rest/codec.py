"""KServe v2 REST bodies <-> dataplane types: JSON tensors and the binary tensor data extension."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from services.gateway.datatypes import numpy_dtype
from services.gateway.errors import InvalidInput
from services.gateway.types import Array, InferInput, InferRequest, InferResponse, as_bytes

HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Which outputs the client wants as binary data (the rest go back as JSON lists)."""

    binary_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def decode_request(
    body: bytes, header_length: str | None, model: str, version: int | None
) -> tuple[InferRequest, OutputFormat]:
    json_end = len(body)
    if header_length is not None:
        try:
            json_end = int(header_length)
        except ValueError:
            raise InvalidInput(f"Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if not 0 < json_end <= len(body):
            raise InvalidInput(f"Inference-Header-Content-Length is {json_end} but the body has {len(body)} bytes")
    try:
        header = orjson.loads(body[:json_end] if json_end != len(body) else body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON request body: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidInput("request body must be a JSON object with an 'inputs' list")
    offset = json_end
    inputs: list[InferInput] = []
    for raw in header["inputs"]:
        tensor, offset = _decode_input(raw, body, offset)
        inputs.append(tensor)
    if offset != len(body):
        raise InvalidInput(f"binary data has {len(body) - offset} bytes not claimed by any input's binary_data_size")
    params = _dict(header.get("parameters", {}), "parameters")
    requested, fmt = _decode_outputs(header.get("outputs"), bool(params.get("binary_data_output", False)))
    request = InferRequest(
        model=model,
        version=version,
        inputs=inputs,
        id=str(header.get("id", "")),
        outputs=requested,
        timeout_s=_timeout(params.get("timeout")),
        priority=_int(params.get("priority", 0), "priority"),
        parameters=params,
    )
    return request, fmt


def encode_response(response: InferResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs follow the JSON, the JSON header's length."""
    outputs: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if fmt.is_binary(output.name):
            data = as_bytes(output.data)
            entry["parameters"] = {"binary_data_size": data.nbytes}
            buffers.append(data)
        else:
            entry["data"] = _json_ready(output.data)
        outputs.append(entry)
    head: dict[str, Any] = {"model_name": response.model, "model_version": str(response.version)}
    if response.id:
        head["id"] = response.id
    head["outputs"] = outputs
    encoded = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return encoded, None
    return b"".join([encoded, *buffers]), len(encoded)


def _decode_input(raw: object, body: bytes, offset: int) -> tuple[InferInput, int]:
    item = _dict(raw, "each input")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidInput("every input needs a string 'name'")
    datatype = item.get("datatype")
    shape = item.get("shape")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input '{name}': missing 'datatype'")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidInput(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    dtype = numpy_dtype(datatype, name)
    count = math.prod(shape)
    size = _dict(item.get("parameters", {}), f"input '{name}' parameters").get("binary_data_size")
    if size is not None:
        expected = count * dtype.itemsize
        if size != expected:
            raise InvalidInput(
                f"input '{name}': shape {shape} of {datatype} needs {expected} bytes, binary_data_size is {size}"
            )
        if offset + size > len(body):
            raise InvalidInput(f"input '{name}': binary_data_size {size} runs past the end of the body")
        data = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
        return InferInput(name, datatype, tuple(shape), data), offset + size
    if "data" not in item:
        raise InvalidInput(f"input '{name}': needs 'data' or a binary_data_size parameter")
    try:
        data = np.asarray(item["data"], dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"input '{name}': data is not a valid {datatype} array: {exc}") from None
    if data.size != count:
        raise InvalidInput(f"input '{name}': shape {shape} needs {count} values, got {data.size}")
    return InferInput(name, datatype, tuple(shape), data.reshape(shape)), offset


def _decode_outputs(raw: object, binary_default: bool) -> tuple[tuple[str, ...] | None, OutputFormat]:
    if raw is None:
        return None, OutputFormat(binary_default)
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list")
    names: list[str] = []
    binary: dict[str, bool] = {}
    for entry in raw:
        item = _dict(entry, "each output")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidInput("every requested output needs a string 'name'")
        names.append(name)
        flag = _dict(item.get("parameters", {}), f"output '{name}' parameters").get("binary_data")
        if flag is not None:
            binary[name] = bool(flag)
    return tuple(names), OutputFormat(binary_default, binary)


def _timeout(value: object) -> float | None:
    """The v2 ``timeout`` parameter is in microseconds, as in Triton."""
    if value is None:
        return None
    micros = _int(value, "timeout")
    return micros / 1e6 if micros > 0 else None


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"parameter '{what}' must be an integer, got {value!r}")
    return value


def _dict(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _json_ready(array: Array) -> Array | list[Any]:
    """orjson writes C-contiguous numeric arrays natively (fast); anything else goes through lists."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind in "fiub" and flat.dtype != np.float16:
        return flat
    return flat.tolist()
