"""An output named many times in one request (issue #28, finding 6): the names a gateway answers with, over REST (a
raw JSON body, as the probe sent it) and gRPC (the KServe stub), for the mlp example (outputs logits and
probabilities)."""

from __future__ import annotations

import grpc
import httpx
from tritonclient.grpc import service_pb2, service_pb2_grpc

TIMES = 1000
ROW = [0.25] * 32


def rest_output_names(http_url: str, names: list[str]) -> list[str]:
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": ROW}],
            "outputs": [{"name": name} for name in names]}  # fmt: skip
    answer = httpx.post(f"http://{http_url}/v2/models/mlp/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return [output["name"] for output in answer.json()["outputs"]]


def grpc_output_names(grpc_url: str, names: list[str]) -> list[str]:
    message = service_pb2.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="features", datatype="FP32", shape=[1, 32]).contents.fp32_contents.extend(ROW)
    for name in names:
        message.outputs.add(name=name)
    with grpc.insecure_channel(grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
    assert len(reply.raw_output_contents) == len(reply.outputs)
    return [output.name for output in reply.outputs]


def answered_names(protocol: str, http_url: str, grpc_url: str, names: list[str]) -> list[str]:
    """The output names answered over ``protocol`` (``rest`` or ``grpc``)."""
    return rest_output_names(http_url, names) if protocol == "rest" else grpc_output_names(grpc_url, names)
