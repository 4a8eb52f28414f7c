"""The closed loop: N clients in this process, each sending its next request when the previous one answered,
for a warm-up and then a measured time; latency percentiles, throughput and server CPU per request."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from services.gateway.errors import GatewayError
from services.gateway.tuning.results import Measurement

_TICKS = os.sysconf("SC_CLK_TCK")


async def closed_loop(
    send: Callable[[], Awaitable[None]],
    concurrency: int,
    *,
    duration_s: float,
    warmup_s: float,
    server_pids: Callable[[], list[int]],
) -> Measurement:
    latencies: list[float] = []
    errors = 0
    first_error: str | None = None
    clock = time.perf_counter
    measure_from = clock() + warmup_s
    stop = measure_from + duration_s
    cpu_from: dict[int, float] | None = None

    async def client() -> None:
        nonlocal errors, first_error, cpu_from
        while True:
            began = clock()
            if began >= stop:
                return
            if cpu_from is None and began >= measure_from:
                cpu_from = cpu_seconds(server_pids())
            try:
                await send()
            except GatewayError as exc:
                if began >= measure_from:
                    errors += 1
                    # What the run's error names: why requests failed, on one line (runtimes' errors span several).
                    first_error = first_error or " ".join(str(exc).split())
                # A request refused before it waited (a full batch queue) never gave the loop a turn: without one,
                # this client would spin through its refusals until the measurement ends, holding the gateway.
                await asyncio.sleep(0)
                continue
            if began >= measure_from:
                latencies.append((clock() - began) * 1e3)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = clock() - measure_from
    cpu = 0.0
    if cpu_from is not None:  # processes that came or went meanwhile (a previous trial's exiting stubs) do not count
        cpu_to = cpu_seconds(list(cpu_from))
        cpu = sum(max(cpu_to[pid] - cpu_from[pid], 0.0) for pid in cpu_to if pid in cpu_from)
    answered = len(latencies)
    p50, p99 = (float(v) for v in np.percentile(latencies, [50, 99])) if latencies else (float("inf"),) * 2
    return Measurement(
        concurrency=concurrency,
        requests=answered,
        errors=errors,
        seconds=max(seconds, 1e-9),
        p50_ms=p50,
        p99_ms=p99,
        cpu_ms_per_request=cpu * 1e3 / answered if answered else 0.0,
        error=first_error,
    )


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU of each process (all its threads) so far, from /proc/PID/stat; gone ones are left out."""
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / _TICKS
    return found
