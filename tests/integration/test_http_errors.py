"""Every rejection over HTTP: the v2 error shape, the status, and a message naming what was wrong."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.error_texts import malformed_version
from tests.gateway_harness import RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def _mlp_input(shape: list[int], datatype: str = "FP32", **extra: Any) -> dict[str, Any]:
    count = int(np.prod(shape))
    value: float = 0.0 if datatype.startswith("FP") else 0  # JSON floats are refused for integer tensors
    return {"name": "features", "shape": shape, "datatype": datatype, "data": [value] * count, **extra}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/models/nope/infer", {"inputs": [_mlp_input([1, 32])]}, 404,
         "Request for unknown model: 'nope' is not found"),
        (
            "/v2/models/mlp/versions/3/infer",
            {"inputs": [_mlp_input([1, 32])]},
            404,
            "Request for unknown model: 'mlp' version 3 is not found; loaded versions: 1, 2",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [_mlp_input([1, 32], "INT32")]},
            400,
            "inference input 'features' data-type is 'INT32', but model 'mlp' expects 'FP32'",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [_mlp_input([2, 16])]},
            400,
            "unexpected shape for input 'features' for model 'mlp'. Expected [-1,32], got [2,16]",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [_mlp_input([33, 32])]},
            400,
            "inference request batch-size must be <= 32 for 'mlp'; input 'features' has 33 rows",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [1.0] * 31}]},
            400,
            "input 'features': shape [1, 32] needs 32 values, got 31",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [{**_mlp_input([1, 32]), "name": "pixels"}]},
            400,
            "unexpected inference input 'pixels' for model 'mlp'; expected inputs: 'features'",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": []},
            400,
            "expected 1 inputs but got 0 inputs for model 'mlp'. Got input(s) [], but missing required input(s) "
            "['features']",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [_mlp_input([1, 32])], "outputs": [{"name": "scores"}]},
            400,
            "unexpected inference output 'scores' for model 'mlp'; expected outputs: logits, probabilities",
        ),
        (
            "/v2/models/mlp/infer",
            {"inputs": [_mlp_input([1, 32], "STRINGY")]},
            400,
            "input 'features': datatype 'STRINGY' is not supported",
        ),
    ],
    ids=[
        "unknown-model",
        "unknown-version",
        "wrong-datatype",
        "wrong-shape",
        "batch-too-large",
        "data-length",
        "unknown-input",
        "missing-input",
        "unknown-output",
        "unsupported-datatype",
    ],
)
def test_http_infer_answers_v2_error_when_request_invalid(
    gateway: RunningGateway, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    response = httpx.post(f"http://{gateway.http_url}{path}", json=body)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert list(error) == ["error"]
    assert error["error"].startswith(message)


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (b"{not json", {}, "failed to parse the request JSON buffer"),
        (b"[1, 2]", {}, "request body must be a JSON object with an 'inputs' list"),
        (b"{}", {"Inference-Header-Content-Length": "abc"}, "Inference-Header-Content-Length must be an integer"),
        (b"{}", {"Inference-Header-Content-Length": "99"}, "Inference-Header-Content-Length is 99 but the body has 2"),
    ],
    ids=["malformed-json", "not-an-object", "header-length-not-int", "header-length-too-long"],
)
def test_http_infer_answers_400_when_framing_malformed(
    gateway: RunningGateway, content: bytes, headers: dict[str, str], message: str
) -> None:
    response = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", content=content, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"].startswith(message)


def _binary_request(declared_size: int, payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "shape": [1, 32],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": declared_size},
                }
            ]
        }
    ).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize(
    ("declared", "payload", "message"),
    [
        (100, b"\0" * 100, "input 'features': shape [1, 32] of FP32 needs 128 bytes, binary_data_size is 100"),
        (128, b"\0" * 64, "input 'features': binary_data_size 128 runs past the end of the body"),
        (128, b"\0" * 130, "binary data has 2 bytes not claimed by any input's binary_data_size"),
    ],
    ids=["size-mismatch", "truncated", "trailing-bytes"],
)
def test_http_infer_answers_400_when_binary_framing_wrong(
    gateway: RunningGateway, declared: int, payload: bytes, message: str
) -> None:
    content, headers = _binary_request(declared, payload)
    response = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", content=content, headers=headers)
    assert response.status_code == 400
    assert response.json() == {"error": message}


def test_http_metadata_answers_404_when_model_or_version_unknown(gateway: RunningGateway) -> None:
    base = f"http://{gateway.http_url}/v2/models"
    assert httpx.get(f"{base}/nope").json() == {"error": "Request for unknown model: 'nope' is not found"}
    assert httpx.get(f"{base}/nope").status_code == 404
    response = httpx.get(f"{base}/mlp/versions/x/config")  # not a version at all: the client's mistake
    assert response.status_code == 400
    assert response.json() == {"error": malformed_version("'x'")}
    assert httpx.get(f"{base}/mlp/versions/5/ready").status_code == 404
    assert httpx.get(f"http://{gateway.http_url}/v2/nothing-here").json() == {"error": "Not Found"}


def test_http_client_raises_with_status_and_message_when_rejected(gateway: RunningGateway) -> None:
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        tensor = httpclient.InferInput("features", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [tensor])
    finally:
        client.close()
    assert caught.value.status() == "400"
    assert caught.value.message().startswith(
        "unexpected shape for input 'features' for model 'mlp'. Expected [-1,32], got [1,16]"
    )


def test_rejections_are_counted_when_requests_invalid(gateway: RunningGateway) -> None:
    before = gateway.metric("switchyard_rejected_total", model="mlp", reason="invalid")
    httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", content=b"{oops")
    httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", json={"inputs": [_mlp_input([1, 3])]})
    assert gateway.metric("switchyard_rejected_total", model="mlp", reason="invalid") == before + 2
