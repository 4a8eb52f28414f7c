"""Checks a decoded request against the model metadata before it reaches a backend."""

from __future__ import annotations

from collections.abc import Mapping
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
                f"unexpected input '{tensor.name}' for model '{metadata.name}'; expected inputs: {_names(specs)}"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidInput(f"input '{tensor.name}': expected datatype {spec.datatype}, got {tensor.datatype}")
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
                    f"unknown output '{name}' requested from model '{metadata.name}'; "
                    f"expected outputs: {', '.join(sorted(known))}"
                )


def _check_names(inputs: list[InferInput], metadata: ModelMetadata) -> None:
    """Each input given once, none missing, one batch size for all (each input's own checks passed)."""
    seen: set[str] = set()
    for tensor in inputs:
        if tensor.name in seen:
            raise InvalidInput(f"input '{tensor.name}' is given more than once")
        seen.add(tensor.name)
    missing = [name for name in metadata.input_specs if name not in seen]
    if missing:
        raise InvalidInput(f"missing input(s) {', '.join(repr(m) for m in missing)} for model '{metadata.name}'")
    if metadata.max_batch_size > 0:
        batches = {tensor.shape[0] for tensor in inputs}
        if len(batches) > 1:
            raise InvalidInput(f"inputs disagree on the batch size: got {sorted(batches)}")


def _check_shape(tensor: InferInput, spec: TensorSpec, metadata: ModelMetadata, batching: bool) -> None:
    shape = tensor.shape
    dims = spec.dims
    if batching:
        if len(shape) != len(dims) + 1:
            _wrong_shape(tensor, spec, metadata)
        if shape[0] < 1 or shape[0] > metadata.max_batch_size:
            raise InvalidInput(
                f"input '{tensor.name}': batch size {shape[0]} is outside 1..{metadata.max_batch_size} "
                f"(max_batch_size of model '{metadata.name}')"
            )
        shape = shape[1:]
    if len(shape) != len(dims):
        _wrong_shape(tensor, spec, metadata)
    for want, got in zip(dims, shape, strict=True):
        if want != got and want != -1:
            _wrong_shape(tensor, spec, metadata)


def _wrong_shape(tensor: InferInput, spec: TensorSpec, metadata: ModelMetadata) -> NoReturn:
    raise InvalidInput(f"input '{tensor.name}': expected shape {metadata.served_shape(spec)}, got {list(tensor.shape)}")


def _names(specs: Mapping[str, TensorSpec]) -> str:
    return ", ".join(repr(name) for name in specs)
