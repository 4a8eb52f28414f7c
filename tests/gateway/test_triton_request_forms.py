"""Request forms Triton's HTTP front end takes that a client may rely on: the raw binary request (a body that is only
the one input's bytes), an empty ``outputs`` list, version strings with leading zeros and version 0; and one it
refuses: an input with both JSON ``data`` and binary data."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from scripted_backend import double_repository

from services.gateway.errors import InvalidInput
from services.gateway.repository import Catalog
from services.gateway.rest.raw_request import decode_raw_request
from services.gateway.tensors.types import ModelMetadata, TensorSpec

ROW = np.array([[1.0, -2.0, 3.5, 0.25]], dtype=np.float32)


def _json_body(**request: object) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ROW.ravel().tolist()}
    return json.dumps({"inputs": [tensor], **request}).encode()


def _binary_outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    """Each output of a binary answer, read by the sizes its JSON header gives."""
    header_length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:header_length])
    outputs, offset = {}, header_length
    for output in header["outputs"]:
        size = output["parameters"]["binary_data_size"]
        data = np.frombuffer(response.content, np.float32, size // 4, offset).reshape(output["shape"])
        outputs[output["name"]], offset = data, offset + size
    assert offset == len(response.content)
    return outputs


async def test_raw_binary_request_is_the_one_input_as_a_batch_of_one_answered_in_binary(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v2/models/double/infer", content=ROW.tobytes(), headers={"Inference-Header-Content-Length": "0"}
    )

    assert response.status_code == 200, response.text
    outputs = _binary_outputs(response)
    assert sorted(outputs) == ["y", "z"]  # every output, as binary data
    np.testing.assert_array_equal(outputs["y"], 2 * ROW)
    np.testing.assert_array_equal(outputs["z"], -ROW)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (12, "a raw binary request (Inference-Header-Content-Length: 0): input 'x' of model 'double' (FP32, dims "
             "[4]) takes 16 bytes, the body has 12"),
        (0, "a raw binary request (Inference-Header-Content-Length: 0): input 'x' of model 'double' (FP32, dims "
            "[4]) takes 16 bytes, the body has 0"),
    ],
)  # fmt: skip
async def test_raw_binary_request_of_the_wrong_size_is_400_naming_both_sizes(
    client: httpx.AsyncClient, size: int, message: str
) -> None:
    response = await client.post(
        "/v2/models/double/infer", content=b"\0" * size, headers={"Inference-Header-Content-Length": "0"}
    )

    assert (response.status_code, response.json()) == (400, {"error": message})


def _metadata(*inputs: TensorSpec, max_batch_size: int = 0) -> ModelMetadata:
    return ModelMetadata("m", (1,), "onnxruntime_onnx", max_batch_size, inputs, (TensorSpec("y", "FP32", (1,)),))


def test_raw_binary_request_deduces_the_one_variable_dim_from_the_size() -> None:
    values = np.arange(12, dtype=np.int32)
    metadata = _metadata(TensorSpec("x", "INT32", (-1, 3)))

    request, _ = decode_raw_request(values.tobytes(), metadata, "m", None)

    [tensor] = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "INT32", (4, 3))
    np.testing.assert_array_equal(tensor.data, values.reshape(4, 3))


def test_raw_binary_request_of_a_bytes_input_is_its_one_element() -> None:
    metadata = _metadata(TensorSpec("text", "BYTES", (1,)), max_batch_size=4)

    request, _ = decode_raw_request(b"hello \xff", metadata, "m", 3)

    [tensor] = request.inputs
    assert (tensor.shape, tensor.data.tolist(), request.version) == ((1, 1), [[b"hello \xff"]], 3)


@pytest.mark.parametrize(
    ("inputs", "body", "message"),
    [
        ((TensorSpec("a", "FP32", (1,)), TensorSpec("b", "FP32", (1,))), b"\0" * 8,
         "a raw binary request (Inference-Header-Content-Length: 0) carries the data of a model's only input, but "
         "model 'm' has 2 inputs ('a', 'b'): send a JSON header naming each input"),
        ((TensorSpec("x", "FP32", (-1, -1)),), b"\0" * 8,
         "a raw binary request (Inference-Header-Content-Length: 0) leaves the shape to be deduced from the body's "
         "size, which needs at most one variable dim; input 'x' of model 'm' has dims [-1, -1]: send a JSON header "
         "giving its shape"),
        ((TensorSpec("x", "FP32", (-1, 3)),), b"\0" * 8,
         "a raw binary request (Inference-Header-Content-Length: 0): 8 bytes are not a whole number of FP32 input "
         "'x' of dims [-1, 3] (12 bytes per step of its variable dim)"),
        ((TensorSpec("text", "BYTES", (2,)),), b"ab",
         "a raw binary request (Inference-Header-Content-Length: 0) is one element of a BYTES input, but input "
         "'text' of model 'm' has dims [2], not [1]: send a JSON header giving its shape"),
    ],
    ids=["two-inputs", "two-variable-dims", "not-whole-rows", "bytes-not-one-element"],
)  # fmt: skip
def test_raw_binary_request_is_refused_naming_why_when_the_shape_cannot_be_deduced(
    inputs: tuple[TensorSpec, ...], body: bytes, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        decode_raw_request(body, _metadata(*inputs), "m", None)

    assert str(refused.value) == message


async def test_input_with_both_json_data_and_binary_data_is_refused(client: httpx.AsyncClient) -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.5] * 4,
              "parameters": {"binary_data_size": 16}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]}).encode()

    response = await client.post(
        "/v2/models/double/infer", content=header + ROW.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip

    assert response.status_code == 400
    assert response.json()["error"] == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'; input 'x' sets both 'data' and 'binary_data_size'"
    )


async def test_empty_outputs_list_asks_for_every_output(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/double/infer", content=_json_body(outputs=[]))

    assert response.status_code == 200, response.text
    assert [output["name"] for output in response.json()["outputs"]] == ["y", "z"]


async def test_version_with_leading_zeros_names_the_same_version(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/double/versions/001/infer", content=_json_body())

    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == "1"


async def test_version_0_is_an_unknown_version_on_every_route(client: httpx.AsyncClient) -> None:
    infer = await client.post("/v2/models/double/versions/0/infer", content=_json_body())
    metadata = await client.get("/v2/models/double/versions/0")
    ready = await client.get("/v2/models/double/versions/0/ready")

    for response in (infer, metadata, ready):
        assert response.status_code == 404, response.text
        assert response.json()["error"].startswith("Request for unknown model: 'double' version 0 is not found")


def test_version_folders_named_with_a_leading_zero_or_not_in_ascii_digits_are_not_versions(tmp_path: Path) -> None:
    repository = double_repository(tmp_path, versions=(1, 2))
    for name in ("01", "0", "\u00b2", "3a"):  # ² passes str.isdigit and int() refuses it
        (repository / "double" / name).mkdir()
        (repository / "double" / name / "model.onnx").write_bytes(b"")

    catalog = Catalog(repository)
    catalog.scan()

    assert catalog.entry("double").available == (1, 2)
