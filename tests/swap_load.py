"""Version switches under load: 32 closed-loop clients send unversioned requests while the admin API activates,
rolls back and activates again; every answer is checked against the routing timeline the switches report."""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from examples import models
from tests.waiting import wait_until_async

TOKEN = "swap-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
# Each switch: (admin path, body). Two of them load a version that an earlier one unloaded.
PLAN: tuple[tuple[str, dict[str, Any]], ...] = (
    ("versions/1/activate", {"keep_previous": False}),
    ("versions/2/activate", {}),
    ("rollback", {}),
    ("versions/2/activate", {"keep_previous": False}),
    ("versions/1/activate", {}),
    ("rollback", {}),
)
SLACK_S = 0.002
"""Clock slack around a flip: a request sent or answered this close to it may see either version."""


@dataclass
class Answer:
    sent: float
    received: float
    status: int
    version: int | None
    error: str = ""


@dataclass
class SwapRun:
    answers: list[Answer] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    flips: list[tuple[float, int]] = field(default_factory=list)
    initial: int = 0
    swaps_started: float = 0.0
    swaps_ended: float = 0.0

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    def misrouted(self) -> list[Answer]:
        """Answers from a version that was not stable at any moment between the request's sending and its answer
        (so: an old version answering a request admitted after the flip, or the new one before it)."""
        return [a for a in self.answers if a.status == 200 and a.version not in self._stable_during(a)]

    def _stable_during(self, answer: Answer) -> set[int]:
        versions, current = set(), self.initial
        start, end = answer.sent - SLACK_S, answer.received + SLACK_S
        for flip_time, target in self.flips:
            if flip_time >= start and current is not None:
                versions.add(current)
            if flip_time > end:
                return versions
            current = target
        versions.add(current)
        return versions

    def latency_ms(self, during: bool) -> tuple[float, float, int]:
        """p50, p99 and count of the answers sent during the switches (or in the steady phase before them)."""
        picked = [
            (a.received - a.sent) * 1e3
            for a in self.answers
            if (self.swaps_started <= a.sent <= self.swaps_ended) == during and a.sent < self.swaps_ended
        ]
        cuts = statistics.quantiles(picked, n=100)
        return cuts[49], cuts[98], len(picked)

    def summary(self, backend: str) -> str:
        steady, swapping = self.latency_ms(False), self.latency_ms(True)
        lines = [
            f"{backend}: {len(self.answers)} requests, {len(self.failures())} failed, {len(self.flips)} switches",
            f"  steady:        p50 {steady[0]:.1f} ms  p99 {steady[1]:.1f} ms  ({steady[2]} requests)",
            f"  during swaps:  p50 {swapping[0]:.1f} ms  p99 {swapping[1]:.1f} ms  ({swapping[2]} requests)",
        ]
        for report in self.reports:
            steps = report["steps"]
            lines.append(
                f"  {report['action']:8s} {report['versions']['from']} -> {report['versions']['to']}: "
                f"to flip {steps.get('to_flip', 0) * 1e3:.0f} ms, to drained {steps.get('to_drained', 0) * 1e3:.0f} ms"
                f" ({', '.join(f'{k} {v * 1e3:.0f}' for k, v in steps.items() if not k.startswith('to_'))})"
            )
        return "\n".join(lines)


def classifier_body(seed: int) -> tuple[bytes, dict[str, str]]:
    """One classifier image as a binary-tensor request (the JSON header, then the raw FP32 bytes)."""
    image = np.random.default_rng(seed).standard_normal((1, 3, 64, 64), dtype=np.float32)
    header = (
        b'{"inputs":[{"name":"image","shape":[1,3,64,64],"datatype":"FP32","parameters":{"binary_data_size":'
        + str(image.nbytes).encode()
        + b'}}],"outputs":[{"name":"logits","parameters":{"binary_data":false}}]}'
    )
    return header + image.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


async def switch_under_load(
    http_url: str, model: str = "classifier", clients: int = 32, steady_s: float = 2.0, tail_s: float = 0.5
) -> SwapRun:
    run = SwapRun()
    base = f"http://{http_url}"
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60.0) as http:
        status = (await http.get(f"/admin/models/{model}", headers=ADMIN)).json()
        run.initial = int(status["routing"]["stable"])
        stop = asyncio.Event()

        async def client(index: int) -> None:
            body, headers = classifier_body(index)
            while not stop.is_set():
                sent = time.time()
                try:
                    response = await http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
                    version = int(response.headers["x-model-version"]) if response.status_code == 200 else None
                    run.answers.append(Answer(sent, time.time(), response.status_code, version, response.text[:200]
                                              if response.status_code != 200 else ""))
                except httpx.HTTPError as exc:
                    run.answers.append(Answer(sent, time.time(), 0, None, repr(exc)))

        workers = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(steady_s)  # steady load before the swaps, and after them (tail_s): part of the run
        run.swaps_started = time.time()
        for path, body in PLAN:
            response = await http.post(f"/admin/models/{model}/{path}", headers=ADMIN, json=body)
            assert response.status_code == 200, response.text
            report = response.json()
            run.reports.append(report)
            flipped = dt.datetime.fromisoformat(report["flipped_at"]).timestamp()
            run.flips.append((flipped, int(report["versions"]["to"])))
        run.swaps_ended = time.time()
        await asyncio.sleep(tail_s)
        stop.set()
        await asyncio.gather(*workers)
    return run


async def light_load(http_url: str, stop: asyncio.Event, answers: list[int]) -> None:
    """Four clients sending unversioned mlp requests until ``stop``; ``answers`` collects the status codes."""
    features = models.mlp_inputs(1, seed=5).numpy().ravel().tolist()
    body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}
    async with httpx.AsyncClient(base_url=f"http://{http_url}", timeout=30.0) as http:

        async def client() -> None:
            while not stop.is_set():
                answers.append((await http.post("/v2/models/mlp/infer", json=body)).status_code)

        await asyncio.gather(*(client() for _ in range(4)))


async def activate_under_light_load(
    http_url: str, token: str, model: str, version: int
) -> tuple[httpx.Response, list[int]]:
    """Activate ``version`` of the mlp while ``light_load`` runs; the admin answer and every request's status."""
    stop, answers = asyncio.Event(), []
    load = asyncio.create_task(light_load(http_url, stop, answers))
    assert await wait_until_async(lambda: len(answers) >= 4)  # the load runs
    async with httpx.AsyncClient(base_url=f"http://{http_url}", timeout=60.0) as http:
        headers = {"Authorization": f"Bearer {token}"}
        response = await http.post(f"/admin/models/{model}/versions/{version}/activate", headers=headers)
    await asyncio.sleep(0.3)  # and goes on a while after the activation's answer: serving must go on too
    stop.set()
    await load
    return response, answers
