"""Repository loads under load: 32 closed-loop clients send unversioned classifier requests while an ops script
(tritonclient gRPC aio) calls ``load_model`` with and without a config override; every answer is checked against
the loads' windows (a request overlapping a load may see either side of it)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import tritonclient.grpc.aio as grpcaio

from tests.repository_clients import policy
from tests.swap_load import Answer, classifier_body

PLAN: tuple[dict[str, Any] | None, ...] = (policy(1), policy(2), None)
"""Narrow to version 1 (2 drained and unloaded), to version 2 (loaded, warmed, routed; 1 unloaded), then a plain
load: config.pbtxt's policy (``all``) loads version 1 again, version 2 stays routed."""
TARGETS = (1, 2, 2)
SLACK_S = 0.002


@dataclass
class LoadRun:
    initial: int
    answers: list[Answer] = field(default_factory=list)
    loads: list[tuple[float, float, int]] = field(default_factory=list)
    """(sent, answered, version routed afterwards) per load."""

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    def misrouted(self) -> list[Answer]:
        return [a for a in self.answers if a.status == 200 and a.version not in self._allowed(a)]

    def during_loads(self) -> int:
        return sum(self.loads[0][0] <= a.sent <= self.loads[-1][1] for a in self.answers)

    def _allowed(self, answer: Answer) -> set[int]:
        versions, current = set(), self.initial
        for started, ended, target in self.loads:
            if ended < answer.sent - SLACK_S:
                current = target
                continue
            if started > answer.received + SLACK_S:
                break
            versions |= {current, target}
            current = target
        return versions | {current}


async def loads_under_load(
    http_url: str, grpc_url: str, token: str, *, initial: int, clients: int = 32, steady_s: float = 1.5,
    pause_s: float = 0.5,
) -> LoadRun:
    """``pause_s`` between loads: traffic on each routing, and on the loads' edges."""
    run = LoadRun(initial)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=f"http://{http_url}", limits=limits, timeout=60.0) as http:

        async def client(index: int) -> None:
            body, headers = classifier_body(index)
            while not stop.is_set():
                sent = time.time()
                try:
                    response = await http.post("/v2/models/classifier/infer", content=body, headers=headers)
                except httpx.HTTPError as exc:
                    run.answers.append(Answer(sent, time.time(), 0, None, repr(exc)))
                    continue
                ok = response.status_code == 200
                version = int(response.headers["x-model-version"]) if ok else None
                run.answers.append(Answer(sent, time.time(), response.status_code, version,
                                          "" if ok else response.text[:200]))

        workers = [asyncio.create_task(client(i)) for i in range(clients)]
        ops = grpcaio.InferenceServerClient(grpc_url)
        try:
            await asyncio.sleep(steady_s)
            for config, target in zip(PLAN, TARGETS, strict=True):
                started = time.time()
                text = json.dumps(config) if config is not None else None
                await ops.load_model("classifier", headers={"authorization": f"Bearer {token}"}, config=text)
                run.loads.append((started, time.time(), target))
                await asyncio.sleep(pause_s)
        finally:
            stop.set()
            await asyncio.gather(*workers)
            await ops.close()
    return run
