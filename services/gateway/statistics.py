"""Inference statistics per model version (the statistics extension): the embedded backend's counters in Triton's
``ModelStatistics`` shape, and the gateway's own time around any backend (its "hop"), kept apart from them.

Plain counters updated on the event loop, as Triton's ``InferenceStatsAggregator`` counts: per successful request
its rows (``inference_count``), its whole time (``success``) and its share of queue and compute time; per executed
batch ``execution_count``, ``last_inference`` and one ``batch_stats`` entry per batch size.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tritonclient.grpc import service_pb2

from services.gateway.batching.batcher import ExecutedBatch
from services.gateway.errors import no_statistics
from services.gateway.tensors.types import VersionState


def nanoseconds(seconds: float) -> int:
    return int(seconds * 1e9)


class Duration:
    """A count and a cumulative duration in nanoseconds: Triton's ``StatisticDuration``."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)  # nanoseconds(), inline: every request adds two or three

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class _BatchSize:
    """``batch_stats`` of one batch size: executions and their compute time, in nanoseconds."""

    __slots__ = ("count", "input_ns", "infer_ns", "output_ns")

    def __init__(self) -> None:
        self.count = self.input_ns = self.infer_ns = self.output_ns = 0


class VersionStatistics:
    """The counters of one loaded version of the embedded backend; they go away with the version, as in Triton."""

    __slots__ = (
        "last_inference_ms", "inference_count", "execution_count", "success", "fail",
        "queue_ns", "input_ns", "infer_ns", "output_ns", "batch_sizes",
    )

    def __init__(self) -> None:
        self.last_inference_ms = self.inference_count = self.execution_count = 0
        self.success, self.fail = Duration(), Duration()
        # Triton reports queue and compute with the success count: only their nanoseconds are kept.
        self.queue_ns = self.input_ns = self.infer_ns = self.output_ns = 0
        self.batch_sizes: dict[int, _BatchSize] = {}

    def executed(self, batch: ExecutedBatch) -> None:
        """Each request of the batch waited its own queue time and shares the batch's whole compute time. A request
        whose caller gave up while the batch ran (its deadline) still adds its share here, as it is counted a fail."""
        requests = len(batch.waits)
        input_ns = nanoseconds(batch.merge_s)
        infer_ns = nanoseconds(batch.execute_s)
        output_ns = nanoseconds(batch.split_s)
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.execution_count += 1
        self.queue_ns += nanoseconds(sum(batch.waits))
        self.input_ns += input_ns * requests
        self.infer_ns += infer_ns * requests
        self.output_ns += output_ns * requests
        size = self.batch_sizes.get(batch.rows)
        if size is None:
            size = self.batch_sizes[batch.rows] = _BatchSize()
        size.count += 1
        size.input_ns += input_ns
        size.infer_ns += infer_ns
        size.output_ns += output_ns

    def succeeded(self, rows: int, seconds: float) -> None:
        self.inference_count += rows
        self.success.add(seconds)

    def failed(self, seconds: float) -> None:
        self.fail.add(seconds)

    def message(self, model: str, version: int) -> service_pb2.ModelStatistics:
        """Triton's message, every duration present (as Triton's own answers have them)."""
        count = self.success.count
        stats = service_pb2.ModelStatistics(
            name=model,
            version=str(version),
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=service_pb2.InferStatistics(
                success=_duration(count, self.success.ns),
                fail=_duration(self.fail.count, self.fail.ns),
                queue=_duration(count, self.queue_ns),
                compute_input=_duration(count, self.input_ns),
                compute_infer=_duration(count, self.infer_ns),
                compute_output=_duration(count, self.output_ns),
                cache_hit=_duration(0, 0),  # the gateway has no response cache
                cache_miss=_duration(0, 0),
            ),
        )
        for rows in sorted(self.batch_sizes):
            size = self.batch_sizes[rows]
            stats.batch_stats.add(
                batch_size=rows,
                compute_input=_duration(size.count, size.input_ns),
                compute_infer=_duration(size.count, size.infer_ns),
                compute_output=_duration(size.count, size.output_ns),
            )
        return stats


def _duration(count: int, ns: int) -> service_pb2.StatisticDuration:
    return service_pb2.StatisticDuration(count=count, ns=ns)


