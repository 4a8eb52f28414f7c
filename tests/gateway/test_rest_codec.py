"""REST codec: JSON and binary tensors in, JSON and binary outputs back, without copying request bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.http import InferResult

from services.gateway.errors import InvalidInput
from services.gateway.rest.codec import decode_request, encode_response
from services.gateway.tensors.types import InferOutput, InferResponse


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


@pytest.mark.parametrize(
    ("values", "accepted"),
    [
        ([float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max), 0.0], True),  # the limits themselves
        ([0.0, 3.4028235e38], False),  # past the largest float32, though C's conversion rounds it down to it
        ([1e39, 0.0], False),
        ([0.5] * 5000, True),  # longer than what struct packs: numpy converts
        ([0.5] * 4999 + [1e39], False),
    ],
)
def test_decode_request_refuses_fp32_values_past_the_range_when_packed_or_not(
    values: list[float], accepted: bool
) -> None:
    x = {"name": "x", "shape": [len(values)], "datatype": "FP32", "data": values}
    body = json.dumps({"inputs": [x]}).encode()
    if accepted:
        request, _ = decode_request(body, None, "m", None)
        np.testing.assert_array_equal(request.inputs[0].data, np.array(values, dtype=np.float32))
        assert request.inputs[0].data.dtype == np.float32
    else:
        with pytest.raises(InvalidInput, match="is outside the FP32 range"):
            decode_request(body, None, "m", None)


def test_encode_response_spells_only_non_finite_values_when_one_output_has_them() -> None:
    from services.gateway.rest.codec import OutputFormat

    finite = np.array([[0.25, -1.0]], dtype=np.float32)
    odd = np.array([[np.nan, 2.0]], dtype=np.float64)
    counts = np.array([[3, 4]], dtype=np.int64)
    response = InferResponse(
        "m", 1, [InferOutput("a", "FP32", finite), InferOutput("b", "FP64", odd), InferOutput("c", "INT64", counts)]
    )
    outputs = json.loads(encode_response(response, OutputFormat())[0])["outputs"]
    assert [output["data"] for output in outputs] == [[0.25, -1.0], ["NaN", 2.0], [3, 4]]


def test_encode_response_writes_numbers_when_a_name_holds_null() -> None:
    from services.gateway.rest.codec import OutputFormat

    y = np.array([[0.5, 1.5]], dtype=np.float32)
    response = InferResponse("null", 1, [InferOutput("null", "FP32", y)], id="null")
    body, _ = encode_response(response, OutputFormat())
    assert json.loads(body) == {
        "model_name": "null", "model_version": "1", "id": "null",
        "outputs": [{"name": "null", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]}],
    }  # fmt: skip
