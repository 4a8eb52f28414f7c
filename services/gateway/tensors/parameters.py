"""Request, input and output parameters: the ones the gateway reads, and the rule for every other one.

The codecs take the parameters the gateway implements (deadlines, priority, binary data, shared memory,
classification) and keep the rest of a request's parameters in ``InferRequest.parameters``. Those are never dropped
in silence: a backend that hands them to the model (Triton: its models read request parameters, and its sequence
batcher the sequence ones) gets them; otherwise the request is refused naming them. An input or output parameter
the gateway does not know is refused at once: no backend has a use for it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.gateway.errors import InvalidInput, shown
from services.gateway.tensors.shared_memory import KEYS

SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
"""Triton's sequence batching parameters: the correlation id and the flags that start and end a sequence."""
REQUEST_READ = ("timeout", "priority")
"""Request parameters every front end applies itself (HTTP adds ``binary_data_output``)."""
INPUT_HTTP = ("binary_data_size", *KEYS)
INPUT_GRPC = INPUT_HTTP
"""KServe's gRPC client names a raw input's size as HTTP does (the codec checks it against the bytes)."""
OUTPUT_HTTP = ("binary_data", "classification", *KEYS)
OUTPUT_GRPC = OUTPUT_HTTP
"""``binary_data`` too (KServe's client sends it): a gRPC answer's outputs are always raw bytes."""
Scalar = bool | int | float | str


def check_tensor_parameters(kind: str, tensor: str, names: Iterable[str], known: tuple[str, ...]) -> None:
    """Refuse an input or output parameter the gateway does not implement, naming it and those it does."""
    for name in names:
        if name not in known:
            raise InvalidInput(
                f"{kind} '{tensor}': parameter {shown(name)} is not supported; {kind} parameters are "
                f"{', '.join(known)}"
            )


def scalar(name: str, value: object) -> Scalar:
    """A request parameter's value as the protocol allows one: a boolean, an integer, a number or a string."""
    if isinstance(value, bool | int | float | str):
        return value
    raise InvalidInput(
        f"parameter {shown(name)} must be a boolean, an integer, a number or a string, got {_json_kind(value)}"
    )


def _json_kind(value: object) -> str:
    """What a decoded JSON value that is none of the scalars is, in JSON's words (not Python's ``NoneType``)."""
    if value is None:
        return "null"
    return "a JSON array" if isinstance(value, list) else "a JSON object"


def check_request_parameters(
    parameters: Mapping[str, Any], model: str, *, forwarded: bool, sequence_batching: bool, backend: str
) -> None:
    """Refuse the request parameters the model cannot be given: sequence ones unless the model has a sequence
    batcher (and a backend that has one), any other unless the backend passes them to the model."""
    sequence = [name for name in SEQUENCE if name in parameters]
    if sequence and not (forwarded and sequence_batching):
        why = (
            "its config has no sequence_batching" if forwarded
            else f"the {backend} backend has no sequence batcher (serve sequence models through Triton)"
        )
        named = ", ".join(f"'{name}'" for name in sequence)
        raise InvalidInput(f"sequence parameter(s) {named} not supported for model '{model}': {why}")
    for name in parameters:
        if name not in SEQUENCE and not forwarded:
            raise InvalidInput(
                f"parameter {shown(name)} is not supported for model '{model}': the {backend} backend has no way to "
                f"pass request parameters to a model; the gateway reads {', '.join(REQUEST_READ)} "
                "(and binary_data_output over HTTP)"
            )
