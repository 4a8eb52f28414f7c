"""KServe v2 REST bodies <-> dataplane types: JSON tensors and the binary tensor data extension.

Anything a client can send decodes to a request or raises ``InvalidInput`` saying what was wrong and what came;
``values`` holds the rules for tensor data in JSON (strict types and ranges, "NaN"/"Infinity" spelled as strings).
Duplicate keys in a JSON object are not an error: the last one wins, as with orjson and Python's json."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from services.gateway.errors import InvalidInput, shown, unparsed_json
from services.gateway.rest.values import described, from_json, native_json, to_json
from services.gateway.tensors.bytes_codec import BYTES, as_bytes, from_binary, has_json_form
from services.gateway.tensors.classification import CLASSIFICATION
from services.gateway.tensors.datatypes import checked_shape, numpy_dtype, shaped
from services.gateway.tensors.parameters import INPUT_HTTP, OUTPUT_HTTP, check_tensor_parameters, scalar
from services.gateway.tensors.regions import NO_REGIONS, TensorRegions, names_region
from services.gateway.tensors.shared_memory import RegionSlice
from services.gateway.tensors.types import NO_PARAMETERS, Array, InferInput, InferRequest, InferResponse
from services.gateway.versions.numbers import MAX_DIGITS

HEADER_LENGTH = "inference-header-content-length"
_INT = frozenset({int})
_READ = frozenset({"binary_data_output", "timeout", "priority"})
"""The request parameters the gateway applies itself; the rest travel in ``InferRequest.parameters``."""
_NOT_JSON_HINTS = ("str is not valid UTF-8", "unexpected content after document")
"""orjson's words for bytes after the JSON: what a binary body sent without its header length looks like."""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Which outputs the client wants as binary data (the rest go back as JSON lists)."""

    binary_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


ABSENT = object()
JSON = OutputFormat(False)
BINARY = OutputFormat(True)
"""Shared formats of requests that name no outputs (frozen, never changed)."""
NO_TARGETS: dict[str, RegionSlice] = {}
"""Shared by requests that name no outputs; nothing writes to it."""


def decode_request(
    body: bytes, header_length: str | None, model: str, version: int | None, regions: TensorRegions = NO_REGIONS
) -> tuple[InferRequest, OutputFormat]:
    """``regions``: the caller's shared-memory regions, which tensor parameters may name."""
    header, json_end = _header(body, header_length)
    offset = json_end
    inputs: list[InferInput] = []
    for raw in header["inputs"]:
        tensor, offset = _decode_input(raw, body, offset, regions)
        inputs.append(tensor)
    if offset != len(body):
        raise InvalidInput(f"binary data has {len(body) - offset} bytes not claimed by any input's binary_data_size")
    raw_params = header.get("parameters", ABSENT)
    if raw_params is ABSENT:  # the common case: nothing to read (a null is refused below, as any non-object)
        params: Mapping[str, Any] = NO_PARAMETERS
        binary_default, timeout, priority = False, None, 0
    else:
        given = _object(raw_params, "'parameters'")
        binary_default = _flag(given, "binary_data_output", "")
        timeout = _natural(given, "timeout", " (microseconds)")
        priority = _natural(given, "priority", "") or 0
        params = {k: scalar(k, v) for k, v in given.items() if k not in _READ} if given.keys() - _READ else {}
    raw_outputs = header.get("outputs")
    if raw_outputs is None or raw_outputs == []:  # none named: every output, as gRPC's empty list and Triton
        requested, fmt, targets, classes = None, BINARY if binary_default else JSON, NO_TARGETS, NO_PARAMETERS
    else:
        requested, fmt, targets, classes = _decode_outputs(raw_outputs, binary_default, regions)
    request_id = header.get("id", "")
    if type(request_id) is not str:  # Triton's protocol has a string id; echoing a repr would invent one
        raise InvalidInput(f"'id' must be a string, got {described(request_id)}")
    request = InferRequest(
        model=model,
        version=version,
        inputs=inputs,
        id=request_id,
        outputs=requested,
        timeout_s=timeout / 1e6 if timeout else None,
        priority=priority,
        parameters=params,
        classification=classes,
        output_regions=targets,
    )
    return request, fmt


