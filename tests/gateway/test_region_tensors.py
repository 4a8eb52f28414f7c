"""Tensor parameters that name shared-memory regions, as the REST and gRPC codecs decode them, and outputs written
into regions, over a real registry and real /dev/shm objects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from services.gateway.errors import InvalidInput
from services.gateway.grpc_api.codec import decode_request as decode_grpc
from services.gateway.rest.codec import decode_request as decode_rest
from services.gateway.tensors.bytes_codec import from_list, serialize
from services.gateway.tensors.regions import TensorRegions, detach, place_outputs, tensor_regions
from services.gateway.tensors.shared_memory import RegionSlice, SharedMemoryRegions
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse
from tests.shm_support import ShmObject, descriptors, mappings, shm_object


@pytest.fixture
def shm() -> Iterator[ShmObject]:
    with shm_object(256) as found:
        yield found


@pytest.fixture
async def registry(shm: ShmObject) -> AsyncIterator[SharedMemoryRegions]:
    regions = SharedMemoryRegions(enabled=True)
    await regions.register("anonymous", "r", shm.key, 0, 128)
    yield regions
    await regions.close()


def rest(inputs: list[dict[str, object]], regions: TensorRegions, outputs: object = None) -> InferRequest:
    body: dict[str, object] = {"inputs": inputs}
    if outputs is not None:
        body["outputs"] = outputs
    return decode_rest(json.dumps(body).encode(), None, "m", None, regions)[0]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_offset": 0}, "parameter 'shared_memory_offset' is given without 'shared_memory_region'"),
        ({"shared_memory_region": 7, "shared_memory_byte_size": 16}, "'shared_memory_region' must be a string"),
        ({"shared_memory_region": "r"}, "'shared_memory_byte_size' must be given along with 'shared_memory_region'"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": -4},
         "'shared_memory_offset' must be a non-negative integer, got -4"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, "must be a non-negative integer, got True"),
    ],
)
def test_region_input_answers_400_when_parameters_are_malformed(
    registry: SharedMemoryRegions, parameters: dict[str, object], message: str
) -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [4], "parameters": parameters}
    with pytest.raises(InvalidInput) as caught:
        rest([tensor], tensor_regions(registry, "anonymous"))
    assert message in str(caught.value)


def test_region_input_answers_400_when_data_is_also_sent(registry: SharedMemoryRegions) -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4],
              "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}
    with pytest.raises(InvalidInput, match="either in shared memory or in the request, not both"):
        rest([tensor], tensor_regions(registry, "anonymous"))


def test_region_input_is_a_read_only_copy_when_decoded(shm: ShmObject, registry: SharedMemoryRegions) -> None:
    shm.put(np.arange(4, dtype=np.float32), offset=32)
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4],
              "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": 32}}
    decoded = rest([tensor], tensor_regions(registry, "anonymous")).inputs[0]
    np.testing.assert_array_equal(decoded.data, [[0, 1, 2, 3]])
    assert not decoded.data.flags.writeable
    shm.put(np.full(4, 9, dtype=np.float32), offset=32)
    np.testing.assert_array_equal(decoded.data, [[0, 1, 2, 3]])  # what was there at decode: the model reads that
    assert mappings(shm.path) == 1  # the client's own: the gateway reads through a descriptor, never a mapping


def test_region_input_decodes_serialized_strings_when_bytes_tensor(
    shm: ShmObject, registry: SharedMemoryRegions
) -> None:
    values = [b"", "zürich".encode(), b"\x00\xff"]
    serialized = serialize(from_list(values))
    shm.put(np.frombuffer(serialized, dtype=np.uint8))
    message = service_pb2.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="s", datatype="BYTES", shape=[3])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = len(serialized)
    decoded = decode_grpc(message, tensor_regions(registry, "anonymous")).inputs[0]
    assert decoded.data.tolist() == values


def test_grpc_region_input_needs_no_raw_contents_entry_when_mixed_with_raw_inputs(
    shm: ShmObject, registry: SharedMemoryRegions
) -> None:
    shm.put(np.array([5, 6], dtype=np.int32))
    message = service_pb2.ModelInferRequest(model_name="m")
    shared = message.inputs.add(name="a", datatype="INT32", shape=[2])
    shared.parameters["shared_memory_region"].string_param = "r"
    shared.parameters["shared_memory_byte_size"].int64_param = 8
    message.inputs.add(name="b", datatype="INT32", shape=[2])
    message.raw_input_contents.append(np.array([7, 8], dtype=np.int32).tobytes())
    decoded = decode_grpc(message, tensor_regions(registry, "anonymous"))
    assert [tensor.data.tolist() for tensor in decoded.inputs] == [[5, 6], [7, 8]]
    message.inputs[0].parameters["shared_memory_region"].int64_param = 1
    with pytest.raises(InvalidInput, match="'shared_memory_region' must be a string, got 1"):
        decode_grpc(message, tensor_regions(registry, "anonymous"))


async def test_region_output_answers_400_after_the_run_when_output_outgrows_its_slice(
    shm: ShmObject, registry: SharedMemoryRegions
) -> None:
    region = registry.find("anonymous", "r")
    assert region is not None
    request = InferRequest("m", None, [], outputs=("y", "z"), output_regions={"y": RegionSlice(region, 8, 12)})
    too_big = [InferOutput("y", "FP32", np.zeros(4, dtype=np.float32)), InferOutput("z", "FP32", np.zeros(1))]
    with pytest.raises(InvalidInput) as caught:
        place_outputs(request, too_big)
    assert str(caught.value) == (
        "output 'y' has 16 bytes, more than the 12 bytes (shared_memory_byte_size) it was given in shared memory "
        "region 'r'"
    )
    fits = [InferOutput("y", "BYTES", from_list([b"ab"])), InferOutput("z", "FP32", np.zeros(1))]
    place_outputs(request, fits)
    assert fits[0].region == RegionSlice(region, 8, 6)
    assert fits[1].region is None
    assert bytes(shm.get(np.uint8, [6], 8)) == serialize(from_list([b"ab"]))


async def test_region_descriptor_closes_when_unregistered_while_request_holds_its_copy(
    shm: ShmObject, registry: SharedMemoryRegions
) -> None:
    alone = descriptors(shm.path) - 1
    shm.put(np.arange(4, dtype=np.uint8))
    tensor = {"name": "x", "datatype": "UINT8", "shape": [4],
              "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}
    request = rest([tensor], tensor_regions(registry, "anonymous"), outputs=[
        {"name": "y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}
    ])
    shadow, _ = detach(request, InferResponse("m", 1, []))
    assert shadow.inputs[0].region is None
    assert shadow.output_regions == {}
    await registry.unregister("anonymous", "r")
    assert descriptors(shm.path) == alone
    with pytest.raises(InvalidInput, match="shared memory region 'r' was unregistered while the request used it"):
        place_outputs(request, [InferOutput("y", "UINT8", np.zeros(4, dtype=np.uint8))])
    np.testing.assert_array_equal(request.inputs[0].data, np.arange(4, dtype=np.uint8))
    np.testing.assert_array_equal(shadow.inputs[0].data, np.arange(4, dtype=np.uint8))


async def test_region_registry_refuses_names_when_unprintable_or_too_long(shm: ShmObject) -> None:
    regions = SharedMemoryRegions(enabled=True)
    for name in ("", "a\nb", "x" * 257):
        with pytest.raises(InvalidInput, match="must be 1 to 256 printable characters"):
            await regions.register("anonymous", name, shm.key, 0, 8)
    assert InferInput("x", "FP32", (1,), np.zeros(1)).region is None
