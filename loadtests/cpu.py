"""CPU time per process group, read from /proc, so a run can say how much CPU each hop spent per request."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
Usage = tuple[float, float, float]
"""CPU ms per request: the hop (gateway or floor), Triton, and the load generator."""


@dataclass
class Processes:
    gateway: int
    floor: int
    triton: int  # tritonserver; its python-backend stubs run in its process group

    def hop(self, mode: str) -> list[int]:
        return [self.floor] if mode.startswith("floor") else [] if mode.startswith("triton") else [self.gateway]

    def triton_group(self) -> list[int]:
        return process_group(self.triton)


def process_group(pid: int) -> list[int]:
    """Every process in ``pid``'s process group (Triton and its python-backend stubs)."""
    group = os.getpgid(pid)
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes (threads included) so far, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS
