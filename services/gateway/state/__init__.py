"""Persisted gateway state: routing records and the audit log, behind the small ``StateStore`` interface."""

from services.gateway.state.file import FileStateStore, default_state_path
from services.gateway.state.records import Event, RoutingRecord, StateError
from services.gateway.state.store import StateStore

__all__ = ["Event", "FileStateStore", "RoutingRecord", "StateError", "StateStore", "default_state_path"]
