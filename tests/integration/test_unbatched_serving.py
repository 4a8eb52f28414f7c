"""An export without a batch dim (``max_batch_size=0``) served by the gateway's embedded backend on real ports: a
client sends the whole tensor (any length of a declared dynamic axis) and gets eager PyTorch's answer, requests of
different shapes in flight at once each get their own, and a shape the config does not declare gets the 400 every
other model gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from exporter import export
from exporter.specs import Format
from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.unbatched_models import FEATURES, ScaledSum, eager, set_example, set_pooler

pytestmark = pytest.mark.slow  # exports models, a gateway on real ports

Array = npt.NDArray[Any]
FORMATS: tuple[Format, ...] = ("onnx", "torchscript")
TOLERANCE = 1e-5


class Served(NamedTuple):
    repository: Path
    inputs: dict[str, list[str]]
    """Per served model, its served input names in order."""
    outputs: dict[str, list[str]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    root = tmp_path_factory.mktemp("unbatched")
    inputs, outputs = {}, {}
    for fmt in FORMATS:
        result = export(set_pooler(), set_example(), name=f"sets_{fmt}", repository=root, format=fmt,
                        max_batch_size=0, dynamic_axes={"x": [0]})
        inputs[result.name] = [t.name for t in result.inputs]
        outputs[result.name] = [t.name for t in result.outputs]
    result = export(ScaledSum(), (torch.ones(3, 4), torch.tensor([2.0])), name="scaled", repository=root,
                    max_batch_size=0)
    inputs["scaled"] = [t.name for t in result.inputs]
    outputs["scaled"] = [t.name for t in result.outputs]
    return Served(root, inputs, outputs)


@pytest.fixture(scope="module")
def gateway(served: Served) -> Iterator[RunningGateway]:
    with running_gateway(Settings(repository=served.repository, port=0, grpc_port=0)) as running:
        yield running


def items(count: int, seed: int) -> Array:
    return set_example(count, seed).numpy()


def infer(client_module: ModuleType, url: str, model: str, names: list[str], arrays: list[Array]) -> Any:
    """One request through ``tritonclient.http`` or ``tritonclient.grpc`` (the same calls in both)."""
    client = client_module.InferenceServerClient(url)
    try:
        tensors = []
        for name, array in zip(names, arrays, strict=True):
            tensor = client_module.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return client.infer(model, tensors)
    finally:
        client.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_gateway_answers_whole_sets_like_eager_pytorch_when_exported_without_batch_dim(
    served: Served, gateway: RunningGateway, fmt: Format
) -> None:
    model = f"sets_{fmt}"
    x = items(11, seed=7)  # 11 items: a length the parity gate never fed (it grew 5 to 7)
    expected = eager(set_pooler(), x)

    for client_module, url in ((httpclient, gateway.http_url), (grpcclient, gateway.grpc_url)):
        result = infer(client_module, url, model, served.inputs[model], [x])
        for name, want in zip(served.outputs[model], expected, strict=True):
            got = result.as_numpy(name)
            assert got.shape == want.shape, name  # (3,) pooled and (11,) weights: no batch dim added or dropped
            np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE, err_msg=f"{model}:{name}")


def test_gateway_answers_each_set_on_its_own_when_sets_of_several_sizes_arrive_together(
    served: Served, gateway: RunningGateway
) -> None:
    model = "sets_onnx"
    sets = [items(count, seed=count) for count in (1, 3, 9, 3)]
    client = httpclient.InferenceServerClient(gateway.http_url, concurrency=len(sets))
    try:
        pending = []
        for x in sets:
            tensor = httpclient.InferInput(served.inputs[model][0], list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            pending.append(client.async_infer(model, [tensor]))
        results = [request.get_result() for request in pending]
    finally:
        client.close()

    pooler = set_pooler()
    for x, result in zip(sets, results, strict=True):
        for name, want in zip(served.outputs[model], eager(pooler, x), strict=True):
            np.testing.assert_allclose(result.as_numpy(name), want, atol=TOLERANCE, rtol=TOLERANCE)


def test_gateway_answers_fixed_shapes_when_exported_without_batch_dim(served: Served, gateway: RunningGateway) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = np.array([0.5], np.float32)

    result = infer(grpcclient, gateway.grpc_url, "scaled", served.inputs["scaled"], [x, t])

    answer = result.as_numpy(served.outputs["scaled"][0])
    assert answer.shape == (1,)
    np.testing.assert_allclose(answer, eager(ScaledSum(), x, t)[0], rtol=TOLERANCE)


@pytest.mark.parametrize(
    ("model", "shapes", "expected", "got"),
    [
        ("sets_onnx", [[2, 6, FEATURES]], "[-1,4]", "[2,6,4]"),  # a batch of sets: the model takes one set
        ("sets_torchscript", [[6, FEATURES + 1]], "[-1,4]", "[6,5]"),
        ("scaled", [[1, 3, 4], [1]], "[3,4]", "[1,3,4]"),  # a batch dim added to a fixed shape
    ],
)
def test_gateway_refuses_a_shape_the_config_does_not_declare_with_400_when_the_model_has_no_batch_dim(
    served: Served, gateway: RunningGateway, model: str, shapes: list[list[int]], expected: str, got: str
) -> None:
    inputs = [{"name": name, "shape": shape, "datatype": "FP32", "data": [0.0] * int(np.prod(shape))}
              for name, shape in zip(served.inputs[model], shapes, strict=True)]

    answer = httpx.post(f"http://{gateway.http_url}/v2/models/{model}/infer", json={"inputs": inputs}, timeout=30)

    assert answer.status_code == 400, answer.text
    name = served.inputs[model][0]
    assert answer.json()["error"] == (f"unexpected shape for input '{name}' for model '{model}'. Expected {expected}, "
                                      f"got {got}")
