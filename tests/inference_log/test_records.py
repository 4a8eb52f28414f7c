"""A record built from an exchange reads back through the shared format: every datatype, redaction, the size cap
and a failed request."""

from __future__ import annotations

import hashlib
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from services.gateway.inference_log.records import Exchange, LogPolicy, build_record
from services.gateway.tensors.shared_memory import RegionSlice
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse
from services.inferlog.format import (
    RecordError,
    check_record,
    decode_tensor,
    inputs_of,
    output_parameters_of,
    outputs_of,
    parameters_of,
    tensor_bytes,
)

NUMERIC = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[0.1, np.inf, np.nan]], np.float16),
    "BF16": np.array([[0.1, -np.inf, np.nan, 3.0e38]], ml_dtypes.bfloat16),  # numpy's kind "V", not "f"
    "FP32": np.array([[0.1, -np.inf, 3.4e38]], np.float32),
    "FP64": np.array([[0.1, np.nan, 1e-300]], np.float64),
}


def _bytes_array(*items: bytes) -> np.ndarray[Any, Any]:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _exchange(inputs: list[InferInput], outputs: list[InferOutput] | None, **changes: Any) -> Exchange:
    request = InferRequest(model="mlp", version=None, inputs=inputs, id="req-1", outputs=("OUT",))
    response = None if outputs is None else InferResponse("mlp", 2, outputs, id="req-1")
    fields: dict[str, Any] = {
        "request": request, "response": response, "status": 200, "error": None, "version": 2, "route": "stable",
        "protocol": "http", "arrived": 1_800_000_000.25, "latency_s": 0.0018406, "request_id": "req-1",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }
    return Exchange(**(fields | changes))


def _through_json(record: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(record))
    return check_record(loaded)


def _same(left: np.ndarray[Any, Any], right: np.ndarray[Any, Any]) -> bool:
    floats = left.dtype.kind == "f" or left.dtype == ml_dtypes.bfloat16
    return left.dtype == right.dtype and left.shape == right.shape and bool(
        np.array_equal(left, right, equal_nan=floats)
    )


def test_every_datatype_reads_back_as_it_went_in() -> None:
    texts = _bytes_array(b"hello", "caf\u00e9".encode())
    binary = _bytes_array(b"\xff\x00", b"ok")
    inputs = [InferInput(name, name, array.shape, array) for name, array in NUMERIC.items()]
    inputs += [InferInput("TEXT", "BYTES", (2,), texts), InferInput("BINARY", "BYTES", (2,), binary)]
    outputs = [InferOutput(f"OUT_{name}", name, array) for name, array in NUMERIC.items()]
    outputs.append(InferOutput("OUT_BYTES", "BYTES", binary))  # outputs may hold bytes objects too

    record = _through_json(build_record(_exchange(inputs, outputs), redact={}, max_bytes=1 << 20))

    read_inputs = {name: values for name, _, values in inputs_of(record)}
    assert list(read_inputs) == [*NUMERIC, "TEXT", "BINARY"]
    for name, array in NUMERIC.items():
        assert _same(read_inputs[name], array), name
        assert _same(outputs_of(record)[f"OUT_{name}"], array), name
    assert read_inputs["TEXT"].tolist() == [b"hello", "caf\u00e9".encode()]
    assert read_inputs["BINARY"].tolist() == [b"\xff\x00", b"ok"]
    assert outputs_of(record)["OUT_BYTES"].tolist() == [b"\xff\x00", b"ok"]


def test_the_record_carries_the_exchange_fields() -> None:
    values = np.array([[1.0, 2.0]], np.float32)
    record = _through_json(build_record(_exchange([InferInput("IN", "FP32", (1, 2), values)],
                                                  [InferOutput("OUT", "FP32", values)]), redact={}, max_bytes=4096))
    del record["request"]["inputs"], record["response"]
    assert record == {
        "format": 1, "id": "req-1", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "time": "2027-01-15T08:00:00.250000Z", "model": "mlp", "version": 2, "route": "stable", "protocol": "http",
        "latency_ms": 1.841, "status": 200, "error": None, "truncated": False, "redacted": [],
        "request": {"outputs": ["OUT"]},
    }


def test_a_failed_exchange_has_no_response_but_its_status_and_error() -> None:
    values = np.array([1], np.int64)
    exchange = _exchange([InferInput("IN", "INT64", (1,), values)], None, status=404, error="unknown model 'mlp'",
                         version=None, route=None, trace_id=None)
    record = _through_json(build_record(exchange, redact={}, max_bytes=4096))
    assert (record["response"], record["status"], record["error"]) == (None, 404, "unknown model 'mlp'")
    assert (record["version"], record["route"], record["trace_id"]) == (None, None, None)
    assert outputs_of(record) == {}


