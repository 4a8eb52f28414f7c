"""The generate extension on the embedded backend (example mlp, over a real port): a JSON list in, the outputs by
name out, the same answer as one server-sent event, and a field that does not fit refused with the v2 error."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest

from examples import models
from tests.gateway_harness import Reference, RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def test_generate_answers_like_onnxruntime_when_mlp_gets_a_json_list(
    gateway: RunningGateway, reference: Reference
) -> None:
    features = models.mlp_inputs(1, seed=3).numpy()
    base = f"http://{gateway.http_url}/v2/models/mlp"
    with httpx.Client(timeout=30) as http:
        answer = http.post(f"{base}/versions/2/generate", json={"features": features.ravel().tolist()})
        streamed = http.post(f"{base}/versions/2/generate_stream", json={"features": features.ravel().tolist()})
        short = http.post(f"{base}/generate_stream", json={"features": [0.5] * 31})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["model_name"], body["model_version"]) == ("mlp", "2")
    expected = reference("mlp", 2, {"features": features})
    for name in ("logits", "probabilities"):
        np.testing.assert_allclose(body[name], expected[name].ravel(), rtol=1e-5, atol=1e-6)
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert streamed.text.startswith("data: ")
    assert streamed.text.endswith("\n\n")
    assert orjson.loads(streamed.text[len("data: ") : -2]) == body  # one event, the same answer
    assert short.status_code == 400
    assert short.json() == {
        "error": "input 'features': 31 value(s) do not fit the shape [-1, 32] the model declares; it takes a "
        "multiple of 32 values"
    }
