"""The embedded backend runs ``pytorch_libtorch`` versions with torch.jit, outputs in config order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from examples import models
from tests.gateway_harness import RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def test_embedded_backend_matches_eager_pytorch_when_model_is_torchscript(gateway: RunningGateway) -> None:
    features = models.mlp_inputs(5, seed=31)
    with torch.no_grad():
        eager = models.build_mlp()(features)
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        assert client.get_model_metadata("mlp_ts")["platform"] == "pytorch_libtorch"
        tensor = httpclient.InferInput("INPUT__0", [5, 32], "FP32")
        tensor.set_data_from_numpy(features.numpy())
        result = client.infer("mlp_ts", [tensor])
    finally:
        client.close()
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), eager["logits"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), eager["probabilities"].numpy(), rtol=1e-5, atol=1e-6)
