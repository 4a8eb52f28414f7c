"""What the gateway loads and routes when it starts: the versions the config's policy selects and those the
persisted routing names, each warmed up; the persisted routing when its stable version is still there. A version
that fails to load or warm up is logged and stays a problem of the model (``Router.failures``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from services.gateway.errors import GatewayError
from services.gateway.state import Event, RoutingRecord, StateError
from services.gateway.tensors.types import VersionState
from services.gateway.versions.context import VersionContext
from services.gateway.versions.exports import Checked, check, stamped
from services.gateway.versions.first_stable import first_stable
from services.gateway.versions.progress import GATEWAY, Progress, Steps

log = logging.getLogger(__name__)


async def start_models(manager: VersionContext) -> None:
    records = dict(await manager.store.load_routing())
    await asyncio.to_thread(manager.catalog.scan)
    initial: dict[str, set[int]] = {}
    checks: dict[str, Checked] = {}
    for name, entry in manager.catalog.entries.items():
        if entry.problem is not None or not entry.available:
            log.error("model '%s' is unavailable: %s", name, entry.problem or f"no version folder in {entry.path}")
            continue
        record = records.get(name)
        if record is not None and record.unloaded:  # stays unloaded, as Triton keeps a model it was told to unload
            await _route_unloaded(manager, name, record, set(entry.available))
            continue
        replaced_stable = False
        if record is not None:
            # A version folder replaced by another export (the model deleted and exported again) is not what the
            # routing chose: it is neither loaded nor routed for the record's sake.
            checks[name] = await asyncio.to_thread(check, entry, record)
            record, replaced_stable = checks[name].record, checks[name].stable is not None
        # What the version policy selects (as Triton would load), plus what the record says the replicas keep
        # loaded: a version exported since, which the policy selects, loads on a restart as on a first start.
        recorded = set(record.loaded) & set(entry.available) if record is not None else set()
        wanted = recorded | set(entry.selected)
        if record is not None:
            named = record.named() - ({record.stable} if replaced_stable else set())
            wanted |= named & set(entry.available)
        if record is None or record.stable not in entry.available or replaced_stable:
            wanted |= set(first_stable(entry).candidates)  # the latest released one, when the policy passed it over
        initial[name] = wanted
    cache = manager.cache
    on_demand = set() if cache is None else {name for name in initial if name not in cache.pinned}
    await manager.backend.start({name: versions for name, versions in initial.items() if name not in on_demand})
    for name, versions in initial.items():
        if name in on_demand:  # routed now, loaded on its first request (the model cache)
            await _route(manager, name, records.get(name), checks.get(name), versions, cold=True)
            continue
        for version in sorted(versions):
            await _warm(manager, name, version)
        await _route(manager, name, records.get(name), checks.get(name), versions)


async def _warm(manager: VersionContext, model: str, version: int) -> None:
    state = manager.backend.state(model, version)
    if state is not VersionState.READY:
        reason = manager.backend.problem(model, version) or (state or VersionState.UNAVAILABLE).value.lower()
        log.error("model '%s' version %d is not serving: %s", model, version, reason)
        return
    try:
        await manager.warm(model, version, Steps(model, manager.metrics, Progress("startup", version)))
    except GatewayError as exc:
        await manager.quietly(manager.backend.unload(model, version), f"unloading version {version}")
        log.error("model '%s' version %d failed its warm-up and was unloaded: %s", model, version, exc)


async def _route(
    manager: VersionContext,
    model: str,
    persisted: RoutingRecord | None,
    checked: Checked | None,
    versions: set[int],
    *,
    cold: bool = False,
) -> None:
    """The persisted routing when its stable version is still on disk (``versions`` holds it then) and still the
    export it names, less the other versions it names that are not; else the highest version that loaded among those
    the policy selects (the policy's own choice when none did, e.g. Triton is still down). A version missing from disk
    or replaced by another export is never carried into the routing: the repair is persisted, logged and in the audit
    log. ``cold``: nothing was loaded (the model cache loads it on demand), so the policy's choice among the versions
    on disk."""
    record = checked.record if checked is not None else None
    errors = [f"dropped from the persisted routing: {checked.dropped}"] if checked and checked.dropped else []
    entry = manager.catalog.entry(model)
    if record is not None and checked is not None and checked.stable is None and record.stable in versions:
        repaired, dropped = _on_disk(record, set(entry.available))
        if dropped and not errors and manager.store.shared and _routes_alike(record, repaired):
            # Only versions the shared record keeps loaded without routing to them are missing (this copy of the
            # repository was pruned): this gateway serves exactly what the others do, so it follows the shared
            # record as it is. A rollback to a missing previous version fails here with its own error.
            log.warning("model '%s': the shared routing (generation %d) keeps %s loaded, which this gateway's "
                        "repository lacks; it routes as the other gateways do", model, record.generation, dropped)
            manager.set_routing(model, record)
            return
        if dropped:
            errors.insert(0, f"the persisted routing names {dropped}, gone from the repository: dropped from it")
        log.info("model '%s': stable version %d, from the persisted routing (generation %d)", model,
                 repaired.stable, repaired.generation)
        if errors:
            await _settle(manager, model, persisted, repaired, "; ".join(errors))
        else:
            manager.set_routing(model, repaired)
        return
    why = "no routing state"
    if record is not None and checked is not None and checked.stable is not None:
        why = "the persisted stable version is another export now"
        errors.insert(0, f"the persisted stable version {record.stable} is not the export that was activated: its "
                         f"files on disk are {checked.stable}; unversioned requests do not go to it (activate it to "
                         "serve this export)")
    elif record is not None:
        why = "the persisted stable version is gone"
        errors.insert(0, f"the persisted stable version {record.stable} is gone from the repository")
    choice = first_stable(entry)
    serving = [v for v in choice.candidates if cold or manager.backend.state(model, v) is VersionState.READY]
    if not serving and manager.router.problem(model) is not None:
        return  # nothing it could route to serves, and the reason is known: reported, not routed
    stable = choice.pick(lambda v: v in serving)
    if stable is None:
        log.error("model '%s' serves no unversioned request: %s", model, choice.rule)
        manager.router.unrouted(model, choice.rule)
        return
    log.info("model '%s': %s; stable version %d, %s", model, why, stable, choice.rule)
    # The stable version the record named is not on disk, or not the export it named (else it would route): it
    # cannot be the one to roll back to. The record's own previous version can, while it is still there.
    previous = record.previous if record is not None else None
    previous = previous if previous in entry.available and previous != stable else None
    routed = RoutingRecord(
        stable=stable,
        previous=previous,
        generation=record.generation + 1 if record is not None else 1,
        loaded=manager.loaded_now(model),
        # The previous version's export is the one that served, checked above; the stable one's is read from disk.
        exports={v: identity for v, identity in record.exports.items() if v == previous} if record else {},
    )
    error = f"{'; '.join(errors)}; serving version {stable}" if errors else None
    await _settle(manager, model, persisted, routed, error, rule=choice.rule)


async def _route_unloaded(manager: VersionContext, model: str, record: RoutingRecord, available: set[int]) -> None:
    """An unloaded model's record, less the versions it names that are gone (its ``stable`` stays: the version the
    audit log refers to, routed to by nothing until a load)."""
    repaired, dropped = _on_disk(record, available)
    if dropped and not manager.store.shared:  # a shared record: another gateway's repository may hold them
        repaired = await _persist(manager, model, repaired, f"the persisted routing names {dropped}, gone from the "
                                                            "repository: dropped from it")
        manager.set_routing(model, repaired)
        return
    manager.set_routing(model, record)


def _routes_alike(record: RoutingRecord, repaired: RoutingRecord) -> bool:
    """Whether requests route the same by both: the same stable version, canary and shadow (``previous`` and
    ``loaded`` only matter to later actions)."""
    return (record.stable, record.canary, record.shadow) == (repaired.stable, repaired.canary, repaired.shadow)


def _on_disk(record: RoutingRecord, available: set[int]) -> tuple[RoutingRecord, str]:
    """``record`` without the versions besides ``stable`` that are not in ``available``, and those in words
    ("previous version 99, canary version 7"; empty when it names none)."""
    changes: dict[str, object] = {}
    gone: list[str] = []
    if record.previous is not None and record.previous not in available:
        changes["previous"] = None
        gone.append(f"previous version {record.previous}")
    for kind, policy in (("canary", record.canary), ("shadow", record.shadow)):
        if policy is not None and policy.version not in available:
            changes[kind] = None
            gone.append(f"{kind} version {policy.version}")
    missing = [version for version in record.loaded if version not in available]
    if missing:
        changes["loaded"] = tuple(version for version in record.loaded if version in available)
        gone.append(f"loaded version{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")
    if not changes:
        return record, ""
    return record.but(**changes), ", ".join(gone)


async def _settle(
    manager: VersionContext,
    model: str,
    persisted: RoutingRecord | None,
    routed: RoutingRecord,
    error: str | None,
    *,
    rule: str | None = None,
) -> None:
    """Route by ``routed``, what this start chose instead of the ``persisted`` record (``error`` says why). Saved,
    unless the store is shared and held a record: the other gateways serve by that one, and their repositories may
    hold what this one lacks (a copy out of step, a volume mounted late), so rewriting it would switch them all. This
    gateway then serves its choice at the shared record's generation, says so (the admin API's ``problem``), and takes
    the shared record once it can (``replicas.follow``) or routes by the next one an action writes."""
    if persisted is None or not manager.store.shared:
        manager.set_routing(model, await _persist(manager, model, routed, error, rule=rule))
        return
    local = dataclasses.replace(await stamped(manager.catalog.entry(model), routed), generation=persisted.generation)
    manager.set_routing(model, local)
    reason = (error or "it cannot serve it").removesuffix(f"; serving version {local.stable}")
    why = (
        f"this gateway does not serve routing generation {persisted.generation} (stable {persisted.stable}) that the "
        f"gateways share: {reason}; it serves version {local.stable} meanwhile, leaves the shared routing as the "
        "other gateways serve it, and takes it once its repository holds what it names"
    )
    manager.behind[model] = (persisted.generation, why)  # after set_routing, which clears what it catches up with
    log.error("model '%s': %s", model, why)
    await manager.record(Event("startup", model, "ok", {"stable": local.stable}, error=why, actor=GATEWAY,
                               generation=persisted.generation, detail={"rule": rule} if rule else {}))


async def _persist(
    manager: VersionContext, model: str, routed: RoutingRecord, error: str | None, *, rule: str | None = None
) -> RoutingRecord:
    """Save the routing startup chose, naming the export of each version it routes to, and say why when it is not
    what the store held (``rule``: which rule chose the stable version, when no routing state did). The record as
    saved."""
    routed = await stamped(manager.catalog.entry(model), routed)
    try:
        await manager.store.save_routing(model, routed)
    except StateError as exc:
        log.error("routing of model '%s' is not persisted: %s", model, exc)
    if error:
        log.error("model '%s': %s", model, error)
    await manager.record(Event("startup", model, "ok", {"stable": routed.stable}, error=error, actor=GATEWAY,
                               generation=routed.generation, detail={"rule": rule} if rule else {}))
    return routed
