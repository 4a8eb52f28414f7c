"""BYTES tensors through tritonclient (HTTP JSON and binary, HTTP aio, gRPC, gRPC aio, typed gRPC contents) to the
embedded backend: onnxruntime string tensors, a TorchScript ``List[str]`` module, and the client errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.string_models import NOT_UTF8, TEXT, VOCABULARY, serialized, string_repository, strings


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """Every model loads through its warm-up: empty strings, or word_ids' model_warmup (a file and random_data)."""
    root = string_repository(tmp_path_factory.mktemp("strings"))
    with running_gateway(Settings(repository=root, port=0, grpc_port=0)) as running:
        yield running


def _http_echo(url: str, values: object, *, binary_in: bool, binary_out: bool) -> np.ndarray:
    data = strings(values)  # type: ignore[arg-type]
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary_in)
        outputs = [httpclient.InferRequestedOutput("echo", binary_data=binary_out)]
        return client.infer("echo", [tensor], outputs=outputs).as_numpy("echo")  # type: ignore[no-any-return]


@pytest.mark.slow  # a gateway on real ports
@pytest.mark.parametrize(("binary_in", "binary_out"), [(False, False), (True, True), (False, True), (True, False)])
def test_echo_answers_the_exact_strings_when_http_sends_json_or_binary(
    gateway: RunningGateway, binary_in: bool, binary_out: bool
) -> None:
    echoed = _http_echo(gateway.http_url, TEXT, binary_in=binary_in, binary_out=binary_out)
    assert echoed.shape == (1, len(TEXT))
    # tritonclient reads JSON strings as str and binary BYTES as bytes, as with Triton
    expected = [t.encode() for t in TEXT] if binary_out else TEXT
    assert echoed.tolist() == [expected]


@pytest.mark.slow  # a gateway on real ports
def test_echo_answers_the_exact_bytes_when_grpc_sends_raw_contents(gateway: RunningGateway) -> None:
    data = strings(TEXT + TEXT[::-1], (2, len(TEXT)))
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer("echo", [tensor])
    assert result.as_numpy("echo").tolist() == data.tolist()


@pytest.mark.slow  # a gateway on real ports
def test_echo_answers_the_exact_bytes_when_grpc_sends_typed_bytes_contents(gateway: RunningGateway) -> None:
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="text", datatype="BYTES", shape=[1, 3]).contents.bytes_contents.extend(
        [b"", "grüße".encode(), "🚀".encode()]
    )
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert (reply.outputs[0].datatype, list(reply.outputs[0].shape)) == ("BYTES", [1, 3])
    assert reply.raw_output_contents[0] == serialized(["", "grüße", "🚀"])


@pytest.mark.slow  # a gateway on real ports
async def test_batched_echo_returns_each_caller_its_own_strings_when_aio_clients_send_together(
    gateway: RunningGateway,
) -> None:
    async def http_call(index: int) -> list[object]:
        data = strings([f"http {index}", TEXT[index % len(TEXT)]])
        async with httpaio.InferenceServerClient(gateway.http_url) as client:
            tensor = httpaio.InferInput("text", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data, binary_data=index % 2 == 0)
            result = await client.infer("echo", [tensor])
        return [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("echo")[0].tolist()]

    async def grpc_call(index: int) -> list[object]:
        data = strings([f"grpc {index}", "x" * index])
        async with grpcaio.InferenceServerClient(gateway.grpc_url) as client:
            tensor = grpcaio.InferInput("text", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            result = await client.infer("echo", [tensor])
        return result.as_numpy("echo")[0].tolist()  # type: ignore[no-any-return]

    answers = await asyncio.gather(*(http_call(i) for i in range(8)), *(grpc_call(i) for i in range(8)))
    expected = [[f"http {i}".encode(), TEXT[i % len(TEXT)].encode()] for i in range(8)]
    expected += [[f"grpc {i}".encode(), b"x" * i] for i in range(8)]
    assert answers == expected


@pytest.mark.slow  # a gateway on real ports
def test_word_ids_maps_strings_to_int64_ids_when_sent_as_json(gateway: RunningGateway) -> None:
    words = ["hello", "grüße", "unknown", "日本語", ""]
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = httpclient.InferInput("words", [1, len(words)], "BYTES")
        tensor.set_data_from_numpy(strings(words), binary_data=False)
        ids = client.infer("word_ids", [tensor]).as_numpy("ids")
    assert ids.dtype == np.int64
    assert ids.tolist() == [[VOCABULARY.get(w, -1) for w in words]]


@pytest.mark.slow  # a gateway on real ports
def test_torchscript_module_takes_and_returns_a_list_of_strings_when_the_tensor_is_1d(gateway: RunningGateway) -> None:
    data = strings(TEXT, (len(TEXT),))
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT__0", [len(TEXT)], "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer("echo_ts", [tensor])
    assert result.as_numpy("OUTPUT__0").tolist() == data.tolist()


@pytest.mark.slow  # a gateway on real ports
def test_torchscript_model_with_2d_strings_is_unavailable_naming_the_limitation_when_requested(
    gateway: RunningGateway,
) -> None:
    """The config fixes the rank, so such a model could never answer: its load is refused (as Triton's PyTorch
    backend refuses it), and every request learns why (503, the model is unavailable) instead of a 400 blaming the
    client."""
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        assert not client.is_model_ready("echo_ts_2d")
        tensor = httpclient.InferInput("INPUT__0", [1, 2], "BYTES")
        tensor.set_data_from_numpy(strings(["a", "b"]), binary_data=False)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo_ts_2d", [tensor])
    assert caught.value.status() == "503"
    assert "TorchScript model 'echo_ts_2d' input 'INPUT__0' is BYTES: TorchScript takes strings as a List[str], " \
           "so only 1-D BYTES tensors can be served" in caught.value.message()


@pytest.mark.slow  # a gateway on real ports
def test_onnx_string_input_refuses_bytes_that_are_not_utf8_naming_the_element(gateway: RunningGateway) -> None:
    message = "input 'text': string 0 is not valid UTF-8 (invalid start byte at byte 0); onnxruntime string tensors"
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = httpclient.InferInput("text", [1, 3], "BYTES")
        tensor.set_data_from_numpy(strings(NOT_UTF8), binary_data=True)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [tensor])
    assert caught.value.status() == "400"
    assert message in caught.value.message()
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("text", [1, 3], "BYTES")
        tensor.set_data_from_numpy(strings(NOT_UTF8[1:] + NOT_UTF8[:1]))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [tensor])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'text': string 1 is not valid UTF-8 (unexpected end of data at byte 0)" in caught.value.message()


