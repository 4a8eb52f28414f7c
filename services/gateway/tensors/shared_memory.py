"""System shared-memory regions that clients on the same host register (Triton's shared-memory extension): each one a
window of a POSIX shm object under /dev/shm, opened read-write, bounded in number and bytes, named per tenant.

The gateway never maps a client's object. The client keeps it and may shrink it at any time (``ftruncate``); a page of
a mapping past the object's new end raises SIGBUS in whichever thread touches it (the event loop, an onnxruntime
worker, a protobuf encoder), and the process dies. Regions are read and written through a descriptor instead:
``pread`` past the end comes back short and ``pwrite`` cannot fault, so a region its object no longer holds is a 400
naming it. Inputs are copied out once (a memcpy, at decode), outputs copied in once.

``region_tensors`` reads inputs from and writes outputs to them; a ``RegionMirror`` (the Triton backend) registers
the same windows in a model server that shares the host's /dev/shm."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from services.gateway.errors import GatewayError, InvalidInput

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
EXTENSION = "system_shared_memory"
"""Triton's name for the extension in the server metadata."""
CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported by this gateway; use system shared memory or send tensors in the request"
)
DISABLED = (
    "system shared memory is off on this gateway: start it with SWITCHYARD_SHARED_MEMORY=true (for clients on the "
    "same host) or send tensors in the request"
)
MAX_NAME = 256
_KEY = re.compile(r"/?[^/\x00]{1,255}")
"""A POSIX shm object name: one optional leading slash, then a single path component (glibc's NAME_MAX)."""


class RegionNotFound(GatewayError):
    status = 404


class RegionMirror(Protocol):
    """A model server that maps the same shm objects (the Triton backend when Triton shares the host)."""

    async def register(self, region: Region) -> None:
        """Make ``region`` known there (setting ``region.remote_name`` when requests may name it); raise
        ``GatewayError`` only when the client should hear of it."""

    async def unregister(self, region: Region) -> None:
        """Best effort: a failure is logged, never raised (the gateway's side is gone either way)."""


class Region:
    """One registered window: ``byte_size`` bytes at ``offset`` in the shm object ``key``, reached through a
    descriptor of the object that stays open until the region is unregistered (as a mapping would, it outlives an
    unlink of the name)."""

    __slots__ = ("_fd", "byte_size", "key", "name", "object_size", "offset", "remote_name", "tenant")

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, tenant: str, fd: int, object_size: int
    ) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.tenant = tenant
        self.object_size = object_size
        """The shm object's size when the region was registered."""
        self.remote_name: str | None = None
        """The name under which a mirror's requests reach the shm object, once the mirror registered it."""
        self._fd: int | None = fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def read_into(self, offset: int, target: memoryview) -> None:
        """Fill ``target`` (a writable byte buffer) from ``offset`` within the region on (the caller checked the
        region's bounds); raises ``InvalidInput`` when the object has been shrunk past them."""
        fd = self._descriptor()
        start = self.offset + offset
        size = target.nbytes
        done = os.preadv(fd, [target], start)
        while done < size:
            count = os.preadv(fd, [target[done:]], start + done)
            if count == 0:  # the object ends sooner than when it was registered
                raise self._shrunk(offset, size)
            done += count

    def read(self, offset: int, size: int) -> memoryview:
        """A copy of ``size`` bytes at ``offset`` within the region."""
        data = memoryview(bytearray(size))
        self.read_into(offset, data)
        return data

    def write(self, offset: int, data: memoryview) -> None:
        """Copy ``data`` (bytes) to ``offset`` within the region; refused when the object no longer holds that much,
        since a write past its end grows it back, which is the client's to decide (one shrinking it during the write
        gets it grown back: never a fault)."""
        fd = self._descriptor()
        self.check(offset, data.nbytes)
        start = self.offset + offset
        done = os.pwrite(fd, data, start)
        while done < data.nbytes:
            done += os.pwrite(fd, data[done:], start + done)

    def check(self, offset: int, size: int) -> None:
        """Raise ``InvalidInput`` unless the object still holds ``size`` bytes at ``offset`` within the region: before
        another process (a model server that maps the object) reads or writes them."""
        if os.fstat(self._descriptor()).st_size < self.offset + offset + size:
            raise self._shrunk(offset, size)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _descriptor(self) -> int:
        if self._fd is None:
            raise InvalidInput(f"shared memory region '{self.name}' was unregistered while the request used it")
        return self._fd

    def _shrunk(self, offset: int, size: int) -> InvalidInput:
        end = self.offset + offset + size
        try:
            now = f"{os.fstat(self._descriptor()).st_size} bytes"
        except OSError:
            now = "fewer"
        return InvalidInput(
            f"shared memory region '{self.name}': its shm object {self.key!r} has {now} now, the request needs "
            f"bytes up to {end} (offset {self.offset + offset} + {size}): it was shrunk after the region was "
            "registered"
        )


