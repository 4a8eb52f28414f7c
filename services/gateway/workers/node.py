"""A worker's part in its node (``switchyard serve --workers N``), started by the app's lifespan once the worker's
models are loaded: its Unix socket for the node's internal calls, its calls to the other workers, and the hooks that
make its answers the node's (readiness, metrics, statistics; on worker 0 the version actions reach every worker, on
the others the admin and repository calls go to worker 0)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

import httpx
from prometheus_client import generate_latest

from services.gateway.backends.loop_holds import LOOP_HOLDS
from services.gateway.dataplane import DataPlane
from services.gateway.repository_api import RepositoryApi
from services.gateway.shaping.node_share import NodeShare
from services.gateway.versions.manager import VersionManager
from services.gateway.versions.replicas import adopt
from services.gateway.workers.figures import NodeFigures
from services.gateway.workers.forwarding import repository_forward
from services.gateway.workers.kept import KeptFigures
from services.gateway.workers.kept_statistics import KeptStatistics
from services.gateway.workers.liveness import BEAT_S, Liveness
from services.gateway.workers.peers import FIGURES_TIMEOUT_S, Peers, WorkerDown, failure
from services.gateway.workers.place import WorkerPlace
from services.gateway.workers.regions import PeerRegions

log = logging.getLogger(__name__)


class WorkerNode:
    """``app.NodeWorker``: what ``create_app`` asks of a worker process."""

    def __init__(self, place: WorkerPlace) -> None:
        self.place = place
        self.acting = place.acting
        self.index = place.index
        self.peers = Peers(place)
        # This process's own mapping (a fork's would share the parent's lock); what a previous process of this worker
        # held when it died is not held any more.
        self.share = NodeShare.attach(place.share_path, place.index)
        self.share.reset_worker(place.index)
        self.kept = KeptFigures(place.figures_path, place.index)
        self.kept_statistics = KeptStatistics(place.figures_path, place.index)
        self._dataplane: DataPlane | None = None
        self._manager: VersionManager | None = None
        self.liveness = Liveness.attach(place.liveness_path, place.count)
        # From now on, including the models' loads at startup: a load that holds the loop is not a hang.
        self._unlisten = LOOP_HOLDS.listen(self._held)
        self._beating: asyncio.Task[None] | None = None
        self._telling: asyncio.Task[None] | None = None

    async def join(self, app: Any, dataplane: DataPlane, manager: VersionManager, repository: RepositoryApi) -> None:
        """Answer for the node: readiness, metrics and statistics gathered from every worker; on worker 0 the
        version actions reach every worker, on the others repository actions go to worker 0 (the admin API goes
        there as HTTP, ``forwarding.py``). The node's calls reach this worker on its socket once it serves."""
        self._dataplane, self._manager = dataplane, manager
        self._beating = asyncio.create_task(self._beat(), name=f"worker {self.index} liveness")
        figures = NodeFigures(self.peers, shared_server=manager.backend.shared_server, kept=self.kept,
                              kept_statistics=self.kept_statistics, here=lambda: dataplane.statistics_here("", None))
        dataplane.node = figures
        regions = PeerRegions(self.peers)
        await regions.take_over(dataplane.regions)
        dataplane.regions.peers = regions
        if self.place.acting:  # the console's calls reach worker 0: its live figures are the node's
            manager.workers = self.peers
            registry = dataplane.metrics.registry
            app.state.live.source = lambda: figures.families(generate_latest(registry).decode())
        else:
            repository.forward = repository_forward(self.peers)
            await self._catch_up(manager)
        log.info("worker %d of %d joined the node", self.place.index, self.place.count)

    def listen(self) -> socket.socket:
        """This worker's Unix socket, for the node's calls (``peer_api.py``); served beside the TCP port, and, like
        it, listening once uvicorn serves (after the worker's startup)."""
        path = self.place.socket_path(self.place.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by this worker's previous process, which died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o600)
        return sock

    async def leave(self) -> None:
        for task in (self._beating, self._telling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # A draining worker still beats: holding its slot "held" keeps the watchdog off it while it stops.
        self.liveness.hold(self.index)
        self._unlisten()
        if self._manager is not None:
            self._manager.workers = None
        if self._dataplane is not None:
            self._dataplane.node = None
            self._dataplane.regions.peers = None
        await self.peers.close()
        self.share.close()
        self.liveness.close()

    async def _beat(self) -> None:
        """The event loop's sign of life, for the supervisor's watchdog (``liveness.py``)."""
        while True:
            self.liveness.beat(self.index)
            await asyncio.sleep(BEAT_S)

    def _held(self, holding: bool) -> None:
        if holding:
            self.liveness.hold(self.index)
        else:
            self.liveness.release(self.index)

    async def serving(self) -> None:
        """Once this worker's sockets listen: the routing worker 0 committed between ``join``'s catch-up and now is
        taken. Worker 0 tells a worker each commit only once its socket listens (``peers.py`` leaves out one that
        does not), so without this a commit in that gap (the rest of the startup: a full garbage collection, the
        listeners) would reach this worker with the next action only, while the action reported it in force.

        On worker 0 the others are told the routing it serves: when it restarts after dying between persisting an
        action's routing and telling the others (``versions/node.py``), it serves that routing and they would go on
        serving the previous one until the next action. A worker that has it already ignores it (its generation)."""
        if self._manager is None:
            return
        if self.place.acting:
            # Not awaited: a hung worker could hold the call for ACTION_TIMEOUT_S, and uvicorn's startup with it.
            self._telling = asyncio.create_task(self._tell_routing(self._manager), name="tell the node's routing")
        else:
            await self._catch_up(self._manager)

    async def _tell_routing(self, manager: VersionManager) -> None:
        for model, record in list(manager.router.records.items()):
            await self.peers.follow(model, record)  # a worker that is not listening yet reads it as it starts

    async def _catch_up(self, manager: VersionManager) -> None:
        """Routing worker 0 committed while this worker started (before its socket listened) is taken now."""
        try:
            records = await self.peers.routing()
        except WorkerDown:
            return  # worker 0 is restarting: it reads the same persisted routing this worker started from
        except httpx.HTTPError as exc:  # worker 0 runs but does not answer: serve what this worker started from
            log.error("worker %d could not ask worker 0 for the node's routing (%s); it serves the routing it "
                      "started from until worker 0's next action reaches it", self.place.index,
                      failure(exc, FIGURES_TIMEOUT_S))
            return
        for model, record in records.items():
            problem = await adopt(manager, model, record)
            if problem is not None:
                log.error("model '%s': %s", model, problem)
