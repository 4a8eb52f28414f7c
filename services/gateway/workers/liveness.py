"""Each worker's sign of life, for the supervisor's watchdog (``switchyard serve --workers N``).

A worker whose event loop stops turning (a deadlock, a model call that never returns while holding the interpreter,
a process stopped by a debugger) still holds its listening sockets, so the kernel goes on handing it about 1/N of the
node's new connections, and the node's admin actions wait on it. Its event loop therefore writes the time here every
``BEAT_S``; the supervisor kills a worker silent for longer than ``SWITCHYARD_WORKER_HANG_TIMEOUT_S`` and starts
another (``supervisor.py``).

Some steps hold the interpreter, and so the loop, for long on purpose: reading a TorchScript file keeps the GIL for
the whole read (measured here: 0.12 s for 200 MB, so minutes for tens of GB). Such a step announces itself
(``backends/loop_holds.py``); while one runs, the worker's slot says until when it may stay silent.

The file: one slot of two 8-byte words per worker, in the node's private folder: the last beat and "silent until",
both milliseconds of ``CLOCK_MONOTONIC``, one clock for every process of the machine. Each word is written whole by
its one writer (the worker), so a reader sees the old value or the new one.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

BEAT_S = 1.0
"""How often a worker's event loop writes its beat."""
HOLD_ALLOWANCE_S = 900.0
"""How long a step that holds the loop on purpose (a model load) may keep the worker silent: as long as a worker may
take to load its models at startup."""

_WORD = struct.Struct("<q")
_SLOT_BYTES = 2 * _WORD.size
_BEAT, _SILENT_UNTIL = 0, _WORD.size


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class Liveness:
    """The node's liveness file, mapped: the supervisor reads every slot, a worker writes its own."""

    def __init__(self, path: Path, count: int, fd: int) -> None:
        self._count = count
        self._map = mmap.mmap(fd, count * _SLOT_BYTES)
        os.close(fd)  # the mapping keeps the file
        self.path = path

    @classmethod
    def create(cls, path: Path, count: int) -> Liveness:
        """A new file of ``count`` slots, every one never beaten (the supervisor, before it starts the workers)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, count * _SLOT_BYTES)
        return cls(path, count, fd)

    @classmethod
    def attach(cls, path: Path, count: int) -> Liveness:
        return cls(path, count, os.open(path, os.O_RDWR))

    def beat(self, index: int) -> None:
        self._write(index, _BEAT, now_ms())

    def hold(self, index: int, allowance_s: float = HOLD_ALLOWANCE_S) -> None:
        """A step that may keep the loop from beating begins: silence is expected for up to ``allowance_s``."""
        self._write(index, _SILENT_UNTIL, now_ms() + int(allowance_s * 1000))

    def release(self, index: int) -> None:
        """That step ended: the loop beats again within ``BEAT_S``, and the watchdog counts silence from now."""
        self._write(index, _SILENT_UNTIL, now_ms())

    def reset(self, index: int) -> None:
        """Never beaten: a worker's slot before its process starts (what its previous process wrote is void)."""
        self._write(index, _BEAT, 0)
        self._write(index, _SILENT_UNTIL, 0)

    def silent_s(self, index: int, now: int | None = None) -> float | None:
        """Seconds since worker ``index`` last beat, or since a step that held its loop ended (whichever is later;
        negative while such a step may still run); None when it never beat (it is starting)."""
        beat = self._read(index, _BEAT)
        if beat == 0:
            return None
        latest = max(beat, self._read(index, _SILENT_UNTIL))
        return ((now_ms() if now is None else now) - latest) / 1000

    def close(self) -> None:
        self._map.close()

    def _write(self, index: int, word: int, value: int) -> None:
        _WORD.pack_into(self._map, self._offset(index) + word, value)

    def _read(self, index: int, word: int) -> int:
        value: int = _WORD.unpack_from(self._map, self._offset(index) + word)[0]
        return value

    def _offset(self, index: int) -> int:
        if not 0 <= index < self._count:
            raise IndexError(f"worker {index} has no liveness slot: the node has {self._count} workers")
        return index * _SLOT_BYTES
