"""REST codec: JSON and binary tensors in, JSON and binary outputs back, without copying request bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.http import InferResult

from services.gateway.errors import InvalidInput
from services.gateway.rest.codec import decode_request, encode_response
from services.gateway.types import InferOutput, InferResponse


def test_decode_request_reads_binary_tensor_in_place_when_header_length_given() -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = json.dumps(
        {
            "id": "r1",
            "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            "parameters": {"timeout": 1500, "priority": 1},
        }
    ).encode()
    body = header + data.tobytes()
    request, fmt = decode_request(body, str(len(header)), "m", 3)
    tensor = request.inputs[0]
    np.testing.assert_array_equal(tensor.data, data)
    assert not tensor.data.flags.writeable  # a view over the request body, not a copy
    assert (request.model, request.version, request.id, request.outputs) == ("m", 3, "r1", ("y", "z"))
    assert request.timeout_s == pytest.approx(0.0015)
    assert request.priority == 1
    assert fmt.is_binary("y")
    assert not fmt.is_binary("z")


def test_decode_request_reads_nested_json_data_when_no_binary() -> None:
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT64", "data": [[1, 2], [3, 4]]}]})
    request, fmt = decode_request(body.encode(), None, "m", None)
    np.testing.assert_array_equal(request.inputs[0].data, np.array([[1, 2], [3, 4]], dtype=np.int64))
    assert request.outputs is None
    assert not fmt.is_binary("anything")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}, "every input needs a string 'name'"),
        ({"inputs": [{"name": "x", "shape": [1], "data": [1]}]}, "input 'x': missing 'datatype'"),
        (
            {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]},
            "input 'x': 'shape' must be a list of non-negative integers, got [-1]",
        ),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "input 'x': needs 'data' or a binary"),
        (
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]},
            'input \'x\': FP32 data must be numbers (or "NaN", "Infinity", "-Infinity"), got the string "a" at index 0',
        ),
        (
            {"inputs": [], "parameters": {"timeout": "soon"}},
            "parameter 'timeout' must be a non-negative integer (microseconds), got the string \"soon\"",
        ),
        ({"inputs": [], "outputs": {"name": "y"}}, "'outputs' must be a list"),
    ],
)
def test_decode_request_raises_invalid_input_when_body_malformed(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_request(json.dumps(body).encode(), None, "m", None)
    assert str(caught.value).startswith(message)


def test_encode_response_appends_binary_outputs_after_header_when_binary_requested() -> None:
    from services.gateway.rest.codec import OutputFormat

    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    z = np.array([[True], [False]])
    response = InferResponse("m", 2, [InferOutput("y", "FP32", y), InferOutput("z", "BOOL", z)], id="q")
    body, header_length = encode_response(response, OutputFormat(binary_default=True, binary={"z": False}))
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert header == {
        "model_name": "m",
        "model_version": "2",
        "id": "q",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
            {"name": "z", "datatype": "BOOL", "shape": [2, 1], "data": [True, False]},
        ],
    }
    assert body[header_length:] == y.tobytes()


def test_encode_response_returns_plain_json_when_no_binary_output() -> None:
    from services.gateway.rest.codec import OutputFormat

    response = InferResponse("m", 1, [InferOutput("y", "INT32", np.array([[1, 2]], dtype=np.int32))])
    body, header_length = encode_response(response, OutputFormat())
    assert header_length is None
    assert json.loads(body)["outputs"][0]["data"] == [1, 2]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_decode_request_reads_non_finite_spellings_when_float_tensor(datatype: str) -> None:
    x = {"name": "x", "shape": [4], "datatype": datatype, "data": ["NaN", "Infinity", "-Infinity", 0.5]}
    request, _ = decode_request(json.dumps({"inputs": [x]}).encode(), None, "m", None)
    data = request.inputs[0].data
    assert data.dtype == np.dtype(datatype.replace("FP", "float"))
    np.testing.assert_array_equal(data, np.array([np.nan, np.inf, -np.inf, 0.5]))


@pytest.mark.parametrize(
    ("datatype", "values"),
    [("INT8", [-128, 127]), ("UINT8", [0, 255]), ("INT64", [-(2**63), 2**63 - 1]), ("UINT64", [0, 2**64 - 1])],
)
def test_decode_request_keeps_exact_values_when_integers_at_range_limits(datatype: str, values: list[int]) -> None:
    x = {"name": "x", "shape": [2], "datatype": datatype, "data": values}
    request, _ = decode_request(json.dumps({"inputs": [x]}).encode(), None, "m", None)
    assert request.inputs[0].data.tolist() == values


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_encode_response_spells_non_finite_values_when_json_output(datatype: str) -> None:
    from services.gateway.rest.codec import OutputFormat

    y = np.array([[np.nan, np.inf], [-np.inf, 1.5]], dtype=datatype.replace("FP", "float"))
    body, header_length = encode_response(InferResponse("m", 1, [InferOutput("y", datatype, y)]), OutputFormat())
    assert header_length is None
    assert json.loads(body)["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 1.5]
    # what tritonclient.http's as_numpy makes of them: numpy reads the spellings as the floats they name
    got = InferResult.from_response_body(body).as_numpy("y")
    assert got.dtype == y.dtype
    np.testing.assert_array_equal(got, y)
