"""Streaming on the embedded backend as a client written against Triton uses it: tritonclient's stream asking for
the empty final response (which Triton takes on any model), and the generate extension's request ``id``, echoed as
Triton echoes it, and a model's failure on a stream in Triton's shape (tests/triton/test_stream_fidelity_triton.py
compares the decoupled cases with Triton itself)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import Reference, RunningGateway, running_gateway
from tests.grpc_stream_cases import infer_input

pytestmark = pytest.mark.slow  # a gateway on real ports


def test_stream_answers_once_with_the_final_flag_when_tritonclient_asks_for_the_empty_final_response(
    gateway: RunningGateway, reference: Reference
) -> None:
    """Triton takes ``enable_empty_final_response`` on a model that answers once and sends that one answer, final:
    the parameter is the stream's, never the model's (the embedded backend refused it as a model parameter)."""
    rows = models.mlp_inputs(1, seed=11).numpy()
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, asked in (("asked", True), ("not-asked", False)):
            client.async_stream_infer("mlp", [infer_input(grpcclient, rows)], model_version="1", request_id=request_id,
                                      enable_empty_final_response=asked)
        got = [answers.get(timeout=30) for _ in range(2)]
        client.stop_stream()
    assert [error for _, error in got] == [None, None]
    expected = reference("mlp", 1, {"features": rows})["probabilities"]
    for result, _ in got:
        assert result.get_response().parameters["triton_final_response"].bool_param
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)
    assert sorted(result.get_response().id for result, _ in got) == ["asked", "not-asked"]
    assert answers.empty()  # one answer each: no empty one after it


def test_generate_echoes_the_request_id_and_refuses_one_that_is_not_a_string(gateway: RunningGateway) -> None:
    features = models.mlp_inputs(1, seed=12).numpy().ravel().tolist()
    base = f"http://{gateway.http_url}/v2/models/mlp/versions/1"
    with httpx.Client(timeout=30) as http:
        answer = http.post(f"{base}/generate", json={"features": features, "id": "req-42"})
        streamed = http.post(f"{base}/generate_stream", json={"features": features, "id": "req-42"})
        numbered = http.post(f"{base}/generate", json={"features": features, "id": 42})
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "req-42"
    assert streamed.text.startswith('data: {"model_name":"mlp","model_version":"1","id":"req-42",')
    assert numbered.status_code == 400
    assert numbered.json() == {"error": "'id' must be a string (the request's id, echoed in the answer), got 42"}


PICK_CONFIG = """
name: "pick"
platform: "onnxruntime_onnx"
max_batch_size: 0
input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }
input { name: "I" data_type: TYPE_INT64 dims: [ 1 ] }
output { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }
"""
"""``pick``: Y = X[I]. An index past X's end fails in onnxruntime as the model runs: a model's failure, not a request
the gateway can refuse before it."""


@pytest.fixture(scope="module")
def failing_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    folder = tmp_path_factory.mktemp("pick") / "repository" / "pick"
    (folder / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["X", "I"], ["Y"])], "pick",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("I", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(PICK_CONFIG)
    with running_gateway(Settings(repository=Path(folder.parent), port=0, grpc_port=0)) as running:
        yield running


def pick(index: int, request_id: str) -> Any:
    message = service_pb2.ModelInferRequest(model_name="pick", id=request_id)
    message.inputs.add(name="X", datatype="FP32", shape=[2])
    message.inputs.add(name="I", datatype="INT64", shape=[1])
    values = np.array([1.5, 2.5], np.float32), np.array([index], np.int64)
    message.raw_input_contents.extend(value.tobytes() for value in values)
    return message


def test_stream_answers_a_model_failure_naming_the_model_with_the_final_flag_as_triton_does(
    failing_gateway: RunningGateway,
) -> None:
    """Triton's error for a model that failed on a stream: ``error_message``, and ``infer_response`` with the model's
    name, the request's id and ``triton_final_response`` (true: a model that answers once is done)."""
    with grpc.insecure_channel(failing_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter([pick(5, "past-the-end"), pick(1, "fine")]), timeout=30))
    by_id = {answer.infer_response.id: answer for answer in answers}
    assert sorted(by_id) == ["fine", "past-the-end"]
    failed = by_id["past-the-end"]
    assert "inference failed" in failed.error_message
    assert failed.infer_response.model_name == "pick"
    assert failed.infer_response.parameters["triton_final_response"].bool_param
    assert not failed.infer_response.outputs
    assert by_id["fine"].error_message == ""
    assert np.frombuffer(by_id["fine"].infer_response.raw_output_contents[0], np.float32).tolist() == [2.5]
