"""The closed loop's measured window (loadtests/clients.py): asked to hold some answers, a window too short for one
answer stretches until it holds them, and reports the seconds it really lasted."""

from __future__ import annotations

import asyncio

import pytest

from tests.locust_runs import loadtests_module

clients = loadtests_module("clients")

ANSWER_S = 0.2  # longer than warm-up and window together: every request sent in the warm-up ends after the window


async def slow_answer() -> None:
    await asyncio.sleep(ANSWER_S)


async def test_a_window_shorter_than_one_answer_holds_none_when_nothing_is_asked_of_it() -> None:
    count, measured, latencies = await clients.closed_loop(slow_answer, 2, duration=0.05, warmup=0.05)

    assert (count, latencies) == (0, [])  # what the stretch is for: 0 answers would read as 0 req/s
    assert measured >= 0.05


async def test_a_window_asked_to_hold_answers_stretches_until_they_were_answered_and_reports_its_real_length() -> None:
    count, measured, latencies = await clients.closed_loop(slow_answer, 2, duration=0.05, warmup=0.05, at_least=3)

    assert count >= 3  # 2 clients: a second round was sent to reach 3
    assert len(latencies) == count
    assert min(latencies) >= ANSWER_S * 1e3 * 0.9
    assert measured >= 0.05 + ANSWER_S  # the seconds the stretched window lasted, not the 0.05 asked for


async def test_a_window_that_cannot_hold_its_answers_ends_at_its_stretch_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(clients, "STRETCH_FLOOR_S", 0.3)
    monkeypatch.setattr(clients, "STRETCH_LIMIT", 1)

    count, measured, _ = await clients.closed_loop(slow_answer, 1, duration=0.05, warmup=0.05, at_least=1000)

    assert 0 < count < 1000
    assert measured < 0.3 + ANSWER_S * 2  # the last request sent before the limit is still awaited
