"""``NodeShare``: the counters that the worker processes of one node (``switchyard serve --workers N``) share, so that
rate limits and per-model concurrency caps hold per node, not per worker.

One fixed-size file in a private folder the supervisor makes (0700), memory-mapped by every worker. Changes that
read, compare and write are made under ``fcntl.flock`` on that file: the kernel drops the lock of a process that
dies, so a worker killed with SIGKILL in the middle of an update never wedges the others (a multiprocessing lock
would stay held by the dead). Every section under the lock is a few memory reads and writes, never an await, so a
worker blocks its event loop for microseconds at most while another holds it.

Each process opens the file itself (``create`` or ``attach``): flock excludes open files, not processes, so a
share inherited through ``fork`` would not exclude its parent. ``spawn`` and subprocesses start with a fresh one.

The file::

    header   64 bytes: magic, format, workers, slots, then the number of slots taken
    names    slots × 256 bytes: a length byte and up to 255 bytes of UTF-8 (a longer name is kept as its SHA-256)
    records  slots × (3 + workers) words of 8 bytes: bucket tokens, bucket time, bucket started, one cell per worker

A name and its slot are never freed: slots are taken by names from the configuration (bucket keys, models the
router knows), so the table stays as small as the configuration.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from pathlib import Path
from types import TracebackType

FORMAT = 1
"""Raised whenever the file's layout changes: a worker of another release refuses the file instead of misreading it."""

_MAGIC = b"SWYDNODE"
_HEADER = struct.Struct("<8sIII")  # magic, format, workers, slots
_HEADER_BYTES = 64
_TAKEN_WORD = 3  # 8-byte word of the header holding how many slots are taken
_NAME_BYTES = 256
_NAME_MAX = _NAME_BYTES - 1
_BUCKET_WORDS = 3  # tokens (float), time (float), started (int): a bucket not started is full
_WORD = 8


class NodeShareError(RuntimeError):
    """The node's share cannot be made or used as asked: the worker does not start (or the request fails)."""


