"""Triton's repository load and unload as version-manager actions. A load re-reads the model's config and version
folders, loads and warms up the versions its policy selects, flips the routing to the highest of them, then drains
and unloads the versions it no longer selects; an unload stops routing first, then drains and unloads every version.
Anything that fails before the flip is undone and the routing stays as it was."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.errors import GatewayError, InvalidInput, ModelNotFound, SwapFailed, load_failed, poll_failed
from services.gateway.repository import ModelEntry, read_entry
from services.gateway.repository_api.overrides import apply_override, describe_policy
from services.gateway.state import Event, RoutingRecord
from services.gateway.tensors.types import VersionState
from services.gateway.versions.follow import scan_repository
from services.gateway.versions.progress import ActionReport, Steps
from services.gateway.versions.reports import failed
from services.modelrepo.config import select_versions

if TYPE_CHECKING:
    from services.gateway.versions.manager import VersionManager

log = logging.getLogger(__name__)
LOAD, UNLOAD = "repository_load", "repository_unload"


class RepositoryActions:
    def __init__(self, manager: VersionManager) -> None:
        self._manager = manager
        self.unloading: dict[str, set[int]] = {}
        """model -> the versions an action of this class is draining or unloading now (the index says UNLOADING)."""

    async def load(self, model: str, override: str | None, actor: str) -> ActionReport:
        manager = self._manager
        if model not in manager.catalog.entries:  # a new folder: read it in, as the repository poller would
            await scan_repository(manager, actor)
            if model not in manager.catalog.entries:
                raise ModelNotFound(
                    poll_failed(model, "the repository has no folder of that name with a config.pbtxt")
                )
        async with manager.exclusive(model, LOAD, None, actor) as steps:
            entry = await self._read(model)
            config, selected = await self._selection(model, entry, override)
            target = max(selected)
            steps.progress.version = target
            await asyncio.to_thread(manager.catalog.refresh, model, target)  # what warm-up and metadata read
            return await self._load(model, steps, config, selected, actor, override is not None)

    async def unload(self, model: str, actor: str) -> ActionReport:
        manager = self._manager
        if model not in manager.catalog.entries:
            # Triton answers success for a model it does not have; so does the gateway, saying what it found.
            note = f"model '{model}' is not in the repository: nothing to unload"
            log.warning("%s (%s, asked by %s)", UNLOAD, note, actor)
            return ActionReport(model, UNLOAD, "unchanged", {"stable": None}, {}, note=note)
        async with manager.exclusive(model, UNLOAD, None, actor) as steps:
            record = manager.router.record(model)
            routed = record is not None and not record.unloaded
            loaded = sorted(manager.backend.models().get(model, {}))
            stable = record.stable if record is not None else None
            if not routed and not loaded:
                return await self._finish(steps, "unchanged", {"stable": stable}, actor, record, {})
            if record is not None and routed:
                async with steps.run("flip"):  # new requests get 404 from here; those admitted finish on their version
                    record = record.but(unloaded=True, loaded=(), canary=None, shadow=None)
                    await manager.commit_routing(model, record)
                steps.mark_flip()
            drained = await self._retire(model, steps, loaded, actor)
            detail = {"unloaded": loaded, "drained": drained}
            report = await self._finish(steps, "ok", {"stable": stable}, actor, record, detail)
            return report.but(drained=drained, unloaded=tuple(loaded))

    async def _read(self, model: str) -> ModelEntry:
        """The model's folder as it is on disk now (config and versions): a load re-reads them, as Triton's does."""
        path = self._manager.catalog.entry(model).path
        if not path.is_dir():
            raise ModelNotFound(poll_failed(model, f"it is gone from the repository (no folder {path})"))
        entry = await asyncio.to_thread(read_entry, path)
        if entry.problem is not None:
            raise GatewayError(poll_failed(model, entry.problem), 422)
        return entry

    async def _selection(
        self, model: str, entry: ModelEntry, override: str | None
    ) -> tuple[mc.ModelConfig, tuple[int, ...]]:
        config = entry.config
        if override is not None:
            served = await self._served(model)
            try:
                config = apply_override(model, override, entry.config, served)
            except InvalidInput as exc:  # Triton refuses a bad override as it polls the repository
                raise InvalidInput(poll_failed(model, str(exc))) from None
        selected = select_versions(config, entry.available)
        if not selected:
            source = "the config override's" if override is not None else "config.pbtxt's"
            available = ", ".join(str(v) for v in entry.available) or "none"
            message = (
                f"{source} version_policy ({describe_policy(config)}) selects no version of model '{model}' "
                f"on disk (version folders: {available})"
            )
            refused = poll_failed(model, message)
            raise InvalidInput(refused) if override is not None else GatewayError(refused, 422)
        return config, selected

    async def _served(self, model: str) -> mc.ModelConfig | None:
        """The configuration the gateway answers for the model now (``None`` while none of it serves)."""
        record = self._manager.router.record(model)
        if record is None or self._manager.backend.state(model, record.stable) is None:
            return None
        return await self._manager.backend.config(model, record.stable)

    async def _load(
        self, model: str, steps: Steps, config: mc.ModelConfig, selected: tuple[int, ...], actor: str, overridden: bool
    ) -> ActionReport:
        manager = self._manager
        record = manager.router.record(model)
        old = record.stable if record is not None and not record.unloaded else None
        target = max(selected)
        versions = {"from": old, "to": target}
        loaded_here: list[int] = []
        try:
            for version in sorted(selected, key=lambda v: v != target):  # the one to route first
                if manager.backend.state(model, version) is VersionState.READY:
                    continue
                steps.progress.version = version
                await manager.prepare(model, version, steps)
                loaded_here.append(version)
            steps.progress.version = target
            routed = self._routed(model, record, target, selected)
            if routed is not None:
                async with steps.run("flip"):
                    await manager.commit_routing(model, routed)
        except GatewayError as exc:
            for version in loaded_here:
                await manager.quietly(manager.backend.unload(model, version), f"unloading version {version}")
            manager.metrics.version_switches.labels(model, "failed").inc()
            swap = await failed(manager, steps, exc, versions, actor, old)
            if swap.step not in ("load", "warmup"):
                raise swap from None
            # The version itself failed: told in Triton's words, then which step and what keeps serving.
            keeps = f"; version {old} keeps serving" if old is not None else ""
            cause = f"{exc} (failed at step '{swap.step}'{keeps})"
            version = steps.progress.version or target
            raise SwapFailed(load_failed(model, version, cause), swap.step, swap.status) from None
        flipped_at = None
        if routed is not None and old != target:
            flipped_at = steps.mark_flip()
            manager.metrics.version_switches.labels(model, "ok").inc()
        dropped = sorted(set(manager.backend.models().get(model, {})) - set(selected))
        drained = await self._retire(model, steps, dropped, actor)
        changed = bool(loaded_here or dropped or routed is not None)
        detail: dict[str, Any] = {"policy": describe_policy(config), "loaded": list(selected), "unloaded": dropped,
                                  "config_override": overridden}
        report = await self._finish(steps, "ok" if changed else "unchanged", versions, actor,
                                    routed or record, detail)
        return report.but(drained=drained, unloaded=tuple(dropped), flipped_at=flipped_at)

    def _routed(
        self, model: str, record: RoutingRecord | None, target: int, selected: tuple[int, ...]
    ) -> RoutingRecord | None:
        """The routing once the load is done; ``None`` when it is the one in place."""
        keep = set(selected)
        if record is None:
            return RoutingRecord(stable=target, loaded=tuple(selected))
        routed = record.switched_to(target) if record.stable != target else record.but(unloaded=False)
        canary, shadow = routed.canary, routed.shadow
        routed = dataclasses.replace(
            routed,
            loaded=tuple(selected),
            canary=canary if canary is not None and canary.version in keep else None,
            shadow=shadow if shadow is not None and shadow.version in keep else None,
        )
        unchanged = dataclasses.replace(routed, generation=record.generation, updated_at=record.updated_at)
        return None if unchanged == record else routed

    async def _retire(self, model: str, steps: Steps, versions: list[int], actor: str) -> bool:
        """Drain ``versions`` together, then unload them one by one; whether every request finished in time."""
        if not versions:
            return True
        manager = self._manager
        timeout = manager.drain_timeout(None)
        self.unloading[model] = set(versions)
        try:
            async with steps.run("drain"):
                finished = await asyncio.gather(*(manager.leases.drain(model, v, timeout) for v in versions))
            for version in versions:
                if manager.backend.state(model, version) is None:
                    # Gone already: Triton drops a version that never loaded once the others are reloaded.
                    manager.router.note(model, version, None)
                    continue
                try:
                    async with steps.run("unload"):
                        await manager.backend.unload(model, version)
                except GatewayError as exc:
                    raise await failed(manager, steps, exc, {"version": version}, actor, None) from None
                manager.router.note(model, version, None)
        finally:
            del self.unloading[model]
        return all(finished)

    async def _finish(
        self,
        steps: Steps,
        result: str,
        versions: dict[str, int | None],
        actor: str,
        routing: RoutingRecord | None,
        detail: dict[str, Any],
    ) -> ActionReport:
        """The audit event (with what was loaded and unloaded) and the report, as every version action ends."""
        progress, manager = steps.progress, self._manager
        generation = routing.generation if routing is not None else None
        await manager.record(Event(progress.action, steps.model, result, versions, dict(progress.steps), actor=actor,
                                   generation=generation, detail=detail))
        report = ActionReport(steps.model, progress.action, result, versions, dict(progress.steps), routing=routing)
        manager.last[steps.model] = report
        return report
