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


FIRST_ANSWER_WAIT_S = 30.0
"""Longest the warm-up waits past ``warmup_s`` for every client's first answer (at most 20 measured windows): a trial
just loaded answers its first requests late (a session created, a Triton python-backend stub started), and a window
measured before then would count no request at all."""


async def closed_loop(
    send: Callable[[], Awaitable[None]],
    concurrency: int,
    *,
    duration_s: float,
    warmup_s: float,
    server_pids: Callable[[], list[int]],
) -> Measurement:
    """The measured window opens once ``warmup_s`` has passed and every client has been answered once (or refused),
    or when the wait for those first answers gives up; the clients go on sending across it, as in a closed loop."""
    latencies: list[float] = []
    errors = 0
    first_error: str | None = None
    clock = time.perf_counter
    started = clock()
    warm_until = started + warmup_s
    give_up_at = warm_until + min(FIRST_ANSWER_WAIT_S, 20 * duration_s)
    measure_from: float | None = None
    stop = float("inf")
    answered_clients = 0
    cpu_from: dict[int, float] | None = None

    def open_window(at: float) -> None:
        nonlocal measure_from, stop
        if measure_from is None:
            measure_from, stop = at, at + duration_s

    async def client() -> None:
        nonlocal errors, first_error, cpu_from, answered_clients
        had_answer = False
        while True:
            began = clock()
            if began >= stop:
                return
            if began >= give_up_at:
                open_window(began)
            counted = measure_from is not None and began >= measure_from
            if counted and cpu_from is None:
                cpu_from = cpu_seconds(server_pids())
            try:
                await send()
            except GatewayError as exc:
                if counted:
                    errors += 1
                    # What the run's error names: why requests failed, on one line (runtimes' errors span several).
                    first_error = first_error or " ".join(str(exc).split())
                # A request refused before it waited (a full batch queue) never gave the loop a turn: without one,
                # this client would spin through its refusals until the measurement ends, holding the gateway.
                await asyncio.sleep(0)
            else:
                if counted:
                    latencies.append((clock() - began) * 1e3)
            if not had_answer:
                had_answer, answered_clients = True, answered_clients + 1
                if answered_clients == concurrency:
                    open_window(max(clock(), warm_until))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = clock() - (measure_from if measure_from is not None else started)
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