def encode_response(response: InferResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs follow the JSON, the JSON header's length."""
    if fmt is JSON:  # every output as JSON: the common answer, with the least Python per output
        outputs: list[dict[str, Any]] = []
        for output in response.outputs:
            data = output.data
            native = native_json(data) if output.region is None else None
            if native is None:
                return _encoded(response, fmt)
            outputs.append({"name": output.name, "datatype": output.datatype, "shape": data.shape, "data": native})
        encoded = orjson.dumps(_head(response, outputs), option=orjson.OPT_SERIALIZE_NUMPY)
        if b"null" not in encoded:  # orjson writes a non-finite float as null (a name holding "null" only costs time)
            return encoded, None
    return _encoded(response, fmt)


def _head(response: InferResponse, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    head: dict[str, Any] = {"model_name": response.model, "model_version": str(response.version)}
    if response.id:
        head["id"] = response.id
    head["outputs"] = outputs
    return head


def _encoded(response: InferResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """Any answer: outputs in shared memory, binary ones, BYTES, float16, and non-finite floats spelled out."""
    outputs: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    floats: list[tuple[dict[str, Any], Array]] = []
    binary_default, binary = fmt.binary_default, fmt.binary
    for output in response.outputs:
        data = output.data
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": data.shape}
        if output.region is not None:  # written into the client's shared memory: named there, not sent
            entry["parameters"] = output.region.parameters()
        elif binary.get(output.name, binary_default) or (data.dtype.kind == "O" and not has_json_form(data)):
            raw = as_bytes(data)  # BYTES that are not UTF-8 go binary: Triton would write invalid JSON
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            buffers.append(raw)
        else:
            native = native_json(data)
            if native is None:
                entry["data"] = to_json(data)
            else:
                entry["data"] = native
                if native.dtype.kind == "f":
                    floats.append((entry, data))
        outputs.append(entry)
    head = _head(response, outputs)
    encoded = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if floats and b"null" in encoded:  # a non-finite float written as null (or a name holding "null": harmless)
        for entry, data in floats:
            entry["data"] = to_json(data)  # NaN and infinities spelled out
        encoded = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return encoded, None
    return b"".join([encoded, *buffers]), len(encoded)


def _header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], int]:
    """The JSON part of the body and where it ends (the binary tensor data, if any, follows it)."""
    json_end = len(body)
    if header_length is not None:
        # int() would also take " 12", "1_2" and non-ASCII digits, and raise on 4,301 of them
        if not (header_length.isascii() and header_length.isdigit() and len(header_length) <= MAX_DIGITS):
            raise InvalidInput(f"Inference-Header-Content-Length must be an integer, got {shown(header_length)}")
        json_end = int(header_length)
        if not 0 < json_end <= len(body):
            raise InvalidInput(f"Inference-Header-Content-Length is {json_end} but the body has {len(body)} bytes")
    try:
        header = orjson.loads(body[:json_end] if json_end != len(body) else body)
    except orjson.JSONDecodeError as exc:
        if header_length is None and exc.msg.startswith(_NOT_JSON_HINTS):
            raise InvalidInput(
                unparsed_json(f"{exc}; binary tensor data after the JSON needs an "
                              "Inference-Header-Content-Length header giving the JSON part's length in bytes")
            ) from None
        raise InvalidInput(unparsed_json(f"{exc}")) from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidInput("request body must be a JSON object with an 'inputs' list")
    return header, json_end


def _decode_input(raw: object, body: bytes, offset: int, regions: TensorRegions) -> tuple[InferInput, int]:
    item = _object(raw, "each entry of 'inputs'")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidInput(f"every input needs a string 'name', got {described(name)}")
    if "datatype" not in item:
        raise InvalidInput(f"input '{name}': missing 'datatype'")
    datatype = item["datatype"]
    if not isinstance(datatype, str):
        raise InvalidInput(f"input '{name}': 'datatype' must be a string like \"FP32\", got {described(datatype)}")
    raw_shape = item.get("shape")
    if not isinstance(raw_shape, list) or not set(map(type, raw_shape)) <= _INT:  # bool is an int subclass
        raise InvalidInput(
            f"input '{name}': 'shape' must be a list of non-negative integers, got {described(raw_shape)}"
        )
    shape = checked_shape(raw_shape, name)
    dtype = numpy_dtype(datatype, name)
    raw_params = item.get("parameters", ABSENT)
    if raw_params is ABSENT:  # the common case: JSON data, nothing else to read
        if "data" not in item:
            raise InvalidInput(f"input '{name}': needs 'data' or a binary_data_size parameter")
        return InferInput(name, datatype, shape, from_json(item["data"], shape, dtype, datatype, name)), offset
    params = _object(raw_params, f"input '{name}': 'parameters'")
    check_tensor_parameters("input", name, params, INPUT_HTTP)
    if names_region(params):
        has_data = "data" in item or "binary_data_size" in params
        return regions.input(name, datatype, shape, params, has_data=has_data), offset
    if "binary_data_size" not in params:
        if "data" not in item:
            raise InvalidInput(f"input '{name}': needs 'data' or a binary_data_size parameter")
        return InferInput(name, datatype, shape, from_json(item["data"], shape, dtype, datatype, name)), offset
    size = params["binary_data_size"]
    if type(size) is not int:
        raise InvalidInput(f"input '{name}': binary_data_size must be an integer, got {described(size)}")
    if "data" in item:  # one of the two would be dropped in silence
        raise InvalidInput(
            f"Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'; input '{name}' sets both 'data' and 'binary_data_size'"
        )
    if datatype == BYTES:  # variable-length elements: the size is what their serialized form takes
        return InferInput(name, datatype, shape, from_binary(body, offset, size, shape, name)), offset + size
    count = math.prod(shape)
    expected = count * dtype.itemsize
    if size != expected:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} of {datatype} needs {expected} bytes, binary_data_size is {size}"
        )
    if offset + size > len(body):
        raise InvalidInput(f"input '{name}': binary_data_size {size} runs past the end of the body")
    data = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
    return InferInput(name, datatype, shape, shaped(data, shape, name)), offset + size


