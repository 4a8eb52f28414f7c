"""The generate extension's JSON <-> the data plane's request and response (docs/protocol.md, "Generate").

A request is one JSON object: a key that names one of the model's inputs is that input's value (a scalar, or a list
flat or nested), shaped to the dims the model declares; every other key, and every key of the ``parameters`` object,
is a request parameter (``timeout`` and ``priority`` the gateway applies, as on ``/infer``), but ``id``, the request's
id. An answer is one JSON object too: ``model_name``, ``model_version``, the request's ``id`` when it has one, and
each output under its own name, a list of its values, or the value itself when the output holds one; BYTES as
strings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from services.gateway.errors import InvalidInput
from services.gateway.rest.values import described, from_json, to_json
from services.gateway.shaping.json_limits import client_json
from services.gateway.tensors.datatypes import numpy_dtype
from services.gateway.tensors.parameters import scalar
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse, ModelMetadata

PARAMETERS = "parameters"
ID = "id"
"""The request's id, as in Triton: a key of the body (not of ``parameters``), echoed in the answer and each event."""
RESERVED = ("model_name", "model_version", ID)
"""The answer's own keys: an output of one of these names is left out of it, as Triton leaves it out."""
_BODY = "the generate request body"


def decode_generate(body: bytes, model: str, version: int | None, metadata: ModelMetadata) -> InferRequest:
    """The request a generate body stands for; ``metadata`` (the version it is routed to) says which keys are inputs
    and their shapes. Raises ``InvalidInput`` naming the key that is wrong and what it should be."""
    fields = client_json(body, _BODY) if body.strip() else None
    if not isinstance(fields, dict):
        raise InvalidInput(
            f"{_BODY} must be a JSON object whose keys name the model's inputs (and request parameters), "
            f"got {described(fields)}"
        )
    specs = metadata.input_specs
    inputs: list[InferInput] = []
    parameters: dict[str, Any] = {}
    request_id = ""
    for key, value in fields.items():
        spec = specs.get(key)
        if spec is not None:
            shape = fitted_shape(metadata.served_shape(spec), _count(value), key)
            dtype = numpy_dtype(spec.datatype, key)
            data = from_json(value if isinstance(value, list) else [value], shape, dtype, spec.datatype, key)
            inputs.append(InferInput(key, spec.datatype, shape, data))
        elif key == ID:
            request_id = _request_id(value)
        elif key != PARAMETERS:
            parameters[key] = value
    named = fields.get(PARAMETERS, {})
    if not isinstance(named, dict):
        raise InvalidInput(f"'{PARAMETERS}' must be a JSON object of request parameters, got {described(named)}")
    for key in named.keys() & parameters.keys():
        raise InvalidInput(f"parameter '{key}' is given twice: as a key of the body and in '{PARAMETERS}'")
    parameters.update(named)
    timeout = _natural(parameters.pop("timeout", None), "timeout", " (microseconds)")
    priority = _natural(parameters.pop("priority", None), "priority", "")
    return InferRequest(
        model=model,
        version=version,
        inputs=inputs,
        id=request_id,
        timeout_s=timeout / 1e6 if timeout else None,
        priority=priority or 0,
        parameters={key: scalar(key, value) for key, value in parameters.items()},
    )


def fitted_shape(declared: Sequence[int], count: int, name: str) -> tuple[int, ...]:
    """The shape ``count`` values take in an input whose dims are ``declared`` (-1: any size), as Triton's generate
    endpoint shapes them: the fixed dims as declared, the innermost variable dim holding what they leave, any other
    variable dim 1 (a batching model's batch dim: one request)."""
    fixed = math.prod(dim for dim in declared if dim >= 0)
    variable = [index for index, dim in enumerate(declared) if dim < 0]
    rest, left = divmod(count, fixed) if fixed else (1, count)
    if left or (not variable and rest != 1):
        wanted = f"a multiple of {fixed}" if variable else f"exactly {fixed}"
        raise InvalidInput(
            f"input '{name}': {count} value(s) do not fit the shape {list(declared)} the model declares; "
            f"it takes {wanted} values"
        )
    shape = [1 if dim < 0 else dim for dim in declared]
    if variable:
        shape[variable[-1]] = rest
    return tuple(shape)


def encode_generate(response: InferResponse) -> bytes:
    """The answer's JSON: its own keys, then each output under its name."""
    answer: dict[str, Any] = {"model_name": response.model, "model_version": str(response.version)}
    if response.id:
        answer["id"] = response.id
    for output in response.outputs:
        if output.name not in RESERVED:
            answer[output.name] = _value(output)
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def error_json(message: str) -> bytes:
    """The v2 error shape, for an error event on a stream already started."""
    return orjson.dumps({"error": message})


def _value(output: InferOutput) -> Any:
    try:
        values = to_json(output.data)
    except ValueError:  # BYTES that are not UTF-8: JSON has no form for them
        raise InvalidInput(
            f"output '{output.name}' holds BYTES that are not UTF-8 text, which a generate answer cannot carry; "
            "ask /infer, which sends them as binary data"
        ) from None
    if output.data.size != 1:
        return values
    return values[0] if isinstance(values, list) else values.tolist()[0]


def _count(value: object) -> int:
    """How many values an input's JSON value holds: one for a scalar, the scalars of a (nested) list."""
    if not isinstance(value, list):
        return 1
    count, pending = 0, [value]
    while pending:  # no recursion: the body's nesting is bounded, this keeps it so anyway
        items = pending.pop()
        for item in items:
            if isinstance(item, list):
                pending.append(item)
            else:
                count += 1
    return count


def _request_id(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"'{ID}' must be a string (the request's id, echoed in the answer), got {described(value)}")
    return value


def _natural(value: object, key: str, unit: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise InvalidInput(f"parameter '{key}' must be a non-negative integer{unit}, got {described(value)}")
    return value
