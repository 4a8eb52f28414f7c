"""Which export a routing record routes to, not just which number: a model folder deleted and exported again reuses
version numbers, and the routing state outlives it. Every record written names the export of each version it routes
to (``RoutingRecord.exports``); a start, a follower and a rollback compare that with what is on disk and never take
another export for the one that was activated (docs/version-switching.md, "Released or not")."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from services.gateway.repository import ModelEntry
from services.gateway.state import RoutingRecord
from services.modelrepo.manifest import export_identity


def on_disk(entry: ModelEntry, versions: Collection[int]) -> dict[int, str]:
    """The export identity of each of ``versions`` on disk (those gone or unreadable now are left out). Reads one
    small manifest per version. Blocking: call off the loop."""
    found = {}
    for version in versions:
        if version in entry.available:
            identity = export_identity(entry.version_dir(version))
            if identity is not None:
                found[version] = identity
    return found


async def stamped(entry: ModelEntry, record: RoutingRecord, fresh: Collection[int] = ()) -> RoutingRecord:
    """``record`` naming the export of every version it names: the one it carries over from the record it follows
    (what was loaded then, even when the folder was replaced since), else, and for the ``fresh`` versions (loaded
    from disk by the action that writes it), the one on disk now. Versions it no longer names are forgotten."""
    named = record.named()
    kept = {v: identity for v, identity in record.exports.items() if v in named and v not in fresh}
    unknown = named - kept.keys()
    found = await asyncio.to_thread(on_disk, entry, unknown) if unknown else {}
    exports = {**kept, **found}
    return record if exports == record.exports else dataclasses.replace(record, exports=exports)


def replaced(record: RoutingRecord, disk: Mapping[int, str], version: int) -> str | None:
    """Why ``version`` on disk is not the export ``record`` names for it, in words; ``None`` when it is, or when
    either side cannot tell (a record from before identities, an unreadable manifest)."""
    recorded, found = record.exports.get(version), disk.get(version)
    if recorded is None or found is None or recorded == found:
        return None
    return f"a different export ({found}) than the one {_meant(record, version)} ({recorded})"


def _meant(record: RoutingRecord, version: int) -> str:
    if version == record.stable:
        return "activated"
    return "that served" if version == record.previous else "the routing named"


@dataclass(frozen=True)
class Checked:
    """A persisted record compared with the exports on disk at startup."""

    record: RoutingRecord
    """The record less its previous, canary and shadow versions whose export was replaced (its stable is kept:
    ``stable`` says whether it may route)."""
    stable: str | None = None
    """Why the stable version may not be routed to: the export on disk is another one. ``None``: it may."""
    dropped: str = ""
    """The other versions dropped, and why, in words (empty when none)."""


def check(entry: ModelEntry, record: RoutingRecord) -> Checked:
    """Compare ``record`` with the exports on disk. Blocking (reads the manifests): call off the loop."""
    if not record.exports:
        return Checked(record)
    disk = on_disk(entry, record.exports.keys())
    stable = replaced(record, disk, record.stable)
    changes: dict[str, object] = {}
    dropped = []
    for kind, version in (("previous", record.previous), ("canary", record.canary_version),
                          ("shadow", record.shadow_version)):
        why = None if version is None else replaced(record, disk, version)
        if why is not None:
            changes[kind] = None
            dropped.append(f"{kind} version {version}, whose files on disk are {why}")
    if not changes:
        return Checked(record, stable)
    repaired = record.but(**changes)
    kept = {v: identity for v, identity in record.exports.items() if v in repaired.named()}
    return Checked(dataclasses.replace(repaired, exports=kept), stable, "; ".join(dropped))