def _decode_outputs(
    raw: object, binary_default: bool, regions: TensorRegions
) -> tuple[tuple[str, ...] | None, OutputFormat, dict[str, RegionSlice], Mapping[str, int]]:
    """Requested names, their format, the outputs to write into shared memory and those to classify."""
    targets: dict[str, RegionSlice] = {}
    if raw is None:
        return None, OutputFormat(binary_default), targets, NO_PARAMETERS
    if not isinstance(raw, list):
        raise InvalidInput(f"'outputs' must be a list, got {described(raw)}")
    names: list[str] = []
    binary: dict[str, bool] = {}
    classes: dict[str, int] = {}
    for entry in raw:
        item = _object(entry, "each entry of 'outputs'")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidInput(f"every requested output needs a string 'name', got {described(name)}")
        names.append(name)
        params = _object(item.get("parameters", {}), f"output '{name}': 'parameters'")
        if not params:
            continue
        check_tensor_parameters("output", name, params, OUTPUT_HTTP)
        if "binary_data" in params:
            binary[name] = _flag(params, "binary_data", f"output '{name}': ")
        count = _natural(params, CLASSIFICATION, "", f"output '{name}': ")
        if count:  # 0 asks for the raw output, as in Triton
            classes[name] = count
        else:
            classes.pop(name, None)
        target = regions.output(name, params)
        if target is not None:
            targets[name] = target
    # An output named twice is answered once, as Triton does (its parameters are the last entry's, as with
    # duplicate JSON keys): an answer never holds more outputs than the model has.
    return tuple(dict.fromkeys(names)), OutputFormat(binary_default, binary), targets, classes or NO_PARAMETERS


def _flag(params: dict[str, Any], key: str, where: str) -> bool:
    """A JSON boolean parameter (absent: false); ``bool("false")`` is True, so nothing else is read as one."""
    value = params.get(key, False)
    if type(value) is not bool:
        raise InvalidInput(f"{where}parameter '{key}' must be true or false, got {described(value)}")
    return value


def _natural(params: dict[str, Any], key: str, unit: str, where: str = "") -> int | None:
    """A non-negative integer parameter, or None when absent."""
    if key not in params:
        return None
    value = params[key]
    if type(value) is not int or value < 0:
        raise InvalidInput(f"{where}parameter '{key}' must be a non-negative integer{unit}, got {described(value)}")
    return value


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object, got {described(value)}")
    return value
