"""The tuner's closed loop: its measured window opens once every client has been answered, so that a trial whose
first answers come late (just loaded, cold) is measured on what it answers after them."""

from __future__ import annotations

import asyncio
import os
import time

from services.gateway.errors import GatewayError
from services.gateway.tuning.drive import closed_loop


class Cold:
    """A trial whose first request takes ``first_s`` (one at a time, as a cold model's first batch), then 1 ms."""

    def __init__(self, first_s: float) -> None:
        self.first_s = first_s
        self.warm = False
        self.lock = asyncio.Lock()

    async def send(self) -> None:
        if not self.warm:
            async with self.lock:
                if not self.warm:
                    await asyncio.sleep(self.first_s)
                    self.warm = True
                    return
        await asyncio.sleep(0.001)


async def test_a_trial_that_answers_its_first_requests_after_the_window_would_have_ended_is_still_measured() -> None:
    cold = Cold(first_s=0.4)  # longer than the warm-up and the window together
    measured = await closed_loop(cold.send, 2, duration_s=0.1, warmup_s=0.05, server_pids=lambda: [os.getpid()])
    assert measured.requests > 10, measured
    assert measured.p99_ms < 100, measured  # the cold answers are not among them
    assert 0.09 < measured.seconds < 2.0, measured


async def test_the_window_opens_after_the_warm_up_even_when_every_client_was_answered_at_once() -> None:
    started = time.perf_counter()
    late = 0  # requests begun once the 0.1 s warm-up was over: the only ones the window may count

    async def send() -> None:
        nonlocal late
        late += time.perf_counter() - started >= 0.1
        await asyncio.sleep(0.001)

    measured = await closed_loop(send, 2, duration_s=0.1, warmup_s=0.1, server_pids=lambda: [os.getpid()])
    assert 0 < measured.requests <= late, measured
    assert 0.09 < measured.seconds < 2.0, measured


async def test_a_client_never_answered_stops_the_wait_after_twenty_windows_and_the_others_are_measured() -> None:
    calls = 0

    async def send() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(1.0 if calls == 1 else 0.001)  # one client's first request hangs past the wait

    started = time.perf_counter()
    measured = await closed_loop(send, 2, duration_s=0.01, warmup_s=0.0, server_pids=lambda: [os.getpid()])
    waited = time.perf_counter() - started
    assert measured.requests > 0, measured  # the other client's, in the window opened at 20 x 0.01 s
    assert 0.9 < waited < 10  # the hung request is waited for, not the 30 s cap


async def test_refusals_during_the_warm_up_count_as_first_answers() -> None:
    async def send() -> None:
        await asyncio.sleep(0.001)
        raise GatewayError("the queue is full", 503)

    measured = await closed_loop(send, 2, duration_s=0.05, warmup_s=0.01, server_pids=lambda: [os.getpid()])
    assert measured.requests == 0
    assert measured.errors > 0
    assert measured.error == "the queue is full"
