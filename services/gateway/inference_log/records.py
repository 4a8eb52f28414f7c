"""From what the data plane saw of one request (an ``Exchange``) to its inference-log record (the JSON form of
``services/inferlog/format.py``).

The data plane builds an ``Exchange`` on the request path, where nothing is encoded; ``build_record`` runs later on
the writer's thread, so a large tensor costs the request nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

import orjson

from services.gateway.tensors.types import InferRequest, InferResponse
from services.inferlog.format import FORMAT, encode_tensor, hashed_tensor

Redaction = Literal["drop", "hash"]
"""What happens to a redacted input: ``drop`` leaves it out (named in the record's ``redacted``), ``hash`` keeps its
name, type and shape with a SHA-256 of its values."""
NO_REDACTION: Mapping[str, Redaction] = MappingProxyType({})


@dataclass(slots=True)
class Exchange:
    """One request and its outcome, as the data plane hands it to the inference log. The arrays are the gateway's
    own copies (shared-memory inputs are copied out at decode), so they stay valid after the answer is sent."""

    request: InferRequest
    response: InferResponse | None
    """``None`` when the request failed (``error`` says why)."""
    status: int
    """The HTTP status answered (gRPC answers map to the same codes)."""
    error: str | None
    version: int | None
    """The version served; ``None`` when the request failed before routing."""
    route: str | None
    """How it reached its version (``format.ROUTES``); ``None`` when it failed before routing."""
    protocol: str
    arrived: float
    """``time.time()`` when the request arrived."""
    latency_s: float
    request_id: str
    trace_id: str | None


@dataclass(frozen=True)
class LogPolicy:
    """A model's own inference-log settings (kept in its routing record)."""

    sample: float | None = None
    """The share of its requests to log, 0..1; ``None`` follows the gateway's global rate."""
    redact: Mapping[str, Redaction] = field(default_factory=lambda: NO_REDACTION)
    """Input names whose values must not reach the log, and how each is redacted."""

    def __post_init__(self) -> None:
        if self.sample is not None and not 0.0 <= self.sample <= 1.0:
            raise ValueError(f"an inference-log sample rate must be between 0 and 1, got {self.sample}")
        wrong = {name: how for name, how in self.redact.items() if how not in ("drop", "hash")}
        if wrong:
            raise ValueError(f"inference-log redaction {wrong} is not one of 'drop', 'hash' per input name")


def build_record(
    exchange: Exchange, *, redact: Mapping[str, Redaction], max_bytes: int, default_priority: int | None = None
) -> dict[str, Any]:
    """The exchange's record, redacted, its tensors' values dropped (largest first) until its JSON is at most
    ``max_bytes`` long; ids, status and shapes are always kept, so an oversized record is marked, never lost.
    ``default_priority``: the rank the gateway gives a request that names none (left out of the record)."""
    inputs, redacted = _request_inputs(exchange.request, redact)
    response = exchange.response
    record: dict[str, Any] = {
        "format": FORMAT,
        "id": exchange.request_id,
        "trace_id": exchange.trace_id,
        "time": _utc_text(exchange.arrived),
        "model": exchange.request.model,
        "version": exchange.version,
        "route": exchange.route,
        "protocol": exchange.protocol,
        "latency_ms": round(exchange.latency_s * 1000.0, 3),
        "status": exchange.status,
        "error": exchange.error,
        "truncated": False,
        "redacted": redacted,
        "request": {
            "inputs": inputs,
            "outputs": list(exchange.request.outputs) if exchange.request.outputs is not None else None,
            **_asked(exchange.request, default_priority),
        },
        "response": None if response is None else {
            "outputs": [encode_tensor(output.name, output.datatype, output.data) for output in response.outputs],
        },
    }
    _fit(record, max_bytes)
    return record


def _request_inputs(request: InferRequest, redact: Mapping[str, Redaction]) -> tuple[list[dict[str, Any]], list[str]]:
    """The encoded inputs and the names of those dropped."""
    encoded: list[dict[str, Any]] = []
    dropped: list[str] = []
    for tensor in request.inputs:
        how = redact.get(tensor.name)
        if how == "drop":
            dropped.append(tensor.name)
        elif how == "hash":
            encoded.append(hashed_tensor(tensor.name, tensor.datatype, tensor.data))
        else:
            encoded.append(encode_tensor(tensor.name, tensor.datatype, tensor.data))
    return encoded, dropped


def _asked(request: InferRequest, default_priority: int | None) -> dict[str, Any]:
    """What the request asked beyond its inputs and output names that changes its answer or its status, in the v2
    form a replay sends back (``format.parameters_of``, ``format.output_parameters_of``); only what it asked.

    ``timeout`` is the v2 parameter as sent (microseconds), ``priority`` the rank the gateway applied when it is not
    the default. ``binary_data`` is not kept: it changes how values travel, never which."""
    asked: dict[str, Any] = {}
    parameters = dict(request.parameters)
    if request.timeout_s is not None:
        parameters["timeout"] = round(request.timeout_s * 1e6)  # the decoders divided the integer by 1e6
    if request.priority and request.priority != default_priority:
        parameters["priority"] = request.priority
    if parameters:
        asked["parameters"] = parameters
    if request.classification:
        asked["output_parameters"] = {name: {"classification": count} for name, count in request.classification.items()}
    return asked


def _utc_text(timestamp: float) -> str:
    """ISO 8601 in UTC with microseconds and ``Z``: sorts as text in time order."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fit(record: dict[str, Any], max_bytes: int) -> None:
    """Drop tensor values, largest first, until the record's JSON fits ``max_bytes``. Sizes are measured once per
    tensor and subtracted; the whole record is measured again only when the estimate says it fits, so a record
    with many tensors costs a few serialisations, not one per tensor."""
    size = len(orjson.dumps(record))
    if size <= max_bytes:
        return
    record["truncated"] = True
    response = record["response"]
    tensors = [*record["request"]["inputs"], *(response["outputs"] if response is not None else [])]
    measured = [(len(orjson.dumps(tensor["data"])), tensor) for tensor in tensors if "data" in tensor]
    measured.sort(key=lambda pair: pair[0], reverse=True)
    for data_size, tensor in measured:
        del tensor["data"]
        tensor.pop("encoding", None)  # it described the values, which are gone
        tensor["truncated"] = True
        size -= data_size
        if size <= max_bytes and len(orjson.dumps(record)) <= max_bytes:
            return
