"""The file store's audit log: JSON lines, appended with fsync, rotated to ``.1`` past a size, read newest first; a
line torn by a crash mid-append is skipped (and never glued to the next one)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from services.durable import fsync_folder
from services.gateway.state.records import Event, StateError

logger = logging.getLogger(__name__)


class EventLog:
    """Blocking file work: the caller serialises calls and runs them off the event loop."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self._max_bytes = max_bytes

    def append(self, event: Event) -> None:
        line = (json.dumps(event.to_json(), separators=(",", ":")) + "\n").encode()
        try:
            self._write(line)
        except OSError as exc:
            raise StateError(f"cannot append to the audit log {self.path}: {exc}") from exc

    def read(self, model: str | None, limit: int) -> list[Event]:
        """The newest ``limit`` events (of ``model``, when given), oldest first, across the rotated file."""
        newest_first: list[Event] = []
        for log in (self.path, _rotated(self.path)):
            if len(newest_first) >= limit:
                break
            newest_first.extend(_read_log(log, model, limit - len(newest_first)))
        newest_first.reverse()
        return newest_first

    def _write(self, line: bytes) -> None:
        log = self.path
        try:
            size = log.stat().st_size
        except FileNotFoundError:
            size = -1
        if size > 0 and size + len(line) > self._max_bytes:
            os.replace(log, _rotated(log))
            size = -1
        fd = os.open(log, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # A crash mid-append leaves a line without its newline; end it, or the next event would be glued to it.
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if size < 0:
            fsync_folder(log.parent)


def _read_log(log: Path, model: str | None, limit: int) -> list[Event]:
    """Up to ``limit`` events of ``log``, newest first."""
    try:
        lines = log.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StateError(f"cannot read the audit log {log}: {exc}") from exc
    found: list[Event] = []
    for number in range(len(lines) - 1, -1, -1):
        if len(found) >= limit:
            break
        if not lines[number].strip():
            continue
        try:
            data = json.loads(lines[number])
            if not isinstance(data, dict):
                raise TypeError("not an object")
            event = Event.from_json(data)
        except (ValueError, TypeError, RecursionError):
            # A torn line from a crash mid-append (or a hand-edited one nested past Python's recursion limit); the
            # rest of the log is still good. Python's json, not orjson: an event's detail may hold NaN.
            logger.warning("skipping unreadable line %d of the audit log %s", number + 1, log)
            continue
        if model is None or event.model == model:
            found.append(event)
    return found


def _rotated(log: Path) -> Path:
    return log.with_name(log.name + ".1")
