"""KServe v2 gRPC messages <-> dataplane types (``raw_input_contents`` and typed contents).

Any ``ModelInferRequest`` a client can build decodes to a request or raises ``InvalidInput``. Raw contents are the
client's bytes and pass as they are (NaN and inf included); typed contents are checked against the datatype's
range, since the proto fields are wider than the small types (``int_contents`` carries INT8 as int32)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from services.gateway.errors import InvalidInput, shown
from services.gateway.grpc_api.shared_memory import output_regions, put_parameters, region_input, shared_parameters
from services.gateway.grpc_api.unparsed import Unparsed
from services.gateway.tensors.bytes_codec import BYTES, deserialize, raw_bytes
from services.gateway.tensors.classification import CLASSIFICATION
from services.gateway.tensors.datatypes import checked_shape, narrow, numpy_dtype, shaped
from services.gateway.tensors.parameters import INPUT_GRPC, OUTPUT_GRPC, REQUEST_READ, Scalar, check_tensor_parameters
from services.gateway.tensors.regions import NO_REGIONS, TensorRegions
from services.gateway.tensors.types import NO_PARAMETERS, InferInput, InferRequest, InferResponse, ModelMetadata
from services.gateway.versions.numbers import parse_version

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
    "BYTES": "bytes_contents",
}
_FIELD_DTYPES = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
    "bytes_contents": np.dtype(np.object_),  # narrow() passes it through: elements are bytes already
}
"""What each ``InferTensorContents`` field holds: the values arrive as these, then narrow to the datatype."""
_INTEGER_PARAMS = ("int64_param", "uint64_param")


def decode_request(message: Any, regions: TensorRegions = NO_REGIONS) -> InferRequest:
    """``regions``: the caller's shared-memory regions, which tensor parameters may name. ``message`` may be the
    stand-in for bytes that did not parse (``unparsed.py``): refused here, where every malformed request is."""
    if type(message) is Unparsed:
        raise InvalidInput(message.message)
    raw = message.raw_input_contents
    tensors = message.inputs
    given = [tensor.parameters or None for tensor in tensors]  # each read of the field builds a wrapper: once
    if given.count(None) == len(given):  # the common case: no tensor parameters, every input's data in the message
        if raw and len(raw) != len(given):
            raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(given)} inputs")
        inputs = (
            [_decode_input(tensor, data, None) for tensor, data in zip(tensors, raw, strict=True)] if raw
            else [_decode_input(tensor, None, None) for tensor in tensors]
        )
    else:
        inputs = _decode_inputs(tensors, raw, given, regions)
    params = message.parameters
    timeout = _natural(params, "timeout") if params else None  # microseconds, as in Triton (int64_param)
    outputs = message.outputs
    raw_version = message.model_version
    classes = _classification(outputs) if outputs else NO_PARAMETERS
    return InferRequest(
        model=message.model_name,
        version=parse_version(raw_version) if raw_version else None,
        inputs=inputs,
        id=message.id,
        outputs=tuple(dict.fromkeys([o.name for o in outputs])) if outputs else None,  # twice named, once answered
        timeout_s=timeout / 1e6 if timeout else None,
        priority=(_natural(params, "priority") or 0) if params else 0,  # tritonclient sends a uint64_param
        parameters=_forwardable(params) if params else NO_PARAMETERS,
        classification=classes,
        output_regions=output_regions(outputs, regions) if outputs else {},
    )


def _decode_inputs(tensors: Any, raw: Any, given: list[Any], regions: TensorRegions) -> list[InferInput]:
    """Inputs some of which have parameters (``given``, by position): shared memory, a declared size."""
    pairs = zip(tensors, given, strict=True)
    shared = [None if params is None else _shared(tensor, params) for tensor, params in pairs]
    sent = shared.count(None)  # as in Triton, inputs in shared memory have no raw_input_contents entry
    if raw and len(raw) != sent:
        named = ", ".join(f"'{tensor.name}'" for tensor, region in zip(tensors, shared, strict=True) if region)
        why = f": the inputs that name a shared-memory region ({named}) have no entry there" if named else ""
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {sent} inputs{why}")
    contents = iter(raw)
    return [
        _decode_input(tensor, next(contents) if raw else None, params) if region is None
        else region_input(tensor, region, regions)
        for tensor, params, region in zip(tensors, given, shared, strict=True)
    ]


def _shared(tensor: Any, params: Any) -> dict[str, Any] | None:
    """An input's ``shared_memory_*`` parameters (None: it names none), after refusing any the gateway does not
    know."""
    check_tensor_parameters("input", tensor.name, params, INPUT_GRPC)
    return shared_parameters(params)


def _forwardable(params: Any) -> Mapping[str, Scalar]:
    """The request parameters the gateway does not apply itself, as plain values (each ``InferParameter`` holds
    one)."""
    found: dict[str, Scalar] = {}
    for key, parameter in params.items():
        if key in REQUEST_READ:
            continue
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInput(f"parameter {shown(key)} has no value")
        found[key] = getattr(parameter, kind)
    return found or NO_PARAMETERS


def _classification(outputs: Any) -> Mapping[str, int]:
    """Requested outputs with a ``classification`` count (tritonclient's ``class_count``: an int64_param), after
    refusing output parameters the gateway does not know."""
    found: dict[str, int] = {}
    for output in outputs:
        params = output.parameters
        if not params:
            continue
        check_tensor_parameters("output", output.name, params, OUTPUT_GRPC)
        count = _natural(params, CLASSIFICATION, f"output '{output.name}': ")
        if count:  # 0 asks for the raw output, as in Triton
            found[output.name] = count
        else:
            found.pop(output.name, None)
    return found or NO_PARAMETERS


def _decode_input(tensor: Any, raw: bytes | None, params: Any) -> InferInput:
    """``params``: the input's parameters when it has any (``None`` otherwise)."""
    name, datatype = tensor.name, tensor.datatype
    shape = checked_shape(tensor.shape, name)
    dtype = numpy_dtype(datatype, name)
    count = math.prod(shape)
    # only the non-empty fields (the common raw case has no contents message at all: skip the listing)
    given = [fd.name for fd, _ in tensor.contents.ListFields()] if tensor.HasField("contents") else []
    if raw is not None:
        if given:  # which one would the client mean? Triton refuses this too
            raise InvalidInput(
                f"input '{name}': give each input's data either in contents or in raw_input_contents, not both"
            )
        if params is not None and "binary_data_size" in params:
            _check_declared_size(params, name, len(raw))
        if datatype == BYTES:  # raw holds the serialized strings, of no fixed size
            return InferInput(name, datatype, shape, deserialize(raw, shape, name))
        if len(raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"input '{name}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
                f"got {len(raw)}"
            )
        return InferInput(name, datatype, shape, shaped(np.frombuffer(raw, dtype=dtype), shape, name))
    if params is not None and "binary_data_size" in params:
        raise InvalidInput(f"input '{name}': binary_data_size is given but its data is not in raw_input_contents")
    field = _CONTENTS.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    if given and given != [field]:
        wrong = ", ".join(f"contents.{g}" for g in given)
        raise InvalidInput(f"input '{name}': {datatype} values go in contents.{field}, got {wrong}")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} values, got {len(values)}")
    data = narrow(np.asarray(values, dtype=_FIELD_DTYPES[field]), dtype, datatype, name)
    return InferInput(name, datatype, shape, shaped(data, shape, name))


