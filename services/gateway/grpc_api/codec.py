"""KServe v2 gRPC messages <-> dataplane types (``raw_input_contents`` and typed contents)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from services.gateway.datatypes import numpy_dtype
from services.gateway.errors import InvalidInput, ModelNotFound
from services.gateway.types import InferInput, InferRequest, InferResponse, ModelMetadata

_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def parse_version(model: str, raw: str) -> int | None:
    if raw == "":
        return None
    if not raw.isdigit():
        raise ModelNotFound(f"model '{model}' has no version '{raw}' (versions are integers)")
    return int(raw)


def decode_request(message: Any) -> InferRequest:
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs")
    inputs = [_decode_input(tensor, raw[i] if raw else None) for i, tensor in enumerate(message.inputs)]
    params = message.parameters
    timeout_s = None
    if "timeout" in params and params["timeout"].int64_param > 0:
        timeout_s = params["timeout"].int64_param / 1e6  # microseconds, as in Triton
    priority = 0
    if "priority" in params:
        priority = int(params["priority"].uint64_param or params["priority"].int64_param)
    return InferRequest(
        model=message.model_name,
        version=parse_version(message.model_name, message.model_version),
        inputs=inputs,
        id=message.id,
        outputs=tuple(o.name for o in message.outputs) if len(message.outputs) else None,
        timeout_s=timeout_s,
        priority=priority,
    )


def _decode_input(tensor: Any, raw: bytes | None) -> InferInput:
    name, datatype = tensor.name, tensor.datatype
    shape = tuple(int(d) for d in tensor.shape)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape must be non-negative, got {list(shape)}")
    dtype = numpy_dtype(datatype, name)
    count = math.prod(shape)
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"input '{name}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
                f"got {len(raw)}"
            )
        return InferInput(name, datatype, shape, np.frombuffer(raw, dtype=dtype).reshape(shape))
    field = _CONTENTS.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    data = np.asarray(getattr(tensor.contents, field), dtype=dtype)
    if data.size != count:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} values, got {data.size}")
    return InferInput(name, datatype, shape, data.reshape(shape))


def encode_response(response: InferResponse) -> Any:
    message = service_pb2.ModelInferResponse(
        model_name=response.model, model_version=str(response.version), id=response.id
    )
    for output in response.outputs:
        message.outputs.add(name=output.name, datatype=output.datatype, shape=output.data.shape)
        # Triton's own bytes when the backend kept them: a pass-through, not a second serialisation.
        raw = output.raw if output.raw is not None else np.ascontiguousarray(output.data).tobytes()
        message.raw_output_contents.append(raw)
    return message


def encode_metadata(metadata: ModelMetadata) -> Any:
    message = service_pb2.ModelMetadataResponse(
        name=metadata.name, versions=[str(v) for v in metadata.versions], platform=metadata.platform
    )
    for specs, target in ((metadata.inputs, message.inputs), (metadata.outputs, message.outputs)):
        for spec in specs:
            target.add(name=spec.name, datatype=spec.datatype, shape=metadata.served_shape(spec))
    return message
