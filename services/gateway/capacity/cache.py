"""``ModelCache``: which model versions are resident, what each costs, and which to unload to make room.

Every load and unload of the node goes through ``CachedBackend`` (``capacity/backend.py``), which asks the cache for
room first and tells it the cost after; a request for a model whose routed version is not loaded waits in
``fault_in`` (one load per version however many wait: single flight), within its own deadline.

What may be unloaded to make room, one model at a time and only as many as needed: the least recently used model
that is not pinned, has no request in flight (its leases: the same count a drain waits for), is not in the middle
of a version action and has no request still waiting for the load that brought it in (``Demand``), once it was
loaded at least ``model_min_residency_s`` ago (until then the load waits for it: a busier model is never unloaded in
its place). When nothing may go, a load waits for room rather than exceed the budget: a load on demand while one of
its requests still waits, others ``ROOM_WAIT_S``. Loads take turns (``room_for``) from making room to counting their
cost, so room is never promised twice; one waiting for room gives up its turn while it waits. ``model_idle_unload_s``
unloads a model no request used for that long, budget or not. See docs/model-cache.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from services.gateway.capacity.demand import Demand, load_demand
from services.gateway.capacity.memory import Cost, Measure, declared_mb, files_mb, this_process
from services.gateway.capacity.metrics import CacheMetrics
from services.gateway.errors import DeadlineExceeded, GatewayError, Overloaded
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings, pinned
from services.gateway.versions.progress import Progress, Steps
from services.gateway.versions.routing import COLD

if TYPE_CHECKING:
    from services.gateway.versions.manager import VersionManager

log = logging.getLogger(__name__)

_POLL_S = 0.05


class ModelTooLarge(GatewayError):
    """One version alone needs more than the whole budget: it can never be loaded under it."""

    status = 507  # Insufficient Storage: the request is fine, the node's budget is what cannot hold it


class CacheFull(Overloaded):
    """No loaded model may be unloaded now (all in use, pinned or just loaded) and the wait ran out."""

    reason = "overload"


@dataclass
class Resident:
    """One model's loaded versions and their costs, and when it was loaded and last used."""

    costs: dict[int, Cost]
    loaded_at: float
    last_used: float
    brought_in_for: list[Demand] = field(default_factory=list)
    """The loads on demand that loaded its versions: it is not unloaded while one of their requests still waits
    (between the load's end and the request taking its lease)."""

    @property
    def awaited(self) -> bool:
        return any(demand.waiting > 0 for demand in self.brought_in_for)

    @property
    def mb(self) -> float:
        return sum(cost.mb for cost in self.costs.values())


@dataclass
class CacheFigures:
    """What the index, the admin API and the console show of one model."""

    resident: bool
    memory_mb: float
    how: str
    idle_s: float | None

    def describe(self) -> str:
        if not self.how:
            return "never loaded here"
        return f"{'uses' if self.resident else 'last used'} {self.memory_mb:.1f} MiB, {self.how}"


