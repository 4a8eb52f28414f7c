"""Calls from one worker to the node's other workers, over their Unix sockets (``peer_api`` answers them).

A worker that is not listening (it is starting, or the supervisor is restarting it) is left out of what the call
gathers: when it starts it reads the routing worker 0 persisted and asks worker 0 for anything newer, so nothing it
missed is lost."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from services.gateway.errors import GatewayError
from services.gateway.state import RoutingRecord
from services.gateway.workers.place import ACTING, WorkerPlace

log = logging.getLogger(__name__)

ACTION_TIMEOUT_S = 900.0
"""A worker's share of a version action (loading and warming a model) may take as long as on worker 0."""
FIGURES_TIMEOUT_S = 5.0
"""Metrics, statistics and readiness answer in milliseconds; a worker slower than this is left out and logged."""


class WorkerDown(Exception):
    """The worker is not listening (starting, or being restarted)."""


class Peers:
    """The node's other workers, from one worker."""

    def __init__(self, place: WorkerPlace) -> None:
        self.place = place
        self._clients = {
            index: httpx.AsyncClient(
                # Plain HTTP over a Unix socket: no TLS, so no CA bundle to load (~20 ms of CPU a transport).
                transport=httpx.AsyncHTTPTransport(uds=str(place.socket_path(index)), verify=False),
                base_url="http://worker",
            )
            for index in range(place.count)
            if index != place.index
        }

    async def close(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self._clients.values()))

    async def call(self, index: int, method: str, path: str, *, timeout_s: float, **kwargs: Any) -> httpx.Response:
        try:
            return await self._clients[index].request(method, path, timeout=timeout_s, **kwargs)
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise WorkerDown(f"worker {index} is not running (it is starting or being restarted)") from exc

    async def each(
        self, method: str, path: str, *, timeout_s: float, **kwargs: Any
    ) -> dict[int, httpx.Response | Exception]:
        """One call per other worker, at once: worker -> its answer, or what went wrong."""
        others = list(self._clients)
        answers = await asyncio.gather(
            *(self.call(index, method, path, timeout_s=timeout_s, **kwargs) for index in others), return_exceptions=True
        )
        found: dict[int, httpx.Response | Exception] = {}
        for index, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer
            found[index] = answer
        return found

    # -- versions/node.py's NodeWorkers, on worker 0 ------------------------------------------------------------
    async def prepare(self, model: str, version: int) -> dict[int, dict[str, float]]:
        answers = await self.each("POST", "/peer/prepare", timeout_s=ACTION_TIMEOUT_S,
                                  json={"model": model, "version": version})
        steps: dict[int, dict[str, float]] = {}
        problems = []
        for index, answer in answers.items():
            if isinstance(answer, WorkerDown):
                continue
            if isinstance(answer, Exception):
                problems.append((index, 503, f"worker {index} did not answer: {failure(answer, ACTION_TIMEOUT_S)}"))
            elif answer.status_code != 200:
                problems.append((index, answer.status_code, f"worker {index}: {_error(answer)}"))
            else:
                steps[index] = answer.json()["steps"]
        if problems:
            raise GatewayError("; ".join(text for _, _, text in problems), max(status for _, status, _ in problems))
        return steps

    async def discard(self, model: str, version: int) -> None:
        answers = await self.each("POST", "/peer/discard", timeout_s=ACTION_TIMEOUT_S,
                                  json={"model": model, "version": version})
        for index, answer in answers.items():
            if isinstance(answer, Exception) and not isinstance(answer, WorkerDown):
                log.error("model '%s': worker %d did not unload version %d: %s", model, index, version, answer)

    async def follow(self, model: str, record: RoutingRecord) -> dict[int, dict[str, float]]:
        answers = await self.each("POST", "/peer/follow", timeout_s=ACTION_TIMEOUT_S,
                                  json={"model": model, "record": record.to_json()})
        steps: dict[int, dict[str, Any]] = {}
        for index, answer in answers.items():
            if isinstance(answer, WorkerDown):
                steps[index] = {"note": str(answer)}
            elif isinstance(answer, Exception):
                steps[index] = {"error": f"did not answer: {failure(answer, ACTION_TIMEOUT_S)}"}
            elif answer.status_code != 200:
                steps[index] = {"error": _error(answer)}
            else:
                steps[index] = answer.json()["steps"]
            if "error" in steps[index]:
                log.error("model '%s': worker %d does not route by generation %d: %s", model, index,
                          record.generation, steps[index]["error"])
        return steps

    # -- the node's figures, on any worker ----------------------------------------------------------------------
    async def answers(self, path: str, *, timeout_s: float = FIGURES_TIMEOUT_S) -> list[tuple[int, httpx.Response]]:
        """Each answering worker's answer to ``path``, in worker order; the others are left out (and logged, but for
        a worker that is not running)."""
        answers = await self.each("GET", path, timeout_s=timeout_s)
        found = []
        for index, answer in sorted(answers.items()):
            if isinstance(answer, Exception) or answer.status_code != 200:
                if not isinstance(answer, WorkerDown):
                    log.warning("worker %d left out of %s: %s", index, path,
                                failure(answer, timeout_s) if isinstance(answer, Exception) else _error(answer))
                continue
            found.append((index, answer))
        return found

    async def routing(self) -> dict[str, RoutingRecord]:
        """Worker 0's routing now (a worker that just started catches up with it)."""
        answer = await self.call(ACTING, "GET", "/peer/routing", timeout_s=FIGURES_TIMEOUT_S)
        return {model: RoutingRecord.from_json(raw) for model, raw in answer.json()["models"].items()}


def failure(exc: Exception, timeout_s: float) -> str:
    """What went wrong with a call to a worker, in words: httpx's timeouts carry no text of their own."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {timeout_s:g} s ({type(exc).__name__}: the worker is busy, hung or stopped)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {answer.status_code}: {answer.text[:200]}"
