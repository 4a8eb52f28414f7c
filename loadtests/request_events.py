"""Entries in locust's stats for calls that locust's HTTP clients do not make (gRPC) or that fail before a request
is sent: each one fires the ``request`` event as those clients do."""

from __future__ import annotations

from typing import Any

from locust.env import Environment


def fire_request(
    environment: Environment,
    request_type: str,
    name: str,
    response_time_ms: float,
    response_length: int = 0,
    exception: BaseException | None = None,
) -> None:
    fields: dict[str, Any] = {
        "request_type": request_type,
        "name": name,
        "response_time": response_time_ms,
        "response_length": response_length,
        "exception": exception,
        "context": {},
    }
    environment.events.request.fire(**fields)  # type: ignore[no-untyped-call]  # locust's EventHook is unannotated


def fire_failure(environment: Environment, request_type: str, name: str, exception: BaseException) -> None:
    """A failure that happened on this side, before or after a request (no response time of its own)."""
    fire_request(environment, request_type, name, 0.0, 0, exception)
