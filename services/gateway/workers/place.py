"""Where one worker stands in its node: its index, how many workers serve the node, and the node's private folder
(mode 0700, made by the supervisor) that holds every worker's socket for the others' calls and the shared figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ACTING = 0
"""The worker that runs the node's version actions (and the repository's polling, and the canaries' judgement); the
others forward their admin calls to it and take the routing it commits."""


@dataclass(frozen=True)
class WorkerPlace:
    index: int
    count: int
    folder: Path

    @property
    def acting(self) -> bool:
        return self.index == ACTING

    @property
    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    def socket_path(self, index: int) -> Path:
        """Worker ``index``'s Unix socket: the node's internal calls (``peer_api``) and admin calls forwarded."""
        return self.folder / f"worker-{index}.sock"

    @property
    def figures_path(self) -> Path:
        """Each worker process's last reported counters, kept for the node's sums (``kept.py``)."""
        return self.folder / "figures"

    @property
    def share_path(self) -> Path:
        """The node's shared rate-limit buckets and concurrency counts (``shaping/node_share.py``)."""
        return self.folder / "share"

    @property
    def liveness_path(self) -> Path:
        """Every worker's last sign of life, for the supervisor's watchdog (``liveness.py``)."""
        return self.folder / "liveness"
