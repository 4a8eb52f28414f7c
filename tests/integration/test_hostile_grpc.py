"""What a hostile or careless gRPC client can send (issue #11): INVALID_ARGUMENT saying what was wrong, never
INTERNAL or UNKNOWN, and nothing silently dropped or wrapped. The codec alone first, then the real gateway."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.errors import InvalidInput
from services.gateway.grpc_api.codec import decode_request
from tests.error_texts import malformed_version
from tests.gateway_harness import RunningGateway

Request = Any  # service_pb2.ModelInferRequest: protobuf's generated classes are untyped


def _infer_request(
    datatype: str = "FP32",
    shape: tuple[int, ...] = (1, 32),
    version: str = "",
    raw: bytes | None = bytes(128),
    **contents: list[Any],
) -> Request:
    """``mlp``'s input ``features``: typed ``contents`` when given, else ``raw`` (zeros for [1, 32] FP32)."""
    request = service_pb2.ModelInferRequest(model_name="mlp", model_version=version)
    tensor = request.inputs.add(name="features", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    if not contents and raw is not None:
        request.raw_input_contents.append(raw)
    return request


def _with(change: Callable[[Request], object], request: Request | None = None) -> Request:
    request = _infer_request() if request is None else request
    change(request)
    return request


def _param(key: str, kind: str, value: object) -> Callable[[Request], object]:
    return lambda request: setattr(request.parameters[key], kind, value)


NASTY: dict[str, Request] = {
    "negative-dim": _infer_request(shape=(1, -32)),
    "huge-dims": _infer_request(shape=(2**40, 2**40)),
    "huge-empty": _infer_request(shape=(0, 2**62), fp32_contents=[]),
    "rank-40": _infer_request(shape=(1,) * 40, fp32_contents=[0.0]),
    "too-few-values": _infer_request(shape=(1, 32), fp32_contents=[0.0] * 31),
    "fp32-in-int-contents": _infer_request(datatype="FP32", shape=(1, 32), int_contents=[0] * 32),
    "int8-1000": _infer_request(datatype="INT8", shape=(1, 32), int_contents=[1000] * 32),
    "uint8-300": _infer_request(datatype="UINT8", shape=(1, 32), uint_contents=[300] * 32),
    "int16-min-int32": _infer_request(datatype="INT16", shape=(1, 32), int_contents=[-(2**31)] * 32),
    "uint16-max-uint32": _infer_request(datatype="UINT16", shape=(1, 32), uint_contents=[2**32 - 1] * 32),
    "bytes": _infer_request(datatype="BYTES", shape=(1, 32), bytes_contents=[b"x"] * 32),
    "fp16-contents": _infer_request(datatype="FP16", shape=(1, 32), fp32_contents=[0.0] * 32),
    "empty-datatype": _infer_request(datatype="", shape=(1, 32)),
    "superscript-datatype": _infer_request(datatype="\u00b2", shape=(1, 32)),
    "superscript-version": _infer_request(version="\u00b2"),
    "4301-digit-version": _infer_request(version="1" * 4301),
    "version-sign": _infer_request(version="-1"),
    "two-raw-for-one-input": _with(lambda r: r.raw_input_contents.append(b"")),
    "raw-3-bytes": _with(lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 3)),
    "contents-and-raw": _with(lambda r: r.inputs[0].contents.fp32_contents.append(1.0)),
    "timeout-string": _with(_param("timeout", "string_param", "soon")),
    "timeout-double": _with(_param("timeout", "double_param", 1.5)),
    "timeout-negative": _with(_param("timeout", "int64_param", -1)),
    "priority-bool": _with(_param("priority", "bool_param", True)),
    "priority-no-value": _with(lambda r: r.parameters["priority"].SetInParent()),
}


@pytest.mark.parametrize("request_", NASTY.values(), ids=NASTY.keys())
def test_decode_request_raises_only_invalid_input_when_message_hostile(request_: Request) -> None:
    with contextlib.suppress(InvalidInput):  # anything else, or a warning (pytest makes it an error), fails
        decode_request(request_)


def test_decode_request_names_each_output_once_in_first_order_when_outputs_repeat() -> None:
    request = _infer_request()
    for name in ["probabilities", "logits"] * 500:
        request.outputs.add(name=name)
    assert decode_request(request).outputs == ("probabilities", "logits")


def test_decode_request_reads_tritonclient_parameters_when_integers() -> None:
    request = _with(_param("timeout", "int64_param", 1500), _with(_param("priority", "uint64_param", 2)))
    decoded = decode_request(request)
    assert decoded.timeout_s == pytest.approx(0.0015)
    assert decoded.priority == 2


