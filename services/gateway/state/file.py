"""``FileStateStore``: routing records in one JSON file that is only ever replaced whole (write, fsync, rename),
and the audit log as JSON lines beside it. An exclusive lock keeps a second gateway off the same files."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from services.durable import fsync_folder, replace_file
from services.gateway.shaping.json_limits import bounded_json
from services.gateway.state.event_log import EventLog
from services.gateway.state.records import Event, RoutingRecord, StateError
from services.gateway.state.store import OnChange

__all__ = ["FORMAT", "FileStateStore", "default_state_path"]

FORMAT = 1
"""The routing file's ``format``; a file with another one is refused rather than guessed at."""

_TMP_SUFFIX = ".tmp"

logger = logging.getLogger(__name__)


def default_state_path(repository: Path) -> Path:
    """Where the routing file of ``repository`` lives unless ``SWITCHYARD_STATE_PATH`` says otherwise.

    Never inside the repository: Triton takes every folder there for a model. The folder name carries a hash of
    the resolved repository path, so two repositories with the same name get separate state."""
    resolved = repository.resolve()
    digest = hashlib.sha1(str(resolved).encode(), usedforsecurity=False).hexdigest()[:12]
    xdg = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "switchyard" / f"{resolved.name}-{digest}" / "routing.json"


class FileStateStore:
    """A ``StateStore`` for one gateway: the routing file at ``path``, the audit log at ``<stem>.events.jsonl``
    (rotated to ``.1`` past ``max_event_bytes``) and ``<path>.lock``, held while the store is open."""

    shared = False

    def __init__(self, path: Path, *, max_event_bytes: int = 10 * 1024 * 1024) -> None:
        if max_event_bytes < 1:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes}")
        self.path = path
        self.events_path = path.with_name(path.stem + ".events.jsonl")
        self.lock_path = path.with_name(path.name + ".lock")
        self._log = EventLog(self.events_path, max_event_bytes)
        self._lock_fd: int | None = None
        self._records: dict[str, RoutingRecord] | None = None
        # The asyncio locks keep concurrent callers from each parking a worker thread; the thread locks are what
        # really serialise the file work, since a cancelled caller releases its asyncio lock while its thread runs.
        self._routing_lock = asyncio.Lock()
        self._events_lock = asyncio.Lock()
        self._routing_io = threading.Lock()
        self._events_io = threading.Lock()

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    async def load_routing(self) -> Mapping[str, RoutingRecord]:
        async with self._routing_lock:
            return await asyncio.to_thread(self._load_routing)

    async def save_routing(self, model: str, record: RoutingRecord) -> None:
        async with self._routing_lock:
            await asyncio.to_thread(self._save_routing, model, record)

    async def append_event(self, event: Event) -> None:
        async with self._events_lock:
            await asyncio.to_thread(self._append_event, event)

    async def events(self, model: str | None = None, limit: int = 100) -> list[Event]:
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        async with self._events_lock:
            return await asyncio.to_thread(self._read_events, model, limit)

    # Everything below runs in a worker thread.

    @contextlib.asynccontextmanager
    async def lock(self, model: str, holder: str) -> AsyncIterator[None]:
        """One gateway per file (the flock taken by ``open``): the version manager's own lock is enough."""
        yield

    async def watch(self, on_change: OnChange) -> None:
        """No other gateway writes this file: nothing to follow."""

    def _open(self) -> None:
        with self._routing_io:
            if self._lock_fd is not None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StateError(f"cannot open the state lock {self.lock_path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                finally:
                    os.close(fd)
                raise StateError(
                    f"the state file {self.path} is in use by another gateway (pid {holder}, holding "
                    f"{self.lock_path}); give each gateway its own SWITCHYARD_STATE_PATH, or a shared store "
                    "such as Redis for replicas"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise StateError(f"cannot lock {self.lock_path}: {exc}") from exc
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                os.close(fd)
                raise StateError(f"cannot write the holder's pid to {self.lock_path}: {exc}") from exc
            self._lock_fd = fd
            # Another gateway may have written the file since a previous open; read it afresh.
            self._records = None
            self._remove_stale_temp_files()

    def _close(self) -> None:
        with self._routing_io:
            fd, self._lock_fd = self._lock_fd, None
            self._records = None
            if fd is not None:
                # Closing the descriptor drops the flock; the lock file stays, as an unlocked file means nothing.
                os.close(fd)

    def _load_routing(self) -> dict[str, RoutingRecord]:
        with self._routing_io:
            return dict(self._current_records())

    def _save_routing(self, model: str, record: RoutingRecord) -> None:
        with self._routing_io:
            records = {**self._current_records(), model: record}
            self._replace_routing_file(records)
            # Only now: when the write fails the store keeps the records it had, and the next save writes those.
            self._records = records

    def _current_records(self) -> dict[str, RoutingRecord]:
        self._check_open()
        if self._records is None:
            self._records = self._read_routing_file()
        return self._records

    def _read_routing_file(self) -> dict[str, RoutingRecord]:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise self._corrupt(f"cannot be read ({exc})") from exc
        try:
            data = bounded_json(text)  # bytes that are not UTF-8 included
        except ValueError as exc:
            raise self._corrupt(f"is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise self._corrupt(f"holds a JSON {type(data).__name__}, not an object")
        found = data.get("format")
        if found != FORMAT or isinstance(found, bool):
            raise self._corrupt(f"has format {found!r}; this gateway reads format {FORMAT}")
        models = data.get("models")
        if not isinstance(models, dict):
            raise self._corrupt(f"has 'models' {models!r}, not an object of routing records")
        records: dict[str, RoutingRecord] = {}
        for model, raw in models.items():
            try:
                records[model] = RoutingRecord.from_json(raw)
            except ValueError as exc:
                raise self._corrupt(f"has a bad routing record for model {model!r}: {exc}") from exc
        return records

    def _replace_routing_file(self, records: dict[str, RoutingRecord]) -> None:
        document = {"format": FORMAT, "models": {name: records[name].to_json() for name in sorted(records)}}
        payload = (json.dumps(document, indent=2) + "\n").encode()
        folder = self.path.parent
        try:
            replace_file(self.path, payload, prefix=self._temp_prefix, suffix=_TMP_SUFFIX)
        except OSError as exc:
            raise StateError(f"cannot write the state file {self.path}: {exc}") from exc
        try:
            fsync_folder(folder)
        except OSError as exc:
            # The new file is in place but may not survive a power cut; the caller must not count on it.
            raise StateError(f"cannot make the state file {self.path} durable: {exc}") from exc

    def _remove_stale_temp_files(self) -> None:
        # Left by a gateway killed mid-save; we hold the lock, so no one else is writing them.
        with contextlib.suppress(OSError):
            for stale in self.path.parent.iterdir():
                if stale.name.startswith(self._temp_prefix) and stale.name.endswith(_TMP_SUFFIX):
                    stale.unlink()

    def _append_event(self, event: Event) -> None:
        with self._events_io:
            self._check_open()
            self._log.append(event)

    def _read_events(self, model: str | None, limit: int) -> list[Event]:
        with self._events_io:
            self._check_open()
            return self._log.read(model, limit)

    @property
    def _temp_prefix(self) -> str:
        return f".{self.path.name}."

    def _check_open(self) -> None:
        if self._lock_fd is None:
            raise RuntimeError(f"the state store at {self.path} is not open; call open() first")

    def _corrupt(self, problem: str) -> StateError:
        return StateError(
            f"the state file {self.path} {problem}; the gateway will not guess the routing: fix or remove the file"
        )
