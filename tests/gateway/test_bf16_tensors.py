"""BF16 tensors end to end: the datatype table, the REST (JSON and binary) and gRPC codecs, shared memory, the Triton
backend's codecs, warm-up plans, and a real bf16 ONNX model on the embedded backend asked over HTTP JSON, HTTP binary
and gRPC raw contents (tritonclient's own BF16 handling: ml_dtypes.bfloat16 arrays), its answers equal to the eager
computation. The TorchScript twin is slow (it scripts a module)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from services.gateway.app import create_app
from services.gateway.backends.triton.codec import infer_request, infer_response
from services.gateway.backends.triton.http_codec import http_request, http_response
from services.gateway.errors import InvalidInput
from services.gateway.grpc_api.codec import decode_request as decode_grpc
from services.gateway.grpc_api.codec import encode_response as encode_grpc
from services.gateway.rest.codec import decode_request as decode_rest
from services.gateway.rest.codec import encode_response as encode_rest
from services.gateway.settings import Settings
from services.gateway.tensors.datatypes import numpy_dtype
from services.gateway.tensors.regions import place_outputs, tensor_regions
from services.gateway.tensors.shared_memory import RegionSlice, SharedMemoryRegions
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse
from services.gateway.versions.warmup import warmup_requests
from services.modelrepo import layout
from services.modelrepo.config import read_config
from services.modelrepo.manifest import Manifest, TensorEntry
from tests.bf16_models import (
    BF16,
    ONNX_MODEL,
    TORCHSCRIPT_MODEL,
    WARMUP_ROWS,
    expected,
    write_onnx_model,
    write_torchscript_model,
)
from tests.shm_support import ShmObject, shm_object

ROWS = np.array([[1.0, -2.5, 0.1, 3e38], [1.00390625, 255.5, -0.0, 2.0**-130]], dtype=np.float32).astype(BF16)
"""Values that round (0.1, 1.00390625 + 1 is a tie), a subnormal, a big one whose 2x + 1 overflows to inf."""
BF16_MAX = 3.3895313892515355e38


def bits(array: np.ndarray) -> list[int]:
    """The bfloat16 bit patterns: equal answers are equal bit for bit (NaN and -0.0 included)."""
    return np.ascontiguousarray(array).view(np.uint16).ravel().tolist()


# --- the datatype and the codecs ---


def test_numpy_dtype_is_two_byte_bfloat16_when_bf16() -> None:
    dtype = numpy_dtype("BF16", "x")
    assert (dtype, dtype.itemsize) == (BF16, 2)


def test_rest_json_input_rounds_numbers_to_bf16_when_bf16() -> None:
    body = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [1, 4], "data": [1.00390625, 0.1, "Infinity", -3]}]}
    data = decode_rest(json.dumps(body).encode(), None, "m", None)[0].inputs[0].data
    assert data.dtype == BF16
    want = np.array([[1.00390625, 0.1, np.inf, -3]], dtype=np.float64).astype(BF16)
    assert bits(data) == bits(want)
    assert float(data[0, 0]) == 1.0  # a tie, to even


@pytest.mark.parametrize("value", [3.4e38, -1e39])
def test_rest_json_input_refuses_values_past_the_bf16_range_like_fp16(value: float) -> None:
    body = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [2], "data": [1.0, value]}]}
    with pytest.raises(InvalidInput, match=r"input 'x': .* is outside the BF16 range -3\.3895314e\+38\.\.3\.3895314e"):
        decode_rest(json.dumps(body).encode(), None, "m", None)
    body["inputs"][0]["data"] = [1.0, BF16_MAX]  # the largest value itself fits
    assert float(decode_rest(json.dumps(body).encode(), None, "m", None)[0].inputs[0].data[1]) == BF16_MAX


def test_rest_binary_input_reads_raw_little_endian_elements_when_bf16() -> None:
    raw = ROWS.view("<u2").tobytes()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "BF16", "shape": [2, 4],
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()  # fmt: skip
    data = decode_rest(header + raw, str(len(header)), "m", None)[0].inputs[0].data
    assert bits(data) == bits(ROWS)
    short = json.dumps({"inputs": [{"name": "x", "datatype": "BF16", "shape": [2, 4],
                                    "parameters": {"binary_data_size": 8}}]}).encode()  # fmt: skip
    with pytest.raises(InvalidInput, match=r"shape \[2, 4\] of BF16 needs 16 bytes, binary_data_size is 8"):
        decode_rest(short + raw[:8], str(len(short)), "m", None)


def test_rest_answer_writes_bf16_as_json_numbers_or_raw_bytes_when_asked() -> None:
    values = np.array([0.1, np.inf, np.nan, -2.5], dtype=np.float32).astype(BF16)
    response = InferResponse("m", 1, [InferOutput("y", "BF16", values)])
    encoded, header_length = encode_rest(response, decode_rest(b'{"inputs": []}', None, "m", None)[1])
    assert header_length is None
    written = json.loads(encoded)["outputs"][0]
    assert (written["datatype"], written["shape"]) == ("BF16", [4])
    # float32's shortest text of each value: it reads back to the same bfloat16 (tritonclient's as_numpy does so)
    assert written["data"] == [0.10009765625, "Infinity", "NaN", -2.5]
    binary = decode_rest(b'{"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": true}}]}',
                         None, "m", None)[1]  # fmt: skip
    encoded, header_length = encode_rest(response, binary)
    assert header_length is not None
    assert encoded[header_length:] == values.view("<u2").tobytes()


def test_grpc_raw_contents_carry_bf16_elements_and_typed_contents_are_refused() -> None:
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="BF16", shape=[2, 4])
    message.raw_input_contents.append(ROWS.tobytes())
    assert bits(decode_grpc(message).inputs[0].data) == bits(ROWS)
    typed = service_pb2.ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="BF16", shape=[1]).contents.fp32_contents.append(1.0)
    # Triton's proto has no bfloat16 field: the elements go raw, as for FP16
    with pytest.raises(InvalidInput, match=r"input 'x': BF16 data must be sent in raw_input_contents"):
        decode_grpc(typed)
    answer = encode_grpc(InferResponse("m", 1, [InferOutput("y", "BF16", ROWS)]))
    assert (answer.outputs[0].datatype, list(answer.outputs[0].shape)) == ("BF16", [2, 4])
    assert answer.raw_output_contents[0] == ROWS.view("<u2").tobytes()


@pytest.fixture
def shm() -> Iterator[ShmObject]:
    with shm_object(64) as found:
        yield found


async def test_shared_memory_reads_and_writes_bf16_as_raw_bytes(shm: ShmObject) -> None:
    registry = SharedMemoryRegions(enabled=True)
    try:
        region = await registry.register("anonymous", "r", shm.key, 0, 64)
        shm.put(ROWS.view(np.uint16), offset=16)
        body = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [2, 4], "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": 16}}]}  # fmt: skip
        decoded = decode_rest(json.dumps(body).encode(), None, "m", None, tensor_regions(registry, "anonymous"))
        assert bits(decoded[0].inputs[0].data) == bits(ROWS)
        request = InferRequest("m", None, [], outputs=("y",), output_regions={"y": RegionSlice(region, 32, 16)})
        place_outputs(request, [InferOutput("y", "BF16", ROWS)])
        assert shm.get(np.uint16, [8], 32).tolist() == bits(ROWS)
    finally:
        await registry.close()


def test_triton_codecs_pass_bf16_through_as_raw_bytes_both_ways() -> None:
    request = InferRequest("m", 1, [InferInput("x", "BF16", (2, 4), ROWS)])
    message = infer_request(request, 1, None, 0)
    assert (message.inputs[0].datatype, message.raw_input_contents[0]) == ("BF16", ROWS.tobytes())
    reply = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    reply.outputs.add(name="y", datatype="BF16", shape=[2, 4])
    reply.raw_output_contents.append(ROWS.tobytes())
    assert bits(infer_response(reply, request, 1).outputs[0].data) == bits(ROWS)
    head, parts = http_request(request, 1, None, 0, b"triton")
    assert bytes(parts[1]) == ROWS.tobytes()
    header = json.dumps({"outputs": [{"name": "y", "datatype": "BF16", "shape": [2, 4],
                                      "parameters": {"binary_data_size": 16}}]}).encode()  # fmt: skip
    answer = http_response(200, len(header), header + ROWS.tobytes(), request, 1)
    assert isinstance(answer, InferResponse)
    assert bits(answer.outputs[0].data) == bits(ROWS)


def test_warmup_reads_a_bf16_model_warmup_file_as_raw_elements(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path)
    (plan,) = warmup_requests(folder, 1, read_config(folder))
    assert plan.inputs["x"].dtype == BF16
    assert bits(plan.inputs["x"]) == bits(np.stack([WARMUP_ROWS[0]] * 2))


def test_warmup_casts_the_manifest_float32_samples_to_bf16(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path)
    version = folder / "1"
    entry = TensorEntry("x", "BF16", [4])
    manifest = Manifest(ONNX_MODEL, 1, "onnx", layout.ONNX_PLATFORM, "model.onnx", "hand", 8, [entry],
                        [TensorEntry("y", "BF16", [4]), TensorEntry("f", "FP32", [4])], {}, {}, {})  # fmt: skip
    (version / layout.MANIFEST_FILE).write_text(manifest.to_json())
    (version / layout.SAMPLES_DIR).mkdir()
    np.savez(version / layout.SAMPLE_INPUTS_FILE, x=ROWS.astype(np.float32))  # as the exporter writes them
    (plan,) = warmup_requests(folder, 1, read_config(folder))
    assert plan.inputs["x"].dtype == BF16
    assert bits(plan.inputs["x"]) == bits(ROWS)


# --- a real model on the embedded backend ---


@asynccontextmanager
async def embedded(repository: Path, state: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """The app on the embedded backend over ``repository`` (its models loaded and warmed up by the lifespan): an
    in-process HTTP client and the gRPC address."""
    settings = Settings(repository=repository, state_path=state / "routing.json", grpc_port=0, repository_poll_s=0)
    app = create_app(settings, registry=CollectorRegistry())
    async with LifespanManager(app, startup_timeout=60) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http, f"127.0.0.1:{app.state.grpc_port}"


async def check_model(http: httpx.AsyncClient, grpc_url: str, model: str) -> None:
    want_y, want_f = expected(ROWS)
    # HTTP JSON: numbers in (the bf16 values as float32 text), numbers out
    body = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [2, 4], "data": ROWS.astype(np.float32).tolist()}]}
    reply = await http.post(f"/v2/models/{model}/infer", json=body)
    assert reply.status_code == 200, reply.text
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    assert outputs["y"]["datatype"] == "BF16"
    spelled = {"Infinity": np.inf, "-Infinity": -np.inf, "NaN": np.nan}
    y = np.array([spelled.get(v, v) for v in outputs["y"]["data"]], dtype=np.float64).astype(BF16)
    assert bits(y) == bits(want_y)
    np.testing.assert_array_equal(np.array(outputs["f"]["data"], dtype=np.float32).reshape(2, 4), want_f)

    # HTTP binary, through tritonclient's own encoding and decoding of BF16
    tensor = httpclient.InferInput("x", [2, 4], "BF16")
    tensor.set_data_from_numpy(ROWS, binary_data=True)
    asked = [httpclient.InferRequestedOutput(name, binary_data=True) for name in ("y", "f")]
    request_body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=asked)
    headers = {"Inference-Header-Content-Length": str(json_size)}
    reply = await http.post(f"/v2/models/{model}/infer", content=request_body, headers=headers)
    assert reply.status_code == 200, reply.text
    result = httpclient.InferenceServerClient.parse_response_body(
        reply.content, header_length=int(reply.headers["Inference-Header-Content-Length"])
    )
    assert result.as_numpy("y").dtype == BF16
    assert bits(result.as_numpy("y")) == bits(want_y)
    np.testing.assert_array_equal(result.as_numpy("f"), want_f)

    # gRPC raw contents; four one-row requests at once, which the dynamic batcher merges and splits back
    async with grpcaio.InferenceServerClient(grpc_url) as client:

        async def one(row: int) -> None:
            tensor = grpcaio.InferInput("x", [1, 4], "BF16")
            tensor.set_data_from_numpy(ROWS[row % 2 : row % 2 + 1])
            result = await client.infer(model, [tensor])
            assert bits(result.as_numpy("y")) == bits(want_y[row % 2])
            np.testing.assert_array_equal(result.as_numpy("f"), want_f[row % 2 : row % 2 + 1])

        await asyncio.gather(*(one(row) for row in range(4)))
        tensor = grpcaio.InferInput("x", [1, 4], "BF16")
        tensor.set_data_from_numpy(ROWS[:1])
        ranked = [grpcaio.InferRequestedOutput("y", class_count=2)]
        # Triton ranks the integer types, FP32 and FP64 only: BF16 is refused with its words
        with pytest.raises(InferenceServerException, match="unsupported type 'BF16'"):
            await client.infer(model, [tensor], outputs=ranked)


async def test_embedded_onnx_model_serves_bf16_over_http_json_binary_and_grpc(tmp_path: Path) -> None:
    write_onnx_model(tmp_path / "repository")
    async with embedded(tmp_path / "repository", tmp_path / "state") as (http, grpc_url):
        metadata = (await http.get(f"/v2/models/{ONNX_MODEL}")).json()
        assert [t["datatype"] for t in (*metadata["inputs"], *metadata["outputs"])] == ["BF16", "BF16", "FP32"]
        await check_model(http, grpc_url, ONNX_MODEL)


@pytest.mark.slow
async def test_embedded_torchscript_model_serves_bf16_over_http_json_binary_and_grpc(tmp_path: Path) -> None:
    write_torchscript_model(tmp_path / "repository")
    async with embedded(tmp_path / "repository", tmp_path / "state") as (http, grpc_url):
        await check_model(http, grpc_url, TORCHSCRIPT_MODEL)
