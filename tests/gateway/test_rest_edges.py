"""What a careless REST client sends that the hostile-body tests do not cover: error texts that name what came in
JSON's words."""

from __future__ import annotations

import json

import pytest

from services.gateway.errors import InvalidInput
from services.gateway.rest.codec import decode_request

X = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}


@pytest.mark.parametrize(
    ("value", "came"),
    [(None, "null"), ({"a": 1}, "a JSON object"), ([1, 2], "a JSON array")],
    ids=["null", "object", "array"],
)
def test_decode_request_names_a_parameter_value_in_json_words_when_it_is_not_a_scalar(value: object, came: str) -> None:
    body = json.dumps({"inputs": [X], "parameters": {"tag": value}}).encode()
    with pytest.raises(InvalidInput) as caught:
        decode_request(body, None, "double", None)
    assert str(caught.value) == f"parameter 'tag' must be a boolean, an integer, a number or a string, got {came}"
