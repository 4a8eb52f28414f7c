"""Triton's raw binary request: ``Inference-Header-Content-Length: 0`` and a body that is nothing but the binary
data of the model's one input. No JSON names the input, its datatype or its shape: they come from the model's
metadata, the shape deduced from the body's size (at most one variable dim; a BYTES input must have dims ``[1]`` and
the body is its one element). A model that batches gets a batch of one, and every output comes back as binary data,
as Triton answers such a request."""

from __future__ import annotations

import math

import numpy as np

from services.gateway.errors import InvalidInput
from services.gateway.rest.codec import BINARY, OutputFormat
from services.gateway.tensors.bytes_codec import BYTES, from_list
from services.gateway.tensors.datatypes import numpy_dtype
from services.gateway.tensors.types import InferInput, InferRequest, ModelMetadata

RAW_HEADER_LENGTH = b"0"
"""The ``Inference-Header-Content-Length`` that marks a raw binary request."""
_WHAT = "a raw binary request (Inference-Header-Content-Length: 0)"


def decode_raw_request(
    body: bytes, metadata: ModelMetadata, model: str, version: int | None
) -> tuple[InferRequest, OutputFormat]:
    if len(metadata.inputs) != 1:
        names = ", ".join(f"'{spec.name}'" for spec in metadata.inputs) or "none"
        raise InvalidInput(
            f"{_WHAT} carries the data of a model's only input, but model '{model}' has "
            f"{len(metadata.inputs)} inputs ({names}): send a JSON header naming each input"
        )
    spec = metadata.inputs[0]
    dims = list(spec.dims)
    if spec.datatype == BYTES:
        if dims != [1]:
            raise InvalidInput(
                f"{_WHAT} is one element of a BYTES input, but input '{spec.name}' of model '{model}' has dims "
                f"{dims}, not [1]: send a JSON header giving its shape"
            )
        shape: tuple[int, ...] = (1,)
        data = from_list([bytes(body)])
    else:
        dtype = numpy_dtype(spec.datatype, spec.name)
        variable = [axis for axis, dim in enumerate(dims) if dim < 0]
        if len(variable) > 1:
            raise InvalidInput(
                f"{_WHAT} leaves the shape to be deduced from the body's size, which needs at most one variable "
                f"dim; input '{spec.name}' of model '{model}' has dims {dims}: send a JSON header giving its shape"
            )
        row = math.prod(dim for dim in dims if dim >= 0) * dtype.itemsize
        if variable and row:
            if len(body) % row:
                raise InvalidInput(
                    f"{_WHAT}: {len(body)} bytes are not a whole number of {spec.datatype} input '{spec.name}' "
                    f"of dims {dims} ({row} bytes per step of its variable dim)"
                )
            dims[variable[0]] = len(body) // row
        elif len(body) != row:
            raise InvalidInput(
                f"{_WHAT}: input '{spec.name}' of model '{model}' ({spec.datatype}, dims {dims}) takes {row} bytes, "
                f"the body has {len(body)}"
            )
        elif variable:  # a fixed dim of 0: no element whatever the variable one is
            dims[variable[0]] = 0
        shape = tuple(dims)
        data = np.frombuffer(body, dtype=dtype).reshape(shape)
    if metadata.max_batch_size > 0:
        shape = (1, *shape)
        data = data.reshape(shape)
    request = InferRequest(model=model, version=version, inputs=[InferInput(spec.name, spec.datatype, shape, data)])
    return request, BINARY