class SharedMemoryRegions:
    """The registry. ``enabled=False`` keeps status and unregister answering (an empty list, nothing to do) so that
    clients which clean up at startup work, and refuses registration with the setting to change."""

    def __init__(
        self,
        *,
        enabled: bool,
        max_regions: int = 256,
        max_bytes: int = 4 << 30,
        root: Path = SHM_ROOT,
        mirror: RegionMirror | None = None,
    ) -> None:
        self.enabled = enabled
        self._max_regions = max_regions
        self._max_bytes = max_bytes
        self._root = root
        self._mirror = mirror
        self._regions: dict[tuple[str, str], Region] = {}
        self.peers: RegionMirror | None = None
        """The node's other workers (``serve --workers N``): a region registered or unregistered here is there too
        (they map the same object; only this worker tells the mirror)."""

    @property
    def extensions(self) -> tuple[str, ...]:
        return (EXTENSION,) if self.enabled else ()

    def find(self, tenant: str, name: str) -> Region | None:
        return self._regions.get((tenant, name))

    def lookup(self, tenant: str) -> Callable[[str], Region | None]:
        """Name -> region for one tenant's requests: tenants never see each other's regions."""
        return lambda name: self._regions.get((tenant, name))

    def status(self, tenant: str, name: str | None = None) -> list[Region]:
        if name is None:
            return [region for (owner, _), region in self._regions.items() if owner == tenant]
        region = self._regions.get((tenant, name))
        if region is None:
            raise RegionNotFound(f"Unable to find system shared memory region: '{name}'")
        return [region]

    async def register(self, tenant: str, name: str, key: str, offset: int, byte_size: int) -> Region:
        if not self.enabled:
            raise InvalidInput(DISABLED)
        _check_name(name)
        if (tenant, name) in self._regions:
            raise InvalidInput(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self._max_regions:
            raise InvalidInput(
                f"the gateway holds {len(self._regions)} shared memory regions, its limit "
                "(SWITCHYARD_SHARED_MEMORY_MAX_REGIONS); unregister some first"
            )
        mapped = sum(region.byte_size for region in self._regions.values())
        if mapped + byte_size > self._max_bytes:
            raise InvalidInput(
                f"registering '{name}' ({byte_size} bytes) would register {mapped + byte_size} bytes in all, above the "
                f"gateway's limit of {self._max_bytes} (SWITCHYARD_SHARED_MEMORY_MAX_BYTES)"
            )
        fd, object_size = self._open(name, key, offset, byte_size)
        region = Region(name, key, offset, byte_size, tenant, fd, object_size)
        self._regions[tenant, name] = region  # before the mirror's await: a second register of the name is refused
        if self._mirror is not None:
            try:
                await self._mirror.register(region)
            except BaseException:
                self._regions.pop((tenant, name), None)
                region.close()
                raise
        if self.peers is not None:
            try:
                await self.peers.register(region)
            except BaseException:
                self._regions.pop((tenant, name), None)
                await self._drop(region)
                raise
        log.info("registered shared memory region '%s' (%s, %d bytes at offset %d)", name, key, byte_size, offset)
        return region

    async def unregister(self, tenant: str, name: str | None = None) -> None:
        """One region, or (``name=None``) every region of the tenant; an unknown name is no error, as in Triton."""
        if name is None:
            names = [owned for owner, owned in self._regions if owner == tenant]
        else:
            names = [name] if (tenant, name) in self._regions else []
        for each in names:
            region = self._regions.pop((tenant, each), None)
            if region is not None:  # not dropped by a concurrent call meanwhile
                await self._drop(region)

    def adopt(self, tenant: str, name: str, key: str, offset: int, byte_size: int, remote_name: str | None) -> None:
        """A region another worker of the node registered (and checked against the limits the node shares): mapped
        here too, neither mirrored nor told further. Already known: nothing to do."""
        if (tenant, name) in self._regions:
            return
        fd, object_size = self._open(name, key, offset, byte_size)
        region = Region(name, key, offset, byte_size, tenant, fd, object_size)
        region.remote_name = remote_name
        self._regions[tenant, name] = region

    def forget(self, tenant: str, name: str) -> None:
        """A region another worker of the node unregistered: closed here (that worker told the mirror)."""
        region = self._regions.pop((tenant, name), None)
        if region is not None:
            region.close()

    def all(self) -> list[Region]:
        """Every tenant's regions (a worker of the node that starts takes them over)."""
        return list(self._regions.values())

    async def close(self) -> None:
        """Close every region (the lifespan's shutdown), and unregister them from the mirror; the node's other
        workers keep theirs (they stop on their own)."""
        regions, self._regions = list(self._regions.values()), {}
        for region in regions:
            await self._drop(region, tell_peers=False)

    async def _drop(self, region: Region, *, tell_peers: bool = True) -> None:
        region.close()
        if self._mirror is not None:
            await self._mirror.unregister(region)
        if tell_peers and self.peers is not None:
            await self.peers.unregister(region)

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> tuple[int, int]:
        """A read-write descriptor of the object, once it holds the window, and the object's size."""
        if not _KEY.fullmatch(key) or key.lstrip("/") in (".", ".."):
            raise InvalidInput(
                f"shared memory key {key[:80]!r} is not a shm object name: expected '/name' with no other '/', "
                "no NUL and at most 255 characters"
            )
        if byte_size < 1 or offset < 0:
            raise InvalidInput(
                f"shared memory region '{name}': byte_size must be at least 1 and offset at least 0, got byte_size "
                f"{byte_size} and offset {offset}"
            )
        path = self._root / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInput(
                f"shared memory region '{name}': no shm object {key!r} exists on the gateway's host ({path}); "
                "create it first (tritonclient.utils.shared_memory.create_shared_memory_region)"
            ) from None
        except OSError as exc:  # a symbolic link (ELOOP), a directory, permissions
            raise InvalidInput(
                f"shared memory region '{name}': cannot open shm object {key!r}: {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"shared memory region '{name}': {key!r} is not a shm object")
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"shared memory region '{name}': shm object {key!r} has {info.st_size} bytes; offset {offset} "
                    f"+ byte_size {byte_size} runs past its end"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size


def _check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise InvalidInput(
            f"shared memory region name {name[:80]!r} must be 1 to {MAX_NAME} printable characters"
        )


REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
KEYS = (REGION, OFFSET, BYTE_SIZE)
"""The tensor parameters that place a tensor in a registered region."""


@dataclass(frozen=True, slots=True)
class RegionSlice:
    """``byte_size`` bytes at ``offset`` within a registered region: where one tensor lies or goes."""

    region: Region
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, str | int]:
        """The tensor parameters a response carries for an output written here (instead of its data)."""
        return {REGION: self.region.name, OFFSET: self.offset, BYTE_SIZE: self.byte_size}

    def write(self, tensor: str, data: memoryview) -> RegionSlice:
        """Copy an output in; the slice it took, as the response names it."""
        if data.nbytes > self.byte_size:
            raise InvalidInput(
                f"output '{tensor}' has {data.nbytes} bytes, more than the {self.byte_size} bytes "
                f"(shared_memory_byte_size) it was given in shared memory region '{self.region.name}'"
            )
        self.region.write(self.offset, data)
        return RegionSlice(self.region, self.offset, data.nbytes)
