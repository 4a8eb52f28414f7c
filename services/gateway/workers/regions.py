"""System shared-memory regions across the node's workers: a client registers a region through one worker and
infers through any (its client's connections may land on different workers), so every registration and
unregistration reaches every worker (``tensors/shared_memory.py``'s ``peers``), and a worker that starts takes over
the regions the others hold."""

from __future__ import annotations

import logging
from typing import Any

from services.gateway.errors import GatewayError
from services.gateway.tensors.shared_memory import Region, SharedMemoryRegions
from services.gateway.workers.peers import FIGURES_TIMEOUT_S, Peers, WorkerDown

log = logging.getLogger(__name__)


def region_json(region: Region) -> dict[str, Any]:
    return {"tenant": region.tenant, "name": region.name, "key": region.key, "offset": region.offset,
            "byte_size": region.byte_size, "remote_name": region.remote_name}


class PeerRegions:
    """``RegionMirror`` for the node's other workers."""

    def __init__(self, peers: Peers) -> None:
        self._peers = peers

    async def register(self, region: Region) -> None:
        answers = await self._peers.each("POST", "/peer/regions/register", timeout_s=FIGURES_TIMEOUT_S,
                                         json=region_json(region))
        problems = [f"worker {index}: {_why(answer)}" for index, answer in answers.items() if _failed(answer)]
        if problems:
            # Undone everywhere it was done; the caller closes its own copy.
            await self.unregister(region)
            raise GatewayError(f"shared memory region '{region.name}' could not be registered on every worker of the "
                               f"node: {'; '.join(problems)}", 400)

    async def unregister(self, region: Region) -> None:
        answers = await self._peers.each("POST", "/peer/regions/forget", timeout_s=FIGURES_TIMEOUT_S,
                                         json={"tenant": region.tenant, "name": region.name})
        for index, answer in answers.items():
            if _failed(answer):
                log.error("worker %d did not unregister shared memory region '%s': %s", index, region.name,
                          _why(answer))

    async def take_over(self, regions: SharedMemoryRegions) -> None:
        """The regions a running worker holds, mapped here too (this worker just started)."""
        for index in self._peers.place.others:
            try:
                answer = await self._peers.call(index, "GET", "/peer/regions", timeout_s=FIGURES_TIMEOUT_S)
            except WorkerDown:
                continue
            for held in answer.json()["regions"]:
                try:
                    regions.adopt(held["tenant"], held["name"], held["key"], held["offset"], held["byte_size"],
                                  held["remote_name"])
                except GatewayError as exc:  # its object is gone meanwhile: the client re-registers
                    log.warning("shared memory region '%s' not taken over: %s", held["name"], exc)
            return


def _failed(answer: Any) -> bool:
    """A worker that answered with an error, or not at all; one not running catches up when it starts."""
    return not isinstance(answer, WorkerDown) and (isinstance(answer, Exception) or answer.status_code != 200)


def _why(answer: Any) -> str:
    if isinstance(answer, Exception):
        return str(answer)
    try:
        return str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {answer.status_code}"