class _FileLock:
    """``with share.lock:`` holds the flock of the share's file; a plain class, as it is taken on every request."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


class NodeShare:
    """One process's view of the node's shared file, as ``worker`` (the supervisor may use any number, it only
    resets). Not thread-safe: one event loop per worker uses it."""

    def __init__(self, path: Path, fd: int, worker: int, workers: int, slots: int) -> None:
        self.path = path
        self.worker = worker
        self.workers = workers
        self.slots = slots
        self._fd = fd
        self._map = mmap.mmap(fd, _file_size(workers, slots))
        self.lock = _FileLock(fd)
        records = memoryview(self._map)[_records_offset(slots):]
        self._ints = records.cast("q")
        """The records as 8-byte integers: the bucket's started flag, the workers' cells."""
        self._floats = records.cast("d")
        """The same records as 8-byte floats: the buckets' tokens and time."""
        self._header_ints = memoryview(self._map)[:_HEADER_BYTES].cast("q")
        self._stride = _BUCKET_WORDS + workers
        self._indexes: dict[str, int] = {}
        """Name -> slot, cached in this process: a slot, once taken, never changes."""

    @classmethod
    def create(cls, path: Path, workers: int, *, slots: int = 1024) -> NodeShare:
        """The supervisor makes the file, all zeros behind its header (replacing one a previous run left). The file
        appears whole (written aside, then renamed), so a worker never attaches to half a header. ``path``'s folder
        must be private to this user (mode 0700): whoever can write the file can lift the node's limits."""
        if workers < 1 or slots < 1:
            raise NodeShareError(f"a node share needs workers >= 1 and slots >= 1, got workers={workers}, "
                                 f"slots={slots}")
        _check_private_folder(path.parent)
        aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _file_size(workers, slots))
            os.pwrite(fd, _HEADER.pack(_MAGIC, FORMAT, workers, slots), 0)
            os.replace(aside, path)
        except BaseException:
            os.close(fd)
            aside.unlink(missing_ok=True)
            raise
        return cls(path, fd, 0, workers, slots)

    @classmethod
    def attach(cls, path: Path, worker: int) -> NodeShare:
        """A worker maps the file the supervisor made; refuses a file of another format or size."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise NodeShareError(f"worker {worker} cannot open the node share {path}: {exc}") from None
        try:
            workers, slots = _read_header(path, fd)
            if not 0 <= worker < workers:
                raise NodeShareError(f"worker {worker} cannot attach to the node share {path}: it was made for "
                                     f"workers 0 to {workers - 1}")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, worker, workers, slots)

    def close(self) -> None:
        """Unmaps and closes the file (the file stays: the supervisor removes its folder)."""
        if self._fd < 0:
            return
        for view in (self._ints, self._floats, self._header_ints):
            view.release()
        self._map.close()
        os.close(self._fd)
        self._fd = -1

    def slot(self, name: str) -> int:
        """The slot of ``name`` (a bucket key, a model), taken on first use by any process of the node."""
        index = self._indexes.get(name)
        if index is None:
            index = self._indexes[name] = self._find_or_take(_stored_name(name), name)
        return index

    def reset_worker(self, worker: int) -> None:
        """Zeroes every cell of ``worker``: what a dead worker held is free again. The supervisor calls it before
        it starts a worker again, and a worker for itself before it serves; never for a live worker, whose next
        ``leave`` would then drive the node's count below what executes."""
        if not 0 <= worker < self.workers:
            raise NodeShareError(f"cannot reset worker {worker} of the node share {self.path}: its workers are 0 to "
                                 f"{self.workers - 1}")
        with self.lock:
            for index in range(self._header_ints[_TAKEN_WORD]):
                self._ints[self._cell(index, worker)] = 0

    # The accessors below are the file's layout for node_buckets.py and NodeSlots; ``bucket``, ``store_bucket``
    # and ``executing`` followed by ``add_own`` are only consistent under ``lock``.

    def bucket(self, index: int) -> tuple[float, float] | None:
        """A bucket's (tokens, time it was counted); None for a bucket never taken from."""
        base = index * self._stride
        if not self._ints[base + 2]:
            return None
        return self._floats[base], self._floats[base + 1]

    def store_bucket(self, index: int, tokens: float, counted_at: float) -> None:
        base = index * self._stride
        self._floats[base] = tokens
        self._floats[base + 1] = counted_at
        self._ints[base + 2] = 1

    def executing(self, index: int) -> int:
        """The node's count in a slot: the sum of the workers' cells."""
        base = index * self._stride + _BUCKET_WORDS
        return sum(self._ints[base:base + self.workers])

    def add_own(self, index: int, delta: int) -> None:
        """Adds to this worker's own cell. Only this worker writes it (``reset_worker`` runs when it is dead or
        not yet serving), and an aligned 8-byte store is one instruction on the 64-bit machines we run on: a
        reader summing under the lock sees the old or the new count, never a torn one. So no lock is needed
        here; a read-compare-write across cells (``NodeSlots.try_take``) takes it."""
        cell = self._cell(index, self.worker)
        self._ints[cell] += delta

    def _cell(self, index: int, worker: int) -> int:
        return index * self._stride + _BUCKET_WORDS + worker

    def _find_or_take(self, stored: bytes, name: str) -> int:
        with self.lock:
            taken = self._header_ints[_TAKEN_WORD]
            for index in range(taken):
                if self._name_at(index) == stored:
                    return index
            if taken >= self.slots:
                raise NodeShareError(f"the node share {self.path} has no slot left for {name!r}: all {self.slots} "
                                     "slots are taken; start the supervisor with more slots")
            offset = _HEADER_BYTES + taken * _NAME_BYTES
            self._map[offset:offset + 1 + len(stored)] = bytes([len(stored)]) + stored
            # The name is written before the count that makes it visible: a process killed in between leaves the
            # slot free, to be written again by the next one.
            self._header_ints[_TAKEN_WORD] = taken + 1
            return taken

    def _name_at(self, index: int) -> bytes:
        offset = _HEADER_BYTES + index * _NAME_BYTES
        return self._map[offset + 1:offset + 1 + self._map[offset]]


