"""Shared-memory regions for the tests, made the way a Triton client makes them (``tritonclient.utils.shared_memory``),
and a look at who maps them or holds them open."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.utils.shared_memory as shm

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class ShmObject:
    """A POSIX shm object under /dev/shm; ``key`` is its name as clients register it (``/switchyard-test-...``)."""

    key: str
    byte_size: int
    handle: Any

    @property
    def path(self) -> Path:
        return Path("/dev/shm") / self.key.lstrip("/")

    def put(self, array: Array, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset=offset)

    def get(self, dtype: Any, shape: list[int], offset: int = 0) -> Array:
        """A copy: the handle's view must not outlive the object."""
        return np.array(shm.get_contents_as_numpy(self.handle, dtype, shape, offset=offset))


@contextmanager
def shm_object(byte_size: int) -> Iterator[ShmObject]:
    """A fresh shm object of ``byte_size`` bytes, unlinked on exit."""
    key = f"/switchyard-test-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key, key, byte_size, create_only=True)
    try:
        yield ShmObject(key, byte_size, handle)
    finally:
        shm.destroy_shared_memory_region(handle)


def mappings(path: Path, pid: int | str = "self") -> int:
    """How many memory mappings of ``path`` the process has."""
    suffix = f" {path}"
    return sum(1 for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if line.endswith(suffix))


def descriptors(path: Path, pid: int | str = "self") -> int:
    """How many open file descriptors of ``path`` the process has."""
    found = 0
    for link in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed since the listing
            found += os.readlink(link) == str(path)
    return found
