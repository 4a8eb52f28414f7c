"""Gateway requests and responses <-> Triton's gRPC ``ModelInfer`` messages (raw tensor bytes both ways)."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2

from services.gateway.datatypes import numpy_dtype
from services.gateway.errors import InferenceFailed, InvalidInput
from services.gateway.types import InferOutput, InferRequest, InferResponse


def infer_request(
    request: InferRequest, version: int, timeout_s: float | None, priority: int
) -> service_pb2.ModelInferRequest:
    """The v2 request Triton receives: every tensor as raw bytes, the version pinned, the deadline budget as
    Triton's queue ``timeout`` (microseconds; the model's queue policy must allow_timeout_override)."""
    message = service_pb2.ModelInferRequest(model_name=request.model, model_version=str(version), id=request.id)
    for tensor in request.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_input_contents.append(tensor.data.tobytes())
    if priority:
        message.parameters["priority"].uint64_param = priority
    if timeout_s is not None:
        message.parameters["timeout"].int64_param = max(1, int(timeout_s * 1e6))
    return message


def infer_response(reply: service_pb2.ModelInferResponse, request: InferRequest, version: int) -> InferResponse:
    """Triton's outputs as arrays over its raw bytes (no copy); ``raw`` keeps the bytes for the gRPC front end."""
    if len(reply.raw_output_contents) != len(reply.outputs):
        raise InferenceFailed(f"Triton answered model '{request.model}' without raw output contents")
    outputs = []
    for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True):
        name, datatype = tensor.name, tensor.datatype  # each read of a protobuf field builds a new str
        try:
            dtype = numpy_dtype(datatype, name)
        except InvalidInput:
            raise InferenceFailed(
                f"model '{request.model}' returned output '{name}' as {datatype}, which the gateway does not serve"
            ) from None
        outputs.append(InferOutput(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(tensor.shape), raw=raw))
    return InferResponse(model=request.model, version=version, id=request.id, outputs=outputs)
