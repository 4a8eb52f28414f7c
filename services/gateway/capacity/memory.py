"""What a loaded model version costs in memory, and how that figure was come by: measured (the resident memory before
and after the load: of this process on the embedded backend, of the local Triton and its backend stubs when Triton
runs on this host and its process can be seen), declared (``parameters { key: "switchyard.memory_mb" value {
string_value: "N" } }`` in its config) or estimated (the size of its version folder's files, when a model server
elsewhere holds it)."""

from __future__ import annotations

import ctypes
import gc
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
from tritonclient.grpc import model_config_pb2

DECLARED = "switchyard.memory_mb"
"""The config parameter a model declares its memory with (MiB)."""
MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")

How = Literal["measured", "declared", "estimated"]


class MemoryDeclarationError(ValueError):
    """The config's ``switchyard.memory_mb`` is not a number of MiB above 0."""


@dataclass(frozen=True, slots=True)
class Cost:
    mb: float
    how: How

    def describe(self) -> str:
        return f"{self.mb:.1f} MiB ({self.how})"


def resident_mb() -> float:
    """This process's resident memory (``/proc/self/statm``: no allocation beyond one small read)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE / MIB


Measure = Callable[[], float | None]
"""The memory a model server holds now, MiB; None when it cannot be measured (then a load's cost is its floor)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, None where the C library has none (musl)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def release_freed() -> None:
    """Free what unloaded models left behind before a load is measured, not at the collector's or the allocator's
    leisure: a runtime session caught in a reference cycle (an unloaded version's batcher and its cancelled worker
    tasks) lives until a full collection, and glibc keeps freed heap memory in the process. Measured without this,
    a load's growth counted memory the allocator had freed and kept (an 8 MiB model measured 52 MiB, and was
    refused for good as larger than a 40 MiB budget), and unloaded sessions piled up beyond the budget."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def this_process() -> float | None:
    release_freed()  # what the process holds, not what it has freed and not yet handed back
    return resident_mb()


class LocalServer:
    """The model server listening on ``address`` when it runs on this host: its resident memory and its children's
    (Triton's python-backend stubs are processes of their own). Found at the first measure, and again while it is
    not found (Triton may start after the gateway); None while it cannot be (another host, another container, a
    process this one may not inspect)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._port = int(port) if host in LOOPBACK and port.isdigit() else None
        self._process: psutil.Process | None = None

    def __call__(self) -> float | None:
        process = self._process or self._find()
        if process is None:
            return None
        try:
            tree = [process, *process.children(recursive=True)]
            return sum(member.memory_info().rss for member in tree) / MIB
        except psutil.Error:  # it stopped: look for it again at the next load
            self._process = None
            return None

    def _find(self) -> psutil.Process | None:
        if self._port is None:
            return None
        try:
            listening = {
                connection.pid for connection in psutil.net_connections(kind="tcp")
                if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == self._port
                and connection.pid is not None
            }
        except psutil.Error:
            return None
        if len(listening) != 1:
            return None
        try:
            self._process = psutil.Process(listening.pop())
        except psutil.Error:
            return None
        return self._process


def files_mb(folder: Path) -> float:
    """The size of every file under ``folder`` (a version's model file and the weights beside it)."""
    total = 0
    for path in folder.rglob("*"):
        if path.is_file():
            total += path.stat().st_size
    return total / MIB


def declared_mb(config: model_config_pb2.ModelConfig, model: str) -> float | None:
    """The config's declared memory, None when it declares none; ``MemoryDeclarationError`` when malformed."""
    if DECLARED not in config.parameters:
        return None
    text = config.parameters[DECLARED].string_value
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise MemoryDeclarationError(
            f"model '{model}': parameter {DECLARED} must be a number of MiB above 0 (as a string_value), got {text!r}"
        )
    return value
