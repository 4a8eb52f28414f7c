"""The sequences Triton's own example clients run (tritonclient's ``src/python/examples``: the health/metadata, infer
(sync, async, aio), model-control, system-shared-memory, string and explicit-contents clients, with their statistics
calls), written again as checks against a gateway serving ``tests/simple_models.py``. A Triton user's scripts must
work unchanged: each sequence asserts what its example checks before it prints PASS, plus what it only prints.

Both backends' conformance tests run them: ``tests/integration/test_triton_examples.py`` (embedded) and
``tests/triton/test_triton_examples_triton.py`` (Triton). The gateway must serve shared memory and the open
repository API (``SEQUENCE_SETTINGS``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.shm_support import shm_object
from tests.simple_models import ELEMENTS, MAX_BATCH_SIZE, MODELS, as_strings

SEQUENCE_SETTINGS: dict[str, object] = {"shared_memory": True, "repository_api_open": True, "repository_poll_s": 0}
"""What the examples need switched on (the README's "Triton's clients" setup); no rescans during the tests."""
SIMPLE = "simple"
UNKNOWN = "wrong_model_name"
UNKNOWN_MODEL = "Request for unknown model"
"""How Triton's answer for a model it does not know begins; the examples check for it."""
LOAD_FAILED = "failed to load"
"""What Triton's answer to a load that fails holds; the model-control examples check for it."""
BAD_OVERRIDE = '"parameters": {"config": {{"max_batch_size": "16"}}}'
"""The model-control examples' override that is not JSON at all."""
POLICY_OVERRIDE = '{"version_policy": {"specific": {"versions": [1]}}}'
"""An override the gateway honours (it may change only the version policy: docs/protocol.md, Model repository)."""
BATCH_OVERRIDE = '{"max_batch_size": "16"}'
"""The examples' good override; the gateway refuses it (a documented difference), naming the field."""

Int32s = npt.NDArray[np.int32]


def example_inputs(second: int = 1) -> tuple[Int32s, Int32s]:
    """INPUT0 = 0..15 and INPUT1 = ``second`` everywhere, one row: what the examples send (the HTTP ones -1)."""
    first = np.arange(ELEMENTS, dtype=np.int32).reshape(1, ELEMENTS)
    return first, np.full((1, ELEMENTS), second, dtype=np.int32)


def assert_sum_and_difference(result: Any, input0: npt.NDArray[Any], input1: npt.NDArray[Any]) -> None:
    """A tritonclient result (any flavour) holds INPUT0 + INPUT1 in OUTPUT0 and INPUT0 - INPUT1 in OUTPUT1."""
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)


# -- simple_http_health_metadata, simple_grpc_health_metadata ----------------------------------------------------


def health_metadata_http(http_url: str, grpc_url: str) -> None:
    with httpclient.InferenceServerClient(http_url) as client:
        assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
        assert client.is_server_ready()
        assert client.is_model_ready(SIMPLE)
        server = client.get_server_metadata()
        assert server["name"]
        assert server["version"]
        assert {"model_repository", "statistics", "system_shared_memory"} <= set(server["extensions"])
        metadata = client.get_model_metadata(SIMPLE, query_params={"test_1": 1, "test_2": 2})
        assert metadata["name"] == SIMPLE
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("INPUT0", "INT32", [-1, ELEMENTS]), ("INPUT1", "INT32", [-1, ELEMENTS])]
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(UNKNOWN)
        assert UNKNOWN_MODEL in str(caught.value.message())
        config = client.get_model_config(SIMPLE)
        assert (config["name"], config["max_batch_size"]) == (SIMPLE, MAX_BATCH_SIZE)


