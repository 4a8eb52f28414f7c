"""Checks a decoded request against the model metadata before it reaches a backend."""

from __future__ import annotations

from services.gateway.errors import InvalidInput
from services.gateway.types import InferRequest, ModelMetadata, TensorSpec


def validate(request: InferRequest, metadata: ModelMetadata) -> None:
    """Raise ``InvalidInput`` naming the tensor, with what was expected and what came."""
    specs = {spec.name: spec for spec in metadata.inputs}
    seen: set[str] = set()
    for tensor in request.inputs:
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"unexpected input '{tensor.name}' for model '{metadata.name}'; expected inputs: {_names(specs)}"
            )
        if tensor.name in seen:
            raise InvalidInput(f"input '{tensor.name}' is given more than once")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidInput(f"input '{tensor.name}': expected datatype {spec.datatype}, got {tensor.datatype}")
        _check_shape(tensor.name, tensor.shape, spec, metadata)
    missing = [name for name in specs if name not in seen]
    if missing:
        raise InvalidInput(f"missing input(s) {', '.join(repr(m) for m in missing)} for model '{metadata.name}'")
    if metadata.max_batch_size > 0:
        batches = {tensor.shape[0] for tensor in request.inputs}
        if len(batches) > 1:
            raise InvalidInput(f"inputs disagree on the batch size: got {sorted(batches)}")
    if request.outputs is not None:
        known = {spec.name for spec in metadata.outputs}
        for name in request.outputs:
            if name not in known:
                raise InvalidInput(
                    f"unknown output '{name}' requested from model '{metadata.name}'; "
                    f"expected outputs: {', '.join(sorted(known))}"
                )


def _check_shape(name: str, shape: tuple[int, ...], spec: TensorSpec, metadata: ModelMetadata) -> None:
    expected = metadata.served_shape(spec)
    dims = shape
    if metadata.max_batch_size > 0:
        if len(shape) != len(spec.dims) + 1:
            raise InvalidInput(f"input '{name}': expected shape {expected}, got {list(shape)}")
        if shape[0] < 1 or shape[0] > metadata.max_batch_size:
            raise InvalidInput(
                f"input '{name}': batch size {shape[0]} is outside 1..{metadata.max_batch_size} "
                f"(max_batch_size of model '{metadata.name}')"
            )
        dims = shape[1:]
    if len(dims) != len(spec.dims) or any(want not in (-1, got) for want, got in zip(spec.dims, dims, strict=True)):
        raise InvalidInput(f"input '{name}': expected shape {expected}, got {list(shape)}")


def _names(specs: dict[str, TensorSpec]) -> str:
    return ", ".join(repr(name) for name in specs)
