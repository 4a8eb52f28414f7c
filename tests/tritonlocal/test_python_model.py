"""The generic python-backend model, run in this process against a stand-in for Triton's ``pb_utils``.

The server tests cover it inside real Triton; here each batching and error path is driven on purpose,
since Triton's own input checks keep most bad requests from ever reaching it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.tritonlocal.derive import derive_config
from tests.tritonlocal.support import Array, Reference, sample

pytestmark = pytest.mark.slow  # a local Triton


class Tensor:
    def __init__(self, name: str, array: Array) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Array:
        return self._array


class Request:
    def __init__(self, **arrays: Array) -> None:
        self._inputs = [Tensor(name, array) for name, array in arrays.items()]

    def inputs(self) -> list[Tensor]:
        return self._inputs


class TritonError:
    def __init__(self, message: str) -> None:
        self.message = message


class Response:
    def __init__(self, output_tensors: Sequence[Tensor], error: TritonError | None = None) -> None:
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


def _input_by_name(request: Request, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


@pytest.fixture
def python_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = Tensor  # type: ignore[attr-defined]
    fake.InferenceResponse = Response  # type: ignore[attr-defined]
    fake.TritonError = TritonError  # type: ignore[attr-defined]
    fake.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    fake.get_input_tensor_by_name = _input_by_name  # type: ignore[attr-defined]
    fake.triton_string_to_numpy = {"TYPE_FP32": np.float32}.__getitem__  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "services.tritonlocal.python_model", raising=False)
    yield importlib.import_module("services.tritonlocal.python_model")
    sys.modules.pop("services.tritonlocal.python_model", None)


def initialize(python_model: types.ModuleType, repository: Path, model: str, version: int) -> tuple[Any, list[int]]:
    """The model as Triton would set it up, plus a list that records the rows of every runtime call."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = derive_config(text_format.Parse((repository / model / "config.pbtxt").read_text(), mc.ModelConfig()))
    instance = python_model.TritonPythonModel()
    instance.initialize({
        "model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
        "model_repository": str(repository / model),
        "model_version": str(version),
    })
    calls: list[int] = []
    run = instance.run

    def counting(arrays: Sequence[Array]) -> list[Array]:
        calls.append(arrays[0].shape[0])
        return list(run(arrays))

    instance.run = counting
    return instance, calls


def test_execute_runs_once_and_splits_rows_back_when_requests_share_a_shape(
    python_model: types.ModuleType, repository: Path, reference: Reference
) -> None:
    model, calls = initialize(python_model, repository, "mlp", 1)
    inputs = [sample("mlp", rows=rows, seed=rows) for rows in (1, 3, 2)]
    responses = model.execute([Request(**x) for x in inputs])
    assert calls == [6]
    for x, response in zip(inputs, responses, strict=True):
        assert response.error is None
        expected = reference("mlp", 1, x)
        for name in ("logits", "probabilities"):
            np.testing.assert_allclose(response.outputs[name], expected[name], rtol=1e-6, atol=1e-7)


def test_execute_answers_only_the_bad_request_with_an_error_when_its_dtype_is_wrong(
    python_model: types.ModuleType, repository: Path
) -> None:
    model, calls = initialize(python_model, repository, "mlp", 2)
    good = sample("mlp", rows=2)
    responses = model.execute([Request(**good), Request(features=good["features"].astype(np.float64)), Request()])
    assert responses[0].error is None
    assert responses[0].outputs["logits"].shape == (2, 8)
    assert "dtype float64" in responses[1].error.message
    assert "'features' is missing" in responses[2].error.message
    assert calls == [2]


def test_execute_isolates_runtime_failures_when_requests_cannot_run(
    python_model: types.ModuleType, repository: Path
) -> None:
    model, calls = initialize(python_model, repository, "mlp", 1)
    narrow = np.zeros((1, 31), dtype=np.float32)  # mlp takes 32 features: onnxruntime refuses these rows
    good = sample("mlp", rows=1)
    responses = model.execute([Request(**good), Request(features=narrow), Request(features=narrow)])
    assert responses[0].error is None
    assert [r.error is not None for r in responses[1:]] == [True, True]
    assert "inference failed" in responses[1].error.message
    assert sorted(calls) == [1, 1, 1, 2]  # the failing group of two, then each of its members alone


def test_execute_runs_torchscript_when_the_version_holds_model_pt(
    python_model: types.ModuleType, repository: Path
) -> None:
    import torch

    model, calls = initialize(python_model, repository, "mlp_ts", 1)
    name = model.inputs[0][0]  # the exporter's INPUT__0
    features = [sample("mlp", rows=rows, seed=rows)["features"] for rows in (2, 1)]
    responses = model.execute([Request(**{name: f}) for f in features])
    assert calls == [3]
    module = torch.jit.load(str(repository / "mlp_ts" / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    for f, response in zip(features, responses, strict=True):
        with torch.inference_mode():
            expected = [t.numpy() for t in module(torch.from_numpy(f))]
        got = [response.outputs[output] for output, _ in model.outputs]
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