def health_metadata_grpc(http_url: str, grpc_url: str) -> None:
    headers = {"test": "1", "dummy": "2"}
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.is_server_live(headers=headers)
        assert client.is_server_ready()
        assert client.is_model_ready(SIMPLE)
        server = client.get_server_metadata()
        assert server.name
        assert server.version
        metadata = client.get_model_metadata(SIMPLE, headers=headers)
        assert metadata.name == SIMPLE
        assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
            ("OUTPUT0", "INT32", [-1, ELEMENTS]), ("OUTPUT1", "INT32", [-1, ELEMENTS])]
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(UNKNOWN)
        assert UNKNOWN_MODEL in str(caught.value.message())
        config = client.get_model_config(SIMPLE).config
        assert (config.name, config.max_batch_size) == (SIMPLE, MAX_BATCH_SIZE)


# -- simple_http_infer_client, simple_http_aio_infer_client, simple_http_async_infer_client -----------------------

HTTP_QUERY = {"test_1": 1, "test_2": 2}
"""Query parameters the HTTP infer examples add to every call: a server ignores them."""


def _http_inputs(module: Any, input0: Int32s, input1: Int32s) -> list[Any]:
    """INPUT0 as JSON, INPUT1 binary, as the HTTP examples mix them (``module``: tritonclient.http or its aio)."""
    first = module.InferInput("INPUT0", [1, ELEMENTS], "INT32")
    first.set_data_from_numpy(input0, binary_data=False)
    second = module.InferInput("INPUT1", [1, ELEMENTS], "INT32")
    second.set_data_from_numpy(input1, binary_data=True)
    return [first, second]


def _http_outputs(module: Any) -> list[Any]:
    return [module.InferRequestedOutput("OUTPUT0", binary_data=True),
            module.InferRequestedOutput("OUTPUT1", binary_data=False)]


