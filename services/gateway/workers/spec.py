"""What the supervisor hands a worker process it starts (pickled by ``multiprocessing``'s spawn)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.gateway.settings import Settings
from services.gateway.workers.place import WorkerPlace

ConfigTransform = Callable[[Any], Any]
"""``backends.triton.ConfigTransform``, named here without importing the Triton backend into the supervisor."""


@dataclass(frozen=True)
class WorkerSpec:
    settings: Settings
    """With the node's concrete ports (the supervisor picked them when 0 was asked) and its worker count."""
    place: WorkerPlace
    config_transform: ConfigTransform | None = None
    restarts: int = 0
    """How many times the supervisor restarted this worker's index before this start."""
