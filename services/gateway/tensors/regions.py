"""Tensors in registered shared-memory regions (Triton's ``shared_memory_region`` / ``_offset`` / ``_byte_size``
tensor parameters): inputs are copied out of a region once, at decode, outputs copied into one, every offset and size
checked against the region first (and against the shm object's current size as the copy runs: ``shared_memory``)."""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from services.gateway.errors import InvalidInput
from services.gateway.tensors.bytes_codec import BYTES, as_bytes, deserialize
from services.gateway.tensors.datatypes import numpy_dtype, shaped
from services.gateway.tensors.shared_memory import (
    BYTE_SIZE,
    DISABLED,
    KEYS,
    OFFSET,
    REGION,
    Region,
    RegionSlice,
    SharedMemoryRegions,
)
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse, ModelMetadata

_LENGTH = struct.Struct("<I")


class TensorRegions:
    """What the codecs resolve tensor parameters through: the regions of one request's tenant (``lookup=None``: the
    extension is off)."""

    def __init__(self, lookup: Callable[[str], Region | None] | None) -> None:
        self._lookup = lookup

    def input(
        self, tensor: str, datatype: str, shape: tuple[int, ...], params: Mapping[str, Any], *, has_data: bool
    ) -> InferInput:
        """The input as a read-only array of the region's bytes, copied out of it now: the client may change or
        shrink its object once the request was decoded, the model reads what was there."""
        if has_data:  # which would the client mean? Triton refuses this too
            raise InvalidInput(f"input '{tensor}': give its data either in shared memory or in the request, not both")
        target = self._slice("input", tensor, params)
        if datatype == BYTES:  # serialized strings, as in a request body: byte_size is what they take
            strings = deserialize(target.region.read(target.offset, target.byte_size), shape, tensor)
            return InferInput(tensor, datatype, shape, strings, region=target)
        dtype = numpy_dtype(datatype, tensor)
        count = math.prod(shape)
        if target.byte_size != count * dtype.itemsize:
            raise InvalidInput(
                f"input '{tensor}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
                f"shared_memory_byte_size is {target.byte_size}"
            )
        data = np.empty(count, dtype=dtype)
        target.region.read_into(target.offset, data.view(np.uint8).data)  # uint8: a buffer of any type, BF16 too
        data.flags.writeable = False  # an input, like one read from a request body
        return InferInput(tensor, datatype, shape, shaped(data, shape, tensor), region=target)

    def output(self, tensor: str, params: Mapping[str, Any]) -> RegionSlice | None:
        """Where a requested output goes, when its parameters name a region."""
        if not names_region(params):
            return None
        return self._slice("output", tensor, params)

    def _slice(self, kind: str, tensor: str, params: Mapping[str, Any]) -> RegionSlice:
        if REGION not in params:
            given = next(key for key in KEYS if key in params)
            raise InvalidInput(f"{kind} '{tensor}': parameter '{given}' is given without '{REGION}'")
        name = params[REGION]
        if not isinstance(name, str):
            raise InvalidInput(f"{kind} '{tensor}': parameter '{REGION}' must be a string, got {_shown(name)}")
        if BYTE_SIZE not in params:
            raise InvalidInput(f"{kind} '{tensor}': parameter '{BYTE_SIZE}' must be given along with '{REGION}'")
        size = _count(params[BYTE_SIZE], BYTE_SIZE, kind, tensor)
        offset = _count(params.get(OFFSET, 0), OFFSET, kind, tensor)
        if self._lookup is None:
            raise InvalidInput(f"{kind} '{tensor}': {DISABLED}")
        region = self._lookup(name)
        if region is None:
            raise InvalidInput(f"{kind} '{tensor}': no system shared memory region '{name}' is registered")
        if offset + size > region.byte_size:
            raise InvalidInput(
                f"{kind} '{tensor}': offset {offset} + byte_size {size} runs past the end of shared memory region "
                f"'{name}' ({region.byte_size} bytes)"
            )
        return RegionSlice(region, offset, size)


NO_REGIONS = TensorRegions(None)


def tensor_regions(registry: SharedMemoryRegions, tenant: str) -> TensorRegions:
    """The regions a request of ``tenant`` may name."""
    return TensorRegions(registry.lookup(tenant)) if registry.enabled else NO_REGIONS


