"""The node's readiness, metrics and statistics, answered by any worker: its own with the other workers' merged in
(``versions/node.py``'s ``NodeFigures``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.statistics import StatisticsReport
from services.gateway.workers.kept import KeptFigures
from services.gateway.workers.kept_statistics import KeptStatistics, report_json, versions_in
from services.gateway.workers.merge import merge_metrics, merge_reports
from services.gateway.workers.peers import FIGURES_TIMEOUT_S, Peers, WorkerDown, failure

log = logging.getLogger(__name__)

PID_HEADER = "x-worker-pid"
"""Names the process that answered ``/peer/metrics`` or ``/peer/statistics``: its kept figures are not added again
(``kept.py``, ``kept_statistics.py``)."""


class NodeFigures:
    def __init__(
        self, peers: Peers, *, shared_server: bool, kept: KeptFigures, kept_statistics: KeptStatistics,
        here: Callable[[], Awaitable[StatisticsReport]],
    ) -> None:
        """``shared_server``: the backend is one server for the whole node (Triton), whose statistics already count
        every worker's requests: they are taken from this worker alone, and only the gateway's hop is added up.
        ``kept``, ``kept_statistics``: the figures of the node's processes that did not answer (gone, or silent this
        time). ``here``: this worker's statistics of every ready version."""
        self._peers = peers
        self._shared_server = shared_server
        self._kept = kept
        self._kept_statistics = kept_statistics
        self._here = here

    async def ready(self) -> bool:
        """Every other worker answers ready; one that runs and does not (in time) is named in the log (one not
        running is not: the supervisor logs its restart)."""
        answers = await self._peers.each("GET", "/peer/ready", timeout_s=FIGURES_TIMEOUT_S)
        for index, answer in sorted(answers.items()):
            if isinstance(answer, Exception) and not isinstance(answer, WorkerDown):
                log.warning("the node is not ready: worker %d did not answer its readiness check: %s", index,
                            failure(answer, FIGURES_TIMEOUT_S))
        return all(not isinstance(a, Exception) and a.status_code == 200 for a in answers.values())

    async def metrics(self, local: str, *, per_worker: bool) -> str:
        answers = await self._peers.answers("/peer/metrics")
        others = [(index, answer.text) for index, answer in answers]
        if per_worker:  # labelled by each worker's index (those not running are left out)
            ordered = sorted([(self._peers.place.index, local), *others])
            return merge_metrics([text for _, text in ordered], per_worker=True, workers=[i for i, _ in ordered])
        await asyncio.to_thread(self._kept.keep, local)
        kept = await asyncio.to_thread(self._kept.others, _pids(answers))
        return merge_metrics([local, *(text for _, text in others), *kept])

    async def families(self, local: str) -> list[Any]:
        """The node's metric families (``local``: this worker's exposition), for the console's live figures."""
        return list(text_string_to_metric_families(await self.metrics(local, per_worker=False)))

    async def statistics(self, local: StatisticsReport, model: str, version: int | None) -> StatisticsReport:
        """Every process's figures of every ready version are gathered and kept (the living ones' answers, the last
        report of the silent and the gone ones: ``kept_statistics.py``), then those ``model`` and ``version`` ask for
        are taken: the node's totals never go backwards when a worker dies."""
        here = report_json(await self._here())
        await asyncio.to_thread(self._kept_statistics.keep_report, here)
        answers = await self._peers.answers("/peer/statistics")
        live = [here, *(answer.json() for _, answer in answers)]
        kept = await asyncio.to_thread(self._kept_statistics.reports, _pids(answers), versions_in(live))
        merged, gateway = merge_reports([*live, *kept])
        if self._shared_server:
            stats = local.model_stats
        else:
            stats = [s for s in merged.model_stats if _asked(s.name, s.version, model, version)]
        hops = {(entry["name"], entry["version"]): entry for entry in gateway}
        return StatisticsReport(stats, [hops.get((s.name, s.version)) or _no_hop(s.name, s.version) for s in stats])


def _pids(answers: list[tuple[int, httpx.Response]]) -> set[int]:
    """The processes that answered (the header they name themselves by)."""
    return {int(pid) for _, answer in answers if (pid := answer.headers.get(PID_HEADER, "")).isdigit()}


def _asked(name: str, number: str, model: str, version: int | None) -> bool:
    """Whether the statistics of ``name`` version ``number`` answer for ``model`` (empty: every model) and
    ``version`` (``None``: every ready one), as ``statistics.gather_statistics`` reads them."""
    if not model:
        return True
    return name == model and (version is None or number == str(version))


def _no_hop(name: str, version: str) -> dict[str, Any]:
    """A version the gateway has no figures of (``Hops.json``'s zeros)."""
    zero = {"count": 0, "ns": 0}
    return {"name": name, "version": version, **{part: dict(zero) for part in ("success", "fail", "backend", "hop")}}