def infer_http(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs(-1)
    with httpclient.InferenceServerClient(http_url) as client:
        inputs = _http_inputs(httpclient, input0, input1)
        result = client.infer(SIMPLE, inputs, outputs=_http_outputs(httpclient), query_params=HTTP_QUERY)
        statistics = client.get_inference_statistics(model_name=SIMPLE)
        assert [s["name"] for s in statistics["model_stats"]] == [SIMPLE]
        assert statistics["model_stats"][0]["inference_stats"]["success"]["count"] >= 1
        assert_sum_and_difference(result, input0, input1)
        assert_sum_and_difference(client.infer(SIMPLE, inputs, query_params=HTTP_QUERY), input0, input1)
        with pytest.raises(InferenceServerException) as caught:
            client.infer(UNKNOWN, inputs, outputs=_http_outputs(httpclient))
        assert str(caught.value.message()).startswith(UNKNOWN_MODEL)


async def infer_http_aio(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs(-1)
    async with httpaio.InferenceServerClient(http_url) as client:
        inputs = _http_inputs(httpaio, input0, input1)
        result = await client.infer(SIMPLE, inputs, outputs=_http_outputs(httpaio), query_params=HTTP_QUERY)
        statistics = await client.get_inference_statistics(model_name=SIMPLE)
        assert len(statistics["model_stats"]) == 1
        assert_sum_and_difference(result, input0, input1)
        assert_sum_and_difference(await client.infer(SIMPLE, inputs, query_params=HTTP_QUERY), input0, input1)
        with pytest.raises(InferenceServerException) as caught:
            await client.infer(UNKNOWN, inputs, outputs=_http_outputs(httpaio))
        assert str(caught.value.message()).startswith(UNKNOWN_MODEL)
        together = await asyncio.gather(
            client.infer(SIMPLE, inputs, outputs=_http_outputs(httpaio), query_params=HTTP_QUERY),
            client.infer(SIMPLE, inputs, query_params=HTTP_QUERY),
        )
    for each in together:
        assert_sum_and_difference(each, input0, input1)


def infer_http_async(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    with httpclient.InferenceServerClient(http_url, concurrency=2) as client:
        inputs = [httpclient.InferInput(name, [1, ELEMENTS], "INT32") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(input0, binary_data=True)
        inputs[1].set_data_from_numpy(input1, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in ("OUTPUT0", "OUTPUT1")]
        pending = [client.async_infer(SIMPLE, inputs, outputs=outputs) for _ in range(2)]
        for request in pending:
            assert_sum_and_difference(request.get_result(timeout=10), input0, input1)


# -- simple_grpc_infer_client, simple_grpc_aio_infer_client, simple_grpc_async_infer_client -----------------------


def _grpc_inputs(module: Any, input0: Int32s, input1: Int32s) -> list[Any]:
    tensors = [module.InferInput(name, [1, ELEMENTS], "INT32") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(input0)
    tensors[1].set_data_from_numpy(input1)
    return tensors


def _grpc_outputs(module: Any) -> list[Any]:
    return [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]


def infer_grpc(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        inputs = _grpc_inputs(grpcclient, input0, input1)
        result = client.infer(SIMPLE, inputs, outputs=_grpc_outputs(grpcclient), headers={"test": "1"})
        statistics = client.get_inference_statistics(model_name=SIMPLE)
        assert [s.name for s in statistics.model_stats] == [SIMPLE]
        assert statistics.model_stats[0].inference_stats.success.count >= 1
        assert_sum_and_difference(result, input0, input1)
        assert_sum_and_difference(client.infer(SIMPLE, inputs), input0, input1)
        with pytest.raises(InferenceServerException) as caught:
            client.infer(UNKNOWN, inputs)
        assert str(caught.value.message()).startswith(UNKNOWN_MODEL)


async def infer_grpc_aio(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    async with grpcaio.InferenceServerClient(grpc_url) as client:
        inputs = _grpc_inputs(grpcaio, input0, input1)
        result = await client.infer(SIMPLE, inputs, outputs=_grpc_outputs(grpcaio), headers={"test": "1"})
        statistics = await client.get_inference_statistics(model_name=SIMPLE)
        assert len(statistics.model_stats) == 1
        assert_sum_and_difference(result, input0, input1)
        together = await asyncio.gather(client.infer(SIMPLE, inputs), client.infer(SIMPLE, inputs))
    for each in together:
        assert_sum_and_difference(each, input0, input1)


def infer_grpc_async(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    answers: list[Any] = []
    answered = threading.Event()

    def callback(result: Any, error: InferenceServerException | None) -> None:
        answers.append(error if error is not None else result)
        answered.set()

    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.async_infer(SIMPLE, _grpc_inputs(grpcclient, input0, input1), callback,
                           outputs=_grpc_outputs(grpcclient))
        assert answered.wait(timeout=10), "async_infer's callback never came"
    assert not isinstance(answers[0], InferenceServerException), answers[0]
    assert_sum_and_difference(answers[0], input0, input1)


# -- simple_http_model_control, simple_grpc_model_control ---------------------------------------------------------


def model_control_http(http_url: str, grpc_url: str) -> None:
    with httpclient.InferenceServerClient(http_url) as client:
        assert sorted(m["name"] for m in client.get_model_repository_index()) == sorted(MODELS)
        _model_control(client, lambda: client.get_model_config(SIMPLE)["max_batch_size"])


def model_control_grpc(http_url: str, grpc_url: str) -> None:
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert sorted(m.name for m in client.get_model_repository_index().models) == sorted(MODELS)
        _model_control(client, lambda: client.get_model_config(SIMPLE).config.max_batch_size)


def _model_control(client: Any, max_batch_size: Callable[[], int]) -> None:
    """The examples' steps after the index; it ends with ``simple`` loaded again (the examples leave it unloaded),
    for the sequences after it."""
    client.load_model(SIMPLE)
    assert client.is_model_ready(SIMPLE)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(SIMPLE, config=BAD_OVERRIDE)
    assert LOAD_FAILED in str(caught.value.message())
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(SIMPLE, config=BATCH_OVERRIDE)
    assert "max_batch_size" in str(caught.value.message())
    client.load_model(SIMPLE, config=POLICY_OVERRIDE)
    assert client.is_model_ready(SIMPLE, "1")
    assert max_batch_size() == MAX_BATCH_SIZE
    client.unload_model(SIMPLE)
    assert not client.is_model_ready(SIMPLE)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(UNKNOWN)
    assert LOAD_FAILED in str(caught.value.message())
    client.load_model(SIMPLE)
    assert client.is_model_ready(SIMPLE)


# -- simple_http_shm_client, simple_grpc_shm_client -----------------------------------------------------------------


def shared_memory_http(http_url: str, grpc_url: str) -> None:
    with httpclient.InferenceServerClient(http_url) as client:
        _shared_memory(client, httpclient, lambda output: (output["datatype"], output["shape"]))


def shared_memory_grpc(http_url: str, grpc_url: str) -> None:
    with grpcclient.InferenceServerClient(grpc_url) as client:
        _shared_memory(client, grpcclient, lambda output: (output.datatype, list(output.shape)))


def _shared_memory(client: Any, module: Any, described: Callable[[Any], tuple[str, list[int]]]) -> None:
    """Both inputs in one region and both outputs in another, registered, used, listed, unregistered."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()  # the examples clean up both kinds at the start
    input0, input1 = (a.reshape(ELEMENTS) for a in example_inputs())
    size = input0.nbytes
    with shm_object(2 * size) as inputs_region, shm_object(2 * size) as outputs_region:
        client.register_system_shared_memory("output_data", outputs_region.key, 2 * size)
        inputs_region.put(input0)
        inputs_region.put(input1, offset=size)
        client.register_system_shared_memory("input_data", inputs_region.key, 2 * size)
        inputs = [module.InferInput(name, [1, ELEMENTS], "INT32") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        result = client.infer(SIMPLE, inputs, outputs=outputs)
        for index, (name, expected) in enumerate((("OUTPUT0", input0 + input1), ("OUTPUT1", input0 - input1))):
            datatype, shape = described(result.get_output(name))
            got = outputs_region.get(utils.triton_to_np_dtype(datatype), shape, offset=index * size)
            np.testing.assert_array_equal(got, expected.reshape(shape))
        assert _region_names(client.get_system_shared_memory_status()) == {"input_data", "output_data"}
        client.unregister_system_shared_memory()
        assert _region_names(client.get_system_shared_memory_status()) == set()


def _region_names(status: Any) -> set[str]:
    if isinstance(status, list):  # HTTP: a list of regions
        return {region["name"] for region in status}
    return set(status.regions)  # gRPC: a map from name to region


# -- simple_http_string_infer_client, simple_grpc_string_infer_client ----------------------------------------------

NUL_INSIDE = np.array([b"he\x00llo"] * ELEMENTS, dtype=np.object_).reshape(1, ELEMENTS)
"""The string examples' identity input with a NUL inside each element."""
BLOBS = np.array([b"\x00\x01\x02\x03"] * ELEMENTS, dtype=np.bytes_).reshape(1, ELEMENTS)
"""The string examples' 4-byte blobs, as ``np.bytes_`` (numpy drops trailing NULs, not these leading ones)."""


def strings_http(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    with httpclient.InferenceServerClient(http_url) as client:
        inputs = [httpclient.InferInput(name, [1, ELEMENTS], "BYTES") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(as_strings(input0), binary_data=True)
        inputs[1].set_data_from_numpy(as_strings(input1), binary_data=False)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                   httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
        _assert_decimal_sum_and_difference(client.infer("simple_string", inputs, outputs=outputs), input0, input1)
        for data in (NUL_INSIDE, BLOBS):
            for binary in (True, False):
                tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
                tensor.set_data_from_numpy(data, binary_data=binary)
                output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
                echoed = client.infer("simple_identity", [tensor], outputs=[output]).as_numpy("OUTPUT0")
                assert _as_bytes(echoed) == _as_bytes(data), f"binary_data={binary}"


def strings_grpc(http_url: str, grpc_url: str) -> None:
    input0, input1 = example_inputs()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        inputs = [grpcclient.InferInput(name, [1, ELEMENTS], "BYTES") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(as_strings(input0))
        inputs[1].set_data_from_numpy(as_strings(input1))
        _assert_decimal_sum_and_difference(
            client.infer("simple_string", inputs, outputs=_grpc_outputs(grpcclient)), input0, input1)
        for data in (NUL_INSIDE, BLOBS):
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            echoed = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
            assert _as_bytes(echoed) == _as_bytes(data)


def _assert_decimal_sum_and_difference(result: Any, input0: Int32s, input1: Int32s) -> None:
    for name, expected in (("OUTPUT0", input0 + input1), ("OUTPUT1", input0 - input1)):
        got = np.vectorize(int)(result.as_numpy(name))
        np.testing.assert_array_equal(got, expected, err_msg=name)


def _as_bytes(array: npt.NDArray[Any]) -> list[bytes]:
    """Elements as bytes, whichever way a client hands them back (bytes, or str from HTTP JSON)."""
    return [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()]


# -- grpc_explicit_int_content_client, grpc_explicit_int8_content_client, grpc_explicit_byte_content_client --------


def explicit_contents_grpc(http_url: str, grpc_url: str) -> None:
    """Typed contents (``int_contents``, ``bytes_contents``) instead of raw bytes, on the bare gRPC stub."""
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        numbers = list(range(ELEMENTS))
        for model, datatype, dtype in (("simple", "INT32", np.int32), ("simple_int8", "INT8", np.int8)):
            request = _typed_request(model, datatype, lambda c: c.int_contents.extend(numbers),
                                     lambda c: c.int_contents.extend([1] * ELEMENTS))
            outputs = _raw_outputs(stub.ModelInfer(request), partial(np.frombuffer, dtype=dtype))
            np.testing.assert_array_equal(outputs["OUTPUT0"], [[n + 1 for n in numbers]], err_msg=model)
            np.testing.assert_array_equal(outputs["OUTPUT1"], [[n - 1 for n in numbers]], err_msg=model)
        request.model_version = "wrong_specification"
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        details = str(caught.value.details())
        assert "failed to get model version from specified version string 'wrong_specification'" in details, details
        request = _typed_request("simple_string", "BYTES",
                                 lambda c: c.bytes_contents.extend(str(n).encode() for n in numbers),
                                 lambda c: c.bytes_contents.extend([b"1"] * ELEMENTS))
        outputs = _raw_outputs(stub.ModelInfer(request), utils.deserialize_bytes_tensor)
        assert [int(v) for v in outputs["OUTPUT0"].reshape(-1)] == [n + 1 for n in numbers]
        assert [int(v) for v in outputs["OUTPUT1"].reshape(-1)] == [n - 1 for n in numbers]


def _typed_request(
    model: str, datatype: str, fill0: Callable[[Any], None], fill1: Callable[[Any], None]
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, fill in (("INPUT0", fill0), ("INPUT1", fill1)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, ELEMENTS])
        fill(tensor.contents)
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    return request


def _raw_outputs(
    response: service_pb2.ModelInferResponse, decode: Callable[[bytes], npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    assert len(response.outputs) == 2, response
    return {output.name: decode(raw).reshape(list(output.shape))
            for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)}


Sequence = Callable[[str, str], None | Awaitable[None]]
SEQUENCES: Mapping[str, Sequence] = {
    sequence.__name__: sequence
    for sequence in (
        health_metadata_http, health_metadata_grpc,
        infer_http, infer_http_aio, infer_http_async, infer_grpc, infer_grpc_aio, infer_grpc_async,
        shared_memory_http, shared_memory_grpc, strings_http, strings_grpc, explicit_contents_grpc,
        model_control_http, model_control_grpc,  # last: they unload and load simple again
    )
}
"""Every example's sequence by name, each called with the gateway's HTTP and gRPC addresses; in the order the tests
run them."""


async def run_sequence(name: str, http_url: str, grpc_url: str) -> None:
    """Runs one sequence; a synchronous one in a worker thread, so that the test's event loop stays free."""
    sequence = SEQUENCES[name]
    if asyncio.iscoroutinefunction(sequence):
        await sequence(http_url, grpc_url)
    else:
        await asyncio.to_thread(sequence, http_url, grpc_url)
