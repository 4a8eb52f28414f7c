"""What a hostile or careless client can send (issue #11): every body and version string is a request or a 400
that says what was wrong and what came, never a 500 and never a silent coercion."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from tritonclient.http import InferResult

from services.gateway.errors import InvalidInput
from services.gateway.rest.codec import decode_request
from services.gateway.versions.numbers import parse_version
from tests.error_texts import malformed_version

BIG = 2**40


def _body(**fields: Any) -> bytes:
    """A request with one input ``x``: FP32, shape [1, 4], four zeros, unless ``fields`` say otherwise."""
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4, **fields}
    return json.dumps({"inputs": [tensor]}).encode()  # json, not orjson: it writes ints past 64 bits


def _decode(body: bytes, header_length: str | None = None) -> Any:
    return decode_request(body, header_length, "m", None)


@pytest.mark.parametrize(
    ("raw", "version"),
    [("", None), ("1", 1), ("12", 12), ("9" * 18, 10**18 - 1), ("01", 1), ("0" * 30 + "7", 7), ("0", 0)],
)  # as Triton reads them: leading zeros are the same number, and 0 is a version no repository holds (404)
def test_parse_version_returns_number_when_plain_decimal(raw: str, version: int | None) -> None:
    assert parse_version(raw) == version


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("\u00b2", malformed_version(r"'\xb2'")),
        ("\uff11", malformed_version(r"'\uff11'")),
        ("\u0661", malformed_version(r"'\u0661'")),
        ("-1", malformed_version("'-1'")),
        (" 1", malformed_version("' 1'")),
        ("1_0", malformed_version("'1_0'")),
        ("x\n", malformed_version(r"'x\n'")),
        ("1" * 19, malformed_version(f"'{'1' * 19}'")),
        ("1" * 4301, malformed_version(f"'{'1' * 40}'... (4301 characters)")),
    ],
    ids=["superscript", "fullwidth", "arabic-indic", "sign", "space", "underscore", "control", "past-int64",
         "4301-digits"],
)  # fmt: skip
def test_parse_version_raises_invalid_input_when_malformed(raw: str, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_version(raw)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(shape=[True, 4]), "input 'x': 'shape' must be a list of non-negative integers, got [true,4]"),
        (_body(shape="1,4"), "input 'x': 'shape' must be a list of non-negative integers, got the string \"1,4\""),
        (_body(shape=[1, -4]), "input 'x': 'shape' must be a list of non-negative integers, got [1, -4]"),
        (_body(shape=[2**63, 0], data=[]), "input 'x': 'shape' must be a list of non-negative integers, got"),
        (_body(shape=[1] * 33), "input 'x': 'shape' has 33 dims; at most 32 are supported"),
        (_body(shape=[BIG, BIG]), f"input 'x': shape [{BIG}, {BIG}] needs {BIG * BIG} values, got 4"),
        (_body(shape=[0, 2**62], data=[]), f"input 'x': shape [0, {2**62}] is too large"),
        (_body(datatype="INT8", data=[1000, 0, 0, 0]), "input 'x': 1000 is outside the INT8 range -128..127"),
        (_body(datatype="UINT8", data=[-1, 0, 0, 0]), "input 'x': -1 is outside the UINT8 range 0..255"),
        (_body(datatype="INT64", data=[2**64 - 1, 0, 0, 0]), f"input 'x': {2**64 - 1} is outside the INT64 range"),
        (_body(datatype="UINT64", data=[2**64 - 1, -1, 0, 0]), "input 'x': -1 is outside the UINT64 range"),
        (_body(datatype="INT32", data=[1.5, 0, 0, 0]), "input 'x': INT32 data must be integers, got 1.5 at index 0"),
        (_body(datatype="INT32", data=[0, 1.0, 0, 0]), "input 'x': INT32 data must be integers, got 1.0 at index 1"),
        (_body(datatype="INT32", data=[0, 0, 0, 1e30]), "input 'x': 1e+30 is outside the INT32 range"),
        (_body(datatype="INT32", data=[0, True, 0, 0]), "input 'x': INT32 data must be integers, got true at index 1"),
        (_body(datatype="BOOL", data=[True, 1, 0, 0]), "input 'x': BOOL data must be true or false, got 1 at index 1"),
        (_body(data=[0, False, 0, 0]), 'input \'x\': FP32 data must be numbers (or "NaN", "Infinity", "-Infinity"), '
                                       "got false at index 1"),
        (_body(data=["1.5", 0, 0, 0]), "input 'x': FP32 data must be numbers (or \"NaN\", \"Infinity\", "
                                       '"-Infinity"), got the string "1.5" at index 0'),
        (_body(data=["nan", 0, 0, 0]), "input 'x': FP32 data must be numbers"),
        (_body(data=[None, 0, 0, 0]), "input 'x': FP32 data must be numbers"),
        (_body(data=[{}, 0, 0, 0]), "input 'x': FP32 data must be numbers"),
        (_body(data=[1e39, 0, 0, 0]), "input 'x': 1e+39 is outside the FP32 range -3.4028235e+38..3.4028235e+38"),
        (_body(datatype="FP16", data=[0, 0, 0, -7e4]), "input 'x': -70000.0 is outside the FP16 range -65504..65504"),
        (_body(data=None), "input 'x': 'data' must be a (nested) list of values, got null"),
        (_body(data=1.0), "input 'x': 'data' must be a (nested) list of values, got 1.0"),
        (_body(data=[[0.0, 0.0], 0.0, 0.0]), "input 'x': 'data' mixes lists and values at the same depth"),
        (_body(data=[[0.0] * 3]), "input 'x': shape [1, 4] needs 4 values, got 3"),
        (_body(datatype=123), "input 'x': 'datatype' must be a string like \"FP32\", got 123"),
        (_body(datatype="BYTES"), "input 'x': BYTES data must be strings, got 0.0 at index 0"),
        (_body(datatype="fp32"), "input 'x': datatype 'fp32' is not supported; expected one of BOOL,"),
        (_body(name=7), "every input needs a string 'name', got 7"),
        (_body(parameters=[]), "input 'x': 'parameters' must be a JSON object, got []"),
        (_body(parameters={"binary_data_size": 16.0}), "input 'x': binary_data_size must be an integer, got 16.0"),
        (_body(parameters={"binary_data_size": "16"}),
         "input 'x': binary_data_size must be an integer, got the string \"16\""),
        (b'{"inputs": [1]}', "each entry of 'inputs' must be a JSON object, got 1"),
        (b'{"inputs": [], "id": {"a": 1}}', "'id' must be a string, got {\"a\":1}"),
        (b'{"inputs": [], "parameters": 5}', "'parameters' must be a JSON object, got 5"),
        (b'{"inputs": [], "outputs": ["y"]}', "each entry of 'outputs' must be a JSON object, got the string \"y\""),
        (b'{"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": "false"}}]}',
         "output 'y': parameter 'binary_data' must be true or false, got the string \"false\""),
        (b'{"inputs": [], "parameters": {"binary_data_output": 0}}',
         "parameter 'binary_data_output' must be true or false, got 0"),
        (b'{"inputs": [], "parameters": {"timeout": true}}',
         "parameter 'timeout' must be a non-negative integer (microseconds), got true"),
        (b'{"inputs": [], "parameters": {"timeout": 1.5}}',
         "parameter 'timeout' must be a non-negative integer (microseconds), got 1.5"),
        (b'{"inputs": [], "parameters": {"timeout": -1}}',
         "parameter 'timeout' must be a non-negative integer (microseconds), got -1"),
        (b'{"inputs": [], "parameters": {"priority": "1"}}',
         "parameter 'priority' must be a non-negative integer, got the string \"1\""),
        (b'{"inputs": [], "parameters": {"priority": -2}}', "parameter 'priority' must be a non-negative integer"),
        (b"[" * 2000 + b"]" * 2000, "failed to parse the request JSON buffer: depth limit exceeded"),
        (b'{"inputs": [], "id": ' + b"[" * 300 + b"]" * 300 + b"}", "'id' must be a string, got a JSON array nested"),
    ],
)  # fmt: skip
def test_decode_request_raises_saying_what_came_when_body_wrong(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _decode(body)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("payload", [np.zeros(4, np.float32).tobytes(), np.full(4, 1.5, np.float32).tobytes()])
def test_decode_request_hints_at_header_length_when_binary_body_sent_without_it(payload: bytes) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
    body = orjson.dumps({"inputs": [x]}) + payload
    with pytest.raises(InvalidInput) as caught:
        _decode(body)
    message = str(caught.value)
    assert message.startswith("failed to parse the request JSON buffer: ")
    assert message.endswith(
        "binary tensor data after the JSON needs an Inference-Header-Content-Length header giving the JSON part's "
        "length in bytes"
    )


@pytest.mark.parametrize("header_length", ["\u0661\u0662", " 12", "1_2", "+12", "9" * 4301])
def test_decode_request_raises_invalid_input_when_header_length_not_plain_decimal(header_length: str) -> None:
    with pytest.raises(InvalidInput, match="^Inference-Header-Content-Length must be an integer, got "):
        _decode(b'{"inputs": []}', header_length)


def test_decode_request_keeps_last_value_when_keys_duplicated() -> None:
    request, _ = _decode(b'{"inputs": [], "id": "first", "id": "second"}')
    assert request.id == "second"


def test_decode_request_names_each_output_once_in_first_order_when_outputs_repeat() -> None:
    outputs = [{"name": "b"}, {"name": "a"}, *({"name": name} for name in ["b", "a"] * 500)]
    request, _ = _decode(json.dumps({"inputs": [], "outputs": outputs}).encode())
    assert request.outputs == ("b", "a")


def test_decode_request_accepts_nesting_when_deep_but_within_json_limit() -> None:
    data = [[[[[[[[[[0.5]]]]]]]]]] * 4  # Triton reads nested data in order, however it is nested
    request, _ = _decode(_body(data=data))
    np.testing.assert_array_equal(request.inputs[0].data, np.full((1, 4), 0.5, np.float32))


NASTY: list[tuple[bytes, str | None]] = [
    (b"", None),
    (b"\x00\xff", None),
    (b"null", None),
    (b'"inputs"', None),
    (b'{"inputs": null}', None),
    (b'{"inputs": {}}', None),
    (b'{"inputs": [null]}', None),
    (b'{"inputs": [[]]}', None),
    (b'{"inputs": [{}]}', None),
    (b'{"inputs": [{"name": null}]}', None),
    (b'{"inputs": [], "outputs": null}', None),
    (b'{"inputs": [], "outputs": [{}]}', None),
    (b'{"inputs": [], "outputs": [{"name": "y", "parameters": null}]}', None),
    (b'{"inputs": [], "parameters": {"timeout": 1e400}}', None),
    (b'{"inputs": [], "parameters": {"timeout": 18446744073709551616}}', None),
    (b'{"inputs": [], "parameters": {"priority": 18446744073709551615}}', None),
    (b'{"inputs": [], "id": null}', None),
    (b'{"inputs": [], "id": 7}', None),
    (b'{"inputs": []}', "0"),
    (b'{"inputs": []}', "-1"),
    (b'{"inputs": []}', "14"),
    (b'{"inputs": []}xx', "14"),
    (b'{"inputs": []}', "\u00b2"),
    (b'{"in', "4"),
    (b"{" * 4000, None),
    (b'{"inputs": [], "id": ' + b"[" * 300 + b"]" * 300 + b"}", None),
    (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ' + b'{"a":' * 300 + b"1" + b"}" * 301,
        None,
    ),
    (b'{"inputs": ' + b"[" * 1030 + b"]" * 1030 + b"}", None),
    (_body(shape=None), None),
    (_body(shape=[True, 4]), None),
    (_body(datatype="INT8", data=[1000, 0, 0, 0]), None),
    (_body(datatype="UINT8", data=[-1, 0, 0, 0]), None),
    (_body(datatype="INT64", data=[2**64 - 1, 0, 0, 0]), None),
    (_body(data=[1e39, 0, 0, 0]), None),
    (_body(parameters={"binary_data_size": 16.0}), None),
    (_body(shape=[[1, 4]]), None),
    (_body(shape=[1.0, 4.0]), None),
    (_body(shape=[18446744073709551615, 0], data=[]), None),
    (_body(shape=[2**62, 2**62, 0], data=[]), None),
    (_body(shape=[0] * 64, data=[]), None),
    (_body(shape=[1] * 40, data=[0.0]), None),
    (_body(shape=[BIG, BIG], parameters={"binary_data_size": BIG * BIG * 4}), None),
    (_body(shape=[1, 4], parameters={"binary_data_size": -16}), None),
    (_body(shape=[1, 4], parameters={"binary_data_size": 2**64 - 1}), None),
    (_body(shape=[1, 4], parameters={"binary_data_size": None}), None),
    (_body(shape=[1, 4], parameters={"binary_data_size": True}), None),
    (_body(data=[[0.0, 0.0], [0.0]]), None),
    (_body(data=[0.0, [0.0, [0.0, 0.0]]]), None),
    (_body(data=[1.7976931348623157e308] * 4), None),
    (_body(data=[-1.7976931348623157e308] * 4, datatype="FP64"), None),
    (_body(data=[18446744073709551615] * 4), None),
    (_body(data=[18446744073709551615] * 4, datatype="UINT64"), None),
    (_body(data=["Infinity", "-Infinity", "NaN", 0]), None),
    (_body(data=["Infinity", "-Infinity", "NaN", 0], datatype="INT32"), None),
    (_body(datatype="FP16", data=[65504, 65505, 1e5, 0]), None),
    (_body(datatype="BOOL", data=[True, False, None, True]), None),
    (_body(datatype=None), None),
    (_body(datatype=""), None),
    (_body(datatype="\u0000"), None),
    (_body(name="\u0000\u202e"), None),
]


@pytest.mark.parametrize(("body", "header_length"), NASTY)
def test_decode_request_raises_only_invalid_input_when_body_hostile(body: bytes, header_length: str | None) -> None:
    with contextlib.suppress(InvalidInput):  # anything else, or a warning (pytest makes it an error), fails
        _decode(body, header_length)


VERSIONED = ["/v2/models/double/versions/{}", "/v2/models/double/versions/{}/ready",
             "/v2/models/double/versions/{}/config"]  # fmt: skip


@pytest.mark.parametrize("path", VERSIONED)
@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("%C2%B2", malformed_version(r"'\xb2'")),
        ("%EF%BC%91", malformed_version(r"'\uff11'")),
        ("1" * 4301, malformed_version(f"'{'1' * 40}'... (4301 characters)")),
        ("-1", malformed_version("'-1'")),
    ],
    ids=["superscript", "fullwidth", "4301-digits", "sign"],
)
async def test_versioned_routes_answer_400_when_version_malformed(
    client: httpx.AsyncClient, path: str, version: str, message: str
) -> None:
    response = await client.get(path.format(version))
    assert (response.status_code, response.json()) == (400, {"error": message})


@pytest.mark.parametrize("version", ["%C2%B2", "1_0", "1" * 4301, "-1"])
async def test_infer_answers_400_when_version_malformed(client: httpx.AsyncClient, version: str) -> None:
    response = await client.post(f"/v2/models/double/versions/{version}/infer", content=_body())
    assert response.status_code == 400
    assert response.json()["error"].startswith("failed to get model version from specified version string ")


@pytest.mark.parametrize(("body", "header_length"), NASTY)
async def test_infer_answers_400_not_500_when_body_hostile(
    client: httpx.AsyncClient, body: bytes, header_length: str | None
) -> None:
    # bytes, as a client can send them: httpx would refuse to encode a non-ASCII str
    headers = {} if header_length is None else {b"Inference-Header-Content-Length": header_length.encode()}
    response = await client.post("/v2/models/double/infer", content=body, headers=headers)
    assert response.status_code in (200, 400), response.text  # one of them is a valid request


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (16.0, "input 'x': binary_data_size must be an integer, got 16.0"),
        ("16", "input 'x': binary_data_size must be an integer, got the string \"16\""),
    ],
)
async def test_infer_answers_400_when_binary_data_size_not_integer(
    client: httpx.AsyncClient, size: object, message: str
) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": size}}
    header = orjson.dumps({"inputs": [x]})
    response = await client.post(
        "/v2/models/double/infer",
        content=header + np.ones(4, np.float32).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert (response.status_code, response.json()) == (400, {"error": message})


async def test_infer_spells_non_finite_outputs_as_strings_when_inputs_spelled(client: httpx.AsyncClient) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": ["NaN", "Infinity", "-Infinity", 1.5]}
    response = await client.post("/v2/models/double/infer", json={"inputs": [x]})
    assert response.status_code == 200, response.text
    assert json.loads(response.content)["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 3.0]
    # tritonclient.http reads the strings back as floats: numpy parses the spellings
    y = InferResult.from_response_body(response.content).as_numpy("y")
    np.testing.assert_array_equal(y, np.array([[np.nan, np.inf, -np.inf, 3.0]], dtype=np.float32))
    assert y.dtype == np.float32


async def test_infer_passes_binary_nan_through_when_sent_raw(client: httpx.AsyncClient) -> None:
    x = np.array([[np.nan, np.inf, -np.inf, 2.0]], dtype=np.float32)
    header = orjson.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}],
            "outputs": [{"name": "z", "parameters": {"binary_data": True}}],
        }
    )
    response = await client.post(
        "/v2/models/double/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(response.content[length:], dtype=np.float32), -x.ravel())
