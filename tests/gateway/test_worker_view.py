"""The routing file as the workers other than worker 0 see it: read afresh at every load, never written."""

from __future__ import annotations

from pathlib import Path

from services.gateway.state import Event, FileStateStore, RoutingRecord
from services.gateway.state.worker_view import WorkerFileView


async def test_a_worker_view_reads_what_worker_0_writes_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state" / "routing.json"
    store = FileStateStore(path)
    await store.open()
    view = WorkerFileView(path)
    await view.open()  # beside the store, which holds the lock: a view takes none
    try:
        assert await view.load_routing() == {}
        await store.save_routing("mlp", RoutingRecord(stable=1))
        assert (await view.load_routing())["mlp"].stable == 1
        await store.save_routing("mlp", RoutingRecord(stable=2, previous=1, generation=2))
        assert (await view.load_routing())["mlp"].stable == 2  # not a cached copy
        written = path.read_bytes()
        await view.save_routing("mlp", RoutingRecord(stable=7, generation=9))
        await view.append_event(Event("activate", "mlp", "ok"))
        assert path.read_bytes() == written
        assert not store.events_path.exists()
        await store.append_event(Event("activate", "mlp", "ok"))
        assert [event.action for event in await view.events("mlp")] == ["activate"]
    finally:
        await view.close()
        await store.close()