def _post(gateway: RunningGateway, header: dict[str, object], tail: bytes = b"") -> httpx.Response:
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))} if tail else {}
    return httpx.post(f"http://{gateway.http_url}/v2/models/echo/infer", content=head + tail, headers=headers)


@pytest.mark.slow  # a gateway on real ports
@pytest.mark.parametrize(
    ("data", "tail", "message"),
    [
        (["a", 7], b"", "input 'text': BYTES data must be strings, got 7 at index 1"),
        (["a"], b"", "input 'text': shape [1, 2] needs 2 values, got 1"),
        (None, b"\x01\x00\x00\x00a\x05\x00", "input 'text': string 1's 4-byte length prefix at byte 5 is cut off: "
                                             "only 2 byte(s) remain"),
        (None, b"\x01\x00\x00\x00a\x05\x00\x00\x00ab", "input 'text': string 1's length prefix at byte 5 says 5 "
                                                       "bytes, only 2 remain"),
        (None, b"\x01\x00\x00\x00a", "input 'text': shape [1, 2] needs 2 strings, the data ends after 1 (at byte 5)"),
    ],
)
def test_rest_refuses_malformed_strings_with_400_naming_the_tensor_when_json_or_prefixes_are_wrong(
    gateway: RunningGateway, data: object, tail: bytes, message: str
) -> None:
    tensor: dict[str, object] = {"name": "text", "shape": [1, 2], "datatype": "BYTES"}
    if tail:
        tensor["parameters"] = {"binary_data_size": len(tail)}
    else:
        tensor["data"] = data
    response = _post(gateway, {"inputs": [tensor]}, tail)
    assert response.status_code == 400
    assert response.json()["error"] == message


@pytest.mark.slow  # a gateway on real ports
def test_grpc_refuses_truncated_raw_strings_with_invalid_argument_naming_the_offset(gateway: RunningGateway) -> None:
    request = service_pb2.ModelInferRequest(model_name="echo", raw_input_contents=[b"\x03\x00\x00\x00ab"])
    request.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "input 'text': string 0's length prefix at byte 0 says 3 bytes, only 2 remain"


@pytest.mark.slow  # a gateway on real ports
def test_metadata_reports_string_tensors_as_bytes_when_the_config_says_type_string(gateway: RunningGateway) -> None:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        metadata = client.get_model_metadata("word_ids")
    assert metadata["inputs"] == [{"name": "words", "datatype": "BYTES", "shape": [-1, -1]}]
    assert metadata["outputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]


def test_repository_fixture_writes_models_other_tools_would_when_built(tmp_path: Path) -> None:
    root = string_repository(tmp_path, torchscript=False)
    assert sorted(p.name for p in root.iterdir()) == ["echo", "word_ids"]