def test_redaction_drops_or_hashes_the_named_inputs() -> None:
    secret = np.array([[3, 1, 4]], np.int32)
    inputs = [InferInput("SECRET", "INT32", (1, 3), secret), InferInput("PII", "INT32", (1, 3), secret),
              InferInput("PLAIN", "INT32", (1, 3), secret)]
    record = _through_json(build_record(_exchange(inputs, None), redact={"SECRET": "drop", "PII": "hash"},
                                        max_bytes=4096))
    assert record["redacted"] == ["SECRET"]
    hashed, plain = record["request"]["inputs"]
    assert [hashed["name"], plain["name"]] == ["PII", "PLAIN"]
    assert hashed == {"name": "PII", "datatype": "INT32", "shape": [1, 3], "redacted": "hash",
                      "sha256": hashlib.sha256(tensor_bytes(secret)).hexdigest()}
    with pytest.raises(RecordError, match="redacted"):
        decode_tensor(hashed)
    assert _same(decode_tensor(plain), secret)


def test_past_the_size_cap_the_largest_tensors_lose_their_values_first() -> None:
    big = np.arange(2000, dtype=np.float64).reshape(2, 1000)
    medium = np.arange(300, dtype=np.int64)
    small = np.array([1, 2], np.int8)
    inputs = [InferInput("BIG", "FP64", big.shape, big), InferInput("SMALL", "INT8", (2,), small)]
    exchange = _exchange(inputs, [InferOutput("MEDIUM", "INT64", medium)])
    built = build_record(exchange, redact={}, max_bytes=2000)
    assert len(orjson.dumps(built)) <= 2000
    record = _through_json(built)

    assert record["truncated"] is True
    big_tensor, small_tensor = record["request"]["inputs"]
    assert big_tensor == {"name": "BIG", "datatype": "FP64", "shape": [2, 1000], "truncated": True}
    assert _same(decode_tensor(small_tensor), small)
    assert _same(outputs_of(record)["MEDIUM"], medium)  # 2000 bytes held it once BIG was gone
    with pytest.raises(RecordError, match="truncated"):
        decode_tensor(big_tensor)


def test_when_nothing_fits_every_tensor_is_truncated_and_the_ids_stay() -> None:
    values = np.arange(100, dtype=np.int64)
    binary = _bytes_array(b"\xff" * 200)
    exchange = _exchange([InferInput("IN", "INT64", (100,), values), InferInput("RAW", "BYTES", (1,), binary)],
                         [InferOutput("OUT", "INT64", values)])
    record = _through_json(build_record(exchange, redact={}, max_bytes=10))
    tensors = [*record["request"]["inputs"], *record["response"]["outputs"]]
    assert [sorted(tensor) for tensor in tensors] == [["datatype", "name", "shape", "truncated"]] * 3
    assert (record["id"], record["status"], record["truncated"]) == ("req-1", 200, True)


def test_under_the_cap_nothing_is_truncated() -> None:
    values = np.arange(100, dtype=np.int64)
    exchange = _exchange([InferInput("IN", "INT64", (100,), values)], [InferOutput("OUT", "INT64", values)])
    record = build_record(exchange, redact={}, max_bytes=len(orjson.dumps(build_record(exchange, redact={},
                                                                                         max_bytes=1 << 20))))
    assert record["truncated"] is False
    assert "truncated" not in record["request"]["inputs"][0]


def test_tensors_in_shared_memory_are_logged_from_their_data() -> None:
    values = np.array([[5, 6]], np.int32)
    region = RegionSlice(object(), 0, 8)  # type: ignore[arg-type]  # the record never reads the region
    exchange = _exchange([InferInput("IN", "INT32", (1, 2), values, region=region)],
                         [InferOutput("OUT", "INT32", values, region=region)])
    record = _through_json(build_record(exchange, redact={}, max_bytes=4096))
    assert _same(inputs_of(record)[0][2], values)
    assert _same(outputs_of(record)["OUT"], values)


def test_a_policy_refuses_a_rate_or_redaction_it_cannot_apply() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        LogPolicy(sample=1.5)
    with pytest.raises(ValueError, match="'drop', 'hash'"):
        LogPolicy(redact={"IN": "blur"})  # type: ignore[dict-item]


def test_record_keeps_parameters_and_class_counts_asked_when_request_named_them() -> None:
    """What changes the answer or its status travels with the inputs, in the v2 form a replay sends back; a plain
    request (and a record older gateways wrote) has none of it."""
    request = InferRequest(
        model="mlp", version=2, inputs=[], outputs=("logits", "probabilities"), timeout_s=0.05, priority=1,
        parameters={"temperature": 0.5}, classification={"logits": 2},
    )
    asked = _through_json(build_record(_exchange([], None, request=request), redact={}, max_bytes=4096,
                                       default_priority=2))
    assert asked["request"]["parameters"] == {"temperature": 0.5, "timeout": 50_000, "priority": 1}
    assert asked["request"]["output_parameters"] == {"logits": {"classification": 2}}
    assert (parameters_of(asked), output_parameters_of(asked)) == (
        {"temperature": 0.5, "timeout": 50_000, "priority": 1}, {"logits": {"classification": 2}}
    )
    request.priority, request.timeout_s, request.parameters, request.classification = 2, None, {}, {}
    plain = _through_json(build_record(_exchange([], None, request=request), redact={}, max_bytes=4096,
                                       default_priority=2))
    assert "parameters" not in plain["request"]
    assert "output_parameters" not in plain["request"]
    assert (parameters_of(plain), output_parameters_of(plain)) == ({}, {})
    with pytest.raises(RecordError, match="request.parameters"):
        parameters_of({"id": "x", "request": {"parameters": {"nested": {"no": 1}}}})
