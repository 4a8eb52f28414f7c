"""Checks a decoded request against the model metadata before it reaches a backend. Each error starts with the
words Triton answers for the same mistake (clients match on them), then says what was expected."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

from services.gateway.errors import InvalidInput
from services.gateway.tensors.types import InferInput, InferRequest, ModelMetadata, TensorSpec


def validate(request: InferRequest, metadata: ModelMetadata) -> None:
    """Raise ``InvalidInput`` naming the tensor, with what was expected and what came."""
    specs = metadata.input_specs
    inputs = request.inputs
    largest = metadata.max_batch_size
    batching = largest > 0
    for tensor in inputs:
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"unexpected inference input '{tensor.name}' for model '{metadata.name}'; "
                f"expected inputs: {_names(specs)}"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model '{metadata.name}' "
                f"expects '{spec.datatype}'"
            )
        shape = tensor.shape
        # The dims as declared (no -1 among them) and a batch in range pass at once; anything else is checked
        # dim by dim, which also words the error.
        if (shape[1:] != spec.dims or not 0 < shape[0] <= largest) if batching else shape != spec.dims:
            _check_shape(tensor, spec, metadata, batching)
    if len(inputs) != len(specs) or len(inputs) > 1:
        _check_names(inputs, metadata)
    if request.outputs is not None:
        known = metadata.output_names
        for name in request.outputs:
            if name not in known:
                raise InvalidInput(
                    f"unexpected inference output '{name}' for model '{metadata.name}'; "
                    f"expected outputs: {', '.join(sorted(known))}"
                )


def _check_names(inputs: list[InferInput], metadata: ModelMetadata) -> None:
    """Each input given once, none missing, one batch size for all (each input's own checks passed)."""
    seen: set[str] = set()
    for tensor in inputs:
        if tensor.name in seen:
            raise InvalidInput(f"input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
    missing = [name for name in metadata.input_specs if name not in seen]
    if missing:
        raise InvalidInput(
            f"expected {len(metadata.input_specs)} inputs but got {len(inputs)} inputs for model '{metadata.name}'. "
            f"Got input(s) {_listed(t.name for t in inputs)}, but missing required input(s) {_listed(missing)}"
        )
    if metadata.max_batch_size > 0 and inputs:
        first = inputs[0].shape[0]
        for tensor in inputs:
            if tensor.shape[0] != first:
                raise InvalidInput(
                    f"input '{tensor.name}' batch size does not match other inputs for '{metadata.name}'; "
                    f"got batch sizes {sorted({t.shape[0] for t in inputs})}"
                )


def _check_shape(tensor: InferInput, spec: TensorSpec, metadata: ModelMetadata, batching: bool) -> None:
    shape = tensor.shape
    dims = spec.dims
    if batching:
        if len(shape) != len(dims) + 1:
            _wrong_shape(tensor, spec, metadata)
        if shape[0] > metadata.max_batch_size:
            raise InvalidInput(
                f"inference request batch-size must be <= {metadata.max_batch_size} for '{metadata.name}'; "
                f"input '{tensor.name}' has {shape[0]} rows"
            )
        if shape[0] < 1:
            raise InvalidInput(
                f"inference request batch-size must be >= 1 for '{metadata.name}'; input '{tensor.name}' has 0 rows"
            )
        shape = shape[1:]
    if len(shape) != len(dims):
        _wrong_shape(tensor, spec, metadata)
    for want, got in zip(dims, shape, strict=True):
        if want != got and want != -1:
            _wrong_shape(tensor, spec, metadata)


def _wrong_shape(tensor: InferInput, spec: TensorSpec, metadata: ModelMetadata) -> NoReturn:
    batching = (
        f"; model '{metadata.name}' batches (max_batch_size {metadata.max_batch_size}): the first dimension is the "
        "batch size"
        if metadata.max_batch_size > 0
        else ""
    )
    raise InvalidInput(
        f"unexpected shape for input '{tensor.name}' for model '{metadata.name}'. "
        f"Expected {_dims(metadata.served_shape(spec))}, got {_dims(tensor.shape)}{batching}"
    )


def _dims(shape: Sequence[int]) -> str:
    """A shape as Triton prints one: ``[-1,32]``."""
    return f"[{','.join(str(d) for d in shape)}]"


def _listed(names: Iterable[str]) -> str:
    """Tensor names as Triton lists them: ``['a', 'b']``."""
    return f"[{', '.join(repr(name) for name in names)}]"


def _names(specs: Mapping[str, TensorSpec]) -> str:
    return ", ".join(repr(name) for name in specs)
