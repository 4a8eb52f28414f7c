"""BYTES tensors through tritonclient (HTTP JSON and binary, HTTP aio, gRPC, gRPC aio) -> gateway (backend=triton)
-> the real local Triton, whose python-backend twins run the string models with onnxruntime and TorchScript."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import RunningGateway
from tests.string_models import NOT_UTF8, TEXT, VOCABULARY, serialized, string_repository, strings
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # a local Triton


@pytest.fixture(scope="module")
def strings_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return string_repository(tmp_path_factory.mktemp("strings"))


@pytest.fixture(scope="module")
def strings_triton(
    install: TritonInstall, strings_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTriton]:
    """Its own Triton: Triton runs word_ids' model_warmup (a serialized-strings file) itself at load."""
    with local_triton(strings_repository, tmp_path_factory.mktemp("strings-triton"), install) as server:
        yield server


@pytest.fixture(scope="module")
def strings_gateway(strings_triton: LocalTriton, strings_repository: Path) -> Iterator[RunningGateway]:
    with local_gateway(gateway_settings(strings_triton.grpc_url, strings_repository)) as running:
        yield running


@pytest.mark.parametrize(("binary_in", "binary_out"), [(False, False), (True, True), (False, True)])
def test_echo_answers_the_exact_strings_when_http_sends_json_or_binary_through_triton(
    strings_gateway: RunningGateway, binary_in: bool, binary_out: bool
) -> None:
    data = strings(TEXT)
    with httpclient.InferenceServerClient(strings_gateway.http_url) as client:
        tensor = httpclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary_in)
        outputs = [httpclient.InferRequestedOutput("echo", binary_data=binary_out)]
        echoed = client.infer("echo", [tensor], outputs=outputs).as_numpy("echo")
    assert echoed.tolist() == [[t.encode() for t in TEXT] if binary_out else TEXT]


def test_echo_passes_triton_raw_bytes_through_when_grpc_sends_them(strings_gateway: RunningGateway) -> None:
    data = strings(TEXT + TEXT[::-1], (2, len(TEXT)))
    with grpcclient.InferenceServerClient(strings_gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer("echo", [tensor])
    assert result.as_numpy("echo").tolist() == data.tolist()
    assert result.get_response().raw_output_contents[0] == b"".join(serialized(row) for row in (TEXT, TEXT[::-1]))


async def test_echo_returns_each_caller_its_own_strings_when_aio_clients_send_together_through_triton(
    strings_gateway: RunningGateway,
) -> None:
    async def http_call(index: int) -> list[bytes]:
        data = strings([f"http {index}", TEXT[index % len(TEXT)]])
        async with httpaio.InferenceServerClient(strings_gateway.http_url) as client:
            tensor = httpaio.InferInput("text", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            result = await client.infer("echo", [tensor], outputs=[httpaio.InferRequestedOutput("echo")])
        return result.as_numpy("echo")[0].tolist()  # type: ignore[no-any-return]

    async def grpc_call(index: int) -> list[bytes]:
        data = strings([f"grpc {index}", "ü" * index])
        async with grpcaio.InferenceServerClient(strings_gateway.grpc_url) as client:
            tensor = grpcaio.InferInput("text", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            result = await client.infer("echo", [tensor])
        return result.as_numpy("echo")[0].tolist()  # type: ignore[no-any-return]

    answers = await asyncio.gather(*(http_call(i) for i in range(6)), *(grpc_call(i) for i in range(6)))
    expected = [[f"http {i}".encode(), TEXT[i % len(TEXT)].encode()] for i in range(6)]
    expected += [[f"grpc {i}".encode(), ("ü" * i).encode()] for i in range(6)]
    assert answers == expected


def test_word_ids_maps_strings_to_int64_ids_when_triton_runs_it(strings_gateway: RunningGateway) -> None:
    words = ["world", "日本語", "nope", ""]
    with grpcclient.InferenceServerClient(strings_gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("words", [1, len(words)], "BYTES")
        tensor.set_data_from_numpy(strings(words))
        ids = client.infer("word_ids", [tensor]).as_numpy("ids")
    assert ids.dtype == np.int64
    assert ids.tolist() == [[VOCABULARY.get(w, -1) for w in words]]


def test_torchscript_twin_takes_and_returns_a_list_of_strings_when_the_tensor_is_1d(
    strings_gateway: RunningGateway,
) -> None:
    data = strings(TEXT, (len(TEXT),))
    with httpclient.InferenceServerClient(strings_gateway.http_url) as client:
        tensor = httpclient.InferInput("INPUT__0", [len(TEXT)], "BYTES")
        tensor.set_data_from_numpy(data, binary_data=True)
        result = client.infer("echo_ts", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT__0")])
    assert result.as_numpy("OUTPUT__0").tolist() == data.tolist()


def test_onnx_twin_refuses_bytes_that_are_not_utf8_with_400_naming_the_element(strings_gateway: RunningGateway) -> None:
    with httpclient.InferenceServerClient(strings_gateway.http_url) as client:
        tensor = httpclient.InferInput("text", [1, 3], "BYTES")
        tensor.set_data_from_numpy(strings(NOT_UTF8), binary_data=True)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [tensor])
    assert caught.value.status() == "400"
    assert "input 'text': string 0 is not valid UTF-8 (invalid start byte at byte 0)" in caught.value.message()


def test_gateway_refuses_truncated_raw_strings_before_triton_when_grpc_sends_them(
    strings_gateway: RunningGateway,
) -> None:
    request = service_pb2.ModelInferRequest(model_name="echo", raw_input_contents=[b"\x01\x00\x00"])
    request.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    with grpc.insecure_channel(strings_gateway.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "input 'text': string 0's 4-byte length prefix at byte 0 is cut off: only 3 byte(s) remain"
    )
