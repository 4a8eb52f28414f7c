"""Properties of the REST infer route over the scripted ``double`` model (y = 2x, z = -x, x FP32 [-1, 4], batches
up to 8, bodies up to 4096 bytes): whatever a client sends, the answer is a result or a client error in the v2
error shape, never a server error."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

URL = "/v2/models/double/infer"
MAX_BATCH = 8
# The app (and its lifespan) is built once per test, not per example: the requests leave no state behind that
# another example could trip on, and a lifespan per example would cost 200 startups.
BOUNDED = settings(
    max_examples=200, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
             "BYTES"]
# Request-shaped objects reach past the first checks, where random JSON hardly ever gets: each field is mostly of
# the right kind (data of every datatype, values of any size), sometimes anything at all.
input_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.just("x") | json_values,
        "shape": st.lists(st.integers(-1, 5), max_size=3) | json_values,
        "datatype": st.sampled_from(DATATYPES) | json_values,
        "data": st.lists(scalars, max_size=8) | json_values,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-1, 64)}) | json_values,
    },
)
request_like = st.fixed_dictionaries(
    {"inputs": st.lists(input_like, max_size=3)},
    optional={"outputs": json_values, "parameters": json_values, "id": json_values},
)


@st.composite
def coherent(draw: st.DrawFn) -> dict[str, Any]:
    """A request whose data has as many values as its shape says, of any datatype and any JSON scalars: what
    reaches the conversion of values, where a value that does not fit its datatype must be refused."""
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    data = draw(st.lists(scalars | st.sampled_from(["NaN", "Infinity", "-Infinity"]), min_size=math.prod(shape),
                         max_size=math.prod(shape)))
    tensor = {"name": "x", "shape": shape, "datatype": draw(st.sampled_from(DATATYPES)), "data": data}
    return {"inputs": [tensor]}


HEADER_TEXT = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
"""What httpx can put in a header value."""
# Within float32 and small enough that 2x stays finite (the scripted model's numpy would warn on overflow).
values = st.floats(min_value=-(2.0**100), max_value=2.0**100, width=32)


def _encode(value: object) -> bytes:
    # json.dumps writes NaN and Infinity literals, and integers of any size: both must be refused, not crash.
    return json.dumps(value).encode()


def _is_error(response: httpx.Response) -> bool:
    body = response.json()
    return isinstance(body, dict) and list(body) == ["error"] and isinstance(body["error"], str)


@given(body=json_values | request_like | coherent())
@BOUNDED
async def test_infer_answers_result_or_client_error_when_body_is_any_json(client: httpx.AsyncClient, body: Any) -> None:
    response = await client.post(URL, content=_encode(body), headers={"content-type": "application/json"})
    assert response.status_code in {200, 400, 404, 413}, (body, response.status_code, response.text)
    if response.status_code != 200:
        assert _is_error(response), response.text


@st.composite
def batches(draw: st.DrawFn) -> tuple[npt.NDArray[np.float32], bool, bool, list[str] | None]:
    """Rows of x, whether x travels as binary data, whether outputs come back binary, the outputs asked for."""
    rows = draw(st.integers(1, MAX_BATCH))
    x = np.asarray(draw(st.lists(values, min_size=4 * rows, max_size=4 * rows)), dtype=np.float32).reshape(rows, 4)
    wanted = draw(st.none() | st.permutations(["y", "z"]).flatmap(lambda names: st.sampled_from([names[:1], names])))
    return x, draw(st.booleans()), draw(st.booleans()), wanted


@given(case=batches(), nested=st.booleans())
@BOUNDED
async def test_infer_answers_outputs_of_the_batch_shape_when_request_is_well_formed(
    client: httpx.AsyncClient, case: tuple[npt.NDArray[np.float32], bool, bool, list[str] | None],
    nested: bool,
) -> None:
    x, binary_in, binary_out, wanted = case
    tensor: dict[str, Any] = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
    header: dict[str, Any] = {"inputs": [tensor], "parameters": {"binary_data_output": binary_out}}
    if wanted is not None:
        header["outputs"] = [{"name": name} for name in wanted]
    headers = {}
    if binary_in:
        tensor["parameters"] = {"binary_data_size": x.nbytes}
        head = _encode(header)
        content = head + x.tobytes()
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        tensor["data"] = x.tolist() if nested else x.reshape(-1).tolist()
        content = _encode(header)
    response = await client.post(URL, content=content, headers=headers)
    assert response.status_code == 200, response.text
    outputs = _outputs(response)
    expected = {"y": x * 2, "z": -x}
    assert list(outputs) == (wanted or ["y", "z"])
    for name, array in outputs.items():
        assert array.shape == x.shape
        np.testing.assert_array_equal(array, expected[name])


def _outputs(response: httpx.Response) -> dict[str, npt.NDArray[np.float32]]:
    length = int(response.headers.get("inference-header-content-length", len(response.content)))
    header = json.loads(response.content[:length])
    offset, found = length, {}
    for output in header["outputs"]:
        assert output["datatype"] == "FP32"
        shape = tuple(output["shape"])
        if "data" in output:
            found[output["name"]] = np.asarray(output["data"], dtype=np.float32).reshape(shape)
            continue
        size = output["parameters"]["binary_data_size"]
        raw = response.content[offset : offset + size]
        found[output["name"]] = np.frombuffer(raw, dtype=np.float32).reshape(shape)
        offset += size
    assert offset == len(response.content)
    return found


def _names_outputs(value: object) -> bool:
    """Whether ``value`` is a list of output requests the model could answer (then it is no mutation)."""
    return isinstance(value, list) and all(isinstance(v, dict) and v.get("name") in ("y", "z") for v in value)


def _valid() -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [float(i) for i in range(8)]}]}


def _count_of_numbers(value: object) -> int | None:
    """How many numbers a (nested) list of numbers holds; None when it is anything else."""
    if isinstance(value, bool) or not isinstance(value, list):
        return None
    total = 0
    for item in value:
        if isinstance(item, list):
            inner = _count_of_numbers(item)
            if inner is None:
                return None
            total += inner
        elif _is_number(item):
            total += 1
        else:
            return None
    return total


def _is_number(item: object) -> bool:
    """A JSON number, or one of the spellings JSON data use for non-finite floats (see rest/values.py)."""
    if isinstance(item, str):
        return item in ("NaN", "Infinity", "-Infinity")
    return isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A valid request made invalid in exactly one way: the body and the headers to send."""
    request = _valid()
    tensor = request["inputs"][0]
    kind = draw(st.sampled_from(["drop", "replace", "retype", "reshape", "top", "framing"]))
    if kind == "drop":
        del tensor[draw(st.sampled_from(["name", "shape", "datatype", "data"]))]
    elif kind == "replace":
        field = draw(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]))
        value = draw(json_values)
        assume(value != tensor.get(field) and not (field == "parameters" and isinstance(value, dict)))
        assume(not (field == "data" and _count_of_numbers(value) == 8))
        tensor[field] = value
    elif kind == "retype":
        datatype = draw(st.sampled_from(DATATYPES) | st.text())
        assume(datatype != "FP32")
        tensor["datatype"] = datatype
        if draw(st.booleans()):  # values that may not fit the new datatype: the codec must refuse, not overflow
            tensor["data"] = draw(st.lists(scalars, min_size=8, max_size=8))
    elif kind == "reshape":
        shape = draw(st.lists(st.integers(-(2**70), 2**70) | st.integers(-2, 10), max_size=6))
        assume(shape != [2, 4])
        tensor["shape"] = shape
    elif kind == "top":
        field = draw(st.sampled_from(["inputs", "parameters", "id", "outputs"]))
        value = draw(json_values)
        assume(field != "inputs" or value != request["inputs"])
        assume(field != "parameters" or not isinstance(value, dict))  # unknown parameters are allowed
        assume(field != "id" or not isinstance(value, str))
        assume(field != "outputs" or not (value is None or _names_outputs(value)))  # null: "not given"
        request[field] = value
    else:
        return draw(_framings())
    return _encode(request), {}


@st.composite
def _framings(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """The binary extension with a header length or a binary_data_size that does not match the body."""
    raw = np.arange(8, dtype=np.float32).tobytes()
    size = draw(st.sampled_from([32]) | st.integers(-4, 100))
    head = _encode({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                "parameters": {"binary_data_size": size}}]})
    length = draw(st.integers(-2, len(head) + 40).map(str) | st.text(HEADER_TEXT, max_size=6))
    assume((size, length) != (32, str(len(head))))
    return head + raw, {"Inference-Header-Content-Length": length}


@given(mutation=mutations())
@BOUNDED
async def test_infer_answers_client_error_in_v2_shape_when_valid_request_is_mutated(
    client: httpx.AsyncClient, mutation: tuple[bytes, dict[str, str]]
) -> None:
    content, headers = mutation
    response = await client.post(URL, content=content, headers={"content-type": "application/json", **headers})
    assert 400 <= response.status_code < 500, (content[:300], headers, response.status_code, response.text)
    assert _is_error(response), response.text
