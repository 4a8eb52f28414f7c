"""Validation against model metadata, including models without a batch dim and dynamic dims."""

from __future__ import annotations

import numpy as np
import pytest

from services.gateway.errors import InvalidInput
from services.gateway.tensors.types import InferInput, InferRequest, ModelMetadata, TensorSpec
from services.gateway.tensors.validation import validate

BATCHED = ModelMetadata(
    "seq", (1,), "onnxruntime_onnx", 4, (TensorSpec("tokens", "INT64", (-1,)), TensorSpec("mask", "INT64", (-1,))), ()
)
UNBATCHED = ModelMetadata("fixed", (1,), "onnxruntime_onnx", 0, (TensorSpec("x", "FP32", (2, 3)),), ())


def _request(*tensors: tuple[str, str, tuple[int, ...]]) -> InferRequest:
    inputs = [InferInput(n, d, s, np.zeros(s)) for n, d, s in tensors]
    return InferRequest("m", None, inputs)


def test_validate_accepts_dynamic_dims_when_shapes_fit() -> None:
    validate(_request(("tokens", "INT64", (2, 7)), ("mask", "INT64", (2, 7))), BATCHED)
    validate(_request(("x", "FP32", (2, 3))), UNBATCHED)


@pytest.mark.parametrize(
    ("request_", "metadata", "message"),
    [
        (
            _request(("tokens", "INT64", (2, 7)), ("mask", "INT64", (3, 7))),
            BATCHED,
            "input 'mask' batch size does not match other inputs for 'seq'; got batch sizes [2, 3]",
        ),
        (
            _request(("tokens", "INT64", (2, 7)), ("tokens", "INT64", (2, 7))),
            BATCHED,
            "input 'tokens' already exists in request",
        ),
        (_request(("tokens", "INT64", (0, 7)), ("mask", "INT64", (0, 7))), BATCHED,
         "inference request batch-size must be >= 1 for 'seq'; input 'tokens' has 0 rows"),
        (_request(("x", "FP32", (1, 2, 3))), UNBATCHED,
         "unexpected shape for input 'x' for model 'fixed'. Expected [2,3], got [1,2,3]"),
        (_request(("x", "FP32", (3, 2))), UNBATCHED,
         "unexpected shape for input 'x' for model 'fixed'. Expected [2,3], got [3,2]"),
    ],
    ids=["batch-disagrees", "duplicate", "empty-batch", "extra-batch-dim", "transposed"],
)
def test_validate_raises_naming_tensor_when_input_wrong(
    request_: InferRequest, metadata: ModelMetadata, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        validate(request_, metadata)
    assert str(caught.value).startswith(message)
