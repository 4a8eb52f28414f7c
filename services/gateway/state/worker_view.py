"""``WorkerFileView``: the routing file as the workers of a node that do not run version actions see it.

With ``switchyard serve --workers N`` on the file store, worker 0 opens the store (and holds its lock, which keeps
other gateways off the files) and runs every version action of the node; the other workers forward their admin calls
to it and are told each new routing record as it is committed. They read the file (at startup, and for the audit log
an admin page shows) but never write it: what they would persist at startup, worker 0 has persisted already."""

from __future__ import annotations

import logging

from services.gateway.state.file import FileStateStore
from services.gateway.state.records import Event, RoutingRecord

log = logging.getLogger(__name__)

_NO_LOCK = -1
"""Stands for the lock descriptor a view never takes: ``open`` has run."""


class WorkerFileView(FileStateStore):
    """Reads the routing file and audit log of the store worker 0 holds; never writes them."""

    def _open(self) -> None:
        with self._routing_io:
            self._lock_fd = _NO_LOCK
            self._records = None

    def _close(self) -> None:
        with self._routing_io:
            self._lock_fd = None
            self._records = None

    def _current_records(self) -> dict[str, RoutingRecord]:
        self._check_open()
        return self._read_routing_file()  # worker 0 replaces the file at every change: never cached here

    def _save_routing(self, model: str, record: RoutingRecord) -> None:
        log.debug("model '%s': routing generation %d is persisted by worker 0, not here", model, record.generation)

    def _append_event(self, event: Event) -> None:
        log.debug("audit event kept by worker 0, not here: %s", event)
