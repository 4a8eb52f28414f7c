"""The statistics extension's node totals never go backwards either (``kept.py``, which does it for ``/metrics``):
every worker process's statistics as it last contributed them to a node answer are kept in the node's folder
(``figures/<index>-<pid>.stats``: every ready version's, whatever the question was), and an answer adds those of each
process that did not answer this time. A client such as perf_analyzer takes the difference of two snapshots: without
this, a worker that died took its counts with it and the difference came out negative.

What is kept and added is what adds up over a process's life: counts, durations, ``batch_stats``, and
``last_inference`` (the node's latest stays the latest); ``memory_usage`` is what a process holds now, so that of a
process that is gone (or silent) is left out. A version no living worker holds any more is dropped from the retired
figures, as a version's statistics go away when it is unloaded (in Triton too)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from services.gateway.rest.messages import message_json
from services.gateway.statistics import StatisticsReport
from services.gateway.workers.kept import KeptTexts
from services.gateway.workers.merge import merge_reports

Report = dict[str, Any]
"""``{"model_stats": [...], "gateway_stats": [...]}``: a ``StatisticsReport`` as JSON (``report_json``)."""
Version = tuple[str, str]
"""(model, version) as the statistics messages spell them."""


def report_json(report: StatisticsReport) -> Report:
    return {"model_stats": [message_json(stats) for stats in report.model_stats],
            "gateway_stats": report.gateway_stats}


def versions_in(reports: Iterable[Report]) -> set[Version]:
    return {(entry["name"], entry["version"])
            for report in reports for part in ("model_stats", "gateway_stats") for entry in report[part]}


def only(report: Report, versions: set[Version]) -> Report:
    """``report`` with the entries of ``versions`` only."""
    return {part: [entry for entry in report[part] if (entry["name"], entry["version"]) in versions]
            for part in ("model_stats", "gateway_stats")}


class KeptStatistics(KeptTexts):
    """Each process's last full statistics (``report_json`` of every ready version), as JSON text."""

    SUFFIX = ".stats"
    RETIRED = "retired.stats"

    def cumulative(self, text: str) -> str:
        report: Report = json.loads(text)
        for stats in report["model_stats"]:
            stats["memory_usage"] = []  # held by a process that is gone or silent: not the node's now
        return json.dumps(report)

    def fold(self, texts: list[str]) -> str:
        merged, gateway = merge_reports([json.loads(text) for text in texts])
        return json.dumps({"model_stats": [message_json(stats) for stats in merged.model_stats],
                           "gateway_stats": gateway})

    def keep_report(self, report: Report) -> None:
        self.keep(json.dumps(report))

    def reports(self, answered: set[int], loaded: set[Version]) -> list[Report]:
        """``others`` as reports, of the versions in ``loaded`` (those the living workers hold): the retired figures
        of any other version are dropped for good (it was unloaded; should it load again, it starts from zero)."""

        def tidy(text: str) -> str:
            return json.dumps(only(json.loads(text), loaded))

        return [only(json.loads(text), loaded) for text in self._others(answered, tidy)]
