"""BYTES tensors: Triton's serialized form both ways, the REST and gRPC codecs, warm-up data and version comparison
for strings (the wire paths through real clients are in tests/integration/test_bytes_embedded.py)."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2
from tritonclient.http import InferResult
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from services.gateway.batching.batcher import BatchPolicy, DynamicBatcher
from services.gateway.errors import InvalidInput
from services.gateway.grpc_api import codec as grpc_codec
from services.gateway.rest.codec import OutputFormat, decode_request, encode_response
from services.gateway.tensors.bytes_codec import deserialize, serialize
from services.gateway.tensors.types import InferOutput, InferResponse
from services.gateway.versions.comparison import max_abs_difference, probe_request
from services.gateway.versions.shadow import compare
from services.gateway.versions.warmup import warmup_requests
from tests.string_models import NOT_UTF8, TEXT, strings

elements = st.lists(st.binary(max_size=12), max_size=12)


@given(values=elements)
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
def test_serialize_matches_tritonclient_and_reads_back_when_elements_are_any_bytes(values: list[bytes]) -> None:
    array = strings(values, (len(values),))
    raw = serialize(array)
    expected = serialize_byte_tensor(array)
    assert raw == (expected.item() if expected.size else b"")
    back = deserialize(raw, (len(values),), "x")
    assert back.dtype == np.object_
    assert back.tolist() == values


@given(values=elements.filter(bool), cut=st.integers(min_value=1))
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
def test_deserialize_refuses_naming_the_offset_when_data_is_cut_anywhere(values: list[bytes], cut: int) -> None:
    raw = serialize(strings(values, (len(values),)))
    cut = cut % len(raw) or 1
    with pytest.raises(InvalidInput, match=r"^input 'x': .*at byte \d+"):
        deserialize(raw[:-cut], (len(values),), "x")


@pytest.mark.parametrize(
    ("raw", "shape", "message"),
    [
        (b"\x02\x00", (1,), "input 'x': string 0's 4-byte length prefix at byte 0 is cut off: only 2 byte(s) remain"),
        (b"\x09\x00\x00\x00abc", (1,), "input 'x': string 0's length prefix at byte 0 says 9 bytes, only 3 remain"),
        (b"\x01\x00\x00\x00a", (2,), "input 'x': shape [2] needs 2 strings, the data ends after 1 (at byte 5)"),
        (b"\x01\x00\x00\x00ab", (1,), "input 'x': shape [1] needs 1 strings, 1 byte(s) remain after the last one"),
        (b"\x00" * 4, (0,), "input 'x': shape [0] needs 0 strings, 4 byte(s) remain after the last one (at byte 0)"),
        (b"\xff\xff\xff\xff", (1,), "input 'x': string 0's length prefix at byte 0 says 4294967295 bytes, only 0"),
    ],
)
def test_deserialize_refuses_with_the_offset_when_prefixes_and_data_disagree(
    raw: bytes, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        deserialize(raw, shape, "x")
    assert str(caught.value).startswith(message)


def test_deserialize_reads_a_huge_empty_shape_without_looping_when_a_dim_is_zero() -> None:
    assert deserialize(b"", (0, 2**40), "x").shape == (0, 2**40)


def _rest(inputs: list[dict[str, object]], tail: bytes = b"") -> tuple[bytes, str | None]:
    header = json.dumps({"inputs": inputs}).encode()
    return header + tail, (str(len(header)) if tail else None)


def test_rest_decode_reads_json_strings_as_utf8_bytes_when_datatype_is_bytes() -> None:
    body, length = _rest([{"name": "x", "shape": [2, 4], "datatype": "BYTES", "data": [TEXT[:4], TEXT[4:]]}])
    request, _ = decode_request(body, length, "m", None)
    assert request.inputs[0].data.tolist() == [[t.encode() for t in TEXT[:4]], [t.encode() for t in TEXT[4:]]]


def test_rest_decode_reads_binary_strings_including_non_utf8_when_sizes_match() -> None:
    raw = serialize(strings(NOT_UTF8))
    body, length = _rest([{"name": "x", "shape": [1, 3], "datatype": "BYTES",
                           "parameters": {"binary_data_size": len(raw)}}], raw)
    request, _ = decode_request(body, length, "m", None)
    assert request.inputs[0].data.tolist() == [NOT_UTF8]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["a", 5], "input 'x': BYTES data must be strings, got 5 at index 1"),
        (["a", None], "input 'x': BYTES data must be strings, got null at index 1"),
        ([["a"], ["b"], ["c"]], "input 'x': shape [1, 2] needs 2 values, got 3"),
    ],
)
def test_rest_decode_refuses_when_json_bytes_data_are_not_strings_of_the_shape(data: object, message: str) -> None:
    body, length = _rest([{"name": "x", "shape": [1, 2], "datatype": "BYTES", "data": data}])
    with pytest.raises(InvalidInput, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        decode_request(body, length, "m", None)


def test_rest_decode_refuses_when_binary_data_size_runs_past_the_body() -> None:
    raw = serialize(strings(["ab"]))
    body, length = _rest([{"name": "x", "shape": [1, 1], "datatype": "BYTES",
                           "parameters": {"binary_data_size": len(raw) + 1}}], raw)
    with pytest.raises(InvalidInput, match="binary_data_size 7 runs past the end of the body"):
        decode_request(body, length, "m", None)


def _response(values: list[bytes]) -> InferResponse:
    return InferResponse("m", 1, [InferOutput("y", "BYTES", strings(values))])


def test_rest_encode_writes_json_strings_when_every_element_is_utf8() -> None:
    body, length = encode_response(_response([t.encode() for t in TEXT]), OutputFormat())
    assert length is None
    assert json.loads(body)["outputs"][0]["data"] == TEXT


def test_rest_encode_sends_binary_data_when_an_element_is_not_utf8_and_json_was_asked() -> None:
    body, length = encode_response(_response(NOT_UTF8), OutputFormat())
    assert length is not None
    result = InferResult.from_response_body(body, header_length=length)
    assert result.as_numpy("y").tolist() == [NOT_UTF8]


def test_grpc_decode_reads_bytes_contents_and_raw_alike_when_either_is_given() -> None:
    values = [b"", "grüße".encode(), b"\xff"]
    typed = service_pb2.ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="BYTES", shape=[1, 3]).contents.bytes_contents.extend(values)
    raw = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[serialize(strings(values))])
    raw.inputs.add(name="x", datatype="BYTES", shape=[1, 3])
    for message in (typed, raw):
        assert grpc_codec.decode_request(message).inputs[0].data.tolist() == [values]


def test_grpc_decode_refuses_when_bytes_contents_miss_a_string() -> None:
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="BYTES", shape=[1, 3]).contents.bytes_contents.extend([b"a", b"b"])
    with pytest.raises(InvalidInput, match=r"input 'x': shape \[1, 3\] needs 3 values, got 2"):
        grpc_codec.decode_request(message)


def test_grpc_encode_writes_what_tritonclient_deserializes_when_output_is_bytes() -> None:
    message = grpc_codec.encode_response(_response(NOT_UTF8))
    assert deserialize_bytes_tensor(message.raw_output_contents[0]).tolist() == NOT_UTF8


STRING_CONFIG = """
name: "s"
max_batch_size: 4
input { name: "text" data_type: TYPE_STRING dims: [ 2 ] }
"""


def test_warmup_sends_empty_strings_when_an_input_is_a_string_without_samples(tmp_path: Path) -> None:
    config = text_format.Parse(STRING_CONFIG, mc.ModelConfig())
    (zeros,) = warmup_requests(tmp_path, 1, config)
    assert zeros.inputs["text"].tolist() == [[b"", b""]]
    assert probe_request(config)["text"].tolist() == [[b"", b""], [b"", b""]]


def test_warmup_reads_serialized_strings_and_falls_back_to_zero_data_when_random_is_asked(tmp_path: Path) -> None:
    folder = tmp_path
    (folder / "warmup").mkdir()
    (folder / "warmup" / "text.bin").write_bytes(b"".join(struct.pack("<I", len(w)) + w for w in (b"hi", b"\xff")))
    config = text_format.Parse(
        STRING_CONFIG
        + 'model_warmup { name: "file" batch_size: 2 inputs { key: "text" value: '
        '{ data_type: TYPE_STRING dims: [ 2 ] input_data_file: "text.bin" } } }'
        + 'model_warmup { name: "random" batch_size: 1 inputs { key: "text" value: '
        "{ data_type: TYPE_STRING dims: [ 2 ] random_data: true } } }",
        mc.ModelConfig(),
    )
    from_file, random = warmup_requests(folder, 1, config)
    assert from_file.inputs["text"].tolist() == [[b"hi", b"\xff"], [b"hi", b"\xff"]]
    assert random.inputs["text"].tolist() == [[b"", b""]]


def test_version_comparison_counts_differing_strings_when_outputs_are_bytes() -> None:
    same, other = strings(["a", "b"]), strings(["a", "c"])
    assert max_abs_difference([{"y": same}], [{"y": same.copy()}]) == {"y": 0.0}
    assert max_abs_difference([{"y": same}, {"y": same}], [{"y": other}, {"y": same}]) == {"y": "1 of 2 strings differ"}
    assert compare({"y": same}, {"y": same.copy()}) == (0.0, 0)
    assert compare({"y": same}, {"y": other}) == (float("inf"), 0)


async def test_batcher_merges_string_requests_and_splits_each_callers_rows_back_when_they_share_a_shape() -> None:
    batches: list[list[list[bytes]]] = []

    async def echo(inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        batches.append(inputs["text"].tolist())
        return {"echo": inputs["text"]}, 0.0

    policy = BatchPolicy(max_batch_size=4, max_queue_delay_s=5.0, adaptive_delay=False)
    batcher = DynamicBatcher(echo, policy)
    await batcher.start()
    try:
        sent = [strings([f"row {i}", TEXT[i]]) for i in range(4)]
        answers = await asyncio.gather(*(batcher.submit({"text": rows}) for rows in sent))
    finally:
        await batcher.close()
    assert batches == [[row for rows in sent for row in rows.tolist()]]  # one batch of four rows
    assert [answer["echo"].tolist() for answer in answers] == [rows.tolist() for rows in sent]
