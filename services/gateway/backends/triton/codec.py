"""Gateway requests and responses <-> Triton's gRPC ``ModelInfer`` messages (raw tensor bytes both ways; BYTES
tensors in Triton's serialized form, kept as they came for the gRPC front end)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from services.gateway.backends.triton.shared_memory import forward_input, forward_outputs, forwarded_output
from services.gateway.errors import InferenceFailed, InvalidInput
from services.gateway.tensors.bytes_codec import OBJECT, deserialize, raw_bytes
from services.gateway.tensors.datatypes import numpy_dtype
from services.gateway.tensors.types import Array, InferOutput, InferRequest, InferResponse

INT64_MAX = 2**63 - 1


def infer_request(
    request: InferRequest, version: int, timeout_s: float | None, priority: int, *, forward: bool = False
) -> service_pb2.ModelInferRequest:
    """The v2 request Triton receives: every tensor as raw bytes, the version pinned, the deadline budget as
    Triton's queue ``timeout`` (microseconds; the model's queue policy must allow_timeout_override). ``forward``:
    tensors in the client's shared memory are named by region instead (Triton maps the same regions)."""
    message = service_pb2.ModelInferRequest(model_name=request.model, model_version=str(version), id=request.id)
    for tensor in request.inputs:
        entry = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if not (forward and forward_input(entry, tensor)):
            message.raw_input_contents.append(raw_bytes(tensor.data))
    if forward:
        forward_outputs(message, request)
    if request.parameters:
        put_request_parameters(message.parameters, request.parameters)
    if priority:
        message.parameters["priority"].uint64_param = priority
    if timeout_s is not None:
        message.parameters["timeout"].int64_param = max(1, int(timeout_s * 1e6))
    return message


def put_request_parameters(parameters: Any, values: Mapping[str, Any]) -> None:
    """The client's own request parameters as Triton's ``InferParameter`` kinds (a bool before an int: in Python
    it is one). Integers past int64 travel as uint64, as tritonclient sends them."""
    for key, value in values.items():
        parameter = parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value > INT64_MAX:
                parameter.uint64_param = value
            else:
                parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = value


def infer_response(
    reply: service_pb2.ModelInferResponse, request: InferRequest, version: int, *, forward: bool = False
) -> InferResponse:
    """Triton's outputs as arrays over its raw bytes (no copy); ``raw`` keeps the bytes for the gRPC front end.
    ``forward``: outputs bound for shared memory are there already, Triton wrote them."""
    if len(reply.raw_output_contents) != len(reply.outputs):
        raise InferenceFailed(f"Triton answered model '{request.model}' without raw output contents")
    outputs = []
    for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True):
        name, datatype = tensor.name, tensor.datatype  # each read of a protobuf field builds a new str
        dtype = output_dtype(datatype, name, request.model)
        written = forwarded_output(request, name, datatype, tuple(tensor.shape)) if forward else None
        if written is not None:
            outputs.append(written)
            continue
        data = output_array(raw, dtype, tuple(tensor.shape), request.model, name)
        outputs.append(InferOutput(name, datatype, data, raw=raw))
    return InferResponse(model=request.model, version=version, id=request.id, outputs=outputs)


def output_dtype(datatype: str, name: str, model: str) -> np.dtype[Any]:
    """The numpy dtype of an output Triton answered; one the gateway cannot serve is the model's fault."""
    try:
        return numpy_dtype(datatype, name)
    except InvalidInput:
        raise InferenceFailed(
            f"model '{model}' returned output '{name}' as {datatype}, which the gateway does not serve"
        ) from None


def output_array(raw: bytes | memoryview, dtype: np.dtype[Any], shape: tuple[int, ...], model: str, name: str) -> Array:
    """An output's values over Triton's bytes (numbers without a copy); strings that do not add up to the shape are
    the model's fault, not the client's."""
    if dtype != OBJECT:
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    try:
        return deserialize(raw, shape, name, kind="output")
    except InvalidInput as exc:
        raise InferenceFailed(f"model '{model}' answered with malformed BYTES: {exc}") from None