@pytest.fixture
def stub(gateway: RunningGateway) -> Iterator[Any]:
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _rejection(call: Callable[[Any], Any], message: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call(message)
    error: Any = caught.value
    return error.code(), error.details()


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow  # a gateway on real ports
@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("\u00b2", malformed_version(r"'\xb2'")),
        ("\uff11", malformed_version(r"'\uff11'")),
        ("-1", malformed_version("'-1'")),
        ("1" * 4301, malformed_version(f"'{'1' * 40}'... (4301 characters)")),
    ],
    ids=["superscript", "fullwidth", "sign", "4301-digits"],
)
def test_grpc_calls_answer_invalid_argument_when_version_malformed(stub: Any, version: str, message: str) -> None:
    assert _rejection(stub.ModelInfer, _infer_request(version=version)) == (INVALID, message)
    target = {"name": "mlp", "version": version}
    assert _rejection(stub.ModelMetadata, service_pb2.ModelMetadataRequest(**target)) == (INVALID, message)
    assert _rejection(stub.ModelConfig, service_pb2.ModelConfigRequest(**target)) == (INVALID, message)
    assert _rejection(stub.ModelReady, service_pb2.ModelReadyRequest(**target)) == (INVALID, message)


@pytest.mark.slow  # a gateway on real ports
def test_grpc_version_0_is_an_unknown_version_and_leading_zeros_name_the_same_version(stub: Any) -> None:
    code, message = _rejection(stub.ModelInfer, _infer_request(version="0"))
    assert (code, message.startswith("Request for unknown model: 'mlp' version 0 is not found")) == (
        grpc.StatusCode.NOT_FOUND, True
    )
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="mlp", version="0")).ready is False  # as Triton
    served = stub.ModelInfer(_infer_request(version="01"))
    assert served.model_version == "1"


@pytest.mark.slow  # a gateway on real ports
@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            _with(lambda r: r.inputs[0].contents.fp32_contents.extend([0.0] * 32)),
            "input 'features': give each input's data either in contents or in raw_input_contents, not both",
        ),
        (
            _infer_request(datatype="INT8", int_contents=[1000] * 32),
            "input 'features': 1000 is outside the INT8 range -128..127",
        ),
        (
            _infer_request(datatype="UINT8", uint_contents=[300] * 32),
            "input 'features': 300 is outside the UINT8 range 0..255",
        ),
        (
            _infer_request(int_contents=[0] * 32),
            "input 'features': FP32 values go in contents.fp32_contents, got contents.int_contents",
        ),
        (
            _infer_request(datatype="BYTES", bytes_contents=[b"x"] * 32),
            "inference input 'features' data-type is 'BYTES', but model 'mlp' expects 'FP32'",
        ),
        (
            _infer_request(shape=(1, -32)),
            "input 'features': 'shape' must be a list of non-negative integers, got [1, -32]",
        ),
        (
            _with(_param("timeout", "string_param", "soon")),
            "parameter 'timeout' must be an int64_param or uint64_param, got string_param",
        ),
        (
            _with(_param("priority", "bool_param", True)),
            "parameter 'priority' must be an int64_param or uint64_param, got bool_param",
        ),
        (
            _with(_param("timeout", "int64_param", -5)),
            "parameter 'timeout' must be a non-negative integer, got -5",
        ),
    ],
    ids=["contents-and-raw", "int8-range", "uint8-range", "wrong-field", "bytes", "negative-dim", "timeout-string",
         "priority-bool", "timeout-negative"],
)  # fmt: skip
def test_grpc_infer_answers_invalid_argument_saying_why_when_request_wrong(
    stub: Any, request_: Request, message: str
) -> None:
    assert _rejection(stub.ModelInfer, request_) == (INVALID, message)


@pytest.mark.slow  # a gateway on real ports
@pytest.mark.parametrize("request_", NASTY.values(), ids=NASTY.keys())
def test_grpc_infer_answers_invalid_argument_when_message_hostile(stub: Any, request_: Request) -> None:
    code, _ = _rejection(stub.ModelInfer, request_)
    assert code == INVALID


@pytest.mark.slow  # a gateway on real ports
def test_grpc_client_passes_nan_through_when_sent_raw(gateway: RunningGateway) -> None:
    features = np.zeros((1, 32), dtype=np.float32)
    features[0, 0] = np.nan  # the client's own bytes: the model sees them as they are
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("features", [1, 32], "FP32")
        tensor.set_data_from_numpy(features)
        # tritonclient's own parameters: timeout as int64_param (microseconds), priority as uint64_param
        result = client.infer("mlp", [tensor], timeout=10_000_000, priority=1)
    assert np.isnan(result.as_numpy("logits")).any()
