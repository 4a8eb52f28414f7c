"""An activation's replay check: the newest logged requests of a model, run again on the version about to become
stable, their answers compared with the logged ones (``services/inferlog/compare.py``). It runs after the warm-up
and before the flip; a version that answers differently, or a log the gateway cannot read, is refused (422) with
the report in the answer, and the routing does not change.

The requests go straight to the backend, as the warm-up's do (validated against the version's metadata first): they
are the gateway's own, so they pass no admission step and feed no canary window, shadow or inference log. What the
logged request asked beyond its inputs is applied as the data plane applies it (its ``timeout`` within the check's
own, its custom parameters refused when the model cannot take them, its outputs' class counts), so that a record
answers the same way here as through ``switchyard replay``."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.gateway.backends.base import Backend
from services.gateway.errors import DeadlineExceeded, GatewayError, InvalidInput
from services.gateway.tensors.classification import CLASSIFICATION, Labels, check_classes, classify, read_labels
from services.gateway.tensors.parameters import check_request_parameters
from services.gateway.tensors.types import InferInput, InferRequest, ModelMetadata
from services.gateway.tensors.validation import validate
from services.inferlog.compare import Answer, ReplayReport, resendable
from services.inferlog.format import RecordError, inputs_of, output_parameters_of, parameters_of
from services.inferlog.sources import SourceError, read_records, shown

log = logging.getLogger(__name__)

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
    model_dir: Path,
    limit: int = DEFAULT_LIMIT,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    timeout_s: float,
) -> ReplayReport:
    """The newest ``limit`` records of ``model`` in ``source`` run on ``version`` and compared with their logged
    answers. ``model_dir``: the model's folder, where its class labels are. ``ReplayRefused`` when the log cannot be
    read or holds no record of the model."""
    records = await _newest_records(model, source, limit)
    version_of = _Version(backend, model, version, await backend.metadata(model, version), model_dir)
    report = ReplayReport(model, version, atol, rtol, source=source)
    for record in records:
        why_not = resendable(record)
        if why_not is not None:
            report.skip(why_not)
            continue
        report.add(record, await _answer(version_of, record, timeout_s))
    return report


@dataclass
class _Version:
    """The version the check runs on, and what the data plane's steps read of it (once, when a record needs it)."""

    backend: Backend
    model: str
    number: int
    metadata: ModelMetadata
    model_dir: Path
    _labels: Labels | None = None

    async def sequence_batching(self) -> bool:
        return bool((await self.backend.config(self.model, self.number)).HasField("sequence_batching"))

    async def labels(self) -> Labels:
        if self._labels is None:
            config = await self.backend.config(self.model, self.number)
            self._labels = await asyncio.to_thread(read_labels, self.model_dir, config)
        return self._labels


async def _newest_records(model: str, source: str, limit: int) -> list[dict[str, Any]]:
    try:
        # Files and Redis are read with blocking calls: off the event loop, which serves traffic meanwhile.
        records = await asyncio.to_thread(
            lambda: list(read_records(source, model=model, limit=limit, newest=True, warn=log.warning))
        )
    except (SourceError, RecordError) as exc:
        raise ReplayRefused(f"the replay source cannot be read: {exc}") from None
    if not records:
        raise ReplayRefused(f"the replay source {shown(source)} holds no record of model '{model}'; nothing to compare")
    return records


async def _answer(version: _Version, record: dict[str, Any], timeout_s: float) -> Answer:
    """The record's request sent again to ``version``: its status as the gateway would answer it, never raising."""
    model, backend = version.model, version.backend
    requested = record["request"].get("outputs")
    inputs = [InferInput(name, datatype, tuple(array.shape), array) for name, datatype, array in inputs_of(record)]
    parameters = parameters_of(record)
    timeout, priority = parameters.pop("timeout", None), parameters.pop("priority", 0)
    counts = {name: asked.get(CLASSIFICATION) for name, asked in output_parameters_of(record).items()}
    classes = {name: count for name, count in counts.items() if isinstance(count, int) and count > 0}
    request = InferRequest(
        model, version.number, inputs, id=REPLAY_ID, outputs=tuple(requested) if isinstance(requested, list) else None,
        parameters=parameters, classification=classes,
    )
    # The logged request's own deadline when it named a shorter one than the check's: a 504 it got is got again.
    budget_s = min(timeout_s, timeout / 1e6) if isinstance(timeout, int) and timeout > 0 else timeout_s
    started = time.perf_counter()
    try:
        validate(request, version.metadata)
        if parameters:
            check_request_parameters(
                parameters, model, forwarded=backend.forwards_parameters,
                sequence_batching=backend.forwards_parameters and await version.sequence_batching(), backend="embedded",
            )
        if classes:
            check_classes(classes, version.metadata)
        left_s = budget_s - (time.perf_counter() - started)
        if left_s <= 0:  # as the data plane refuses a request whose deadline passed before it reached the model
            raise DeadlineExceeded(f"request to model '{model}': its deadline passed before it reached the model")
        async with asyncio.timeout(left_s):
            response = await backend.infer(
                request, version=version.number, timeout_s=left_s, priority=priority if isinstance(priority, int) else 0
            )
        if classes:
            labels = await version.labels()
            batched = version.metadata.max_batch_size > 0
            response.outputs = [
                classify(output, classes[output.name], labels.get(output.name, ()), batched)
                if output.name in classes else output
                for output in response.outputs
            ]
    except TimeoutError:
        return Answer(504, {}, _since(started), f"no answer within {budget_s:g} s")
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
    if report.sent == 0:
        why = report.none_sent()
    else:
        why = (
            f"{report.failures} of {report.sent} logged answers differed "
            f"({report.differing} beyond atol {report.atol:g} / rtol {report.rtol:g}, "
            f"{len(report.status_mismatches)} with another status)"
        )
    return ReplayRefused(f"replay check failed: {why}; the report is in this answer's 'replay' field", data)
