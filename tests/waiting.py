"""Waiting for something to happen in a test: poll a condition with a timeout instead of sleeping a guessed time
(a sleep that "lets it happen" is a flaky test on a busy machine, and a slow one on an idle machine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
TIMEOUT_S = 10.0


def wait_until(check: Callable[[], bool], timeout_s: float = TIMEOUT_S, interval_s: float = 0.005) -> bool:
    """True as soon as ``check()`` holds; False when it still does not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def eventually(read: Callable[[], T], want: T, timeout_s: float = TIMEOUT_S) -> T:
    """``read()`` once it equals ``want`` (or what it reads at the timeout, for the assertion to show)."""
    last: list[T] = []

    def matches() -> bool:
        last[:] = [read()]
        return last[0] == want

    wait_until(matches, timeout_s)
    return last[0]


async def wait_until_async(check: Callable[[], bool], timeout_s: float = TIMEOUT_S, interval_s: float = 0.005) -> bool:
    """``wait_until`` on the event loop: the loop keeps running what the check waits for."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_s)


async def eventually_async(read: Callable[[], Awaitable[T]], want: T, timeout_s: float = TIMEOUT_S) -> T:
    """``eventually`` for a read that awaits (a request to an in-process app): ``read()`` once it equals ``want``
    (or what it reads at the timeout, for the assertion to show)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await read()
        if got == want or time.monotonic() >= deadline:
            return got
        await asyncio.sleep(0.005)
