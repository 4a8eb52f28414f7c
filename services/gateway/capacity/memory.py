"""What a loaded model version costs in memory, and how that figure was come by: measured (the process's resident
memory before and after the load, on the embedded backend), declared (``parameters { key: "switchyard.memory_mb"
value { string_value: "N" } }`` in its config) or estimated (the size of its version folder's files, when a model
server elsewhere holds it)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
