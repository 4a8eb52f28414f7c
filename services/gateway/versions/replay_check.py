"""An activation's replay check: the newest logged requests of a model, run again on the version about to become
stable, their answers compared with the logged ones (``services/inferlog/compare.py``). It runs after the warm-up
and before the flip; a version that answers differently, or a log the gateway cannot read, is refused (422) with
the report in the answer, and the routing does not change.

The requests go straight to the backend, as the warm-up's do (validated against the version's metadata first): they
are the gateway's own, so they pass no admission step and feed no canary window, shadow or inference log."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

from services.gateway.backends.base import Backend
from services.gateway.errors import GatewayError, InvalidInput
from services.gateway.tensors.types import InferInput, InferRequest, ModelMetadata
from services.gateway.tensors.validation import validate
from services.inferlog.compare import Answer, ReplayReport, resendable
from services.inferlog.format import RecordError, inputs_of
from services.inferlog.sources import SourceError, read_records

DEFAULT_LIMIT = 200
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
MOST_RECORDS = 10_000
"""The largest ``limit`` an activation takes: the check holds the model's action lock while it runs."""
REPLAY_ID = "switchyard-replay"


class ReplayRefused(GatewayError):
    """The replay check refused the version: answers differ, or the log cannot be read. ``report`` (when the
    requests ran) is the comparison's JSON, which the action's failure answer carries."""

    status = 422

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class ReplayOptions:
    """An activation's ``verify_replay`` option."""

    source: str
    limit: int = DEFAULT_LIMIT
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL

    @classmethod
    def from_json(cls, value: object) -> ReplayOptions:
        """``{"source": str, "limit"?: int, "atol"?: float, "rtol"?: float}``; ``InvalidInput`` naming what is wrong."""
        expected = 'an object {"source": str, "limit"?: int, "atol"?: number, "rtol"?: number}'
        if not isinstance(value, dict):
            raise InvalidInput(f"option 'verify_replay' must be {expected}, got {type(value).__name__}")
        unknown = sorted(set(value) - {"source", "limit", "atol", "rtol"})
        if unknown:
            raise InvalidInput(f"option 'verify_replay' has unknown field(s) {', '.join(unknown)}; expected {expected}")
        source = value.get("source")
        if not isinstance(source, str) or not source:
            raise InvalidInput("option 'verify_replay' needs 'source': the inference log's directory or redis:// URL")
        limit = value.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MOST_RECORDS:
            raise InvalidInput(f"'verify_replay.limit' must be a whole number from 1 to {MOST_RECORDS}, got {limit!r}")
        return cls(source, limit, _tolerance(value, "atol", DEFAULT_ATOL), _tolerance(value, "rtol", DEFAULT_RTOL))


def _tolerance(value: dict[str, Any], name: str, default: float) -> float:
    given = value.get(name, default)
    if isinstance(given, bool) or not isinstance(given, int | float) or not math.isfinite(given) or given < 0:
        raise InvalidInput(f"'verify_replay.{name}' must be a finite number of 0 or more, got {given!r}")
    return float(given)


async def replay_check(
    backend: Backend,
    model: str,
    version: int,
    source: str,
    *,
    limit: int = DEFAULT_LIMIT,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    timeout_s: float,
) -> ReplayReport:
    """The newest ``limit`` records of ``model`` in ``source`` run on ``version`` and compared with their logged
    answers. ``ReplayRefused`` when the log cannot be read or holds no record of the model."""
    records = await _newest_records(model, source, limit)
    metadata = await backend.metadata(model, version)
    report = ReplayReport(model, version, atol, rtol, source=source)
    for record in records:
        why_not = resendable(record)
        if why_not is not None:
            report.skip(why_not)
            continue
        report.add(record, await _answer(backend, metadata, model, version, record, timeout_s))
    return report


async def _newest_records(model: str, source: str, limit: int) -> list[dict[str, Any]]:
    try:
        # Files and Redis are read with blocking calls: off the event loop, which serves traffic meanwhile.
        records = await asyncio.to_thread(lambda: list(read_records(source, model=model, limit=limit, newest=True)))
    except (SourceError, RecordError) as exc:
        raise ReplayRefused(f"the replay source cannot be read: {exc}") from None
    if not records:
        raise ReplayRefused(f"the replay source {source} holds no record of model '{model}'; nothing to compare")
    return records


async def _answer(
    backend: Backend, metadata: ModelMetadata, model: str, version: int, record: dict[str, Any], timeout_s: float
) -> Answer:
    """The record's request sent again to ``version``: its status as the gateway would answer it, never raising."""
    requested = record["request"].get("outputs")
    inputs = [InferInput(name, datatype, tuple(array.shape), array) for name, datatype, array in inputs_of(record)]
    request = InferRequest(
        model, version, inputs, id=REPLAY_ID, outputs=tuple(requested) if isinstance(requested, list) else None
    )
    started = time.perf_counter()
    try:
        validate(request, metadata)
        async with asyncio.timeout(timeout_s):
            response = await backend.infer(request, version=version, timeout_s=timeout_s, priority=0)
    except TimeoutError:
        return Answer(504, {}, _since(started), f"no answer within {timeout_s:g} s")
    except GatewayError as exc:
        return Answer(exc.status, {}, _since(started), str(exc))
    outputs = {output.name: output.data for output in response.outputs}
    if request.outputs is not None:
        outputs = {name: value for name, value in outputs.items() if name in request.outputs}
    return Answer(200, outputs, _since(started))


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def refusal(report: ReplayReport) -> ReplayRefused | None:
    """The error that refuses the flip for a failing report; ``None`` when it passed."""
    if report.passed:
        return None
    data = report.to_json()
    if report.compared + report.status_only == 0:
        why = f"none of the {report.records} logged requests could be sent again (see 'skipped')"
    else:
        why = (
            f"{report.failures} of {report.compared + report.status_only} logged answers differed "
            f"({report.differing} beyond atol {report.atol:g} / rtol {report.rtol:g}, "
            f"{len(report.status_mismatches)} with another status)"
        )
    return ReplayRefused(f"replay check failed: {why}; the report is in this answer's 'replay' field", data)
