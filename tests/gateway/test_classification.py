"""The classification extension's ranking and wording, and how both codecs read ``class_count`` and refuse the
parameters the gateway does not implement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from services.gateway.errors import InferenceFailed, InvalidInput
from services.gateway.grpc_api.codec import decode_request as decode_grpc
from services.gateway.rest.codec import decode_request as decode_rest
from services.gateway.tensors.classification import classify, read_labels
from services.gateway.tensors.parameters import check_request_parameters
from services.gateway.tensors.types import InferOutput


def _texts(output: InferOutput) -> list[object]:
    return [[v.decode() for v in row] for row in output.data] if output.data.ndim == 2 else [
        v.decode() for v in output.data
    ]


def test_classify_ranks_each_batch_row_highest_first_with_scores_as_triton_prints_them() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], dtype=np.float32)
    ranked = classify(InferOutput("p", "FP32", scores), 2, [], batched=True)
    assert (ranked.datatype, ranked.data.shape) == ("BYTES", (2, 2))
    # %f of the float32 value widened to a double, as std::to_string prints it; ties keep the lower index first
    assert _texts(ranked) == [["0.700000:1", "0.200000:2"], ["0.500000:0", "0.250000:1"]]


def test_classify_appends_labels_and_caps_k_at_the_entries() -> None:
    scores = np.array([3, -2, 9], dtype=np.int32)
    ranked = classify(InferOutput("p", "INT32", scores), 10, ["cat", "dog"], batched=False)
    assert ranked.data.shape == (3,)
    assert _texts(ranked) == ["9:2", "3:0:cat", "-2:1:dog"]  # index 2 has no label line: no ':label'


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int8, np.uint8])
def test_classify_orders_integers_at_their_range_limits(dtype: type[np.integer]) -> None:
    info = np.iinfo(dtype)
    scores = np.array([[info.min, info.max, 0]], dtype=dtype)
    ranked = classify(InferOutput("p", np.dtype(dtype).name.upper(), scores), 3, [], batched=True)
    expected = sorted([(int(info.min), 0), (int(info.max), 1), (0, 2)], key=lambda pair: -pair[0])
    assert _texts(ranked) == [[f"{value}:{index}" for value, index in expected]]


@pytest.mark.parametrize("datatype", ["BYTES", "BOOL", "FP16", "BF16"])
def test_classify_refuses_types_triton_does_not_rank_with_its_text(datatype: str) -> None:
    text = f"class result not available for output due to unsupported type '{datatype}'"
    with pytest.raises(InvalidInput, match=text):
        classify(InferOutput("p", datatype, np.zeros((1, 2))), 1, [], batched=True)


def test_read_labels_reads_one_label_per_line_and_refuses_a_file_outside_the_model(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("zero\none\ntwo\n")
    config = mc.ModelConfig(name="m")
    config.output.add(name="p", label_filename="labels.txt")
    config.output.add(name="q")
    assert read_labels(tmp_path, config) == {"p": ["zero", "one", "two"]}
    config.output[1].label_filename = "../secret.txt"
    with pytest.raises(InferenceFailed, match="outside the model's folder"):
        read_labels(tmp_path, config)


def _rest(request: dict[str, object]) -> tuple[object, ...]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}], **request}
    decoded, _ = decode_rest(json.dumps(body).encode(), None, "m", None)
    return decoded.parameters, decoded.classification


def test_rest_codec_reads_class_count_and_keeps_the_request_parameters_it_does_not_apply() -> None:
    parameters, classes = _rest(
        {
            "parameters": {"timeout": 10, "priority": 1, "binary_data_output": False, "sequence_id": 7, "tag": "a"},
            "outputs": [{"name": "p", "parameters": {"classification": 3}}, {"name": "q", "parameters": {}}],
        }
    )
    assert dict(parameters) == {"sequence_id": 7, "tag": "a"}
    assert dict(classes) == {"p": 3}


@pytest.mark.parametrize(
    ("request_part", "message"),
    [
        ({"outputs": [{"name": "p", "parameters": {"top_k": 3}}]}, "output 'p': parameter 'top_k' is not supported"),
        ({"outputs": [{"name": "p", "parameters": {"classification": "3"}}]}, "output 'p': parameter 'classification'"),
        ({"parameters": {"tags": [1, 2]}}, "parameter 'tags' must be a boolean, an integer, a number or a string"),
    ],
)
def test_rest_codec_refuses_parameters_it_cannot_read(request_part: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _rest(request_part)


def test_rest_codec_refuses_an_unknown_input_parameter() -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0], "parameters": {"scale": 2}}]}
    with pytest.raises(InvalidInput, match="input 'x': parameter 'scale' is not supported"):
        decode_rest(json.dumps(body).encode(), None, "m", None)


def _grpc_message(**parameters: object) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    output = grpcclient.InferRequestedOutput("p", class_count=2)
    message.outputs.extend([output._get_tensor()])
    for key, value in parameters.items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        elif isinstance(value, int):
            message.parameters[key].int64_param = value
        else:
            message.parameters[key].string_param = str(value)
    return message


def test_grpc_codec_reads_class_count_and_the_request_parameters_as_plain_values() -> None:
    decoded = decode_grpc(_grpc_message(sequence_id=4, sequence_start=True, tag="t", timeout=5))
    assert dict(decoded.classification) == {"p": 2}
    assert dict(decoded.parameters) == {"sequence_id": 4, "sequence_start": True, "tag": "t"}


def test_grpc_codec_refuses_an_unknown_output_parameter() -> None:
    message = _grpc_message()
    message.outputs[0].parameters["top_k"].int64_param = 1
    with pytest.raises(InvalidInput, match="output 'p': parameter 'top_k' is not supported"):
        decode_grpc(message)


def test_request_parameters_are_refused_where_no_backend_or_batcher_takes_them() -> None:
    with pytest.raises(InvalidInput, match="parameter 'tag' is not supported for model 'm': the embedded backend"):
        check_request_parameters({"tag": 1}, "m", forwarded=False, sequence_batching=False, backend="embedded")
    with pytest.raises(InvalidInput, match="'sequence_id', 'sequence_end' not supported for model 'm': its config"):
        check_request_parameters(
            {"sequence_end": False, "sequence_id": 1}, "m", forwarded=True, sequence_batching=False, backend="triton"
        )
    check_request_parameters({"sequence_id": 1, "tag": 1}, "m", forwarded=True, sequence_batching=True, backend="t")


def test_grpc_codec_checks_a_binary_data_size_given_with_raw_contents() -> None:
    """KServe's gRPC client names each raw input's size: accepted when true, refused when not (never ignored)."""
    message = service_pb2.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    tensor.parameters["binary_data_size"].int64_param = 8
    assert decode_grpc(message).inputs[0].data.tolist() == [0.0, 0.0]
    tensor.parameters["binary_data_size"].int64_param = 12
    with pytest.raises(InvalidInput, match="binary_data_size is 12 but its raw_input_contents entry has 8 bytes"):
        decode_grpc(message)