@dataclass
class ModelCache:
    settings: Settings
    catalog: Catalog
    metrics: GatewayMetrics
    """The gateway's, for the steps of a load on demand (``switchyard_swap_step_seconds``)."""
    figures: CacheMetrics
    clock: Callable[[], float] = time.monotonic
    measure: Measure = this_process
    """The memory of what holds the models, MiB (this process on the embedded backend, a local Triton's process
    tree): a load's cost is what it grew by. None when unmeasurable: then its declared or estimated cost."""
    residents: dict[str, Resident] = field(default_factory=dict)
    _known: dict[tuple[str, int], Cost] = field(default_factory=dict)
    """The last cost seen of each version, kept after it is unloaded: what its next load expects to need."""
    _unloaded_by: dict[str, str] = field(default_factory=dict)
    """Why the cache last unloaded each model it unloaded (``capacity``, ``idle``), until it is loaded again."""
    _loading: dict[tuple[str, int], Demand] = field(default_factory=dict)
    _evicting: dict[str, asyncio.Event] = field(default_factory=dict)
    room: asyncio.Lock = field(default_factory=asyncio.Lock)
    """A load's turn (``room_for``): held from finding room to accounting its cost, so loads are measured one at a
    time and the room one was given is not counted on by another; never held while waiting for room."""
    _manager: VersionManager | None = None
    _idle_task: asyncio.Task[None] | None = None
    _warned_pinned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        assert self.settings.model_cache_mb is not None
        self.budget_mb: float = self.settings.model_cache_mb
        self.pinned = pinned(self.settings)
        self._hits = self.figures.requests.labels("hit")
        self.figures.budget.set(self.budget_mb * 2**20)
        self.figures.used.set_function(lambda: self.used_mb * 2**20)

    def check_pinned(self) -> None:
        """Warn of the pinned models the repository, as last read, does not have: a misspelled name would
        otherwise go unnoticed. Once per name: called again (a rescan), it says nothing it said already."""
        unknown = sorted(self.pinned - set(self.catalog.entries) - self._warned_pinned)
        if unknown:
            self._warned_pinned.update(unknown)
            log.warning("SWITCHYARD_PINNED_MODELS names %s, not in the repository %s (pinned if they appear)",
                        unknown, self.catalog.root)

    def attach(self, manager: VersionManager) -> None:
        """The version manager whose locks, leases, router and warm-up the cache uses; starts the idle sweep."""
        self._manager = manager
        if self.settings.model_idle_unload_s > 0:
            self._idle_task = asyncio.get_running_loop().create_task(self._sweep_idle(), name="model-cache-idle")

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task

    @property
    def used_mb(self) -> float:
        return sum(resident.mb for resident in self.residents.values())

    # -- the request path -----------------------------------------------------------------------------------------
    def touch(self, model: str, *, hit: bool = True) -> None:
        """A request is served by the model: it is the most recently used now (``hit``: it was loaded already)."""
        resident = self.residents.get(model)
        if resident is not None:
            resident.last_used = self.clock()
        if hit:
            self._hits.inc()

    async def fault_in(self, model: str, version: int, deadline: float | None) -> None:
        """Load ``version`` of ``model`` for a request that found it unloaded; one load however many requests
        wait for it. Waits no longer than ``deadline`` (``time.monotonic()``); past it the answer says how far the
        load got (``_late``): 504 while loading (it goes on), 503 with ``Retry-After`` while no room was free."""
        key = (model, version)
        demand = self._loading.get(key)
        if demand is None or demand.task.done():  # done: a load that ended this very moment is not joined
            self.figures.requests.labels("miss").inc()
            demand = Demand(for_requests=True, until=0.0)
            demand.join(deadline)  # before the load starts: it waits for room only while someone waits
            demand.task = asyncio.get_running_loop().create_task(
                self._bring_in(model, version, demand), name=f"load {model}"
            )
            self._loading[key] = demand
            demand.task.add_done_callback(lambda _: self._loaded(key, demand))
        else:
            self.figures.requests.labels("miss_waiting").inc()
            demand.join(deadline)
        try:
            if deadline is None:
                await asyncio.shield(demand.task)
                return
            try:
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + (deadline - time.monotonic())):
                    await asyncio.shield(demand.task)
            except TimeoutError:
                raise self._late(model, version, demand) from None
        finally:
            demand.leave()

    def _late(self, model: str, version: int, demand: Demand) -> GatewayError:
        """The answer to a request whose deadline passed before its model was loaded, true to what the load does
        next: loading, or waiting for its turn, it goes on (504); waiting for room, it is given up once no request
        waits for it (503 with ``Retry-After``)."""
        if demand.stage == "loading":
            return DeadlineExceeded(
                f"model '{model}' version {version} was not loaded yet when the request's deadline passed (a cold "
                "start of the model cache; it goes on loading)"
            )
        if demand.stage == "room":
            return self._no_room(model, version, demand, "within the request's deadline")
        return DeadlineExceeded(
            f"model '{model}' version {version} was not loaded yet when the request's deadline passed (a cold start "
            "of the model cache, waiting for its turn: one load at a time, none during a version action of the "
            "model; it loads when its turn comes, room permitting)"
        )

    def _no_room(self, model: str, version: int, demand: Demand, when: str) -> CacheFull:
        needed = "" if demand.needed_mb is None else f" ({demand.needed_mb:.1f} MiB)"
        residency = self.settings.model_min_residency_s
        young = (f"loaded less than SWITCHYARD_MODEL_MIN_RESIDENCY_S ({residency:g} s) ago" if residency > 0
                 else "just loaded")
        error = CacheFull(
            f"model '{model}' version {version} could not be loaded: the model cache had no room free for it"
            f"{needed} {when} ({self.used_mb:.0f} of {self.budget_mb:g} MiB in use; every loaded model is pinned, "
            f"serving or {young}); retry later"
        )
        error.retry_after_s = self._retry_after_s()
        return error

    def _retry_after_s(self) -> int:
        """When a retry may find room: once the least recently used model that may go is old enough, else in a
        second (a request in flight ends, a load finishes)."""
        now = self.clock()
        movable = [(r.last_used, r.loaded_at) for m, r in self.residents.items() if self._movable(m, r)]
        if not movable:
            return 1
        age = now - min(movable)[1]
        return max(1, math.ceil(self.settings.model_min_residency_s - age))

    def prefetch(self, model: str, version: int) -> None:
        """Load ``version`` in the background, for no request in particular: a canary's or shadow's version that is
        not loaded (its traffic goes to the stable version, or is not copied, until it is). Once at a time."""
        key = (model, version)
        if key in self._loading or self._manager is None or self._manager.backend.state(model, version) is not None:
            return
        demand = Demand.background()
        demand.task = asyncio.get_running_loop().create_task(
            self._bring_in(model, version, demand), name=f"load {model}"
        )
        self._loading[key] = demand
        demand.task.add_done_callback(lambda _: self._prefetched(key, demand))

    def _loaded(self, key: tuple[str, int], demand: Demand) -> None:
        """A load for requests ended: its failure went to every request that waited for it (also when all of them
        gave up waiting: retrieved here, asyncio does not report it as lost)."""
        if self._loading.get(key) is demand:  # a newer load of the version may have taken its place already
            del self._loading[key]
        if not demand.task.cancelled():
            demand.task.exception()

    def _prefetched(self, key: tuple[str, int], demand: Demand) -> None:
        if self._loading.get(key) is demand:
            del self._loading[key]
        task = demand.task
        if not task.cancelled() and task.exception() is not None:
            log.warning("model cache: loading model '%s' version %d for its canary or shadow failed: %s",
                        key[0], key[1], task.exception())

    async def _bring_in(self, model: str, version: int, demand: Demand) -> None:
        manager = self._manager
        assert manager is not None, "attach() the version manager first"
        load_demand.set(demand)  # this task's own context: the load below waits for room only while it is wanted
        evicting = self._evicting.get(model)
        if evicting is not None:
            await evicting.wait()  # being unloaded right now: load it again once that is done
        started = self.clock()
        async with manager.lock(model):  # after a version action of the model, never beside one
            if manager.backend.state(model, version) is not None:
                return
            manager.progress[model] = progress = Progress("cache_load", version)
            try:
                steps = Steps(model, self.metrics, progress)
                async with steps.run("load"):
                    await manager.backend.load(model, version)
                try:
                    await manager.warm(model, version, steps)
                except GatewayError:
                    await manager.quietly(manager.backend.unload(model, version), f"unloading version {version}")
                    raise
            finally:
                manager.progress.pop(model, None)
        resident = self.residents.get(model)
        if resident is not None and demand.waiting > 0:  # kept for them; with none left, nothing to keep it for
            resident.brought_in_for = [kept for kept in resident.brought_in_for if kept.waiting > 0] + [demand]
        seconds = self.clock() - started
        self.figures.load_seconds.labels(model).observe(seconds)
        log.info("model cache: loaded model '%s' version %d on demand in %.2f s (%.0f of %.0f MiB in use)",
                 model, version, seconds, self.used_mb, self.budget_mb)

    # -- loads and unloads (CachedBackend) ------------------------------------------------------------------------
    def expected(self, model: str, version: int) -> Cost:
        """What a load of ``version`` is expected to need: its cost when last loaded, else ``floor``."""
        known = self._known.get((model, version))
        return known if known is not None else self.floor(model, version)

    def floor(self, model: str, version: int) -> Cost:
        """The least a load of ``version`` is counted at: its declared memory, else the size of its files (a
        measured load that grew the process by less counts this). Raises ``MemoryDeclarationError`` for a
        malformed declaration."""
        entry = self.catalog.entry(model)
        declared = declared_mb(entry.config, model)
        if declared is not None:
            return Cost(declared, "declared")
        return Cost(files_mb(entry.version_dir(version)), "estimated")

    def refuse_if_too_large(self, model: str, version: int, cost: Cost) -> None:
        if cost.mb > self.budget_mb:
            raise ModelTooLarge(
                f"model '{model}' version {version} needs {cost.describe()}, more than the whole model cache of "
                f"{self.budget_mb:g} MiB (SWITCHYARD_MODEL_CACHE_MB): raise the budget, or serve it elsewhere"
            )

    def refuse_if_pinned_out(self, model: str, version: int, needed_mb: float) -> None:
        """507 when the pinned models left too little of the budget for ever: they are never unloaded, so waiting
        for room could only end in a refusal (a gateway starting with more pinned than fits would wait at start)."""
        held = {m: r.mb for m, r in self.residents.items() if m in self.pinned and m != model}
        if held and sum(held.values()) + needed_mb > self.budget_mb:
            names = ", ".join(f"'{m}' {mb:.0f} MiB" for m, mb in sorted(held.items()))
            raise ModelTooLarge(
                f"model '{model}' version {version} needs {needed_mb:.1f} MiB, and the pinned models ({names}) hold "
                f"{sum(held.values()):.0f} of the model cache's {self.budget_mb:g} MiB for good "
                "(SWITCHYARD_PINNED_MODELS): pin fewer models, or raise SWITCHYARD_MODEL_CACHE_MB"
            )

    @contextlib.asynccontextmanager
    async def room_for(self, model: str, version: int, needed_mb: float, demand: Demand) -> AsyncIterator[None]:
        """The load's turn, with ``needed_mb`` free for it within the budget (``_make_room``), until it has counted its
        cost: the loads after it find that room taken, and each load is measured alone."""
        await self._make_room(model, version, needed_mb, demand)
        try:
            yield
        finally:
            self.room.release()

    async def _make_room(self, model: str, version: int, needed_mb: float, demand: Demand) -> None:
        """Take the load's turn (``room``) and unload least recently used models, one at a time, until ``needed_mb``
        more fit; returns holding the turn. When none may go, give the turn up and wait for one while ``demand`` is
        wanted: the loads behind it go ahead meanwhile (one that fits, or a version action's load of the very model
        it waits for, which holds that model until it ends). Raises ``CacheFull`` (503) when it no longer is wanted:
        the deadlines of the requests it is for passed (they were answered so), nobody waits for it any more, or
        ``ROOM_WAIT_S`` ran out for a load made for no request."""
        demand.needed_mb = needed_mb
        self.refuse_if_pinned_out(model, version, needed_mb)
        while True:
            await self.room.acquire()
            try:
                fits = await self._unload_for(model, needed_mb, demand)
            except BaseException:
                self.room.release()
                raise
            if fits:
                demand.stage = "loading"
                return
            self.room.release()
            if not demand.wanted():
                if demand.for_requests:
                    log.info("model cache: gave up loading model '%s' version %d: no room, and no request waits for "
                             "it any more", model, version)
                raise self._no_room(model, version, demand, "in time")
            demand.stage = "room"
            await asyncio.sleep(_POLL_S)

    async def _unload_for(self, model: str, needed_mb: float, demand: Demand) -> bool:
        """Unload least recently used models until ``needed_mb`` more fit; False when none may go now."""
        while self.used_mb + needed_mb > self.budget_mb:
            # Once it waited, it unloads others only while wanted: a request told "no room" was not loaded for.
            victim = self._victim(exclude=model) if demand.stage != "room" or demand.wanted() else None
            if victim is None:
                return False
            await self.evict(victim, "capacity")
        return True

    async def fit_after(self, model: str) -> None:
        """A load measured more than expected: unload others until the budget holds again, without waiting."""
        while self.used_mb > self.budget_mb:
            victim = self._victim(exclude=model)
            if victim is None:
                log.warning("model cache: %.0f of %.0f MiB in use after loading '%s' (it measured more than expected) "
                            "and nothing may be unloaded yet", self.used_mb, self.budget_mb, model)
                return
            await self.evict(victim, "capacity")

    def startup_failed(self, model: str, version: int, error: Exception) -> None:
        log.error("model cache: pinned model '%s' version %d did not load at start: %s", model, version, error)

    def remember(self, model: str, version: int, cost: Cost) -> None:
        """What ``version`` cost when loaded: what its next load expects to need (and is refused for, when over)."""
        self._known[model, version] = cost

    def loaded(self, model: str, version: int, cost: Cost) -> None:
        now = self.clock()
        resident = self.residents.get(model)
        if resident is None:
            resident = self.residents[model] = Resident({}, now, now)
            self.figures.resident.labels(model).set_function(lambda: self._resident_bytes(model))
        resident.costs[version] = cost
        self._known[model, version] = cost
        self._unloaded_by.pop(model, None)

    def unloaded(self, model: str, version: int) -> None:
        resident = self.residents.get(model)
        if resident is None:
            return
        resident.costs.pop(version, None)
        if not resident.costs:
            del self.residents[model]

    async def evict(self, model: str, reason: str) -> None:
        """Unload every loaded version of ``model`` (none has a request in flight: ``_victim`` checked, and the
        router sends new requests to ``fault_in`` from now on, which waits for this to finish)."""
        manager = self._manager
        assert manager is not None
        resident = self.residents[model]
        age = self.clock() - resident.loaded_at
        done = self._evicting[model] = asyncio.Event()
        versions = sorted(resident.costs)
        for version in versions:
            manager.router.evicting(model, version, True)
        try:
            for version in versions:
                await manager.backend.unload(model, version)
        finally:
            for version in versions:
                manager.router.evicting(model, version, False)
            del self._evicting[model]
            done.set()
        self._unloaded_by[model] = reason
        self.figures.evictions.labels(reason).inc()
        self.figures.age_at_eviction.observe(age)
        log.info("model cache: unloaded model '%s' (%s; loaded %.1f s ago; %.0f of %.0f MiB in use now)",
                 model, reason, age, self.used_mb, self.budget_mb)

    def _victim(self, exclude: str) -> str | None:
        """The least recently used model that may be unloaded, or None. Only the least recently used: when it is
        younger than the minimum residency the load waits for it rather than unload a busier model in its place
        (which would make the cache first-in-first-out under pressure, unloading the most used model the moment
        it is old enough)."""
        now = self.clock()
        movable = [
            (resident.last_used, model)
            for model, resident in self.residents.items()
            if model != exclude and self._movable(model, resident)
        ]
        if not movable:
            return None
        model = min(movable)[1]
        return model if now - self.residents[model].loaded_at >= self.settings.model_min_residency_s else None

    def _movable(self, model: str, resident: Resident) -> bool:
        """Whether ``model`` could be unloaded at all now: not pinned, not being unloaded, no request still waiting
        for the load that brought it in, no version action on it, no request in flight."""
        if model in self.pinned or model in self._evicting or resident.awaited:
            return False
        manager = self._manager
        assert manager is not None  # only pinned models are resident before it is attached
        if manager.lock(model).locked():  # a version action (or another load) of it is under way
            return False
        return all(manager.leases.count(model, version) == 0 for version in resident.costs)

    def _evictable(self, model: str, resident: Resident, now: float) -> bool:
        old_enough = now - resident.loaded_at >= self.settings.model_min_residency_s
        return old_enough and self._movable(model, resident)

    async def _sweep_idle(self) -> None:
        limit = self.settings.model_idle_unload_s
        while True:
            await asyncio.sleep(min(1.0, limit / 2))
            for model in list(self.residents):
                # Read again after each unload: one this sweep is to look at next may have been unloaded (to make
                # room, through the API) or loaded again meanwhile.
                resident, now = self.residents.get(model), self.clock()
                if resident is None:
                    continue
                if now - resident.last_used >= limit and self._evictable(model, resident, now):
                    try:
                        await self.evict(model, "idle")
                    except GatewayError as exc:
                        log.error("model cache: unloading idle model '%s' failed: %s", model, exc)

    # -- what is shown --------------------------------------------------------------------------------------------
    def shown(self, model: str) -> CacheFigures:
        resident = self.residents.get(model)
        if resident is None:
            known = [cost for (name, _), cost in self._known.items() if name == model]
            return CacheFigures(False, known[-1].mb if known else 0.0, known[-1].how if known else "", None)
        hows = {cost.how for cost in resident.costs.values()}
        return CacheFigures(True, resident.mb, "/".join(sorted(hows)), self.clock() - resident.last_used)

    def summary(self) -> dict[str, Any]:
        return {"budget_mb": self.budget_mb, "used_mb": round(self.used_mb, 1), "pinned": sorted(self.pinned)}

    def view(self, model: str) -> dict[str, Any]:
        shown = self.shown(model)
        return {
            "resident": shown.resident,
            "memory_mb": round(shown.memory_mb, 2),
            "memory_is": shown.how or None,
            "idle_s": None if shown.idle_s is None else round(shown.idle_s, 1),
            "pinned": model in self.pinned,
            "unloaded_by": self._unloaded_by.get(model),
        }

    def reason(self, model: str) -> str:
        return f"{COLD} ({self.shown(model).describe()})"

    def _resident_bytes(self, model: str) -> float:
        resident = self.residents.get(model)
        return resident.mb * 2**20 if resident is not None else 0.0
