"""An ONNX export without a batch dim (``max_batch_size=0``) on the real local Triton: Triton loads its config (no
batch dim, whole-shape dims with a dynamic axis 0, no dynamic batcher, a whole-tensor warm-up sample) and answers
whole sets, directly and through the gateway in front of it, and fixed-shape singletons; a batch of sets is refused
with the gateway's 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from exporter import export
from services.tritonlocal import TritonInstall
from tests.triton.support import gateway_settings, local_gateway, local_triton
from tests.unbatched_models import ScaledSum, eager, set_example, set_pooler

pytestmark = pytest.mark.slow  # exports a model, a local Triton

MODEL = "sets"
TOLERANCE = 1e-5


def test_triton_loads_and_answers_whole_sets_when_the_export_has_no_batch_dim(
    install: TritonInstall, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    result = export(set_pooler(), set_example(), name=MODEL, repository=repository, max_batch_size=0,
                    dynamic_axes={"x": [0]})
    export(ScaledSum(), (torch.ones(3, 4), torch.tensor([2.0])), name="scaled", repository=repository,
           max_batch_size=0)  # fixed whole shapes, (1,) for one element
    x = set_example(9, seed=3).numpy()  # 9 items: the gate fed 5 to 7
    expected = eager(set_pooler(), x)
    outputs = [t.name for t in result.outputs]

    with local_triton(repository, tmp_path, install) as server, local_gateway(
        gateway_settings(server.grpc_url, repository)
    ) as gateway:
        assert server.model_states(MODEL) == {1: "READY"}
        for url in (server.grpc_url, gateway.grpc_url):  # Triton itself, then the gateway in front of it
            with grpcclient.InferenceServerClient(url) as client:
                assert client.get_model_config(MODEL, as_json=True)["config"].get("max_batch_size", 0) == 0
                tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                answer = client.infer(MODEL, [tensor])
            for name, want in zip(outputs, expected, strict=True):
                got = answer.as_numpy(name)
                assert got.shape == want.shape, (url, name)
                np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE, err_msg=f"{url}:{name}")

        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            matrix, factor = grpcclient.InferInput("x", [3, 4], "FP32"), grpcclient.InferInput("t", [1], "FP32")
            matrix.set_data_from_numpy(np.ones((3, 4), np.float32))
            factor.set_data_from_numpy(np.array([0.5], np.float32))
            np.testing.assert_allclose(client.infer("scaled", [matrix, factor]).as_numpy("output"), [6.0])

        batch_of_sets = {"inputs": [{"name": "x", "shape": [2, 9, 4], "datatype": "FP32", "data": [0.0] * 72}]}
        refused = httpx.post(f"http://{gateway.http_url}/v2/models/{MODEL}/infer", json=batch_of_sets, timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == ("unexpected shape for input 'x' for model 'sets'. Expected [-1,4], got "
                                           "[2,9,4]")
