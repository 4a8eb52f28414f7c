"""Persisted gateway state: routing records and the audit log, behind the small ``StateStore`` interface."""

from services.gateway.state.file import FileStateStore, default_state_path
from services.gateway.state.records import Event, RoutingRecord, StateError
from services.gateway.state.redis_store import RedisStateStore
from services.gateway.state.store import OnChange, StateBusy, StateStore

__all__ = [
    "Event",
    "FileStateStore",
    "OnChange",
    "RedisStateStore",
    "RoutingRecord",
    "StateBusy",
    "StateError",
    "StateStore",
    "default_state_path",
]
