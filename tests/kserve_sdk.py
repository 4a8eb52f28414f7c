"""Run as ``python -m tests.kserve_sdk HTTP_URL GRPC_URL REQUEST_JSON``: KServe's own Python SDK (``kserve``) against
a server, over REST (``InferenceRESTClient``, protocol v2) and gRPC (``InferenceGRPCClient``); prints what each call
answered as JSON.

A process of its own because kserve's gRPC stubs and tritonclient's (which the gateway imports) both define the
protobuf package ``inference``: one interpreter cannot load both. So this module imports nothing from the gateway,
from tritonclient or from the other test helpers. REQUEST_JSON: ``{"model": ..., "inputs": [{"name", "datatype",
"shape", "data" (flat)}], "outputs": [names]}``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Json = dict[str, Any]


async def main(http_url: str, grpc_url: str, request: Json) -> Json:
    # kserve is imported only in the child process: the test modules import this one's helpers next to tritonclient.
    from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig

    model = request["model"]
    report: Json = {}
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    base = f"http://{http_url}"
    try:
        report["rest"] = {
            "live": await rest.is_server_live(base),
            "ready": await rest.is_server_ready(base),
            "model_ready": await rest.is_model_ready(base, model),
            "unknown_model_ready": await rest.is_model_ready(base, "no-such-model"),
            "infer_json": await _rest_answer(rest, base, _request(request, binary=False), model),
            "infer_binary": await _rest_answer(rest, base, _request(request, binary=True), model),
        }
    finally:
        await rest.close()
    grpc_client = InferenceGRPCClient(grpc_url, retries=0, timeout=30)
    try:
        report["grpc"] = {
            "live": await grpc_client.is_server_live(),
            "ready": await grpc_client.is_server_ready(),
            "model_ready": await grpc_client.is_model_ready(model),
            "unknown_model_ready": await grpc_client.is_model_ready("no-such-model"),
            # gRPC has no JSON: "json" is the typed contents fields, "binary" raw_input_contents.
            "infer_json": await _answer(grpc_client.infer(_request(request, binary=False, rest=False))),
            "infer_binary": await _answer(grpc_client.infer(_request(request, binary=True, rest=False))),
        }
    finally:
        await grpc_client.close()
    return report


def _request(request: Json, *, binary: bool, rest: bool = True) -> Any:
    """An ``InferRequest`` as the SDK's users build it. Binary over REST also asks for binary outputs (the
    ``binary_data`` output parameter); gRPC always answers raw contents, so it names no outputs."""
    from kserve import InferInput, InferRequest
    from kserve.protocol.infer_type import RequestedOutput

    inputs = []
    for spec in request["inputs"]:
        tensor = InferInput(spec["name"], spec["shape"], spec["datatype"])
        array = np.asarray(spec["data"], dtype=_NUMPY[spec["datatype"]]).reshape(spec["shape"])
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = None
    if binary and rest:
        outputs = [RequestedOutput(name, {"binary_data": True}) for name in request["outputs"]]
    return InferRequest(request["model"], inputs, request_id="kserve-sdk", request_outputs=outputs)


async def _rest_answer(client: Any, base: str, request: Any, model: str) -> Json:
    """The SDK parses a REST answer without its ``model_version``: the ``X-Model-Version`` header tells it."""
    headers: dict[str, str] = {}
    answer = await _answer(client.infer(base, request, model_name=model, response_headers=headers))
    if "outputs" in answer:
        answer["model_version"] = headers.get("x-model-version")
    return answer


async def _answer(call: Awaitable[Any]) -> Json:
    """The answer's outputs, or the error the SDK raised (each test then fails with its own call's error)."""
    try:
        response = await call
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    tensors = {
        output.name: {"datatype": output.datatype, "shape": list(output.shape), "data": output.as_numpy().tolist()}
        for output in response.outputs
    }
    return {"model_version": response.model_version, "outputs": tensors}


def features_request(rows: int, seed: int) -> Json:
    """The example ``mlp``'s request: ``features`` FP32 [rows, 32], its outputs as ``outputs`` names them."""
    data = np.random.default_rng(seed).standard_normal((rows, 32), dtype=np.float32)
    return {"model": "mlp", "inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, 32],
                                        "data": data.ravel().tolist()}], "outputs": []}


def request_arrays(request: Json) -> dict[str, Any]:
    """The request's inputs as numpy arrays, by name: what a reference computes the expected outputs from."""
    return {
        spec["name"]: np.asarray(spec["data"], dtype=_NUMPY[spec["datatype"]]).reshape(spec["shape"])
        for spec in request["inputs"]
    }


def assert_answer(answer: Json, expected: dict[str, Any]) -> None:
    """An SDK ``infer`` answer (``_answer``) against the expected arrays, by name."""
    assert "error" not in answer, answer["error"]
    assert sorted(answer["outputs"]) == sorted(expected)
    for name, array in expected.items():
        got = answer["outputs"][name]
        assert (got["datatype"], got["shape"]) == ("FP32", list(array.shape)), name
        np.testing.assert_allclose(np.asarray(got["data"], dtype=np.float32), array, rtol=1e-5, atol=1e-5)


_NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}


SDK_PYTHON = ROOT / ".kserve" / "bin" / "python"
"""The interpreter of the SDK's own environment (``make install``): kserve is not in the project's."""


def run_sdk(http_url: str, grpc_url: str, request: Json) -> Json:
    """Run this module in the SDK's environment and return its report; the SDK's error, if any, fails the caller."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # loopback, never through a proxy
    done = subprocess.run(
        [str(SDK_PYTHON), "-m", "tests.kserve_sdk", http_url, grpc_url, json.dumps(request)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: Json = json.loads(done.stdout.strip().splitlines()[-1])
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
