"""The version manager: what is loaded and where unversioned requests go. It runs every version action (activate,
rollback, load, unload) one at a time per model, with the swap protocol, and persists routing and audit events.
What loads at startup is in ``startup``, how the repository is followed in ``follow``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import AsyncIterator, Collection, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from services.gateway.backends.base import Backend
from services.gateway.errors import BackendUnavailable, Conflict, GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings
from services.gateway.state import Event, RoutingRecord, StateBusy, StateError, StateStore
from services.gateway.state.policies import CanaryPolicy
from services.gateway.state.records import now_iso
from services.gateway.tensors.types import VersionState
from services.gateway.versions.comparison import compare_versions
from services.gateway.versions.context import OnDemand
from services.gateway.versions.exports import on_disk, replaced, stamped
from services.gateway.versions.follow import poll, scan_repository
from services.gateway.versions.leases import Leases
from services.gateway.versions.node import NodeWorkers
from services.gateway.versions.notes import VersionNotes
from services.gateway.versions.progress import GATEWAY, ActionReport, Progress, Steps
from services.gateway.versions.replay_check import ReplayOptions, refusal, replay_check
from services.gateway.versions.replicas import catch_up, follow
from services.gateway.versions.reports import failed, finish
from services.gateway.versions.routing import Router
from services.gateway.versions.shadow import ShadowRunner
from services.gateway.versions.startup import start_models
from services.gateway.versions.traffic import watch_canaries
from services.gateway.versions.warmup import WarmedUp, WarmupError, warm_up
from services.gateway.versions.windows import TrafficWindows

log = logging.getLogger(__name__)


class VersionManager:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        backend: Backend,
        router: Router,
        leases: Leases,
        store: StateStore,
        metrics: GatewayMetrics,
        windows: TrafficWindows,
        shadows: ShadowRunner,
    ) -> None:
        self.settings = settings
        self.windows = windows
        self.shadows = shadows
        self.catalog = catalog
        self.backend = backend
        self.router = router
        self.leases = leases
        self.store = store
        self.metrics = metrics
        self._locks: dict[str, asyncio.Lock] = {}
        self.progress: dict[str, Progress] = {}
        """The action running on each model now (the CLI's live view polls it)."""
        self.last: dict[str, ActionReport] = {}
        self.follow_failures: dict[tuple[str, int], float] = {}
        """(model, generation) -> when following a routing record another gateway wrote failed (``replicas``)."""
        self.behind: dict[str, tuple[int, str]] = {}
        """model -> the newest routing generation another gateway wrote that this one could not take, and why, until
        it routes by that generation or a newer one (the admin API names it as the model's problem)."""
        self.notes = VersionNotes()
        """What the admin API and the repository index say of each version that serves."""
        config_sent = getattr(backend, "config_sent", None)  # the Triton backend: each load or unload sends it whole
        if config_sent is not None:
            config_sent.append(self.notes.config_sent)
        self._held: dict[str, str] = {}
        """model -> the ``since`` of the canary whose promotion waits for its version to be ready (logged once)."""
        self.last_replay: dict[str, dict[str, Any]] = {}
        """The last replay check's report of each model (an activation's ``verify_replay``), passed or not."""
        self.loaded_exports: dict[tuple[str, int], str] = {}
        """(model, version) -> the export its folder held when this gateway loaded it (``exports.on_disk``): a version
        whose folder was replaced since serves the files it was loaded from, not those a record would name."""
        self._tasks: list[asyncio.Task[None]] = []
        self.cache: OnDemand | None = None
        """The model cache (``SWITCHYARD_MODEL_CACHE_MB``), set by the app before ``start``."""
        self.workers: NodeWorkers | None = None
        """The node's other workers, on the worker that runs its version actions once they all started
        (``switchyard serve --workers N``): every action's versions are prepared and its routing followed there too."""

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, *, acting: bool = True) -> None:
        """Open the state store, load and route every model (``startup``), and follow the repository.
        ``acting=False``: a worker of a node whose version actions run on another worker: it neither polls the
        repository nor judges canaries (that worker does, and tells it the routing)."""
        await self.store.open()
        await start_models(self)
        if self.cache is not None:
            self.cache.attach(self)
        if acting and self.settings.repository_poll_s > 0:
            self._tasks.append(asyncio.create_task(poll(self), name="repository-poll"))
        if acting:
            self._tasks.append(asyncio.create_task(watch_canaries(self), name="canary-watch"))
        self._tasks.append(asyncio.create_task(self.store.watch(self._followed), name="routing-watch"))

    async def scan(self, *, actor: str = GATEWAY) -> dict[str, Any]:
        """Read the repository again (``follow``): new models load and route, new versions are only listed."""
        return await scan_repository(self, actor)

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.shadows.close()
        await self.store.close()

    # -- actions --------------------------------------------------------------------------------------------
    async def activate(
        self,
        model: str,
        version: int,
        *,
        keep_previous: bool = True,
        drain_timeout_s: float | None = None,
        compare: bool = True,
        actor: str = GATEWAY,
        verify_replay: ReplayOptions | None = None,
    ) -> ActionReport:
        """``verify_replay``: before the flip, replay the newest logged requests on ``version`` and refuse it (422,
        the report in the answer) when its answers differ from the logged ones (``replay_check``)."""
        async with self.exclusive(model, "activate", version, actor) as steps:
            return await self._switch(
                model, version, steps, keep_previous, drain_timeout_s, compare, actor, verify_replay
            )

    async def promote(self, model: str, canary: CanaryPolicy) -> ActionReport | None:
        """Activate ``canary``'s version as the canary watch's promotion, only while the routing still has that split
        and its version is loaded, ready and warmed up: a version that served none of the canary's traffic is never
        made stable by the clock alone. ``None`` when it is not promoted now (the watch looks again)."""
        async with self.exclusive(model, "activate", canary.version) as steps:
            record = self.router.record(model)
            if record is None or record.canary != canary:
                return None  # the split changed while the watch judged it: the next period judges the new one
            if self.backend.state(model, canary.version) is not VersionState.READY or self.router.is_warming(
                model, canary.version
            ):
                if self._held.get(model) != canary.since:
                    self._held[model] = canary.since
                    log.warning(
                        "model '%s': canary version %d is due for promotion but is not loaded and ready (%s): not "
                        "promoting it until it is", model, canary.version,
                        self.router.problem(model, canary.version) or "not loaded",
                    )
                return None
            self._held.pop(model, None)
            log.info("model '%s': canary version %d behaved for %gs: promoting it", model, canary.version,
                     canary.promote_after_s or 0)
            return await self._switch(model, canary.version, steps, True, None, True, GATEWAY)

    async def rollback(
        self,
        model: str,
        *,
        keep_previous: bool = True,
        drain_timeout_s: float | None = None,
        compare: bool = False,
        actor: str = GATEWAY,
    ) -> ActionReport:
        async with self.exclusive(model, "rollback", None, actor) as steps:
            record = self.router.record(model)
            if record is None or record.previous is None:
                raise Conflict(f"model '{model}' has no previous version to roll back to")
            entry = self.catalog.entry(model)
            why = replaced(record, await asyncio.to_thread(on_disk, entry, {record.previous}), record.previous)
            if why is not None:
                # A rollback returns to what served before; another export under its number never served here.
                raise Conflict(
                    f"model '{model}' cannot roll back to version {record.previous}: its files on disk are {why}; "
                    f"activate it to serve this export (switchyard models activate {model} {record.previous})"
                )
            steps.progress.version = record.previous
            return await self._switch(model, record.previous, steps, keep_previous, drain_timeout_s, compare, actor)

    # -- the swap protocol ----------------------------------------------------------------------------------
    async def _switch(
        self,
        model: str,
        version: int,
        steps: Steps,
        keep_previous: bool,
        drain_timeout_s: float | None,
        compare: bool,
        actor: str,
        verify_replay: ReplayOptions | None = None,
    ) -> ActionReport:
        record = self.router.record(model)
        # A model unloaded through the repository API serves no version: its ``stable`` is only what served last,
        # so activating it routes the model again (as a repository load would) rather than being a no-op.
        old = record.stable if record is not None and not record.unloaded else None
        versions = {"from": old, "to": version}
        if old == version:
            self.metrics.version_switches.labels(model, "unchanged").inc()
            return await finish(self, steps, "unchanged", versions, actor)
        comparison = replayed = None
        warmed: WarmedUp | None = None
        try:
            warmed = await self.prepare(model, version, steps)
            if compare and old is not None and self.backend.state(model, old) is VersionState.READY:
                async with steps.run("compare"):
                    comparison = await compare_versions(
                        self.backend, self.catalog.entry(model), version, old, warmed, self.settings.warmup_timeout_s
                    )
            if verify_replay is not None:
                async with steps.run("replay"):
                    replayed = await self.replay(model, version, verify_replay)
            async with steps.run("flip"):
                if record is None:
                    routed = RoutingRecord(stable=version)
                elif record.stable == version:  # routed again after a repository unload: no previous to set
                    routed = record.but(unloaded=False)
                else:
                    routed = record.switched_to(version)
                dropped = {old} if old is not None and not keep_previous else set()
                routed = dataclasses.replace(routed, loaded=self.loaded_now(model, plus={version}, minus=dropped))
                # Loaded by this action: its export is the one on disk now; else the one it was loaded as.
                routed = await self.commit_routing(model, routed, fresh={version} if warmed is not None else ())
        except GatewayError as exc:
            if warmed is not None and self.backend.state(model, version) is not None:
                await self.quietly(self.backend.unload(model, version), f"unloading version {version}")
            self.metrics.version_switches.labels(model, "failed").inc()
            raise await failed(self, steps, exc, versions, actor, old) from None
        flipped_at = steps.mark_flip()
        self.metrics.version_switches.labels(model, "ok").inc()
        drained, after_flip_error = True, None
        unloaded: tuple[int, ...] = ()
        if old is not None:
            async with steps.run("drain"):
                drained = await self.leases.drain(model, old, self.drain_timeout(drain_timeout_s))
            steps.mark("to_drained")
            if not keep_previous and self.backend.state(model, old) is not None:
                try:
                    async with steps.run("unload"):
                        await self.backend.unload(model, old)
                    unloaded = (old,)
                except GatewayError as exc:  # the switch itself is done; say what is left behind
                    after_flip_error = f"unloading version {old} failed: {exc}"
                    log.error("model '%s': %s", model, after_flip_error)
        report = await finish(
            self, steps, "ok", versions, actor, comparison=comparison, error=after_flip_error,
            generation=routed.generation, replay=replayed,
        )
        return report.but(
            routing=routed,
            comparison=comparison,
            drained=drained,
            in_flight_left=self.leases.count(model, old) if old is not None else 0,
            unloaded=unloaded,
            flipped_at=flipped_at,
        )

    async def replay(self, model: str, version: int, options: ReplayOptions) -> dict[str, Any]:
        """The replay check's report (kept as the model's ``last_replay``); ``ReplayRefused`` when it failed."""
        report = await replay_check(
            self.backend, model, version, options.source, model_dir=self.catalog.entry(model).path,
            limit=options.limit, atol=options.atol, rtol=options.rtol, timeout_s=self.settings.warmup_timeout_s,
        )
        data = {**report.to_json(), "checked_at": now_iso()}
        self.last_replay[model] = data
        refused = refusal(report)
        if refused is not None:
            raise refused
        return data

    async def prepare(self, model: str, version: int, steps: Steps) -> WarmedUp | None:
        """Load ``version`` (unless it is loaded) and warm it up; undo what this did on failure. The warm-up when
        it was loaded here, ``None`` when it was loaded already."""
        try:
            async with steps.run("load"):
                loaded_here = self.backend.state(model, version) is not VersionState.READY
                if loaded_here:
                    await self.backend.load(model, version)  # re-reads the model's config and versions from disk
                else:
                    await self._same_export(model, version)
        except GatewayError as exc:
            await self._forget_failed_load(model, version, exc)
            raise
        try:
            warmed = await self.warm(model, version, steps) if loaded_here else None
            if self.workers is not None:
                async with steps.run("workers_prepare"):
                    for worker, seconds in (await self.workers.prepare(model, version)).items():
                        steps.worker(worker, seconds)
        except GatewayError:
            if loaded_here:
                await self.quietly(self.backend.unload(model, version), f"unloading version {version}")
            if self.workers is not None:
                await self.workers.discard(model, version)
            raise
        return warmed

    async def _forget_failed_load(self, model: str, version: int, exc: GatewayError) -> None:
        """A load the backend tried and failed leaves nothing behind: a backend keeps such a version as
        ``UNAVAILABLE``, which would read as loaded. Why it failed stays noted on the version, as a failed warm-up's
        does (pinned requests and the admin API give it). A load that never reached the version (not on disk, the
        backend down) leaves no state and notes nothing."""
        if self.backend.state(model, version) is not VersionState.UNAVAILABLE:
            return
        reason = self.backend.problem(model, version) or f"loading failed: {exc}"
        await self.quietly(self.backend.unload(model, version), f"unloading version {version}")
        self.router.note(model, version, reason)

    async def _same_export(self, model: str, version: int) -> None:
        """409 when ``version`` is loaded from another export than its folder holds now (the model deleted and exported
        again while it served): routing to it would name the export on disk while the one loaded answers. Not on a
        shared model server (Triton), which other gateways load too: what it loaded is its own to know."""
        if self.backend.shared_server:
            return
        loaded = self.loaded_exports.get((model, version))
        now = (await asyncio.to_thread(on_disk, self.catalog.entry(model), {version})).get(version)
        if loaded is not None and now is not None and now != loaded:
            raise Conflict(
                f"model '{model}' version {version} is loaded from another export ({loaded}) than its folder holds now "
                f"({now}); unload it (switchyard models unload {model} {version}) and try again to serve the files "
                "on disk"
            )

    async def warm(self, model: str, version: int, steps: Steps) -> WarmedUp:
        """Warm up ``version``, loaded a moment ago (every load is warmed up: actions, startup, the model cache), and
        note which export it was loaded from."""
        found = await asyncio.to_thread(on_disk, self.catalog.entry(model), {version})
        if version in found:
            self.loaded_exports[model, version] = found[version]
        else:
            self.loaded_exports.pop((model, version), None)
        self.router.warming(model, version, True)
        try:
            async with steps.run("warmup"):
                warmed = await warm_up(
                    self.backend, self.catalog.entry(model), version, timeout_s=self.settings.warmup_timeout_s
                )
        except WarmupError as exc:
            self.router.note(model, version, f"warm-up failed: {exc}")
            raise GatewayError(str(exc), 422) from None
        finally:
            self.router.warming(model, version, False)
        self.router.note(model, version, None)
        note = f"serving without a full warm-up: {'; '.join(warmed.failed)}" if warmed.failed else None
        self.notes.warmed(model, version, note)
        if note is not None:  # invented data only (declared data that fails raised above): serve, but say so
            self.metrics.invented_warmup_failures.labels(model).inc()
            log.warning("model '%s' version %d is %s", model, version, note)
        if warmed.sources:
            log.info("warmed model '%s' version %d with %s", model, version, "; ".join(warmed.sources))
        return warmed

    # -- bookkeeping ----------------------------------------------------------------------------------------
    @asynccontextmanager
    async def exclusive(
        self, model: str, action: str, version: int | None, actor: str = GATEWAY
    ) -> AsyncIterator[Steps]:
        """One action per model at a time: a second one is refused (409), never queued behind the first. An action
        the state store refuses to lock (Redis down) is refused (503) and recorded in the audit log as failed, by
        ``actor``: the store keeps the event until it can write it."""
        self.catalog.entry(model)
        lock = self.lock(model)
        if lock.locked():
            busy = self.progress.get(model)
            doing = f"{busy.action} of version {busy.version} is at step '{busy.step}'" if busy else "it is following"
            raise Conflict(f"model '{model}' is busy: {doing}; try again when it has finished")
        holder = f"{socket.gethostname()} pid {os.getpid()}: {action} of version {version}"
        async with lock:
            progress = Progress(action, version)
            self.progress[model] = progress
            locked = False
            try:
                async with self.store.lock(model, holder):
                    await catch_up(self, model)  # another gateway may have changed the routing a moment ago
                    locked = True
                    yield Steps(model, self.metrics, progress)
            except StateBusy as exc:
                raise Conflict(str(exc)) from None
            except StateError as exc:
                refused = BackendUnavailable(f"{action} refused: {exc}")
                if not locked:  # once it ran, the action recorded its own outcome
                    versions: dict[str, int | None] = {} if version is None else {"version": version}
                    await self.record(Event(action, model, "failed", versions, step="lock", error=str(refused),
                                            actor=actor))
                raise refused from None
            finally:
                del self.progress[model]

    async def _followed(self, model: str, record: RoutingRecord) -> None:
        await follow(self, model, record)

    async def audit_events(self, model: str | None, limit: int) -> list[Event]:
        """The newest ``limit`` events of the audit log (``model``'s, or every model's); a store that cannot be read
        (Redis down) is a 503 naming why, not a traceback."""
        try:
            return list(await self.store.events(model, limit))
        except StateError as exc:
            raise BackendUnavailable(f"the audit log cannot be read: {exc}") from None

    def loaded_now(self, model: str, *, plus: set[int] | None = None, minus: set[int] | None = None) -> tuple[int, ...]:
        """What a routing record says is loaded: the ready versions, with what the action is about to add or drop."""
        ready = {v for v, state in self.backend.models().get(model, {}).items() if state is VersionState.READY}
        return tuple(sorted((ready | (plus or set())) - (minus or set())))

    def lock(self, model: str) -> asyncio.Lock:
        """This gateway's lock of one model's actions (the store's lock covers the other gateways)."""
        return self._locks.setdefault(model, asyncio.Lock())

    async def commit_routing(
        self, model: str, record: RoutingRecord, *, fresh: Collection[int] = ()
    ) -> RoutingRecord:
        """Persist ``record`` (durable first: a crash right after keeps either routing), then route by it; 503 when
        the state store cannot take it, and then nothing changed. The record names the export of every version it
        routes to (``exports.stamped``): the ``fresh`` versions the action has just loaded from disk, the others as
        the record they follow named them. The record as committed."""
        record = await stamped(self.catalog.entry(model), record, fresh)
        try:
            await self.store.save_routing(model, record)
        except StateError as exc:
            raise BackendUnavailable(f"the routing could not be persisted: {exc}") from None
        self.set_routing(model, record)
        if self.workers is not None:  # in force in every worker before the action answers
            followed = await self.workers.follow(model, record)
            progress = self.progress.get(model)
            if progress is not None:
                for worker, seconds in followed.items():
                    progress.workers.setdefault(str(worker), {}).update(seconds)
        return record

    def set_routing(self, model: str, record: RoutingRecord) -> None:
        self.router.set(model, record)
        behind = self.behind.get(model)
        if behind is not None and record.generation >= behind[0]:
            del self.behind[model]
        self.windows.watch(model, record)  # every routing change starts the canary's windows afresh
        self.metrics.known_model(model)
        self.metrics.active_version.labels(model).set(record.stable)
        self.metrics.canary_weight.labels(model).set(record.canary.weight if record.canary is not None else 0)

    async def record(self, event: Event) -> None:
        try:
            await self.store.append_event(event)
        except StateError as exc:  # the audit log must not undo an action that succeeded
            log.error("audit event not written (%s): %s", exc, event)

    def drain_timeout(self, requested: float | None) -> float:
        return self.settings.drain_timeout_s if requested is None else requested

    @staticmethod
    async def quietly(call: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await call
        except GatewayError as exc:
            log.error("%s failed: %s", what, exc)