class _Hop:
    """One version's figures: plain numbers (every answered request adds to three of them)."""

    __slots__ = ("served", "success_ns", "backend_ns", "fail")

    def __init__(self) -> None:
        self.served = self.success_ns = self.backend_ns = 0
        self.fail = Duration()


class Hops:
    """The gateway's own view of each version, whatever the backend: requests it answered (``success``, ``fail``:
    from routing to the answer), the time its successful ones waited on the backend (``backend``: Triton's round
    trip, or the embedded batcher), and the difference, the gateway's hop. Never mixed into the backend's figures:
    on the Triton backend those are Triton's, measured inside Triton."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, _Hop]] = {}

    def _entry(self, model: str, version: int) -> _Hop:
        # Only routed requests land here: the models and versions are ones the repository knows.
        try:
            return self._models[model][version]  # every request after a version's first
        except KeyError:
            hop = self._models.setdefault(model, {})[version] = _Hop()
            return hop

    def served(self, model: str, version: int, seconds: float, backend_seconds: float) -> None:
        """A request answered in ``seconds``, of which it waited ``backend_seconds`` on the backend."""
        hop = self._entry(model, version)
        hop.served += 1
        hop.success_ns += int(seconds * 1e9)
        hop.backend_ns += int(backend_seconds * 1e9)

    def failed(self, model: str, version: int, seconds: float) -> None:
        self._entry(model, version).fail.add(seconds)

    def prune(self, loaded: Mapping[str, Mapping[int, VersionState]]) -> None:
        """Forget the versions no longer loaded: their figures go away with them, like the backend's."""
        for model, versions in self._models.items():
            for version in [v for v in versions if v not in loaded.get(model, {})]:
                del versions[version]

    def json(self, model: str, version: int) -> dict[str, Any]:
        hop = self._models.get(model, {}).get(version) or _Hop()
        count = hop.served
        return {
            "name": model,
            "version": str(version),
            "success": {"count": count, "ns": hop.success_ns},
            "fail": hop.fail.json(),
            "backend": {"count": count, "ns": hop.backend_ns},
            "hop": {"count": count, "ns": max(hop.success_ns - hop.backend_ns, 0)},
        }


@dataclass(frozen=True)
class StatisticsReport:
    model_stats: list[service_pb2.ModelStatistics]
    """The backend's figures in Triton's message: the embedded backend's own, or Triton's."""
    gateway_stats: list[dict[str, Any]]
    """The gateway's hop (``Hops.json``) of the same versions, in the same order."""


class StatisticsSource(Protocol):
    """What the statistics extension reads of a backend (``backends.base.Backend`` has it; named here so that this
    module, which the embedded backend imports, does not import the backends)."""

    def models(self) -> Mapping[str, Mapping[int, VersionState]]: ...

    async def statistics(self, model: str | None, version: int | None) -> list[service_pb2.ModelStatistics]: ...


async def gather_statistics(
    known: Mapping[str, object], backend: StatisticsSource, hops: Hops, model: str, version: int | None
) -> StatisticsReport:
    """Every ready version of every model (``model`` empty: as in Triton), of ``model``, or one ``version`` of it;
    ``known``: the repository's models. 404 for a model the repository does not have, or one with no ready version,
    in Triton's words (Triton: 400)."""
    loaded = backend.models()
    hops.prune(loaded)
    if model:
        if model not in known:
            raise no_statistics(model, None, "the repository has no such model")
        ready = sorted(v for v, state in loaded.get(model, {}).items() if state is VersionState.READY)
        if version is not None and version not in ready:
            listed = ", ".join(str(v) for v in ready) or "none"
            raise no_statistics(model, version, f"version {version} is not ready (ready versions: {listed})")
        if not ready:
            raise no_statistics(model, None, "no version of it is ready")
    found = await backend.statistics(model or None, version if model else None)
    return StatisticsReport(found, [hops.json(stats.name, _number(stats.version)) for stats in found])


def _number(version: str) -> int:
    """A version as the backend spelled it (Triton: decimal digits); 0, which no version is, for anything else."""
    return int(version) if version.isascii() and version.isdigit() else 0