def names_region(params: Mapping[str, Any]) -> bool:
    return REGION in params or OFFSET in params or BYTE_SIZE in params


def check_room(request: InferRequest, metadata: ModelMetadata) -> None:
    """Refuse, before the model runs, an output region too small for an output whose size the shapes tell."""
    specs = {spec.name: spec for spec in metadata.outputs}
    batch = request.inputs[0].shape[:1] if metadata.max_batch_size > 0 and request.inputs else ()
    for name, target in request.output_regions.items():
        spec = specs[name]  # validation refused unknown outputs
        if spec.datatype == BYTES or -1 in spec.dims or name in request.classification:
            continue  # known once it ran (a classified output's strings too)
        shape = (*batch, *spec.dims)
        needed = math.prod(shape) * numpy_dtype(spec.datatype, name).itemsize
        if needed > target.byte_size:
            raise InvalidInput(
                f"output '{name}': shape {list(shape)} of {spec.datatype} needs {needed} bytes, more than the "
                f"{target.byte_size} bytes (shared_memory_byte_size) given in shared memory region "
                f"'{target.region.name}'"
            )


def place_outputs(request: InferRequest, outputs: Sequence[InferOutput]) -> None:
    """Write the outputs requested into regions there (those a model server did not write itself)."""
    for output in outputs:
        target = request.output_regions.get(output.name)
        if target is None or output.region is not None:
            continue
        output.region = target.write(output.name, as_bytes(output.data))


def written_by_server(target: RegionSlice, name: str, datatype: str, shape: Sequence[int]) -> InferOutput:
    """An output a model server wrote into ``target`` itself, copied out of the region (BYTES: its strings, which end
    where their length prefixes say)."""
    count = math.prod(shape)
    region = target.region
    if datatype == BYTES:
        written = region.read(target.offset, target.byte_size)
        size = _serialized_size(written, count, name)
        data = deserialize(written[:size], tuple(shape), name, kind="output")
    else:
        dtype = numpy_dtype(datatype, name)
        size = count * dtype.itemsize
        if size > target.byte_size:
            raise InvalidInput(f"output '{name}' of {size} bytes does not fit its {target.byte_size} bytes")
        values = np.empty(count, dtype=dtype)
        region.read_into(target.offset, values.view(np.uint8).data)  # BF16 has no buffer format of its own
        data = values.reshape(shape)
    return InferOutput(name, datatype, data, region=RegionSlice(region, target.offset, size))


def _serialized_size(view: memoryview, count: int, name: str) -> int:
    """Bytes that ``count`` serialized strings take from the start of ``view``."""
    offset = 0
    for index in range(count):
        if offset + _LENGTH.size > len(view):
            raise InvalidInput(f"output '{name}': string {index} runs past the end of its shared memory")
        offset += _LENGTH.size + _LENGTH.unpack_from(view, offset)[0]
    if offset > len(view):
        raise InvalidInput(f"output '{name}': its strings run past the end of its shared memory")
    return offset


def detach(request: InferRequest, response: InferResponse) -> tuple[InferRequest, InferResponse]:
    """The request and answer without their regions, for work that outlives the answer (shadow traffic): the client
    may reuse its regions once answered, and a shadow's outputs must never land in them. The arrays are the
    gateway's own copies already (inputs copied out at decode, outputs copied in or out), so they are kept."""
    if not request.output_regions and all(tensor.region is None for tensor in request.inputs):
        return request, response
    inputs = [
        InferInput(tensor.name, tensor.datatype, tensor.shape, tensor.data) if tensor.region else tensor
        for tensor in request.inputs
    ]
    outputs = [
        InferOutput(output.name, output.datatype, output.data) if output.region else output
        for output in response.outputs
    ]
    return (
        dataclasses.replace(request, inputs=inputs, output_regions={}),
        dataclasses.replace(response, outputs=outputs),
    )


def _count(value: object, key: str, kind: str, tensor: str) -> int:
    if type(value) is not int or value < 0:  # bool is an int subclass
        raise InvalidInput(f"{kind} '{tensor}': parameter '{key}' must be a non-negative integer, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."
