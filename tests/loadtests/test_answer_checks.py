"""The locust users' answer checks (loadtests/kserve_tensors.py): a 200 whose shape, datatype, size, model or version
is not what the metadata promises is a failure, and the requests they build fit the model."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from tests.locust_runs import loadtests_module

kt = loadtests_module("kserve_tensors")
METADATA = {
    "name": "mlp",
    "versions": ["1", "2"],
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 32]}],
    "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 8]},
        {"name": "names", "datatype": "BYTES", "shape": [-1, -1]},
    ],
}
SPEC = kt.ModelSpec.from_metadata(METADATA, max_batch_size=32)


def _binary(outputs: list[tuple[str, str, list[int], bytes]], model: str = "mlp") -> tuple[bytes, int]:
    header = {
        "model_name": model,
        "model_version": "2",
        "outputs": [
            {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(raw)}}
            for n, d, s, raw in outputs
        ],
    }
    head = json.dumps(header).encode()
    return head + b"".join(raw for *_, raw in outputs), len(head)


def _strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _json(outputs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model_name": "mlp", "model_version": "1", "outputs": outputs}).encode()


def test_binary_answer_returns_the_version_when_shapes_and_sizes_fit() -> None:
    body, length = _binary(
        [("logits", "FP32", [3, 8], bytes(3 * 8 * 4)), ("names", "BYTES", [3, 1], _strings(b"a", b"bc", b""))]
    )
    assert kt.binary_answer(SPEC, 3, body, length) == "2"


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ([("logits", "FP32", [2, 8], bytes(64)), ("names", "BYTES", [3, 1], _strings(b"", b"", b""))], "shape"),
        ([("logits", "FP16", [3, 8], bytes(48)), ("names", "BYTES", [3, 1], _strings(b"", b"", b""))], "datatype"),
        ([("logits", "FP32", [3, 8], bytes(95)), ("names", "BYTES", [3, 1], _strings(b"", b"", b""))], "bytes"),
        ([("logits", "FP32", [3, 8], bytes(96)), ("names", "BYTES", [3, 1], _strings(b"", b""))], "BYTES elements"),
        ([("logits", "FP32", [3, 8], bytes(96))], "outputs"),
    ],
)
def test_binary_answer_raises_wrong_answer_when_an_output_breaks_the_metadata(
    outputs: list[tuple[str, str, list[int], bytes]], message: str
) -> None:
    body, length = _binary(outputs)
    with pytest.raises(kt.WrongAnswer, match=message):
        kt.binary_answer(SPEC, 3, body, length)


def test_binary_answer_raises_wrong_answer_when_another_model_answers() -> None:
    body, length = _binary([("logits", "FP32", [1, 8], bytes(32)), ("names", "BYTES", [1, 1], _strings(b""))], "cnn")
    with pytest.raises(kt.WrongAnswer, match="model 'cnn'"):
        kt.binary_answer(SPEC, 1, body, length)


def test_json_answer_raises_wrong_answer_when_the_data_does_not_fill_the_shape() -> None:
    names = {"name": "names", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}
    good = {"name": "logits", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}
    assert kt.json_answer(SPEC, 1, _json([good, names])) == "1"
    with pytest.raises(kt.WrongAnswer, match="7 values"):
        kt.json_answer(SPEC, 1, _json([{**good, "data": [0.0] * 7}, names]))


def test_served_versions_raise_wrong_answer_when_an_unknown_version_answers() -> None:
    reads: list[int] = []

    def read() -> list[str]:
        reads.append(1)
        return ["1", "2", "3"]

    served = kt.ServedVersions(["1", "2"], read)
    served.check("2", "2")
    assert reads == []
    served.check("3")  # activated during the run: the metadata now lists it
    assert reads == [1]
    with pytest.raises(kt.WrongAnswer, match="version '7'"):
        served.check("7")
    with pytest.raises(kt.WrongAnswer, match="X-Model-Version"):
        served.check("2", "1")


def test_random_inputs_have_the_metadata_datatype_and_rows_when_built() -> None:
    arrays = kt.random_inputs(SPEC, 5, {}, np.random.default_rng(0))
    assert arrays["features"].shape == (5, 32)
    assert arrays["features"].dtype == np.float32
    body, headers = kt.binary_body(SPEC, arrays)
    header = json.loads(body[: int(headers["Inference-Header-Content-Length"])])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 5 * 32 * 4


def test_request_shape_raises_value_error_when_shape_option_does_not_fit_the_input() -> None:
    with pytest.raises(ValueError, match="does not fit input 'features'"):
        SPEC.request_shape(SPEC.inputs[0], 1, kt.parse_dims("16"))
    dynamic = kt.ModelSpec.from_metadata({**METADATA, "inputs": [{"name": "x", "datatype": "INT64", "shape": [-1]}]}, 0)
    assert dynamic.request_shape(dynamic.inputs[0], 4, kt.parse_dims("x:6")) == (6,)