class NodeSlots:
    """One model's executing requests across the node, for ``ModelGate`` (or one API key's requests in flight,
    ``kind="key"``): a cell per worker, each written only by its worker; the node's count is their sum, and never
    passes the limit.

    A worker's cell counts what it executes plus a small reserve: taking one slot under the file lock for every
    request kept two busy workers queueing on that lock (9 % of the throughput and of the CPU per request at 32
    clients), so a worker claims a few slots at once and serves the next requests from its reserve without the lock.
    The reserve is small (``BLOCK``, and less near the limit), and given back whole as soon as the worker has
    nothing executing or the node is close to its limit: a few slots at most stay unused while another worker
    waits."""

    __slots__ = ("_index", "_share", "_spare")
    BLOCK = 4
    """Slots claimed at once at most, and kept in reserve at most."""

    def __init__(self, share: NodeShare, model: str, *, kind: str = "gate") -> None:
        """``kind``: what is counted (``gate``: a model's executing requests; ``key``: an API key's in flight)."""
        self._share = share
        self._index = share.slot(f"{kind}:{model}")
        self._spare = 0
        """Slots counted in this worker's cell and not used by any request yet."""

    @property
    def executing(self) -> int:
        """The node's count less this worker's reserve (read without the lock: for messages and gauges)."""
        return self._share.executing(self._index) - self._spare

    def try_take(self, limit: int) -> bool:
        """Takes a slot for this worker: from its reserve, else under the lock when the node holds fewer than
        ``limit`` (sum, compare and add in one critical section, so two workers never both take the last slot; a
        worker's store to its cell may sit in its core's store buffer while it reads the others' cells, and the
        lock's system calls order them). Far from the limit it claims a few slots at once: the reserve."""
        if self._spare:
            self._spare -= 1
            return True
        share = self._share
        with share.lock:
            free = limit - share.executing(self._index)
            if free <= 0:
                return False
            claim = max(1, min(self.BLOCK, free // (2 * share.workers)))
            share.add_own(self._index, claim)
        self._spare = claim - 1
        return True

    def give_back(self, limit: int, *, idle: bool) -> None:
        """Frees a slot this worker took (its own cell: no lock, see ``NodeShare.add_own``). ``idle``: the worker
        has nothing left executing here; then, and when the node is near ``limit``, the whole reserve goes back."""
        self._spare += 1
        keep = self.BLOCK
        if idle or limit - self._share.executing(self._index) < self.BLOCK * self._share.workers:
            keep = 0
        if self._spare > keep:
            self._share.add_own(self._index, keep - self._spare)
            self._spare = keep


def _stored_name(name: str) -> bytes:
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) <= _NAME_MAX:
        return encoded
    # A NUL byte starts no name we are given (model names and tenants are printable), so digests never meet names.
    return b"\x00sha256:" + hashlib.sha256(encoded).hexdigest().encode("ascii")


def _records_offset(slots: int) -> int:
    return _HEADER_BYTES + slots * _NAME_BYTES


def _file_size(workers: int, slots: int) -> int:
    return _records_offset(slots) + slots * (_BUCKET_WORDS + workers) * _WORD


def _check_private_folder(folder: Path) -> None:
    try:
        info = folder.stat()
    except OSError as exc:
        raise NodeShareError(f"the node share's folder {folder} cannot be read: {exc}; the supervisor makes it "
                             "(mode 0700) first") from None
    if info.st_mode & 0o077 or info.st_uid != os.geteuid():
        raise NodeShareError(f"the node share's folder {folder} has mode {info.st_mode & 0o777:o} and owner "
                             f"{info.st_uid}; expected mode 700, owned by this user ({os.geteuid()})")


def _read_header(path: Path, fd: int) -> tuple[int, int]:
    """(workers, slots) of a node share file; refuses a file of another format or size."""
    header = os.pread(fd, _HEADER.size, 0)
    if len(header) < _HEADER.size or not header.startswith(_MAGIC):
        raise NodeShareError(f"{path} is not a Switchyard node share: it does not start with {_MAGIC!r}")
    _, found, workers, slots = _HEADER.unpack(header)
    if found != FORMAT:
        raise NodeShareError(f"the node share {path} has format {found}, this gateway reads format {FORMAT}: "
                             "the supervisor and its workers must be the same release")
    size, expected = os.fstat(fd).st_size, _file_size(workers, slots)
    if size != expected:
        raise NodeShareError(f"the node share {path} is {size} bytes; expected {expected} for {workers} workers and "
                             f"{slots} slots")
    return workers, slots
