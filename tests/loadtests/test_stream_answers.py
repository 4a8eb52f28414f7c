"""The stream clients' answer check (loadtests/clients.py): a stream that answers with an error, or ends instead of
answering, fails the run instead of being counted as a fast answer."""

from __future__ import annotations

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tests.locust_runs import loadtests_module

clients = loadtests_module("clients")


def test_stream_answer_returns_the_inference_response_when_the_stream_answers_outputs() -> None:
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.model_name = "mlp"
    message.infer_response.outputs.add(name="logits", datatype="FP32", shape=[1, 8])

    answer = clients.stream_answer(message)

    assert answer.model_name == "mlp"
    assert [output.name for output in answer.outputs] == ["logits"]


def test_stream_answer_raises_naming_the_error_when_the_stream_answers_an_error() -> None:
    message = service_pb2.ModelStreamInferResponse(error_message="model 'mlpx' is not in the repository")

    with pytest.raises(clients.StreamAnswerError, match="error instead of outputs: model 'mlpx'"):
        clients.stream_answer(message)


def test_stream_answer_raises_when_the_stream_ends_before_answering() -> None:
    with pytest.raises(clients.StreamAnswerError, match="ended before answering"):
        clients.stream_answer(grpc.aio.EOF)
