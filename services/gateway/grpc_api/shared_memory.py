"""The shared-memory extension over gRPC: ``SystemSharedMemory*`` on the registry, ``CudaSharedMemory*`` answered
with a clear refusal, and the ``shared_memory_*`` tensor parameters of ``ModelInfer`` as the codec reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import service_pb2

from services.gateway.errors import InvalidInput
from services.gateway.tensors.datatypes import checked_shape, numpy_dtype
from services.gateway.tensors.regions import TensorRegions
from services.gateway.tensors.shared_memory import CUDA_UNSUPPORTED, KEYS, RegionSlice, SharedMemoryRegions
from services.gateway.tensors.types import InferInput

_VALUES = ("string_param", "int64_param", "uint64_param", "bool_param", "double_param")


def shared_parameters(parameters: Any) -> dict[str, Any] | None:
    """A tensor's ``shared_memory_*`` parameters as plain values (None: it names none). Triton sends the region as a
    string_param and sizes as int64_param; a value of another kind comes through as what it is, for the checks to
    name."""
    if not parameters or not any(key in parameters for key in KEYS):
        return None
    found: dict[str, Any] = {}
    for key in KEYS:
        if key in parameters:
            kind = parameters[key].WhichOneof("parameter_choice")
            found[key] = getattr(parameters[key], kind) if kind in _VALUES else None
    return found


def region_input(tensor: Any, params: Mapping[str, Any], regions: TensorRegions) -> InferInput:
    name, datatype = tensor.name, tensor.datatype
    shape = checked_shape(tensor.shape, name)
    numpy_dtype(datatype, name)  # an unknown datatype is named as such, before any region check
    return regions.input(name, datatype, shape, params, has_data=bool(tensor.contents.ListFields()))


def output_regions(outputs: Any, regions: TensorRegions) -> dict[str, RegionSlice]:
    """Requested outputs to write into shared memory, by name."""
    found: dict[str, RegionSlice] = {}
    for output in outputs:
        params = shared_parameters(output.parameters)
        if params is not None:
            target = regions.output(output.name, params)
            if target is not None:
                found[output.name] = target
    return found


def put_parameters(parameters: Any, values: Mapping[str, str | int]) -> None:
    """Write tensor parameters into a protobuf map as Triton types them (strings, int64)."""
    for key, value in values.items():
        if isinstance(value, str):
            parameters[key].string_param = value
        else:
            parameters[key].int64_param = value


async def system_status(regions: SharedMemoryRegions, tenant: str, request: Any) -> Any:
    response = service_pb2.SystemSharedMemoryStatusResponse()
    for region in regions.status(tenant, request.name or None):
        entry = response.regions[region.name]
        entry.name, entry.key, entry.offset, entry.byte_size = region.name, region.key, region.offset, region.byte_size
    return response


async def system_register(regions: SharedMemoryRegions, tenant: str, request: Any) -> Any:
    await regions.register(tenant, request.name, request.key, request.offset, request.byte_size)
    return service_pb2.SystemSharedMemoryRegisterResponse()


async def system_unregister(regions: SharedMemoryRegions, tenant: str, request: Any) -> Any:
    await regions.unregister(tenant, request.name or None)
    return service_pb2.SystemSharedMemoryUnregisterResponse()


async def cuda_status(request: Any) -> Any:
    """No CUDA region can exist here: the list is empty, and asking for one by name is the clear refusal."""
    if request.name:
        raise InvalidInput(CUDA_UNSUPPORTED)
    return service_pb2.CudaSharedMemoryStatusResponse()


async def cuda_register(request: Any) -> Any:
    raise InvalidInput(CUDA_UNSUPPORTED)


async def cuda_unregister(request: Any) -> Any:
    """Nothing to unregister (clients that clean up at startup must get through)."""
    return service_pb2.CudaSharedMemoryUnregisterResponse()
