"""The node's readiness, metrics and statistics, answered by any worker: its own with the other workers' merged in
(``versions/node.py``'s ``NodeFigures``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

from services.gateway.statistics import StatisticsReport
from services.gateway.workers.kept import KeptFigures
from services.gateway.workers.merge import merge_gateway_stats, merge_metrics, merge_statistics
from services.gateway.workers.peers import FIGURES_TIMEOUT_S, Peers

PID_HEADER = "x-worker-pid"
"""Names the process that answered ``/peer/metrics``: its kept figures are not added again (``kept.py``)."""


class NodeFigures:
    def __init__(self, peers: Peers, *, shared_server: bool, kept: KeptFigures) -> None:
        """``shared_server``: the backend is one server for the whole node (Triton), whose statistics already count
        every worker's requests: they are taken from this worker alone, and only the gateway's hop is added up.
        ``kept``: the figures of the node's processes that did not answer (gone, or silent this time)."""
        self._peers = peers
        self._shared_server = shared_server
        self._kept = kept

    async def ready(self) -> bool:
        answers = await self._peers.each("GET", "/peer/ready", timeout_s=FIGURES_TIMEOUT_S)
        return all(not isinstance(a, Exception) and a.status_code == 200 for a in answers.values())

    async def metrics(self, local: str, *, per_worker: bool) -> str:
        answers = await self._peers.answers("/peer/metrics")
        others = [(index, answer.text) for index, answer in answers]
        if per_worker:  # labelled by each worker's index (those not running are left out)
            ordered = sorted([(self._peers.place.index, local), *others])
            return merge_metrics([text for _, text in ordered], per_worker=True, workers=[i for i, _ in ordered])
        await asyncio.to_thread(self._kept.keep, local)
        answered = {int(pid) for _, answer in answers if (pid := answer.headers.get(PID_HEADER, "")).isdigit()}
        kept = await asyncio.to_thread(self._kept.others, answered)
        return merge_metrics([local, *(text for _, text in others), *kept])

    async def families(self, local: str) -> list[Any]:
        """The node's metric families (``local``: this worker's exposition), for the console's live figures."""
        return list(text_string_to_metric_families(await self.metrics(local, per_worker=False)))

    async def statistics(self, local: StatisticsReport, model: str, version: int | None) -> StatisticsReport:
        params = {"model": model} if version is None else {"model": model, "version": str(version)}
        others = [json.loads(text) for _, text in await self._peers.texts("/peer/statistics", **params)]
        gateway = merge_gateway_stats([local.gateway_stats, *(o["gateway_stats"] for o in others)])
        if self._shared_server:
            return StatisticsReport(local.model_stats, gateway)
        answers = [service_pb2.ModelStatisticsResponse(model_stats=local.model_stats)]
        for other in others:
            answers.append(json_format.ParseDict({"model_stats": other["model_stats"]},
                                                 service_pb2.ModelStatisticsResponse()))
        merged = merge_statistics(answers)
        return StatisticsReport(list(merged.model_stats), gateway)

