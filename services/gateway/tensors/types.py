"""Protocol-neutral request, response and metadata types shared by the front ends, dataplane and backends."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy.typing as npt

from services.gateway.tensors.shared_memory import RegionSlice

Array = npt.NDArray[Any]
NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})
"""Shared by the requests that carry none (read-only: nothing can add to it)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output; ``dims`` exclude the batch dim (as in ``config.pbtxt``), -1 is dynamic."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[int, ...]
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_specs: Mapping[str, TensorSpec] = field(init=False, repr=False, compare=False)
    """``inputs`` by name, built once: every request is validated against it."""
    output_names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_specs", {spec.name: spec for spec in self.inputs})
        object.__setattr__(self, "output_names", frozenset(spec.name for spec in self.outputs))

    def served_shape(self, spec: TensorSpec) -> list[int]:
        """The shape as the v2 metadata endpoints report it: batch dim -1 first when the model batches."""
        return [-1, *spec.dims] if self.max_batch_size > 0 else list(spec.dims)


class Quota(Protocol):
    """A share the request holds while the dataplane serves it (an API key's requests in flight)."""

    def take(self) -> None:
        """Raises the refusal (a ``GatewayError``) when the share is used up."""

    def give_back(self) -> None: ...


class VersionState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(slots=True)
class InferInput:
    """A decoded input: ``data`` already has ``shape`` and the numpy dtype of ``datatype``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array
    region: RegionSlice | None = None
    """Where ``data`` lies when the client sent it in shared memory (``data`` is a view of it)."""


@dataclass(slots=True)
class InferRequest:
    model: str
    version: int | None
    """``None`` means "whichever version the gateway routes to" (the highest loaded one for now)."""
    inputs: list[InferInput]
    id: str = ""
    outputs: tuple[str, ...] | None = None
    """Requested output names, in the order to return them; ``None`` asks for all of them."""
    timeout_s: float | None = None
    """The v2 ``timeout`` parameter (seconds), as the client sent it; ``budget_s`` is what the gateway applies."""
    priority: int = 0
    """The v2 ``priority`` parameter as decoded; the front end replaces it with the rank the gateway applies
    (1 highest .. ``priority_levels``)."""
    budget_s: float | None = None
    """The request's whole deadline budget in seconds (from every place it names one, or the default)."""
    deadline: float | None = None
    """``time.monotonic()`` at which the budget runs out; the backend receives what is left of it."""
    tenant: str = "anonymous"
    """Who sent it (the API key's tenant), for metrics; never the key."""
    parameters: Mapping[str, Any] = field(default_factory=lambda: NO_PARAMETERS)
    """Request parameters the front end did not apply itself (custom ones, sequence batching): the dataplane
    refuses those the backend cannot hand to the model (``tensors.parameters``)."""
    classification: Mapping[str, int] = field(default_factory=lambda: NO_PARAMETERS)
    """Requested outputs to answer as their top k classes (the classification extension), by name."""
    output_regions: Mapping[str, RegionSlice] = field(default_factory=dict)
    """Requested outputs the client wants written into its shared memory, by name."""
    quota: Quota | None = None
    """The API key's requests-in-flight share (``concurrency`` in the keys file), taken while it is served."""
    routed: int | None = None
    """The version the dataplane routed it to, once routed: a request given up is counted against it."""

    def counted_version(self) -> int | None:
        """The version a request given up (a cancelled call, a closed connection) is counted against: the one the
        dataplane routed it to, once it was (an unversioned request names none)."""
        return self.version if self.routed is None else self.routed


@dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    data: Array
    raw: bytes | None = None
    """``data``'s bytes as the backend received them, when it has them (Triton): front ends send these as they
    are instead of serialising ``data`` again."""
    region: RegionSlice | None = None
    """Set once the output lies in the client's shared memory: the response names the slice instead of data."""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape  # numpy's shape is a tuple of Python ints already


@dataclass(slots=True)
class InferResponse:
    model: str
    version: int
    outputs: list[InferOutput]
    id: str = ""
    final: bool = True
    """The last response to its request: always, but for a decoupled model's (Triton's ``triton_final_response``),
    which may send several, and an empty final one."""