def _check_declared_size(params: Any, name: str, size: int) -> None:
    """A ``binary_data_size`` given with raw contents (KServe's client sends one) must be what came."""
    declared = _natural(params, "binary_data_size", f"input '{name}': ")
    if declared != size:
        raise InvalidInput(
            f"input '{name}': binary_data_size is {declared} but its raw_input_contents entry has {size} bytes"
        )


def _natural(params: Any, key: str, where: str = "") -> int | None:
    """A non-negative integer parameter, or None when absent; Triton's own clients send int64 or uint64."""
    if key not in params:
        return None
    kind = params[key].WhichOneof("parameter_choice")
    if kind not in _INTEGER_PARAMS:
        raise InvalidInput(
            f"{where}parameter '{key}' must be an int64_param or uint64_param, got {kind or 'no value'}"
        )
    value: int = getattr(params[key], kind)
    if value < 0:
        raise InvalidInput(f"{where}parameter '{key}' must be a non-negative integer, got {value}")
    return value


def encode_response(response: InferResponse, into: Any = None) -> Any:
    """The ``ModelInferResponse`` of ``response``; ``into``: fill that (empty) message instead, e.g. the
    ``infer_response`` of a stream's answer, without copying the tensors' bytes a second time."""
    if into is None:
        message = service_pb2.ModelInferResponse(
            model_name=response.model, model_version=str(response.version), id=response.id
        )
    else:
        message = into
        message.model_name, message.model_version, message.id = response.model, str(response.version), response.id
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.data.shape)
        if output.region is not None:
            # In the client's shared memory: named, not sent. The empty entry keeps raw_output_contents aligned with
            # the outputs (tritonclient's as_numpy pairs them by position), as Triton does.
            put_parameters(tensor.parameters, output.region.parameters())
            message.raw_output_contents.append(b"")
            continue
        # Triton's own bytes when the backend kept them: a pass-through, not a second serialisation.
        raw = output.raw if output.raw is not None else raw_bytes(output.data)
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
