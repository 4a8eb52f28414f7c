"""What the worker that runs a node's version actions asks of the node's other workers
(``switchyard serve --workers N``; ``services/gateway/workers/`` answers it).

A version action runs on worker 0. Before it flips, every other worker loads and warms the versions it needs
(``prepare``: each worker holds its own model sessions); once the new routing is committed, every other worker takes
it (``follow``) before the admin call returns. Each answers the seconds its steps took, which the action reports per
worker."""

from __future__ import annotations

from typing import Protocol

from services.gateway.state import RoutingRecord
from services.gateway.statistics import StatisticsReport


class NodeWorkers(Protocol):
    async def prepare(self, model: str, version: int) -> dict[int, dict[str, float]]:
        """Every other worker loads and warms ``version`` (when it is not loaded): worker -> seconds per step.
        Raises ``GatewayError`` naming the worker and its reason when one cannot; the others keep what they loaded
        until ``discard``."""
        ...

    async def discard(self, model: str, version: int) -> None:
        """Every other worker unloads ``version`` unless its routing names it (an action that failed); never raises."""
        ...

    async def follow(self, model: str, record: RoutingRecord) -> dict[int, dict[str, float]]:
        """Every other worker routes by ``record`` (loading what it still lacks, unloading what it dropped):
        worker -> seconds per step, or ``{"error": ...}`` in words for a worker that could not."""
        ...


class NodeFigures(Protocol):
    """The node's answers that any worker gives (``/v2/health/ready``, ``/metrics``, the statistics extension): its
    own figures with the other workers' added."""

    async def ready(self) -> bool:
        """Whether every other worker is ready (a worker not running is not)."""
        ...

    async def metrics(self, local: str, *, per_worker: bool) -> str:
        """``local`` (this worker's exposition) with the other workers' merged in: node totals, or each worker's
        series under a ``worker`` label."""
        ...

    async def statistics(self, local: StatisticsReport, model: str, version: int | None) -> StatisticsReport:
        """``local`` with the other workers' figures of the same versions added."""
        ...
